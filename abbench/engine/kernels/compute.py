"""The expert compute team: `threads` threads (the caller plus helpers) running the experts.

numpy runs a small GEMV on one core, so one thread cannot reach the memory bandwidth a
large GEMV gets from BLAS's own threads; splitting a layer's experts over the cores can.

A layer's work is a list of tasks taken from one shared counter: an expert's *up* task (its
gate/up GEMV and activation) and its *down* task (the down GEMV). Resident experts' up tasks
come first, then their down tasks, then each missing expert's up and down in routing order:
the resident work is done while reads are in flight, and the layer ends one expert after
its last read. Down tasks are small and taken by whichever thread is free, so the threads
finish within one down GEMV of each other. A down task whose up task another thread is
still running waits for it; an up task whose bytes are still being read waits for them.
Those waits are recorded so the *stall* — time during which every compute thread was
waiting or had nothing left to do — can be measured.

What an expert computes around its GEMVs is its architecture's (`arch.common.ExpertFFN`:
`act` after the gate/up GEMV, `post` after the down GEMV); qwen3moe's, plain SwiGLU
without biases, is `SwiGLU` here.

Waking a sleeping thread costs tens of microseconds here (a futex wake, and on a virtual
machine an interrupt to a halted CPU), as does every hand-over of the GIL between threads.
So the team avoids them where it can: the caller never waits for a helper that has not
started (it runs what is left itself), the last task is always the caller's (so the helper
is usually done before the caller needs it), the activation of one expert is small enough
that numpy runs it without releasing the GIL, and completion is counted without locks. Where
every expert is resident, the partner process (`partner.py`) replaces the helpers.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.streaming.streamer import ExpertBuffer, ReadTicket

if TYPE_CHECKING:
    from abbench.engine.kernels.expert_ffn import ExpertFFN, FFNGraph
    from abbench.engine.kernels.ggml import Context


@dataclass(slots=True)
class Job:
    slot: int  # row of the output matrix (routing order)
    buffer: ExpertBuffer
    ticket: ReadTicket | None  # None when the expert is already resident
    expert: int | None = None  # its id in the layer, for an FFN that reads it (`by_expert`)


Task = tuple[bool, int]  # (is a down task, index into the batch's jobs)
Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # one job's scratch, see below
MatVec = Callable[..., np.ndarray]  # (w, x, out=None) → w @ x, as `matvec`
MatMulT = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (x, w) → x @ w.T, as `matmul_t`
SPLIT_MIN_BYTES = 64 * 1024  # smaller matrices are one GEMV: not worth a second core


class Scratch:
    """The experts' intermediate rows for up to `max_k` jobs: `rows[j]` is job j's (2ff,)
    gate|up, (ff,) gate, (ff,) up and (ff,) act — views made once of `h` and `act`, so
    that `experts_into` can take all the jobs' rows together."""

    __slots__ = ("act", "h", "rows")

    def __init__(self, max_k: int, ff: int) -> None:
        self.h = np.empty((max_k, 2 * ff), np.float32)  # (k, 2ff) gate and up projections
        self.act = np.empty((max_k, ff), np.float32)  # (k, ff) silu(gate) * up
        h, act = self.h, self.act
        self.rows: list[Rows] = [(h[j], h[j, :ff], h[j, ff:], act[j]) for j in range(max_k)]


# An expert is computed by these functions wherever it runs (a team thread, the caller,
# the partner process), so its output is bit-identical whoever computes it.


HALF = np.float32(0.5)
_mul, _add, _tanh = np.multiply, np.add, np.tanh


def swiglu(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """silu(gate) * up into `out` (all three alike), with numpy alone: scipy's `expit`
    would load scipy — ~25 MiB of RSS with its own OpenBLAS — into every engine process.

    silu(g) = g·sigmoid(g) = h + h·tanh(h) with h = g/2: five small ufunc calls, as cheap
    as expit's three with their keyword handling (measured ~1.6 µs per (256,) here), and
    tanh cannot overflow where e^-g would. `gate` is overwritten with h (it is the GEMV's
    scratch). Positional `out`: keyword parsing costs as much as the arithmetic at this
    size."""
    _mul(gate, HALF, gate)
    _tanh(gate, out)
    _mul(out, gate, out)
    _add(out, gate, out)
    _mul(out, up, out)


class SwiGLU:
    """silu(gate) * up, no biases: qwen3moe's expert FFN (llama.cpp's LLM_FFN_SILU with
    LLM_FFN_PAR), an `arch.common.ExpertFFN`, and the expert side's default. Its numpy
    `act` is `swiglu`, its graph step ggml's `swiglu_split`, as before there was a choice."""

    by_expert = False

    def act(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray, layer: int,
            experts: Any) -> None:
        swiglu(gate, up, out)

    def post(self, y: np.ndarray, layer: int, experts: Any) -> None:
        """Nothing after the down product."""

    def graph_bytes(self, rows: int, ff: int, d: int) -> int:
        return 4 * rows * ff + 64  # the activation, at the scratch's 64-byte alignment

    def graph(self, ctx: Context, eids: int) -> FFNGraph:
        return _SwiGLUGraph(ctx)


class _SwiGLUGraph:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def act(self, gate: int, up: int) -> int:
        return self.ctx.op("swiglu_split", gate, up)  # (ff, n_used, t)

    def post(self, down: int) -> int:
        return down

    def set_layer(self, layer: int) -> None:
        """Nothing held per layer."""


SWIGLU = SwiGLU()


def expert_up(buf: ExpertBuffer, x: np.ndarray, rows: Rows, ffn: ExpertFFN = SWIGLU,
              layer: int = 0, expert: int | None = None) -> None:
    """The gate/up GEMV and the FFN's activation of one expert into `rows` (x: (d,))."""
    h, gate, up, act = rows
    np.matmul(buf.gate_up, x, out=h)  # (2ff,)
    ffn.act(gate, up, act, layer, expert)  # (ff,); gate overwritten


def expert_down(buf: ExpertBuffer, act: np.ndarray, out: np.ndarray, ffn: ExpertFFN = SWIGLU,
                layer: int = 0, expert: int | None = None) -> None:
    np.matmul(buf.down, act, out=out)  # (d, ff) @ (ff,) → (d,)
    if ffn.by_expert:
        ffn.post(out, layer, expert)


def experts_into(bufs: Sequence[ExpertBuffer], x: np.ndarray, scratch: Scratch,
                 out: np.ndarray, ffn: ExpertFFN = SWIGLU, layer: int = 0,
                 experts: Sequence[int] = ()) -> None:
    """Several experts on one input into out[0 .. n-1] (x: (d,), out: (>= n, d); experts:
    their ids, read where `ffn.by_expert`): what `expert_up` then `expert_down` give for
    each, with one activation over all n rows — the same elementwise arithmetic on the
    same values, so the same bits, in a few ufunc calls instead of a few per expert (on a
    decode layer's path each call costs more than its arithmetic)."""
    n = len(bufs)
    if n == 0:
        return
    for buf, (h, _, _, _) in zip(bufs, scratch.rows):
        np.matmul(buf.gate_up, x, out=h)  # (2ff,)
    ff = scratch.act.shape[1]
    # (n, ff); gates overwritten
    ffn.act(scratch.h[:n, :ff], scratch.h[:n, ff:], scratch.act[:n], layer, experts)
    for j, buf in enumerate(bufs):
        np.matmul(buf.down, scratch.act[j], out=out[j])  # (d, ff) @ (ff,) → (d,)
    if ffn.by_expert:
        ffn.post(out[:n], layer, experts)  # (n, d)


def expert_rows(buf: ExpertBuffer, x: np.ndarray, ffn: ExpertFFN = SWIGLU, layer: int = 0,
                expert: int | None = None) -> np.ndarray:
    """One expert over a batch of rows (prefill): x (m, d) → (m, d). The same FFN as
    `expert_up` and `expert_down`, as GEMMs: equal to them up to float summation order."""
    ff = buf.down.shape[1]
    # Weights on the left (w @ x.T rather than x @ w.T): measured here at ~11 rows per
    # expert, 2-3% faster on one thread and ~18% with two threads sharing the memory; at
    # other row counts either order can win, so this is a small, not a general, gain.
    h = buf.gate_up @ x.T  # (2ff, d) @ (d, m) → (2ff, m)
    gate, up = h[:ff], h[ff:]  # (ff, m) each
    act = np.empty_like(gate)  # (ff, m)
    # The FFN sees rows (m, ff): transposed views, elementwise the same arithmetic.
    ones = [expert] if ffn.by_expert else None  # (1,): every row this expert's
    ffn.act(gate.T, up.T, act.T, layer, ones)  # gate overwritten
    y = (buf.down @ act).T  # (d, ff) @ (ff, m) → (d, m), seen as (m, d)
    if ffn.by_expert:
        ffn.post(y, layer, ones)
    return y


RowTask = tuple[ExpertBuffer, np.ndarray]  # an expert and its slots of a prefill batch


def rows_task(buf: ExpertBuffer, x: np.ndarray, k: int, slots: np.ndarray,
              y: np.ndarray, ffn: ExpertFFN = SWIGLU, layer: int = 0,
              expert: int | None = None) -> None:
    """One expert of a prefill batch: `slots` are flat (token, routing slot) indices
    token * k + slot of the batch's (n, k) routing that chose it (x: (n, d), y: (n * k, d))
    → y[slots] = its outputs for those tokens."""
    y[slots] = expert_rows(buf, x[slots // k], ffn, layer, expert)  # (m, d)


def private_vectors() -> Callable[[int], np.ndarray]:
    """A GEMV's input vectors without a partner: one private (n,) vector per length, the
    same on every call (as `Partner.input`, whose vectors are in its shared block)."""
    vectors: dict[int, np.ndarray] = {}

    def vector(n: int) -> np.ndarray:
        if n not in vectors:
            vectors[n] = np.empty(n, np.float32)
        return vectors[n]

    return vector


def split_rows(w: np.ndarray) -> int:
    """Where a large GEMV is split in two (half the rows, on a 16-row boundary), 0 if not.

    The split depends on the matrix alone and is made whether or not a second core takes
    the second half, so the result is the same bits either way.
    """
    return 0 if w.nbytes < SPLIT_MIN_BYTES else w.shape[0] // 32 * 16


def matvec(w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """w @ x on the calling thread, split as `split_rows` says (w: (m, n), x: (n,)) → (m,)."""
    if out is None:
        out = np.empty(w.shape[0], np.float32)
    s = split_rows(w)
    if s:
        np.matmul(w[:s], x, out=out[:s])  # (s,)
        np.matmul(w[s:], x, out=out[s:])  # (m - s,)
    else:
        np.matmul(w, x, out=out)
    return out


def matmul_t(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T on the calling thread, w's rows split as `split_rows` says (x: (n, k),
    w: (m, k)) → (n, m): a prefill batch through a dense matrix, as `matvec` splits it."""
    s = split_rows(w)
    if not s:
        return x @ w.T  # (n, m)
    out = np.empty((x.shape[0], w.shape[0]), np.float32)  # (n, m)
    np.matmul(x, w[:s].T, out=out[:, :s])  # (n, s)
    np.matmul(x, w[s:].T, out=out[:, s:])  # (n, m - s)
    return out


def task_order(jobs: list[Job]) -> list[Task]:
    """Resident up tasks, resident down tasks, then each late expert's up and down."""
    resident = [j for j, job in enumerate(jobs) if job.ticket is None]
    late = [j for j, job in enumerate(jobs) if job.ticket is not None]
    tasks = [(False, j) for j in resident] + [(True, j) for j in resident]
    return tasks + [t for j in late for t in ((False, j), (True, j))]


class _Batch:
    """One layer's tasks, shared by the team for one `run` call."""

    def __init__(self, jobs: list[Job], x: np.ndarray, out: np.ndarray, n: int,
                 layer: int) -> None:
        self.jobs = jobs
        self.layer = layer
        self.x = x
        self.out = out
        self.tasks = task_order(jobs)
        self.taken = itertools.count()  # next() is atomic: the claim of a task
        self.completed = itertools.count()  # next() after each task, done or failed
        self.up_done = [False] * len(jobs)
        self.error: BaseException | None = None
        self.waits: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.finished = [0.0] * n  # per thread: when its last task ended (0: it ran none)
        self.t_start = time.perf_counter()


class ComputeTeam:
    def __init__(self, threads: int, ff: int, max_k: int, ffn: ExpertFFN = SWIGLU) -> None:
        self.threads = max(1, threads)
        self.ffn = ffn
        # Shared by the team: a job's rows are written by its up task and read by its
        # down task, whichever threads take them.
        self._rows = Scratch(max_k, ff).rows
        self.input = private_vectors()  # where a GEMV's input is computed (no copy either way)
        self._inboxes: list[queue.SimpleQueue[_Batch | None]] = []
        self._last_done: queue.SimpleQueue[None] = queue.SimpleQueue()  # helper did the last
        # A down task whose up task another thread is still running waits here (rare: the
        # up tasks are all taken before the first down task).
        self._dep = threading.Condition(threading.Lock())
        self._dep_waiters = 0
        for i in range(1, self.threads):
            inbox: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
            t = threading.Thread(target=self._helper, args=(i, inbox), daemon=True,
                                 name=f"compute-{i}")
            t.start()
            self._inboxes.append(inbox)

    def run(self, jobs: list[Job], x: np.ndarray, out: np.ndarray, layer: int = 0) -> float:
        """Compute every job of `layer` into `out[slot]` (x: (d,), out: (k, d)); returns
        stall seconds."""
        if not jobs:
            return 0.0
        helpers = min(len(self._inboxes), len(jobs) - 1)
        batch = _Batch(jobs, x, out, helpers + 1, layer)
        t_start = batch.t_start
        for inbox in self._inboxes[:helpers]:
            inbox.put(batch)
        n = len(batch.tasks)
        self._work(0, batch, n - 1)  # every task but the last, shared with the helpers
        self._task(0, batch, n - 1)  # the last one is the caller's
        batch.finished[0] = time.perf_counter()
        if next(batch.completed) != n - 1:
            self._last_done.get()  # a helper's task is still running: it signals its end
        if batch.error is not None:
            raise batch.error
        if not any(j.ticket for j in jobs):
            return 0.0
        return starved_seconds(batch.waits, batch.finished, t_start, time.perf_counter())

    matvec = staticmethod(matvec)
    matmul_t = staticmethod(matmul_t)

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)

    def _helper(self, index: int, inbox: queue.SimpleQueue[_Batch | None]) -> None:
        while (batch := inbox.get()) is not None:
            # Until it starts, a helper computes nothing: for the stall it was waiting.
            batch.waits[index].append((batch.t_start, time.perf_counter()))
            n = len(batch.tasks)
            if self._work(index, batch, n - 1) == n - 1:
                self._last_done.put(None)  # the caller is waiting for this thread's task

    def _work(self, index: int, batch: _Batch, stop: int) -> int:
        """Run tasks taken from the batch's counter while it is below `stop`; returns the
        completion number of this thread's last task (-1 if it ran none)."""
        completion = -1
        while (i := next(batch.taken)) < stop:
            self._task(index, batch, i)
            batch.finished[index] = time.perf_counter()  # written before it is counted
            completion = next(batch.completed)
        return completion

    def _task(self, index: int, batch: _Batch, i: int) -> None:
        down, j = batch.tasks[i]
        job = batch.jobs[j]
        waits = batch.waits[index]
        try:
            if batch.error is not None:
                return  # the layer has failed: finish counting, compute nothing
            if down:
                if not batch.up_done[j]:  # another thread is running the up task
                    w0 = time.perf_counter()
                    with self._dep:
                        self._dep_waiters += 1
                        while not batch.up_done[j] and batch.error is None:
                            self._dep.wait()
                        self._dep_waiters -= 1
                    waits.append((w0, time.perf_counter()))
                    if batch.error is not None:
                        return
                expert_down(job.buffer, self._rows[j][3], batch.out[job.slot], self.ffn,
                            batch.layer, job.expert)
                return
            if job.ticket is not None:
                if not job.ticket.event.is_set():
                    w0 = time.perf_counter()
                    job.ticket.event.wait()
                    waits.append((w0, time.perf_counter()))
                job.ticket.wait()  # raises if the read failed
            expert_up(job.buffer, batch.x, self._rows[j], self.ffn, batch.layer, job.expert)
            batch.up_done[j] = True
        except BaseException as e:  # re-raised by `run` in the calling thread
            if batch.error is None:
                batch.error = e
            with self._dep:
                self._dep.notify_all()
            return
        if self._dep_waiters:
            with self._dep:
                self._dep.notify_all()


def starved_seconds(
    waits: list[list[tuple[float, float]]], finished: list[float], t0: float, t1: float
) -> float:
    """Measure of [t0, t1] during which every thread was waiting on a read or done.

    Each thread's starved set is its wait intervals plus [its finish time, t1]; the stall
    is the length of the intersection of those sets over all threads. A thread's spans
    can overlap (a helper that ran no task has finish time 0, so [0, t1] covers its
    wait for the batch): they are merged first, or the overlap would count twice.
    """
    common: list[tuple[float, float]] = [(t0, t1)]
    for w, fin in zip(waits, finished):
        common = _intersect(common, _union([*w, (fin, t1)]))
        if not common:
            return 0.0
    return sum(b - a for a, b in common)


Spans = list[tuple[float, float]]


def _union(spans: Spans) -> Spans:
    """The same set as disjoint spans, in order."""
    out: Spans = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _intersect(a: Spans, b: Spans) -> Spans:
    out = []
    for x0, x1 in a:
        for y0, y1 in b:
            lo, hi = max(x0, y0), min(x1, y1)
            if hi > lo:
                out.append((lo, hi))
    return out
