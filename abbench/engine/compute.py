"""The expert compute team: `threads` threads (the caller plus helpers) running SwiGLU experts.

numpy runs a small GEMV on one core, so one thread cannot reach the memory bandwidth a
large GEMV gets from BLAS's own threads; splitting a layer's experts over the cores can.
Each thread takes the next job from a shared counter; a job whose bytes are still being
read waits for them first, and that wait is recorded so the *stall* — time during which
every compute thread was waiting on a read or had nothing left to do — can be measured.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from abbench.engine.streamer import ExpertBuffer, ReadTicket


@dataclass
class Job:
    slot: int  # row of the output matrix (routing order)
    buffer: ExpertBuffer
    ticket: ReadTicket | None  # None when the expert is already resident


class _Scratch:
    def __init__(self, k: int, ff: int) -> None:
        self.h = np.empty((k, 2 * ff), np.float32)  # (k, 2ff) gate and up projections
        self.act = np.empty((k, ff), np.float32)  # (k, ff)


class _Batch:
    """One layer's jobs, shared by the team for one `run` call."""

    def __init__(self, jobs: list[Job], x: np.ndarray, out: np.ndarray, n: int) -> None:
        self.jobs = jobs
        self.x = x
        self.out = out
        self.next = itertools.count()
        self.waits: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.finished = [0.0] * n
        self.error: BaseException | None = None
        self.warm: tuple[np.ndarray, ...] = ()


class ComputeTeam:
    def __init__(self, threads: int, ff: int, max_k: int) -> None:
        from scipy.special import expit  # 0.25 s to import: only where experts are computed

        self._expit = expit
        self.threads = max(1, threads)
        self.ff = ff
        self._scratch = [_Scratch(max_k, ff) for _ in range(self.threads)]
        self._inboxes: list[queue.SimpleQueue[_Batch | None]] = []
        self._done: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._warm_x = np.zeros(1 << 16, np.float32)
        self._warm_out: dict[int, np.ndarray] = {}
        for i in range(1, self.threads):
            inbox: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
            t = threading.Thread(target=self._helper, args=(i, inbox), daemon=True,
                                 name=f"compute-{i}")
            t.start()
            self._inboxes.append(inbox)

    def run(
        self, jobs: list[Job], x: np.ndarray, out: np.ndarray, warm: tuple[np.ndarray, ...] = ()
    ) -> float:
        """Compute every job into `out[slot]` (x: (d,), out: (k, d)); returns stall seconds.

        `warm`: matrices (d columns) the caller will need next. A helper streams them through
        the CPU caches after reporting done, while the caller finishes this layer and runs
        the next one's small ops — so the caller's next GEMVs read from cache, not DRAM.
        """
        t_start = time.perf_counter()
        helpers = min(len(self._inboxes), max(0, len(jobs) - 1))
        batch = _Batch(jobs, x, out, helpers + 1)
        batch.warm = warm
        for inbox in self._inboxes[:helpers]:
            inbox.put(batch)
        self._work(0, batch)
        for _ in range(helpers):
            self._done.get()
        if batch.error is not None:
            raise batch.error
        if not any(j.ticket for j in jobs):
            return 0.0
        return starved_seconds(batch.waits[: helpers + 1], batch.finished[: helpers + 1],
                               t_start, time.perf_counter())

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)

    def _helper(self, index: int, inbox: queue.SimpleQueue[_Batch | None]) -> None:
        while (batch := inbox.get()) is not None:
            self._work(index, batch)
            self._done.put(index)
            if index == 1 and batch.warm:
                self._warm(batch.warm)

    def _work(self, index: int, batch: _Batch) -> None:
        # The small elementwise ops hold the GIL, and every hand-over of the GIL between
        # threads costs a wake-up; so a thread runs the gate/up GEMVs of the resident
        # experts it takes back to back, then one vectorised SwiGLU and their down GEMVs.
        # An expert whose bytes are still being read is computed whole as soon as they
        # land, so the layer ends one expert after its last read. Jobs come from a shared
        # counter, so the caller — which starts first — takes more.
        s = self._scratch[index]
        waits = batch.waits[index]
        jobs = batch.jobs
        held: list[Job] = []  # resident experts whose gate/up is done, down pending
        try:
            take = batch.next
            while (i := next(take)) < len(jobs):
                job = jobs[i]
                if job.ticket is None:
                    np.matmul(job.buffer.gate_up, batch.x, out=s.h[len(held)])  # (2ff,)
                    held.append(job)
                    continue
                self._finish(held, s, batch.out)
                held.clear()
                if not job.ticket.event.is_set():
                    w0 = time.perf_counter()
                    job.ticket.event.wait()
                    waits.append((w0, time.perf_counter()))
                job.ticket.wait()  # raises if the read failed
                np.matmul(job.buffer.gate_up, batch.x, out=s.h[0])
                self._finish([job], s, batch.out)
            self._finish(held, s, batch.out)
        except BaseException as e:  # re-raised by `run` in the calling thread
            batch.error = e
        batch.finished[index] = time.perf_counter()

    def _finish(self, done: list[Job], s: _Scratch, out: np.ndarray) -> None:
        """SwiGLU and down projection of experts whose gate/up rows are in s.h[:n]."""
        n = len(done)
        if not n:
            return
        ff = self.ff
        gate, up, act = s.h[:n, :ff], s.h[:n, ff:], s.act[:n]  # (n, ff) each
        self._expit(gate, out=act)  # silu(gate) * up
        act *= gate
        act *= up
        for j, job in enumerate(done):
            np.matmul(job.buffer.down, act[j], out=out[job.slot])  # (d,)

    def _warm(self, matrices: tuple[np.ndarray, ...]) -> None:
        for m in matrices:
            y = self._warm_out.get(m.shape[0])
            if y is None:
                y = self._warm_out[m.shape[0]] = np.empty(m.shape[0], np.float32)
            np.matmul(m, self._warm_x[: m.shape[1]], out=y)  # BLAS: the GIL is released


def starved_seconds(
    waits: list[list[tuple[float, float]]], finished: list[float], t0: float, t1: float
) -> float:
    """Measure of [t0, t1] during which every thread was waiting on a read or done.

    Each thread's starved set is its wait intervals plus [its finish time, t1]; the stall
    is the length of the intersection of those sets over all threads.
    """
    common: list[tuple[float, float]] = [(t0, t1)]
    for w, fin in zip(waits, finished):
        mine = sorted([*w, (fin, t1)])
        common = _intersect(common, mine)
        if not common:
            return 0.0
    return sum(b - a for a, b in common)


Spans = list[tuple[float, float]]


def _intersect(a: Spans, b: Spans) -> Spans:
    out = []
    for x0, x1 in a:
        for y0, y1 in b:
            lo, hi = max(x0, y0), min(x1, y1)
            if hi > lo:
                out.append((lo, hi))
    return out
