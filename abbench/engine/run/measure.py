"""One forward pass measured into a `TokenRecord`: wall and CPU time (the partner
process's included), page faults, resident memory, and what the expert side counted.

Timing covers the pass and whatever `work` does besides (decode's sampling)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.run.result import TokenRecord
from abbench.engine.units import MIB

_PAGE = resource.getpagesize()


def measure_pass(runner: ExpertRunner, step: int, phase: int, tokens: list[int],
                 work: Callable[[], None], trace_step: int) -> TokenRecord:
    """Run `work` (one pass over `tokens`) as pass `step` of `phase`, and record it."""
    tok = runner.tok
    runner.begin_pass(phase, trace_step)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    partner0 = runner.partner_cpu_s()
    t0 = time.perf_counter()
    # A prefill batch's GEMMs run on one BLAS thread too: BLAS splits a GEMM by thread
    # count, and the output must not depend on --threads (measured: two BLAS threads
    # gave no clear gain on 2 cores).
    work()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    cpu += runner.partner_cpu_s() - partner0
    return TokenRecord(
        step=step,
        phase=phase,
        token=tokens[0],
        tokens=len(tokens),
        wall_ms=wall * 1e3,
        io_ms=tok.io_s * 1e3,
        compute_ms=max(0.0, wall - tok.stall_s - tok.mgmt_s) * 1e3,
        stall_ms=tok.stall_s * 1e3,
        mgmt_ms=tok.mgmt_s * 1e3,
        majflt=ru1.ru_majflt - ru0.ru_majflt,
        cpu_ms=cpu * 1e3,
        rss_mib=rss_mib(),
        **tok.counts(),
    )


def rss_mib() -> float:
    """This process's resident memory now (NaN where /proc cannot say). Read once a pass:
    through a descriptor kept open (a pread, 2.4 us here, where an open, read and close
    took 15 us, a percent of a small model's token), opened again in a forked child,
    whose /proc/self is another file."""
    try:
        if _statm[0] != os.getpid():
            if _statm[1] >= 0:
                os.close(_statm[1])
            _statm[:] = [os.getpid(), os.open("/proc/self/statm", os.O_RDONLY)]
        # "size resident shared ..." in pages
        return int(os.pread(_statm[1], 256, 0).split()[1]) * _PAGE / MIB
    except (OSError, IndexError, ValueError):
        return float("nan")


_statm = [-1, -1]  # the process that opened it, and the descriptor of its /proc/self/statm


def peak_rss_mib(status: str = "/proc/self/status") -> float:
    """This process's peak resident memory so far: `VmHWM`, the high-water mark of its
    own memory. Not `ru_maxrss` where VmHWM is there: Linux carries the peak of the
    process that forked and exec'd this one into it (measured: a child of an 800 MiB
    parent reported 827 MiB at its start, VmHWM 11 MiB), so an engine run by a campaign
    or a bench reported its parent's memory. Elsewhere ru_maxrss (KiB on Linux)."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
