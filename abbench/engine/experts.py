"""The MoE layer's expert side: residency, reads, overlap, and the counters of what was done.

`ExpertRunner.forward(layer, x, ids, weights)` is called by the architecture's sparse MoE
block with the final routing. It looks each routed expert up in the cache, issues the
missing ones' reads at once on the reader lanes, and computes the experts on the compute
team — with `overlap`, resident experts first while the reads run, then each missing one
as it lands, in routing order; without it, after every read has finished. The outputs are
summed in routing order, so the result is bit-identical whatever was resident or in which
order reads completed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np

from abbench.engine.cache import ExpertCache
from abbench.engine.compute import ComputeTeam, Job
from abbench.engine.gguf_file import ModelFile
from abbench.engine.streamer import ExpertBuffer, LayerExperts, ReadTicket, SliceReader

MIB = 1024 * 1024


@dataclass
class TokenCounters:
    """What one token's forward pass did on the expert side (reset per token)."""

    read_bytes: int = 0
    io_s: float = 0.0  # time reads were in flight (per layer, first issue → last done)
    stall_s: float = 0.0  # time every compute thread waited on a read
    mgmt_s: float = 0.0  # cache bookkeeping on the compute thread
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    experts_routed: int = 0
    experts_dropped: int = 0
    spec_read_bytes: int = 0
    spec_experts: int = 0
    spec_useful: int = 0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())


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
    ) -> None:
        self.layout = layout
        self.overlap = overlap
        self.resident = resident
        self.n_expert = layout[0].gate.shape[0] if layout else 0
        self.reader = SliceReader(mf.path, io_lanes, o_direct)
        total = sum(le.buffer_bytes * self.n_expert for le in layout)
        self.cache = ExpertCache(total if resident else int(cache_mib * MIB))
        ff = max((le.ff for le in layout), default=1)
        d = max((le.d for le in layout), default=1)
        self.team = ComputeTeam(threads, ff, max_k)
        self.out = np.zeros((max_k, d), np.float32)  # (k, d) expert outputs, routing order
        self.tok = TokenCounters()
        self.load_read_bytes = 0
        if resident:
            self._preload()

    @property
    def o_direct(self) -> bool:
        return self.reader.o_direct

    def _preload(self) -> None:
        for layer, le in enumerate(self.layout):
            tickets = []
            for e in range(self.n_expert):
                buf = ExpertBuffer(le.ff, le.d)
                tickets.append((e, buf, self.reader.submit(le.slices(e), buf)))
            for e, buf, t in tickets:
                t.wait()
                self.load_read_bytes += t.nbytes
                self.cache.insert((layer, e), buf)

    def forward(
        self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int,
        warm: tuple[np.ndarray, ...] = (),
    ) -> np.ndarray:
        """x: (d,), ids/weights: (k,) → (d,) the weighted sum of the routed experts."""
        le = self.layout[layer]
        tok = self.tok
        cache = self.cache
        t0 = time.perf_counter()
        k = len(ids)
        tok.experts_routed += k
        resident: list[Job] = []
        missing: list[tuple[int, int, ExpertBuffer, bool]] = []
        tickets: list[ReadTicket] = []
        evictions_before = cache.counters.evictions
        batch: set[tuple[int, int]] | None = None  # this layer's keys: never evicted by it
        for slot, e in enumerate(ids.tolist()):
            key = (layer, e)
            buf = cache.lookup(key)
            if buf is not None:
                resident.append(Job(slot, buf, None))
            else:
                if batch is None:
                    batch = {(layer, int(i)) for i in ids}
                buf, cached = cache.admit(key, le.ff, le.d, batch)
                missing.append((slot, e, buf, cached))
                tickets.append(self.reader.submit(le.slices(e), buf))  # read starts now
        tok.hits += len(resident)
        tok.misses += len(missing)
        tok.evictions += cache.counters.evictions - evictions_before
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
            stall += self.team.run(jobs, x, self.out, warm)
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
        return weights @ self.out[:k]  # (k,) @ (k, d) → (d,)

    def close(self) -> None:
        self.reader.close()
        self.team.close()
