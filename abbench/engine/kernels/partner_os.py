"""The operating system's side of the compute partner (`partner.py`): whether a partner
can run here, and mapping memory into a process before its first touch would fault.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform

from abbench.engine.streaming.slots import MADV_POPULATE_READ, MADV_POPULATE_WRITE
from abbench.engine.streaming.streamer import ExpertBuffer


def supported() -> bool:
    """x86-64 (the shared counters rely on its store order: `partner.py`) with at least
    two CPUs to run on: on one, the two sides would spin against each other."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (hasattr(os, "fork") and platform.machine().lower() in ("x86_64", "amd64")
            and (cpus or 1) >= 2)


def map_pages(buf: ExpertBuffer) -> None:
    """Map a buffer's pages into this process now. A fork copies the page-table entries of
    private anonymous memory but not those of a shared mapping: should a buffer ever live
    in one, the child's first GEMV on each expert would take a page fault per 4 KiB and
    run slower than the parent's for the first hundred tokens."""
    try:
        buf.mm.madvise(MADV_POPULATE_READ, buf.offset, buf.nbytes)  # Linux >= 5.14
    except (OSError, ValueError):
        buf.floats[:: mmap.PAGESIZE // 4].max()  # one read per page


def populate(mm: mmap.mmap) -> None:
    """Map the shared block's pages into this process now, for writing: each side would
    otherwise map a shared page on its first touch, a fault per 4 KiB, during the first
    prefill pass. (Measured, that pass's GEMM waits for the partner are the same either way:
    its first layers' multi-millisecond waits are the page faults of the other buffers a
    first pass writes, see docs/engine.md, "The first pass is slower".)"""
    with contextlib.suppress(OSError, ValueError):  # Linux >= 5.14; else on first touch
        mm.madvise(MADV_POPULATE_WRITE)
