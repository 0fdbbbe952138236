"""The compute partner: a forked process that takes half of each layer's work beside the
caller, when every expert is resident (`--resident`, `--threads` >= 2).

Why a process and not the thread team: a layer's pieces of work are tens of microseconds
long, and handing one to a sleeping thread costs about as much (a futex wake, which on a
virtual machine is an interrupt to a halted CPU; measured 15-25 us for the waker and 45-90
us until the woken thread runs). Threads cannot wait any other way — a thread spinning in
Python holds the GIL the caller needs. A process has its own GIL, so it can spin: the two
sides meet through counters in shared memory, a hand-over costs about a microsecond, and
the attention GEMVs, which the thread team leaves to the caller alone, are split in two as
well (`split_rows`). Measured on a 2-core VM: a 1.5 MiB GEMV 138 us alone, 81 us split.
A prefill pass uses it too: half of the batch's experts (`run_rows`) and half of the
columns of its dense GEMMs (`matmul_t`), in place of the prefill threads. On the same VM a
64-token prompt's prefill measured no faster or slower for it: partner over threads, the
median of 10 alternating pairs was 1.005 and 1.074 in two runs, against 0.963 and 1.051 for
each one alone twice (A/A) — the VM's noise is wider than any difference.

What is shared: expert buffers (private anonymous memory, inherited copy-on-write) and the
dense matrices are never written after load, so the child forked after loading sees the
very same bytes and copies none (it maps them all before it reports ready:
`partner_os.map_pages`); requests name a matrix by its index in a table and an expert
buffer by its `id()`, which a forked child shares with the parent. The inputs and outputs
of a request go through one small shared block. Only resident buffers are known to the
child: a buffer made after the fork (a streaming cache's) could not be, hence `--resident`
only.

The child spins only while requests keep coming: after SPIN_S without one it sleeps on a
pipe, and the parent wakes it with a byte. A parent that dies closes the pipe (EOF) or
changes the child's parent id; either ends the child. Counters in shared memory are only
ordered for another process by x86's stores (TSO), so the partner is x86-64 only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import signal
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from threadpoolctl import threadpool_limits

from abbench.engine.kernels.compute import (
    SWIGLU,
    Job,
    RowTask,
    Scratch,
    experts_into,
    matmul_t,
    matvec,
    rows_task,
    split_rows,
)
from abbench.engine.kernels.partner_os import MADV_POPULATE_WRITE as MADV_POPULATE_WRITE
from abbench.engine.kernels.partner_os import map_pages, populate
from abbench.engine.kernels.partner_os import supported as supported
from abbench.engine.streaming.streamer import ExpertBuffer
from abbench.errors import EngineError

if TYPE_CHECKING:
    from abbench.engine.kernels.expert_ffn import ExpertFFN

SPIN_S = 0.002  # the child spins this long after its last request, then sleeps
LOST_WAKE_S = 0.001  # a wake-up lost between the two sides' counters costs at most this
CLOCK_EVERY = 1 << 10  # the child's spins between looks at the clock
YIELD_EVERY = 1 << 12  # the caller's spins (~0.3 ms) between yields, should the two share a CPU
CHECK_EVERY = 1 << 16  # spins between checks that the other side is still there

# Control words (int64) in the shared block.
SEQ, DONE, OP, ARG, SLEEPING, FAILED, READY, ROW, LAYER = range(9)
N_CTL = 9
GEMV, EXPERTS, EXIT, ROWS, GEMM = 1, 2, 3, 4, 5


class Partner:
    """Computes half of each large GEMV and of each layer's experts in a forked process (of
    a prefill batch's too).

    Same interface as `ComputeTeam` (`run`, `matvec`, `matmul_t`, `close`), plus
    `run_resident` (a decode layer's resident experts, without jobs) and `run_rows` (a
    prefill batch's experts); its results are the same bits, since both sides compute with
    the same functions and the same split.
    """

    def __init__(
        self, matrices: Sequence[np.ndarray], buffers: Iterable[ExpertBuffer], d: int,
        ff: int, max_k: int, max_rows: int = 0, ffn: ExpertFFN = SWIGLU,
    ) -> None:
        """`max_rows`: the most prompt tokens one prefill pass gives the partner (0: none,
        every prefill pass then runs on the caller's threads); `ffn`: the experts' FFN
        (both sides hold it: the child inherits it, with what it read, at the fork)."""
        self.threads = 2  # the caller and the partner
        self.ffn = ffn
        self._matrices = list(matrices)
        self._buffers = {id(b): b for b in buffers}
        self.max_rows = max_rows
        self._map_shared_block(d, max_k, max_rows)
        self._plan_work(d, ff, max_k)
        self._seq = 0
        self._parent = os.getpid()
        self._fork()

    def _map_shared_block(self, d: int, max_k: int, max_rows: int) -> None:
        """The block both processes share, and this side's views of its parts."""
        cols = max([d, *(m.shape[1] for m in self._matrices)])
        rows = max([1, *(m.shape[0] for m in self._matrices)])
        slots = max_rows * max_k  # a prefill pass's routed slots, at most
        half = max([0, *(m.shape[0] - split_rows(m) for m in self._matrices)])  # rows there
        sizes = [N_CTL * 8, max_k * 8, cols * 4, rows * 4, max_k * d * 4,
                 (3 + 3 * slots) * 8, slots * 8, max_rows * cols * 4, slots * d * 4,
                 max_rows * half * 4, max_k * 8]
        offsets = np.cumsum([0, *(-(-n // 64) * 64 for n in sizes)])  # 64-byte aligned
        self._mm = mmap.mmap(-1, int(offsets[-1]))  # MAP_SHARED | MAP_ANONYMOUS
        buf = self._mm
        # Control words as a memoryview: an index is a plain 8-byte load or store, several
        # times cheaper than a numpy scalar's, and each hand-over takes about six.
        self._ctl = memoryview(buf)[int(offsets[0]) : int(offsets[0]) + N_CTL * 8].cast("q")
        self._args = np.frombuffer(buf, np.int64, max_k, int(offsets[1]))  # buffer ids
        self._x = np.frombuffer(buf, np.float32, cols, int(offsets[2]))  # (cols,) input
        self._y = np.frombuffer(buf, np.float32, rows, int(offsets[3]))  # (rows,) GEMV out
        self._out = np.frombuffer(buf, np.float32, max_k * d, int(offsets[4])).reshape(max_k, d)
        # A prefill pass's experts (`run_rows`): n, k and the layer, then (buffer id, slot
        # count, expert id) per expert; their slots, expert after expert; the batch's
        # inputs; its routed outputs.
        self._row_args = np.frombuffer(buf, np.int64, 3 + 3 * slots, int(offsets[5]))
        self._row_slots = np.frombuffer(buf, np.int64, slots, int(offsets[6]))
        self._row_x = np.frombuffer(buf, np.float32, max_rows * cols,
                                    int(offsets[7])).reshape(max_rows, cols)  # (rows, cols)
        self._row_y = np.frombuffer(buf, np.float32, slots * d,
                                    int(offsets[8])).reshape(slots, d)  # (rows * k, d)
        # A prefill batch through a dense matrix (`matmul_t`): the partner's columns.
        self._gemm_y = np.frombuffer(buf, np.float32, max_rows * half, int(offsets[9]))
        self._eids = np.frombuffer(buf, np.int64, max_k, int(offsets[10]))  # `_args`' experts

    def _plan_work(self, d: int, ff: int, max_k: int) -> None:
        """Each side's scratch and its views of the shared block per piece of work."""
        self._scratch = Scratch(max_k, ff)
        self._mine = np.empty((max_k, d), np.float32)  # `run`'s experts on the caller
        self._inputs: dict[int, np.ndarray] = {}  # `input`'s views of the shared input
        # Per matrix split in two: (its index, the split row, the caller's rows, where the
        # partner's part of a GEMV's result lands, a GEMV's input's place), made once.
        self._plans = {id(w): (i, s, w[:s], self._y[s : w.shape[0]], self.input(w.shape[1]))
                       for i, w in enumerate(self._matrices) if (s := split_rows(w))}
        # The partner's side of the same: per matrix index, (its rows, the input, where
        # their result goes), so that it starts its GEMV as soon as it sees the request
        # (the caller waits for the later of the two halves).
        self._halves = [(w[s:], self._x[: w.shape[1]], self._y[s : w.shape[0]])
                        for w in self._matrices for s in (split_rows(w),)]
        self._outs = [self._out[row:] for row in range(max_k)]  # experts' outputs from row
        self._xd = self.input(d)  # the experts' input

    def _fork(self) -> None:
        """Start the child, which serves until it is told to exit or this side is gone,
        and wait until it is ready."""
        rfd, self._wake = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a threaded process may deadlock the child on
            # a lock another thread held. This child takes none: it computes with numpy on
            # memory set up before the fork and talks through shared memory and a pipe.
            warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                    DeprecationWarning)
            self._pid = os.fork()
        if self._pid == 0:  # the child never returns from here
            status = 1
            try:
                os.close(self._wake)
                self._serve(rfd)
                status = 0
            finally:
                os._exit(status)
        os.close(rfd)
        self._reaper = weakref.finalize(self, _stop, self._pid, self._wake, self._ctl)
        populate(self._mm)
        self._wait(READY, 1)  # the child has mapped every expert buffer

    # -- the caller's side ------------------------------------------------------------------

    def input(self, n: int) -> np.ndarray:
        """The shared block's input vector (n,), always the same view for one n: an input
        computed into it (`rms_norm(..., out=)`) is not copied there again by `matvec` or
        `run_resident` — a copy on the caller's path of each large GEMV otherwise."""
        view = self._inputs.get(n)
        if view is None:
            view = self._inputs[n] = self._x[:n]
        return view

    def run(self, jobs: list[Job], x: np.ndarray, out: np.ndarray, layer: int = 0) -> float:
        """Compute every job of `layer` into `out[slot]` (x: (d,), out: (k, d)); the stall
        is 0."""
        for job in jobs:
            if job.ticket is not None:  # not resident after all: its bytes first
                job.ticket.wait()
        half = len(jobs) // 2  # the partner takes the second half, of the buffers it knows
        mine, theirs = list(jobs[:half]), list[Job]()
        for job in jobs[half:]:
            known = half > 0 and id(job.buffer) in self._buffers
            (theirs if known else mine).append(job)
        if theirs:
            self._post_experts(x, [job.buffer for job in theirs], 0, layer,
                               [job.expert for job in theirs])
        if mine:
            experts_into([job.buffer for job in mine], x, self._scratch, self._mine, self.ffn,
                         layer, [job.expert for job in mine])
            for i, job in enumerate(mine):
                out[job.slot] = self._mine[i]
        if theirs:
            self._wait(DONE, self._seq)
            for i, job in enumerate(theirs):
                out[job.slot] = self._out[i]
        return 0.0

    def run_resident(self, bufs: list[ExpertBuffer], x: np.ndarray,
                     experts: Sequence[int] = (), layer: int = 0) -> np.ndarray:
        """`run` of resident jobs in slots 0 .. k-1 (experts: their ids), every buffer one
        the partner knows, without the jobs. → (k, d), the outputs in the shared block,
        where each side wrote its own (no copy), valid until the next call.

        The partner takes the routing's first half (its heaviest experts), the caller the
        rest: measured here (default preset, two runs), the caller then waited 5-8 us a layer
        (median) for the partner, against 10-11 us the other way round — a heavily routed
        expert is more often still in the last-level cache, and the partner starts after the
        caller's post. Each expert is the same arithmetic whoever runs it, so the split
        changes no bit."""
        n = len(bufs)
        mine = n // 2  # the caller's: the last n // 2
        out, ffn = self._out, self.ffn
        if not mine:
            experts_into(bufs, x, self._scratch, out, ffn, layer, experts)
            return out[:n]
        first = n - mine
        self._post_experts(x, bufs[:first], 0, layer, experts[:first])
        experts_into(bufs[first:], x, self._scratch, out[first:], ffn, layer, experts[first:])
        self._wait(DONE, self._seq)
        return out[:n]

    def run_rows(self, x: np.ndarray, k: int, tasks: list[RowTask], y: np.ndarray,
                 experts: Sequence[int] = (), layer: int = 0) -> bool:
        """A prefill pass's experts of `layer`, half of them on the partner: each task
        (buffer, slots) as `rows_task` (x: (n, d), y: (n * k, d); experts: the tasks' ids,
        read where the FFN is `by_expert`). False, computing nothing, when the batch does
        not fit the shared block or an expert is unknown to the partner."""
        n, d = x.shape
        if n > self.max_rows or any(id(buf) not in self._buffers for buf, _ in tasks):
            return False
        ids = list(experts) if self.ffn.by_expert else [0] * len(tasks)
        # The partner takes every other expert (their costs are alike: at a few rows each,
        # reading the weights is the work) and the first, as the caller has the posting
        # and the copying back to do.
        theirs, mine = tasks[::2], tasks[1::2]
        self._row_x[:n, :d] = x
        args = self._row_args
        args[0], args[1], args[2] = n, k, layer
        at = 0
        for i, ((buf, slots), e) in enumerate(zip(theirs, ids[::2])):
            args[3 + 3 * i : 6 + 3 * i] = id(buf), slots.size, e
            self._row_slots[at : at + slots.size] = slots
            at += slots.size
        self._post(ROWS, len(theirs))
        for (buf, slots), e in zip(mine, ids[1::2]):
            rows_task(buf, x, k, slots, y, self.ffn, layer, e)
        self._wait(DONE, self._seq)
        done = self._row_slots[:at]
        y[done] = self._row_y[done]
        return True

    def matmul_t(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """x @ w.T (x: (n, k), w: (m, k)) → (n, m), the second half of w's rows (the last
        columns) on the partner, as `compute.matmul_t` splits them."""
        plan = self._plans.get(id(w))
        n, k = x.shape
        if plan is None or n > self.max_rows:
            return matmul_t(x, w)
        i, s, first, _, _ = plan
        out = np.empty((n, w.shape[0]), np.float32)  # (n, m)
        self._row_x[:n, :k] = x
        self._row_args[0] = n
        self._post(GEMM, i)
        np.matmul(x, first.T, out=out[:, :s])  # (n, s)
        self._wait(DONE, self._seq)
        out[:, s:] = self._gemm_y[: n * (w.shape[0] - s)].reshape(n, -1)
        return out

    def matvec(self, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """w @ x (w: (m, n), x: (n,)) → (m,), the second half of the rows on the partner."""
        plan = self._plans.get(id(w))
        if plan is None:
            return matvec(w, x, out)
        i, s, first, theirs, x_in = plan
        if out is None:
            out = np.empty(w.shape[0], np.float32)
        if x is not x_in:
            x_in[:] = x
        self._post(GEMV, i)
        np.matmul(first, x, out=out[:s])  # (s,)
        self._wait(DONE, self._seq)
        out[s:] = theirs
        return out

    def cpu_seconds(self) -> float:
        """CPU time the child has used so far (its spinning included); 0 if unreadable."""
        try:
            with open(f"/proc/{self._pid}/schedstat", "rb") as f:  # "run_ns wait_ns slices"
                return int(f.read().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self) -> None:
        self._reaper()

    def _post_experts(self, x: np.ndarray, bufs: list[ExpertBuffer], row: int, layer: int,
                      experts: Sequence[int]) -> None:
        """The partner computes `bufs` (experts `experts` of `layer`) on x into the shared
        outputs from `row` on."""
        x_in = self.input(x.shape[0])
        if x is not x_in:
            x_in[:] = x
        self._args[: len(bufs)] = [id(buf) for buf in bufs]
        if self.ffn.by_expert:
            self._eids[: len(bufs)] = experts
            self._ctl[LAYER] = layer
        self._ctl[ROW] = row
        self._post(EXPERTS, len(bufs))

    def _post(self, op: int, arg: int) -> None:
        ctl = self._ctl
        ctl[OP], ctl[ARG] = op, arg
        self._seq += 1
        ctl[SEQ] = self._seq  # stored after the request's data: x86 keeps stores in order
        if ctl[SLEEPING]:
            try:
                os.write(self._wake, b"w")
            except BrokenPipeError:
                raise EngineError("the compute partner process died") from None

    def _wait(self, word: int, value: int) -> None:
        """Spin until the child sets control word `word` to `value`."""
        ctl = self._ctl
        spins = 0
        while ctl[word] != value:
            spins += 1
            if spins % YIELD_EVERY == 0:
                os.sched_yield()  # on a busy machine the child may be waiting for a CPU
                if spins % CHECK_EVERY == 0 and not self._alive():
                    raise EngineError("the compute partner process died")
        if ctl[FAILED]:
            raise EngineError("the compute partner process failed")

    def _alive(self) -> bool:
        try:
            return os.waitpid(self._pid, os.WNOHANG)[0] == 0
        except ChildProcessError:  # reaped already
            return False

    # -- the child's side -------------------------------------------------------------------

    def _serve(self, rfd: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
        threadpool_limits(limits=1, user_api="blas")  # the parent uses the other core
        for buf in self._buffers.values():
            map_pages(buf)
        populate(self._mm)
        ctl = self._ctl
        ctl[READY] = 1
        seen = 0
        spins = 0
        idle_since = time.perf_counter()
        while True:
            if ctl[SEQ] == seen:
                spins += 1
                if spins % CLOCK_EVERY:
                    continue
                if spins % CHECK_EVERY == 0 and os.getppid() != self._parent:
                    return
                if time.perf_counter() - idle_since > SPIN_S and not self._sleep(rfd, seen):
                    return
                continue
            seen = ctl[SEQ]
            op = ctl[OP]
            if op == EXIT:
                return
            try:
                self._serve_one(op, ctl[ARG])
            except Exception:
                ctl[FAILED] = 1
            ctl[DONE] = seen
            idle_since = time.perf_counter()

    def _sleep(self, rfd: int, seen: int) -> bool:
        """Sleep until the parent writes to the pipe; False once the parent is gone."""
        ctl = self._ctl
        ctl[SLEEPING] = 1
        timeout: float | None = LOST_WAKE_S
        while ctl[SEQ] == seen:
            if select.select([rfd], [], [], timeout)[0] and not os.read(rfd, 64):
                return False  # EOF: the parent closed its end
            timeout = None  # the parent has seen SLEEPING by now: it will write
        ctl[SLEEPING] = 0
        return True

    def _serve_one(self, op: int, arg: int) -> None:
        if op == GEMV:
            rows, x, y = self._halves[arg]
            _matmul(rows, x, y)  # (m - s,); positional out: no keyword parsing
        elif op == GEMM:
            w = self._matrices[arg]
            s, (m, k) = split_rows(w), w.shape
            n = int(self._row_args[0])
            out = self._gemm_y[: n * (m - s)].reshape(n, m - s)
            np.matmul(self._row_x[:n, :k], w[s:].T, out=out)  # (n, m - s)
        elif op == ROWS:
            n, k, layer = self._row_args[:3].tolist()
            x, at = self._row_x[:n, : self._out.shape[1]], 0
            for i in range(arg):
                buf_id, m, e = self._row_args[3 + 3 * i : 6 + 3 * i].tolist()
                rows_task(self._buffers[buf_id], x, k, self._row_slots[at : at + m],
                          self._row_y, self.ffn, layer, e)
                at += m
        elif op == EXPERTS:
            bufs = [self._buffers[i] for i in self._args[:arg].tolist()]
            ffn = self.ffn
            eids = self._eids[:arg].tolist() if ffn.by_expert else ()
            experts_into(bufs, self._xd, self._scratch, self._outs[self._ctl[ROW]], ffn,
                         self._ctl[LAYER], eids)


_matmul = np.matmul


def _stop(pid: int, wake: int, ctl: memoryview) -> None:
    """End the child (it may be spinning or asleep) and reap it."""
    ctl[OP] = EXIT
    ctl[SEQ] = ctl[SEQ] + 1
    with contextlib.suppress(OSError):  # the child may be gone already
        os.write(wake, b"x")
    os.close(wake)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
