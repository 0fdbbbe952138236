"""The MoE layer's expert side: residency, reads, policies, overlap, and what was done.

`ExpertRunner.forward(layer, x, ids, weights)` is called by the architecture's sparse MoE
block with the final routing. In order:

1. *settle* speculation left from the previous layer — real reads always win: finished
   speculative reads join the cache, the rest are cancelled;
2. the *drop policy* (`--drop-cold-experts F`) skips routed experts that are not resident
   and weigh less than F/k (never the top one), renormalising the survivors;
3. each surviving expert is looked up (one lookup per unique expert; a hit refreshes
   recency) and the misses' reads are issued at once on the reader lanes;
4. *speculation* for the next layers is issued behind them (`--prefetch K`: the previous
   token's routing; `--predict-prefetch`: the stale-gate prediction), and predicted
   experts already resident are refreshed so they are not evicted before use (retention);
5. the experts run on the compute team — with `--overlap`, resident ones while the reads
   run and each missing one as it lands; with every expert resident, on the caller and a
   partner process (`partner.py`) — and their outputs are summed in routing order, so the
   result is bit-identical whatever was resident, when reads finished, or who computed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine import partner
from abbench.engine.cache import ExpertCache
from abbench.engine.compute import ComputeTeam, Job
from abbench.engine.config import EngineConfig
from abbench.engine.gguf_file import ModelFile
from abbench.engine.streamer import ExpertBuffer, LayerExperts, ReadTicket, SliceReader

if TYPE_CHECKING:
    from abbench.engine.predictor import RoutePredictor
    from abbench.records.route_trace import RouteTraceWriter

MIB = 1024 * 1024


@dataclass
class TokenCounters:
    """What one forward pass did on the expert side (reset per pass)."""

    read_bytes: int = 0
    io_s: float = 0.0  # time reads were in flight (per layer, first issue → last done)
    stall_s: float = 0.0  # time every compute thread waited on a read
    mgmt_s: float = 0.0  # cache bookkeeping and read issue on the compute thread
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    experts_routed: int = 0
    experts_dropped: int = 0
    spec_read_bytes: int = 0
    spec_experts: int = 0  # speculative reads completed and integrated into the cache
    spec_useful: int = 0  # speculatively read experts hit before eviction
    spec_cancelled: int = 0
    retained: int = 0  # predicted residents refreshed in the LRU

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())

    def counts(self) -> dict[str, int]:
        """The pass's counts, which a TokenRecord carries as they are (times it converts)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}


@dataclass(frozen=True)
class Policies:
    """The expert-side policies of a run (DESIGN 3.4); all off by default."""

    drop_frac: float | None = None
    drop_in_prefill: bool = False
    drop_renorm: bool = True
    prefetch: int = 0
    prefetch_sync: bool = False
    predict_prefetch: bool = False
    spec_max: int = 2

    @classmethod
    def of(cls, config: EngineConfig) -> Policies:
        """The policies an engine configuration asks for (the config is the one
        declaration; this is its expert-side view)."""
        return cls(drop_frac=config.drop_cold_experts, drop_in_prefill=config.drop_in_prefill,
                   drop_renorm=not config.drop_no_renorm, prefetch=config.prefetch,
                   prefetch_sync=config.prefetch_sync,
                   predict_prefetch=config.predict_prefetch, spec_max=config.predict_spec_max)


class ExpertRunner:
    def __init__(
        self,
        mf: ModelFile,
        layout: list[LayerExperts],
        *,
        cache_mib: float,
        resident: bool,
        io_lanes: int,
        o_direct: bool,
        overlap: bool,
        threads: int,
        max_k: int,
        policies: Policies | None = None,
    ) -> None:
        self.layout = layout
        self.overlap = overlap
        self.resident = resident
        self.policies = policies or Policies()
        self.n_expert = layout[0].gate.shape[0] if layout else 0
        self.reader = SliceReader(mf.path, io_lanes, o_direct)
        total = sum(le.buffer_bytes * self.n_expert for le in layout)
        self.cache = ExpertCache(total if resident else int(cache_mib * MIB))
        ff = max((le.ff for le in layout), default=1)
        d = max((le.d for le in layout), default=1)
        self.team: ComputeTeam | partner.Partner = ComputeTeam(threads, ff, max_k)
        self.out = np.zeros((max_k, d), np.float32)  # (k, d) expert outputs, routing order
        self.tok = TokenCounters()
        self.load_read_bytes = 0
        self.predictor: RoutePredictor | None = None  # set by the session for predictions
        self.trace: RouteTraceWriter | None = None
        self.phase = 1
        self.step = 0
        self._prev_routing: list[list[int]] = [[] for _ in layout]  # previous token's
        self._routing: list[list[int]] = [[] for _ in layout]  # this token's
        self._pending: list[tuple[tuple[int, int], ReadTicket]] = []
        if self.policies.drop_frac is not None and max_k <= 4:
            warnings.warn(
                f"--drop-cold-experts with top-{max_k}: the threshold F/k is {1 / max_k:.2f}"
                f"*F of the routing mass, so dropping removes far more than at top-8",
                RuntimeWarning, stacklevel=2,
            )
        if resident:
            self._preload()

    def start_partner(self, matrices: Sequence[np.ndarray]) -> bool:
        """With every expert resident and more than one thread, hand half of each layer's
        work to a partner process instead of the thread team (see `partner.py`);
        `matrices` are the dense ones the model multiplies through `team.matvec`."""
        if not (self.resident and self.team.threads > 1 and partner.supported()):
            return False
        max_k, d = self.out.shape
        ff = max((le.ff for le in self.layout), default=1)
        team = partner.Partner(matrices, self.cache.entries.values(), d, ff, max_k)
        self.team.close()
        self.team = team
        return True

    def partner_cpu_s(self) -> float:
        """CPU seconds the partner process has used (0 without one): `getrusage` of this
        process does not see a child until it is reaped."""
        return self.team.cpu_seconds() if isinstance(self.team, partner.Partner) else 0.0

    @property
    def o_direct(self) -> bool:
        return self.reader.o_direct

    def _preload(self) -> None:
        for layer, le in enumerate(self.layout):
            tickets = []
            for e in range(self.n_expert):
                buf = ExpertBuffer(le.ff, le.d, self.cache.arena)
                tickets.append((e, buf, self.reader.submit(le.slices(e), buf)))
            for e, buf, t in tickets:
                t.wait()
                self.load_read_bytes += t.nbytes
                self.cache.insert((layer, e), buf)

    def begin_pass(self, phase: int, step: int) -> None:
        """Called before each forward pass (the previous pass's routing becomes "previous")."""
        if phase == 1 and any(self._routing):
            self._prev_routing = self._routing
            self._routing = [[] for _ in self.layout]
        self.phase, self.step = phase, step
        self.tok.reset()

    # -- one layer -------------------------------------------------------------------

    def forward(
        self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int
    ) -> np.ndarray:
        """x: (d,), ids/weights: (k,) → (d,) the weighted sum of the routed experts."""
        le = self.layout[layer]
        tok = self.tok
        cache = self.cache
        pol = self.policies
        t0 = time.perf_counter()
        if self._pending:
            self._settle()
        k = len(ids)
        tok.experts_routed += k
        routed = ids.tolist()
        routed_weights = weights
        if phase == 1:
            self._routing[layer] = routed

        keep = None
        if pol.drop_frac is not None and (phase == 1 or pol.drop_in_prefill):
            threshold = pol.drop_frac / k
            top = int(np.argmax(weights))
            keep = [bool(j == top or weights[j] >= threshold or cache.peek((layer, e)))
                    for j, e in enumerate(routed)]
            n_drop = k - sum(keep)
            if n_drop:
                tok.experts_dropped += n_drop
                mask = np.array(keep)
                kept_w = weights[mask]
                if pol.drop_renorm:
                    kept_w = kept_w * (weights.sum() / kept_w.sum())
                ids, weights = ids[mask], kept_w.astype(np.float32)
            else:
                keep = None

        resident: list[Job] = []
        missing: list[tuple[int, int, ExpertBuffer, bool]] = []
        tickets: list[ReadTicket] = []
        residency: list[int] = []  # per surviving slot: 0 miss, 1 hit, 2 hit on speculation
        evictions_before = cache.counters.evictions
        useful_before = cache.counters.spec_useful
        batch: set[tuple[int, int]] | None = None  # this layer's keys: never evicted by it
        speculative = cache.speculative
        for slot, e in enumerate(routed if keep is None else ids.tolist()):
            key = (layer, e)
            was_spec = key in speculative
            buf = cache.lookup(key)
            if buf is not None:
                resident.append(Job(slot, buf, None))
                residency.append(2 if was_spec else 1)
            else:
                if batch is None:
                    batch = {(layer, int(i)) for i in ids}
                buf, cached = cache.admit(key, le.ff, le.d, batch)
                missing.append((slot, e, buf, cached))
                tickets.append(self.reader.submit(le.slices(e), buf))  # read starts now
                residency.append(0)
        tok.hits += len(resident)
        tok.misses += len(missing)
        tok.spec_useful += cache.counters.spec_useful - useful_before
        if phase == 1 and (pol.prefetch or pol.predict_prefetch):
            self._speculate(layer, batch)
        tok.evictions += cache.counters.evictions - evictions_before
        if self.trace is not None:
            if keep is None:
                full, dropped = residency, [0] * k
            else:
                it = iter(residency)
                full = [next(it) if kept else 0 for kept in keep]
                dropped = [0 if kept else 1 for kept in keep]
            self.trace.layer(phase, self.step, layer, routed, routed_weights.tolist(), full,
                             dropped, le.file_bytes)
        t1 = time.perf_counter()
        tok.mgmt_s += t1 - t0

        jobs = list(resident)
        stall = 0.0
        try:
            if self.overlap:
                jobs += [Job(slot, buf, t) for (slot, _, buf, _), t in zip(missing, tickets)]
            elif tickets:
                w0 = time.perf_counter()
                for t in tickets:
                    t.wait()
                stall = time.perf_counter() - w0
                jobs += [Job(slot, buf, None) for slot, _, buf, _ in missing]
            stall += self.team.run(jobs, x, self.out)
        except BaseException:
            # Every read ends (done or failed) before its buffer is reused; then the
            # entries whose contents are not trustworthy leave the cache.
            for t in tickets:
                t.event.wait()
            for _, e, _, cached in missing:
                if cached:
                    cache.drop((layer, e))
            raise
        if missing:
            tok.io_s += max(t.t_done for t in tickets) - min(t.t_issued for t in tickets)
            tok.read_bytes += sum(t.nbytes for t in tickets)
            t2 = time.perf_counter()
            for _, _, buf, cached in missing:
                if not cached:
                    cache.release(buf, le.ff, le.d)
            tok.mgmt_s += time.perf_counter() - t2
        tok.stall_s += stall
        n = len(ids)
        return weights @ self.out[:n]  # (k,) @ (k, d) → (d,)

    # -- speculation -----------------------------------------------------------------

    def _speculate(self, layer: int, in_use: set[tuple[int, int]] | None) -> None:
        """Issue speculative reads behind this layer's own (FIFO lanes: real reads first)."""
        pol = self.policies
        cache = self.cache
        targets: list[tuple[int, int]] = []
        if pol.prefetch:
            last = min(len(self.layout), layer + 1 + pol.prefetch)
            for nxt in range(layer + 1, last):
                targets += [(nxt, e) for e in self._prev_routing[nxt]]
        elif self.predictor is not None and layer + 1 < len(self.layout):
            pred = self.predictor.pred_ids[layer + 1]
            if pred is None:
                return
            budget = pol.spec_max
            if budget == 0:  # retention only: free
                refresh = cache.refresh
                self.tok.retained += sum(refresh((layer + 1, e)) for e in pred.tolist())
                return
            pw = self.predictor.pred_weights[layer + 1]
            threshold = pol.drop_frac / len(pred) if pol.drop_frac is not None else 0.0
            for j, e in enumerate(pred.tolist()):  # highest predicted weight first
                key = (layer + 1, e)
                if cache.refresh(key):  # retention: free, whatever the cap
                    self.tok.retained += 1
                    continue
                if budget == 0:
                    continue
                if j > 0 and pw is not None and pw[j] < threshold:
                    continue  # dropping would skip it unread: reading it is the waste
                targets.append(key)
                budget -= 1
        if not targets:
            return
        pinned = {key for key, _ in self._pending}
        pinned |= in_use if in_use is not None else {(layer, e) for e in self._routing[layer]}
        for key in targets:
            if cache.peek(key) or key in pinned:
                continue
            le = self.layout[key[0]]
            buf, cached = cache.admit(key, le.ff, le.d, pinned, speculative=True)
            if not cached:  # no room without evicting what is in use: do not speculate
                cache.release(buf, le.ff, le.d)
                continue
            pinned.add(key)
            self._pending.append((key, self.reader.submit(le.slices(key[1]), buf)))
        if pol.prefetch_sync:
            self._settle(cancel=False)

    def _settle(self, cancel: bool = True) -> None:
        """Finished speculative reads join the cache; the rest are cancelled."""
        tok = self.tok
        for key, ticket in self._pending:
            if cancel and not ticket.event.is_set():
                ticket.cancelled = True
            ticket.event.wait()
            tok.spec_read_bytes += ticket.nbytes
            if ticket.error is not None or ticket.skipped:
                self.cache.drop(key)  # partly read or failed: not trustworthy
                tok.spec_cancelled += 1
            else:
                self.cache.speculative.add(key)
                tok.spec_experts += 1
        self._pending.clear()

    def finish(self) -> None:
        """Settle what speculation is still in flight (end of run)."""
        if self._pending:
            self._settle()

    def close(self) -> None:
        self.finish()
        self.reader.close()
        self.team.close()
