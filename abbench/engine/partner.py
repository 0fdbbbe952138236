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

What is shared: expert buffers (private anonymous memory, inherited copy-on-write) and the
dense matrices are never written after load, so the child forked after loading sees the
very same bytes and copies none (it maps them all before it reports ready: see `_map`);
requests name a matrix by its index in a table and an expert buffer by its `id()`, which a
forked child shares with the parent. The inputs and outputs of a request go through one
small shared block. Only resident buffers are known to the child: a buffer made after the
fork (a streaming cache's) could not be, hence `--resident` only.

The child spins only while requests keep coming: after SPIN_S without one it sleeps on a
pipe, and the parent wakes it with a byte. A parent that dies closes the pipe (EOF) or
changes the child's parent id; either ends the child. Counters in shared memory are only
ordered for another process by x86's stores (TSO), so the partner is x86-64 only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import select
import signal
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from abbench.engine.compute import (
    Job,
    expert_down,
    expert_up,
    matvec,
    scratch_rows,
    split_rows,
)
from abbench.engine.streamer import ExpertBuffer
from abbench.errors import EngineError

SPIN_S = 0.002  # the child spins this long after its last request, then sleeps
LOST_WAKE_S = 0.001  # a wake-up lost between the two sides' counters costs at most this
CLOCK_EVERY = 1 << 10  # the child's spins between looks at the clock
YIELD_EVERY = 1 << 12  # the caller's spins (~0.3 ms) between yields, should the two share a CPU
CHECK_EVERY = 1 << 16  # spins between checks that the other side is still there

# Control words (int64) in the shared block.
SEQ, DONE, OP, ARG, SLEEPING, FAILED, READY = range(7)
N_CTL = 8
GEMV, EXPERTS, EXIT = 1, 2, 3
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Python < 3.12 lacks the name


def supported() -> bool:
    """x86-64 (see above) with at least two CPUs to run on: on one, the two sides would
    spin against each other."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (hasattr(os, "fork") and platform.machine().lower() in ("x86_64", "amd64")
            and (cpus or 1) >= 2)


class Partner:
    """Computes half of each large GEMV and of each layer's experts in a forked process.

    Same interface as `ComputeTeam` (`run`, `matvec`, `close`); its results are the same
    bits, since both sides compute with the same functions and the same split.
    """

    def __init__(
        self, matrices: Sequence[np.ndarray], buffers: Iterable[ExpertBuffer], d: int,
        ff: int, max_k: int,
    ) -> None:
        self.threads = 2  # the caller and the partner
        self._matrices = list(matrices)
        self._index = {id(m): i for i, m in enumerate(self._matrices)}
        self._buffers = {id(b): b for b in buffers}
        cols = max([d, *(m.shape[1] for m in self._matrices)])
        rows = max([1, *(m.shape[0] for m in self._matrices)])
        sizes = [N_CTL * 8, max_k * 8, cols * 4, rows * 4, max_k * d * 4]
        offsets = np.cumsum([0, *(-(-n // 64) * 64 for n in sizes)])  # 64-byte aligned
        self._mm = mmap.mmap(-1, int(offsets[-1]))  # MAP_SHARED | MAP_ANONYMOUS
        buf = self._mm
        self._ctl = np.frombuffer(buf, np.int64, N_CTL, int(offsets[0]))
        self._args = np.frombuffer(buf, np.int64, max_k, int(offsets[1]))  # buffer ids
        self._x = np.frombuffer(buf, np.float32, cols, int(offsets[2]))  # (cols,) input
        self._y = np.frombuffer(buf, np.float32, rows, int(offsets[3]))  # (rows,) GEMV out
        self._out = np.frombuffer(buf, np.float32, max_k * d, int(offsets[4])).reshape(max_k, d)
        self._rows = scratch_rows(max_k, ff)
        self._seq = 0
        self._parent = os.getpid()
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
        self._wait(READY, 1)  # the child has mapped every expert buffer

    # -- the caller's side ------------------------------------------------------------------

    def run(self, jobs: list[Job], x: np.ndarray, out: np.ndarray) -> float:
        """Compute every job into `out[slot]` (x: (d,), out: (k, d)); the stall is 0."""
        for job in jobs:
            if job.ticket is not None:  # not resident after all: its bytes first
                job.ticket.wait()
        half = len(jobs) // 2  # the partner takes the second half, of the buffers it knows
        mine, theirs = list(jobs[:half]), []
        for job in jobs[half:]:
            known = half > 0 and id(job.buffer) in self._buffers
            (theirs if known else mine).append(job)
        if theirs:
            self._post_experts(x, [job.buffer for job in theirs])
        for j, job in enumerate(mine):
            expert_up(job.buffer, x, self._rows[j])
            expert_down(job.buffer, self._rows[j][3], out[job.slot])
        if theirs:
            self._wait(DONE, self._seq)
            for i, job in enumerate(theirs):
                out[job.slot] = self._out[i]
        return 0.0

    def matvec(self, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """w @ x (w: (m, n), x: (n,)) → (m,), the second half of the rows on the partner."""
        s = split_rows(w)
        i = self._index.get(id(w)) if s else None
        if i is None:
            return matvec(w, x, out)
        if out is None:
            out = np.empty(w.shape[0], np.float32)
        self._x[: w.shape[1]] = x
        self._post(GEMV, i)
        np.matmul(w[:s], x, out=out[:s])  # (s,)
        self._wait(DONE, self._seq)
        out[s:] = self._y[s : w.shape[0]]
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

    def _post_experts(self, x: np.ndarray, bufs: list[ExpertBuffer]) -> None:
        self._x[: x.shape[0]] = x
        for i, buf in enumerate(bufs):
            self._args[i] = id(buf)
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
            _map(buf)
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
            seen = int(ctl[SEQ])
            op = int(ctl[OP])
            if op == EXIT:
                return
            try:
                self._serve_one(op, int(ctl[ARG]))
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
            w = self._matrices[arg]
            s, (m, n) = split_rows(w), w.shape
            np.matmul(w[s:], self._x[:n], out=self._y[s:m])  # (m - s,)
        elif op == EXPERTS:
            x = self._x[: self._out.shape[1]]
            for i in range(arg):
                buf = self._buffers[int(self._args[i])]
                expert_up(buf, x, self._rows[i])
                expert_down(buf, self._rows[i][3], self._out[i])


def _map(buf: ExpertBuffer) -> None:
    """Map a buffer's pages into this process now. A fork copies the page-table entries of
    private anonymous memory but not those of a shared mapping: should a buffer ever live
    in one, the child's first GEMV on each expert would take a page fault per 4 KiB and
    run slower than the parent's for the first hundred tokens."""
    try:
        buf.mm.madvise(MADV_POPULATE_READ, buf.offset, buf.nbytes)  # Linux >= 5.14
    except (OSError, ValueError):
        buf.floats[:: mmap.PAGESIZE // 4].max()  # one read per page


def _stop(pid: int, wake: int, ctl: np.ndarray) -> None:
    """End the child (it may be spinning or asleep) and reap it."""
    ctl[OP] = EXIT
    ctl[SEQ] = ctl[SEQ] + 1
    with contextlib.suppress(OSError):  # the child may be gone already
        os.write(wake, b"x")
    os.close(wake)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
