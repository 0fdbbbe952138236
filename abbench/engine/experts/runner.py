"""The MoE layer's expert side: residency, reads, overlap, and what was done.

The architecture's sparse MoE block routes, then calls the two steps here with the routing:

1. `select` — speculation left from the previous layer is *settled* (finished reads join
   the cache, those under way for a routed expert go on, the rest are cancelled), then the
   *drop policy* (`policies.cold_keep`) keeps some of the routed experts, their weights
   renormalised (`policies.kept_weights`);
2. `__call__` — each kept expert is looked up (one lookup per unique expert; a hit
   refreshes recency) and the misses' reads are issued at once on the reader lanes;
   *speculation* for the next layers is issued behind them (`policies.prev_token_prefetch`
   for `--prefetch K`, `policies.stale_gate_prefetch` for `--predict-prefetch`, which also
   names the predicted residents to refresh so they are not evicted before use — with
   no speculative reads, `--predict-spec-max 0`, that refresh waits for the next layer's
   lookups, see `speculation.py`); the layer's route-trace rows are written; then the
   experts run on the compute team — with `--overlap`, resident ones while the reads
   run and each missing one as it lands; with every expert resident, on the caller and
   a partner process (`partner.py`). There a decode layer takes its buffers straight
   from the complete cache, counted and traced as the lookups would count and trace them
   (`_call_resident`, tested), and with no drop policy and no route trace `run_routed`
   does both steps at once with the same counters: the short ways docs/engine.md
   measures ("The resident short ways").

The block sums the outputs in routing order, so the result is bit-identical whatever was
resident, when reads finished, or who computed. The steps' bookkeeping is *mgmt* time.

A prompt's batch: `prefill.py`; speculation: `speculation.py`; counters, `Load`: `selection.py`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.experts.policies import Policies, cold_keep, kept_weights
from abbench.engine.experts.prefill import BatchPrefill
from abbench.engine.experts.selection import (
    Direct,
    Load,
    Miss,
    Selection,
    TokenCounters,
    by_expert_id,
)
from abbench.engine.experts.speculation import Speculator
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import partner
from abbench.engine.kernels.compute import SWIGLU, ComputeTeam, Job
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.streaming.cache import ExpertCache, Key, buffer_kinds
from abbench.engine.streaming.prelaid import Prelaid, open_prelaid
from abbench.engine.streaming.streamer import LayerExperts, Slice, SliceReader
from abbench.engine.units import MIB
from abbench.errors import EngineError

if TYPE_CHECKING:
    from abbench.engine.experts.predictor import RoutePredictor
    from abbench.engine.kernels.expert_ffn import ExpertFFN
    from abbench.records.route_trace import RouteTraceWriter

__all__ = ["Direct", "ExpertRunner", "Load", "Miss", "Selection", "TokenCounters"]  # re-exported


class ExpertRunner:
    """The experts of every layer: one cache, one set of reader lanes, one compute team,
    and a decode layer's steps. Its parts have their own state and modules: `spec`, the
    speculation behind a layer's reads (`speculation.py`), and `batch`, the prefill path
    (`prefill.py`); a token's one graph asks its questions in `in_graph.py`."""

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
        team: QuantTeam | None = None,
        ffn: ExpertFFN = SWIGLU,
        prelaid: Path | None = None,
        note: Callable[[str], None] | None = None,
    ) -> None:
        """`team`: compute the experts in the file's own types on this ggml team made with
        `ffn` (their buffers then hold the file's bytes); None: in F32 on the numpy team.
        `ffn`: the architecture's expert FFN. `prelaid`: read the experts from a copy
        pre-laid in this folder (`streaming/prelaid.py`; `note` says when it is written)."""
        self.ffn = ffn
        self.layout = layout
        self.overlap = overlap
        self.resident = resident
        self.threads = max(1, threads)
        self.policies = policies or Policies()
        self.n_expert = layout[0].gate.shape[0] if layout else 0
        ff = max((le.ff for le in layout), default=1)
        d = max((le.d for le in layout), default=1)
        self.team: ComputeTeam | partner.Partner | QuantTeam = self._team(team, ff, max_k)
        self.raw = team is not None
        budget = None if resident else int(cache_mib * MIB)
        self.kinds = buffer_kinds(layout, self.raw, self.n_expert, max_k, budget or 0)
        self.prelaid: Prelaid | None = None
        self.reader = self._reader(mf, team, io_lanes, o_direct, prelaid, note)
        self.cache = ExpertCache(budget if budget is not None else sum(
            kind.nbytes * self.n_expert for kind in self.kinds))
        self.out = np.zeros((max_k, d), np.float32)  # (k, d) expert outputs, routing order
        self.tok = TokenCounters()
        self.load_read_bytes = 0
        self.trace: RouteTraceWriter | None = None
        self.phase = 1
        self.step = 0
        self.spec = Speculator(self)
        self.batch = BatchPrefill(self)
        self.direct: Direct | None = None  # with a partner: see start_partner
        if self.policies.drop_frac is not None and max_k <= 4:
            warnings.warn(
                f"--drop-cold-experts with top-{max_k}: the threshold F/k is {1 / max_k:.2f}"
                f"*F of the routing mass, so dropping removes far more than at top-8",
                RuntimeWarning, stacklevel=2,
            )
        if resident:
            self._preload()
            self.cache.complete = True

    def _reader(self, mf: ModelFile, team: QuantTeam | None, io_lanes: int, o_direct: bool,
                prelaid: Path | None, note: Callable[[str], None] | None) -> SliceReader:
        """The reader lanes, over the model file or its pre-laid copy (`self.prelaid`)."""
        relay = None
        if team is not None and (self.resident or team.relay or prelaid is not None):
            # re-laid as llama.cpp's --repack does, by the lane reading each part (`--relay`)
            for pool in dict.fromkeys(self.kinds):
                team.repack_pool(pool)  # type: ignore[arg-type]
            relay = team.relay_part
        if prelaid is not None and team is not None:  # the session refuses F32 experts
            self.prelaid = open_prelaid(prelaid, mf.path, self.layout, self.kinds,  # type: ignore[arg-type]
                                        team.repack_slot, team.repack_pool, o_direct, note)
            relay = None  # read as they are computed from
        source = mf.path if self.prelaid is None else self.prelaid.path
        return SliceReader(source, io_lanes, o_direct, relay)

    def _team(self, team: QuantTeam | None, ff: int, max_k: int) -> ComputeTeam | QuantTeam:
        """The ggml team given, which must run this runner's FFN, or the numpy team."""
        if team is None:
            return ComputeTeam(self.threads, ff, max_k, self.ffn)
        if team.ffn is not self.ffn:
            raise EngineError("the ggml team computes another expert FFN than the runner's")
        return team

    @property
    def repacked(self) -> list[str]:
        """The expert projections held re-laid for ggml's repacked kernels (any layer's)."""
        return [p for i, p in enumerate(("gate", "up", "down"))
                if any(getattr(k, "repack", (False,) * 3)[i] for k in self.kinds)]

    @property
    def kernel_types(self) -> dict[str, list[str]]:
        """The types the experts are computed in, per projection (every layer's)."""
        if not self.raw:
            return {p: ["F32"] for p in ("gate", "up", "down")}
        return {p: sorted({getattr(le, p).type_name for le in self.layout})
                for p in ("gate", "up", "down")}

    def start_partner(self, matrices: Sequence[np.ndarray], max_rows: int = 0) -> bool:
        """With every expert resident and more than one thread, hand half of each layer's
        work to a partner process instead of the thread team (see `partner.py`);
        `matrices` are the dense ones the model multiplies through `team.matvec`, and
        `max_rows` the most tokens a prefill pass gives it. The ggml team (no partner)
        takes the same short way to a complete cache's buffers (`direct`)."""
        if self.resident and isinstance(self.team, QuantTeam):
            self.direct = (self.team, by_expert_id(self.cache, len(self.layout), self.n_expert))
            return False
        if not (self.resident and isinstance(self.team, ComputeTeam) and self.team.threads > 1
                and partner.supported()):
            return False
        max_k, d = self.out.shape
        ff = max((le.ff for le in self.layout), default=1)
        team = partner.Partner(matrices, self.cache.entries.values(), d, ff, max_k, max_rows,
                               self.ffn)
        self.team.close()
        self.team = team
        # A complete cache never changes: each layer's buffers by expert id, for
        # `_call_resident`, are the very buffers the partner knows.
        self.direct = (team, by_expert_id(self.cache, len(self.layout), self.n_expert))
        return True

    @property
    def predictor(self) -> RoutePredictor | None:
        """The stale-gate predictor the session installs (speculation's)."""
        return self.spec.predictor

    @predictor.setter
    def predictor(self, predictor: RoutePredictor | None) -> None:
        self.spec.predictor = predictor

    def prefill(self, layer: int, x: np.ndarray, ids: np.ndarray,
                weights: np.ndarray) -> np.ndarray:
        """A batch of prompt tokens through `layer`'s experts (`prefill.py`): x (n, d),
        ids and weights (n, k) → (n, d)."""
        return self.batch.prefill(layer, x, ids, weights)

    def settle(self, routed: set[Key] | None = None) -> None:
        """Speculative reads in flight are settled before any lookup (real reads win; those
        for experts `routed` here go on: `Speculator.settle`)."""
        if self.spec.pending:
            self.spec.settle(routed=routed)

    def finish(self) -> None:
        """Settle what speculation is still in flight (end of run)."""
        self.spec.finish()

    @property
    def policies(self) -> Policies:
        return self._policies

    @policies.setter
    def policies(self, pol: Policies) -> None:
        """The policies, and what `run_routed` reads of them on every layer, worked out
        once (a bench swaps them between tokens)."""
        self._policies = pol
        self._retains = pol.speculates and pol.reads_nothing  # retention-only speculation
        self._short = pol.drop_frac is None and (self._retains or not pol.speculates)

    def partner_cpu_s(self) -> float:
        """CPU seconds the partner process has used (0 without one): `getrusage` of this
        process does not see a child until it is reaped."""
        return self.team.cpu_seconds() if isinstance(self.team, partner.Partner) else 0.0

    @property
    def o_direct(self) -> bool:
        return self.reader.o_direct

    def _preload(self) -> None:
        for layer in range(len(self.layout)):
            tickets = []
            for e in range(self.n_expert):
                buf = self.kinds[layer].new()
                tickets.append((e, buf, self.reader.submit(self.slices(layer, e), buf)))
            for e, buf, t in tickets:
                t.wait()  # and re-laid, where the team repacks
                self.load_read_bytes += t.nbytes
                self.cache.insert((layer, e), buf)

    def slices(self, layer: int, expert: int) -> tuple[Slice, Slice, Slice]:
        """Where an expert's parts are read from: the model file, or the copy (--prelaid)."""
        if self.prelaid is not None:
            return self.prelaid.slices(layer, expert)
        return self.layout[layer].slices(expert, self.raw)

    def begin_pass(self, phase: int, step: int) -> None:
        """Called before each forward pass (the previous pass's routing becomes "previous")."""
        self.spec.begin_pass(phase)
        self.phase, self.step = phase, step
        self.tok.reset()

    # -- one layer: select, then load and run -----------------------------------------

    def run_routed(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                   phase: int) -> tuple[np.ndarray, np.ndarray]:
        """`select`, then the call: the kept experts' weights (k',) and outputs (k', d),
        the outputs valid until the next call.

        A decode layer over the partner's complete cache with no drop policy, no route
        trace and no reads (retention-only speculation just counts there) takes the short
        way: the same counters as `select` and `_call_resident` keep, without the
        selection's objects and checks — on the caller's path of every layer, where they
        measured 1.0-1.8% of a token (token-alternating, default preset, two runs).
        """
        direct, spec = self.direct, self.spec
        if (direct is None or not self._short or phase != 1 or self.trace is not None
                or spec.pending or spec.retain_at is not None):
            chosen = self.select(layer, ids, weights, phase)
            return chosen.weights, self(layer, x, chosen, phase)
        t0 = time.perf_counter()
        routed = ids.tolist()
        k = len(routed)
        spec.routing[layer] = routed
        tok = self.tok
        tok.experts_routed += k
        tok.hits += k
        self.cache.counters.hits += k
        if self._retains:
            spec.speculate(layer, None)
        table = direct[1][layer]
        bufs = [table[e] for e in routed]
        tok.mgmt_s += time.perf_counter() - t0
        return weights, direct[0].run_resident(bufs, x, routed, layer)

    def select(self, layer: int, ids: np.ndarray, weights: np.ndarray,
               phase: int) -> Selection:
        """The routing (ids, weights: (k,)) as the drop policy leaves it.

        Speculation left from the previous layer is settled first: real reads always win
        the lanes, and the drop rule must see what is resident after it.
        """
        t0 = time.perf_counter()
        routed = ids.tolist()
        self.settle({(layer, e) for e in routed})
        self.tok.experts_routed += len(routed)
        if phase == 1:
            self.spec.routing[layer] = routed  # the next token's --prefetch reads these
        chosen = Selection(routed, weights, None, routed, weights)
        frac = self.policies.drop_frac_in(phase)
        if frac is not None:
            resident = [self.cache.peek((layer, e)) for e in routed]
            keep = cold_keep(weights, resident, frac)
            if not all(keep):
                self.tok.experts_dropped += keep.count(False)
                chosen = Selection(routed, weights, keep,
                                   [e for e, kept in zip(routed, keep) if kept],
                                   kept_weights(weights, keep, self.policies.drop_renorm))
        self.tok.mgmt_s += time.perf_counter() - t0
        return chosen

    def __call__(self, layer: int, x: np.ndarray, chosen: Selection, phase: int) -> np.ndarray:
        """x: (d,) → (k', d) the chosen experts' outputs in routing order, valid until the
        next call: their lookups and reads, speculation behind them, then the FFNs."""
        direct, spec = self.direct, self.spec
        speculates = phase == 1 and self.policies.speculates
        if (direct is not None and spec.retain_at is None and not spec.pending
                and not (speculates and not self.policies.reads_nothing)):
            if speculates:  # retention alone: over a complete cache, a count (`speculate`)
                spec.speculate(layer, None)
            return self._call_resident(direct, layer, x, chosen, phase)
        t0 = time.perf_counter()
        evictions_before = self.cache.counters.evictions
        load = self.load(layer, chosen.experts)
        if phase == 1 and self.policies.speculates:  # decode only: the bets are on decode
            spec.speculate(layer, load.batch)
        self.tok.evictions += self.cache.counters.evictions - evictions_before
        if self.trace is not None:
            chosen.trace(self.trace, phase, self.step, layer, load.residency,
                         self.layout[layer].file_bytes)
        self.tok.mgmt_s += time.perf_counter() - t0
        self._run(layer, x, load)
        return self.out[: len(chosen.experts)]  # (k', d)

    def _call_resident(self, direct: Direct, layer: int, x: np.ndarray, chosen: Selection,
                       phase: int) -> np.ndarray:
        """`__call__` with every expert resident and the partner: what the lookups would
        find and count (every one a hit, nothing read, evicted or speculated), without
        their per-expert bookkeeping, which is on the caller's path of every layer."""
        t0 = time.perf_counter()
        team, by_id = direct
        table = by_id[layer]
        bufs = [table[e] for e in chosen.experts]
        k = len(bufs)
        self.cache.counters.hits += k
        self.tok.hits += k
        if self.trace is not None:
            chosen.trace(self.trace, phase, self.step, layer, [1] * k,
                         self.layout[layer].file_bytes)
        self.tok.mgmt_s += time.perf_counter() - t0
        return team.run_resident(bufs, x, chosen.experts, layer)  # (k', d)

    def load(self, layer: int, experts: list[int]) -> Load:
        """One lookup per expert (a hit refreshes recency); every miss's read is issued at
        once on the reader lanes, into a buffer the cache admits (or scratch)."""
        cache = self.cache
        predicted = self.spec.at_lookups(layer, experts)  # a deferred retention, done
        useful_before = cache.counters.spec_useful
        load = Load([], [], [], [], None)
        speculative = cache.speculative
        for slot, e in enumerate(experts):
            key = (layer, e)
            was_spec = key in speculative
            buf = cache.lookup(key)
            if buf is not None:  # a speculative read still under way: waited for as it lands
                load.resident.append(Job(slot, buf, self.spec.adopted.get(key), e))
                load.residency.append(2 if was_spec else 1)
                continue
            if load.batch is None:
                load.batch = {(layer, i) for i in experts}
            buf, cached = cache.admit(key, self.kinds[layer], load.batch)
            load.missing.append((slot, e, buf, cached))
            load.tickets.append(self.reader.submit(self.slices(layer, e), buf))  # starts now
            load.residency.append(0)
        if predicted is not None:  # and those looked up: they were resident if they hit
            self.tok.retained += sum(1 for e, r in zip(experts, load.residency)
                                     if r and e in predicted)
        self.tok.hits += len(load.resident)
        self.tok.misses += len(load.missing)
        self.tok.spec_useful += cache.counters.spec_useful - useful_before
        return load

    def _run(self, layer: int, x: np.ndarray, load: Load) -> None:
        """The loaded experts into `self.out` (x: (d,)). With `--overlap` the resident ones
        run while the reads are in flight and each missing one as it lands; without, every
        read is waited for first (all of that wait is stall)."""
        tickets = load.tickets if self.overlap else [None] * len(load.tickets)
        jobs = load.resident + [Job(slot, buf, t, e)
                                for (slot, e, buf, _), t in zip(load.missing, tickets)]
        self.compute(layer, load, lambda: self.team.run(jobs, x, self.out, layer))

    def compute(self, layer: int, load: Load, compute: Callable[[], float]) -> None:
        """Run one layer's `compute` (it returns its stall seconds) over `load`: without
        `--overlap` every read is waited for first, as stall; on a failure the layer is
        abandoned; then the reads are accounted."""
        stall = 0.0
        try:
            if not self.overlap and load.tickets:
                w0 = time.perf_counter()
                for t in load.tickets:
                    t.wait()
                stall = time.perf_counter() - w0
            stall += compute()
        except BaseException:
            self._abandon(layer, load)
            raise
        self.spec.adopted_done()
        if load.missing:
            self._account_reads(layer, load)
        self.tok.stall_s += stall

    def _abandon(self, layer: int, load: Load) -> None:
        """A layer failed: every read ends (done or failed) before its buffer is reused;
        then the entries whose contents are not trustworthy leave the cache."""
        for t in load.tickets:
            t.event.wait()
        for _, e, _, cached in load.missing:
            if cached:
                self.cache.drop((layer, e))
        self.spec.adopted_done(failed=True)

    def _account_reads(self, layer: int, load: Load) -> None:
        """The layer's reads into the counters; scratch buffers back to the free list."""
        tok = self.tok
        tickets = load.tickets
        tok.io_s += max(t.t_done for t in tickets) - min(t.t_issued for t in tickets)
        tok.read_bytes += sum(t.nbytes for t in tickets)
        t0 = time.perf_counter()
        for _, _, buf, cached in load.missing:
            if not cached:
                self.cache.release(buf)
        tok.mgmt_s += time.perf_counter() - t0

    def close(self) -> None:
        self.finish()
        self.reader.close()
        self.team.close()
        self.batch.close()
        for kind in dict.fromkeys(self.kinds):  # the cache's memory, now
            kind.release()
