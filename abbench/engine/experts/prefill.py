"""Prefill on the expert side: a batch of prompt tokens through one layer's experts
(docs/engine.md#how-a-token-is-computed).

The union of the batch's kept experts is looked up and read once, as a decode token's
experts are (`ExpertRunner.load`, `compute`: the same cache, counters and failure
handling); then each expert runs one GEMM over the rows routed to it — on numpy threads
or the partner (F32), or as one ggml graph over every token's experts (quantized, as
llama.cpp runs a batch). The route trace gets a row per token and routed slot.

`BatchPrefill` is a part of `ExpertRunner` (runner.py) with its own state (the thread
pool of the batch's GEMMs); it runs on the runner's cache, team and counters, through the
decode path's lookups and compute steps (`Host`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Protocol

import numpy as np

from abbench.engine.experts.policies import Policies, cold_keep, kept_weights
from abbench.engine.experts.selection import Load, TokenCounters
from abbench.engine.kernels import partner
from abbench.engine.kernels.compute import ComputeTeam, rows_task
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.streaming.cache import BufferKind, ExpertCache
from abbench.engine.streaming.streamer import ExpertBuffer, LayerExperts, ReadTicket

if TYPE_CHECKING:
    from abbench.engine.kernels.expert_ffn import ExpertFFN
    from abbench.records.route_trace import RouteTraceWriter


class Host(Protocol):
    """What the prefill path reads of the runner it is part of."""

    layout: list[LayerExperts]
    kinds: list[BufferKind]
    cache: ExpertCache
    tok: TokenCounters
    policies: Policies
    team: ComputeTeam | partner.Partner | QuantTeam
    ffn: ExpertFFN
    threads: int
    trace: RouteTraceWriter | None
    step: int

    def load(self, layer: int, experts: list[int]) -> Load: ...

    def compute(self, layer: int, load: Load, compute: Callable[[], float]) -> None: ...

    def settle(self) -> None: ...


class BatchPrefill:
    """The prefill path of `ExpertRunner`: a batch of prompt tokens through a layer."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._pool: ThreadPoolExecutor | None = None  # the batch's expert GEMMs, on use

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def prefill(self, layer: int, x: np.ndarray, ids: np.ndarray,
                weights: np.ndarray) -> np.ndarray:
        """The MoE output of a batch of prompt tokens at one layer (prefill: see
        docs/engine.md#how-a-token-is-computed).

        x: (n, d) normalised inputs; ids, weights: (n, k) each token's routing. The union of
        the kept experts is looked up and read once for the whole batch (one lookup each, as
        a decode token does per layer); each expert then runs one GEMM over the rows routed
        to it. With --drop-in-prefill a token drops against the residency before the
        layer's reads. → (n, d), each token's weighted sum in routing order.
        """
        host = self.host
        t0 = time.perf_counter()
        host.settle()
        n, k = ids.shape
        host.tok.experts_routed += n * k
        keep = np.ones((n, k), bool)  # (n, k)
        w = weights  # (n, k)
        frac = host.policies.drop_frac_in(0)
        if frac is not None:
            resident = np.vectorize(lambda e: host.cache.peek((layer, int(e))), otypes=[bool])
            flags = resident(ids)  # (n, k)
            w = np.zeros_like(weights)  # (n, k), 0 where dropped
            for t in range(n):
                keep[t] = cold_keep(weights[t], flags[t].tolist(), frac)
                w[t, keep[t]] = kept_weights(weights[t], keep[t].tolist(),
                                             host.policies.drop_renorm)
            host.tok.experts_dropped += int(n * k - keep.sum())
        # The union in first-use order (row-major): the batch's reads are issued in it.
        kept_ids = ids[keep]  # (kept,)
        _, first = np.unique(kept_ids, return_index=True)
        union = kept_ids[np.sort(first)].tolist()  # (|union|,)
        y = np.zeros((n, k, x.shape[1]), np.float32)  # (n, k, d) per routed slot
        # As many experts at a time as the budget holds, so that a union larger than the
        # cache is not held all at once (memory stays at the budget): each group is
        # looked up, read and computed, then the next one may evict it.
        group = max(1, host.cache.budget_bytes // host.kinds[layer].nbytes)
        residency: list[int] = []
        host.tok.mgmt_s += time.perf_counter() - t0
        for lo in range(0, len(union), group):
            chunk = union[lo : lo + group]
            t1 = time.perf_counter()
            evictions_before = host.cache.counters.evictions
            load = host.load(layer, chunk)
            host.tok.evictions += host.cache.counters.evictions - evictions_before
            residency += load.residency
            host.tok.mgmt_s += time.perf_counter() - t1
            self._run_batch(layer, x, ids, keep, chunk, load, y)
        if host.trace is not None:
            t1 = time.perf_counter()
            self._trace_prefill(host.trace, layer, ids, weights, keep, union, residency)
            host.tok.mgmt_s += time.perf_counter() - t1
        # Each token's slots summed in routing order, as the decode path sums them.
        out = np.zeros_like(x)  # (n, d)
        for j in range(k):
            out += w[:, j, None] * y[:, j]  # (n, 1) * (n, d)
        return out

    def _run_batch(self, layer: int, x: np.ndarray, ids: np.ndarray, keep: np.ndarray,
                   union: list[int], load: Load, y: np.ndarray) -> None:
        """Each expert of the union as one GEMM over its rows of x (n, d), into y (n, k, d).
        With a partner and every expert resident, half the experts run there (`partner.py`);
        otherwise on `--threads` threads (numpy releases the GIL in a GEMM), resident ones
        first, then each read as it lands (without --overlap, every read is waited for
        first). Each expert's GEMMs are one thread's, on one BLAS thread, so the bits do not
        depend on who ran it. The stall is the time spent waiting on reads, per thread."""
        host = self.host
        n, k = ids.shape
        if isinstance(host.team, QuantTeam):
            self._run_batch_quant(host.team, layer, x, ids, keep, union, load, y)
            return
        flat = y.reshape(n * k, -1)  # (n * k, d): row t * k + j is token t's slot j
        # Each expert's slots, ascending: one sort of the kept slots by expert id.
        chosen = np.where(keep, ids, -1).ravel()  # (n * k,), -1 where dropped
        order = np.argsort(chosen, kind="stable")  # (n * k,)
        ranked = chosen[order]
        first = np.array(union, dtype=ranked.dtype)  # (|union|,)
        bounds = np.searchsorted(ranked, np.stack([first, first + 1]))  # (2, |union|)
        slots = [order[lo:hi] for lo, hi in bounds.T.tolist()]  # per union slot
        # (its rows, its buffer, its read or None, its expert id) per expert
        jobs: list[tuple[np.ndarray, ExpertBuffer, ReadTicket | None, int]]
        jobs = [(slots[job.slot], job.buffer, None, union[job.slot]) for job in load.resident]
        jobs += [(slots[slot], buf, t, e)
                 for (slot, e, buf, _), t in zip(load.missing, load.tickets)]

        def run(job: tuple[np.ndarray, ExpertBuffer, ReadTicket | None, int]) -> float:
            where, buf, ticket, e = job
            waited = 0.0
            if ticket is not None:
                w0 = time.perf_counter()
                ticket.wait()  # raises if the read failed
                waited = time.perf_counter() - w0
            rows_task(buf, x, k, where, flat, host.ffn, layer, e)  # no two jobs share a slot
            return waited

        def run_all() -> float:
            team = host.team
            if (isinstance(team, partner.Partner) and not load.tickets
                    and team.run_rows(x, k, [(buf, where) for where, buf, _, _ in jobs], flat,
                                      [e for _, _, _, e in jobs], layer)):
                return 0.0
            if host.threads == 1 or len(jobs) == 1:
                return sum(run(job) for job in jobs)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(host.threads, "prefill")
            running = [self._pool.submit(run, job) for job in jobs]
            wait(running)  # every job ends, failed or not, before a buffer is let go
            return sum(f.result() for f in running) / host.threads  # the first error raises

        host.compute(layer, load, run_all)

    def _run_batch_quant(self, team: QuantTeam, layer: int, x: np.ndarray, ids: np.ndarray,
                         keep: np.ndarray, union: list[int], load: Load,
                         y: np.ndarray) -> None:
        """The batch on ggml, as llama.cpp runs it: one graph over every token's experts
        (their slots), once every read has landed (the wait is the stall)."""
        host = self.host

        def run() -> float:
            w0 = time.perf_counter()
            for t in load.tickets:
                t.wait()  # raises if the read failed
            stall = time.perf_counter() - w0
            slot = {}  # expert id → its slot index, for this group of the union
            for job in load.resident:
                slot[union[job.slot]] = job.buffer.index  # type: ignore[union-attr]
            for _, e, buf, _ in load.missing:
                slot[e] = buf.index  # type: ignore[union-attr]
            # The (token, routing slot) pairs this group's experts serve, token by token:
            # each one row of `rows`' batch (an expert's rows in token order, as ggml
            # groups them in llama.cpp's batch, so the same bits).
            mine = np.vectorize(slot.__contains__, otypes=[bool])(ids) & keep  # (n, k)
            tok, j = np.nonzero(mine)  # (m,), (m,)
            pool = host.kinds[layer]
            experts = ids[tok, j]  # (m,)
            slots = np.array([slot[e] for e in experts.tolist()], np.int32)[:, None]  # (m, 1)
            # (m, d): each pair's expert over its token's row
            y[tok, j] = team.rows(pool, x[tok], slots,  # type: ignore[arg-type]
                                  experts[:, None], layer)[:, 0]
            return stall

        host.compute(layer, load, run)

    def _trace_prefill(self, trace: RouteTraceWriter, layer: int, ids: np.ndarray,
                       weights: np.ndarray, keep: np.ndarray, union: list[int],
                       residency: list[int]) -> None:
        """The batch's rows, token by token (`step` = the token's index in the prompt): an
        expert's first row carries its lookup's residency; later rows in the batch are hits
        on the one read (the replay's accounting, records/route_trace.py)."""
        host = self.host
        status = dict(zip(union, residency))
        seen: set[int] = set()
        base = host.step
        for t in range(ids.shape[0]):
            routed = ids[t].tolist()
            res, dropped = [], []
            for e, kept in zip(routed, keep[t].tolist()):
                dropped.append(0 if kept else 1)
                if not kept:
                    res.append(0)
                elif e in seen:
                    res.append(1)
                else:
                    seen.add(e)
                    res.append(status[e])
            trace.layer(0, base + t, layer, routed, weights[t].tolist(), res, dropped,
                        host.layout[layer].file_bytes)
