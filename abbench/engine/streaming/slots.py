"""Expert buffers that hold the file's own bytes: equal slots in one reserved mapping.

With quantized experts the cache holds what the file holds — a Q4_K expert of the
Qwen3-30B-A3B geometry is 2.53 MiB, not the 18 MiB it takes in F32 — and ggml computes
from those bytes (`qcompute.py`). Its `mul_mat_id` reads matrix i of a stack at
`base + i * stride`, so the experts a layer uses must sit at one stride from one base: a
`SlotPool` is that stack. Each slot holds one expert as `[gate | up | down]`, each part
starting on a 4 KiB boundary (an O_DIRECT read lands straight in it), and the slot's
index is what the compute is given. Experts of one layout (the three parts' types and
shapes) share a pool; a file whose layers differ (Q4_K_M keeps some layers' `down` in
Q6_K) has one pool per layout.

The mapping reserves address space for every slot the pool may ever hand out (nothing is
committed until touched; `MAP_NORESERVE` where Python names it, 3.12 on). A streaming
cache faults its budget in at load
(`fault_in`), each pool its layers' share, so that no read lands in a page never touched:
an O_DIRECT read into fresh memory cost 1.4-1.5 ms of kernel time per expert here (2.5
MiB zeroed and mapped, in the reader's thread beside the compute), against 0.03 ms into a
slot used before. Past that, memory is used only as slots are written, so what the process
holds follows the cache's contents. A slot leaving the cache for an expert of another
layout gives its pages back (`trim`), and a pool handing out a slot it did not fault in
first takes back a slot another pool faulted in and never handed out, so the bytes held
never exceed the budget by more than the slots in use.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from abbench.errors import EngineError

ALIGN = 4096  # O_DIRECT's alignment, and a page
HUGE_PAGE = 2 << 20
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
# Linux >= 5.14: map pages in now (Python < 3.12 lacks the names; partner_os.py uses them)
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def whole_pages(n: int) -> int:
    """`n` bytes rounded up to whole 4 KiB pages (O_DIRECT's unit)."""
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Part:
    """One projection of an expert as the file stores it."""

    ggml_type: int  # enum ggml_type
    rows: int
    cols: int  # values per row (ggml's ne[0])
    nbytes: int  # in the file


@dataclass(frozen=True)
class SlotLayout:
    """The three parts of an expert (gate, up, down) and where each sits in a slot."""

    gate: Part
    up: Part
    down: Part

    @property
    def offsets(self) -> tuple[int, int, int]:
        g = 0
        u = whole_pages(self.gate.nbytes)
        d = u + whole_pages(self.up.nbytes)
        return g, u, d

    @property
    def stride(self) -> int:
        return self.offsets[2] + whole_pages(self.down.nbytes)

    @property
    def file_bytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes


class RawSlot:
    """One expert's bytes as in the file, in slot `index` of `kind` (its pool)."""

    __slots__ = ("kind", "index", "mm", "offset", "nbytes", "data")

    def __init__(self, pool: SlotPool, index: int) -> None:
        self.kind = pool
        self.index = index
        self.mm = pool.mm
        self.offset = pool.base + index * pool.layout.stride
        self.nbytes = pool.layout.file_bytes  # what the cache's budget counts
        self.data = np.frombuffer(pool.mm, np.uint8, pool.layout.stride, self.offset)

    def trim(self) -> None:
        """Give the slot's pages back (its contents are gone; written again on reuse)."""
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(mmap.MADV_DONTNEED, self.offset, self.kind.layout.stride)


class SlotPool:
    """Up to `capacity` slots of one layout, handed out once each (the cache keeps the
    ones it frees and hands them out again)."""

    def __init__(self, layout: SlotLayout, capacity: int) -> None:
        self.layout = layout
        self.capacity = max(1, capacity)
        length = self.capacity * layout.stride
        try:
            self.mm = mmap.mmap(-1, length + HUGE_PAGE, flags=_FLAGS)
        except OSError as e:
            raise EngineError(f"cannot reserve {length / 2**20:.0f} MiB of address space "
                              f"for expert slots: {e}") from e
        with contextlib.suppress(AttributeError, OSError):  # no THP here: plain pages
            self.mm.madvise(mmap.MADV_HUGEPAGE)
        probe = np.frombuffer(self.mm, np.uint8, 1)
        self.base = -probe.ctypes.data % HUGE_PAGE  # slot 0 starts a huge page
        self.address = probe.ctypes.data + self.base  # of slot 0, for ggml
        del probe
        self._next = 0
        self.faulted = 0  # slots 0.. mapped in at load (`fault_in`)
        self.siblings: tuple[SlotPool, ...] = ()  # the pools one budget is shared with
        # Per part: whether slots hold it re-laid for ggml's repacked kernels (the team
        # decides: `QuantTeam.repack_pool`), else as the file has it.
        self.repack = (False, False, False)

    @property
    def nbytes(self) -> int:
        """What one slot counts against a cache budget: the expert's bytes in the file."""
        return self.layout.file_bytes

    def release(self) -> None:
        """Give every slot's pages back (the pool's contents are gone), as a runner closes:
        a closed engine's cache leaves the process's memory then, not whenever Python's
        collector finds the objects that hold the pool."""
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(mmap.MADV_DONTNEED)

    def new(self) -> RawSlot:
        if self._next >= self.capacity:
            raise EngineError(f"expert slot pool exhausted ({self.capacity} slots)")
        if self._next >= self.faulted:  # a slot past the faulted ones: room made for it
            for pool in self.siblings:
                if pool.unfault_one():
                    break
        self._next += 1
        return RawSlot(self, self._next - 1)

    def fault(self, slots: int) -> None:
        """Map slots 0..`slots` in now, for writing (`fault_in`)."""
        slots = min(slots, self.capacity)
        if slots <= self.faulted:
            return
        stride = self.layout.stride
        start, length = self.faulted * stride, (slots - self.faulted) * stride
        try:  # Linux >= 5.14: one call, the kernel's pages (huge ones where it has them)
            self.mm.madvise(MADV_POPULATE_WRITE, self.base + start, length)
        except (OSError, ValueError):  # older kernels: a write per page
            view = np.frombuffer(self.mm, np.uint8, length, self.base + start)
            view[::ALIGN] = 0
        self.faulted = slots

    def unfault_one(self) -> bool:
        """Give back the pages of the last slot faulted in and never handed out → whether
        there was one."""
        if self.faulted <= self._next:
            return False
        self.faulted -= 1
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(mmap.MADV_DONTNEED, self.base + self.faulted * self.layout.stride,
                            self.layout.stride)
        return True

    def part_address(self, part: int) -> int:
        """Where part 0 (gate), 1 (up) or 2 (down) of slot 0 is; slot i's is i strides on."""
        return self.address + self.layout.offsets[part]


def fault_in(kinds: Sequence[SlotPool], budget_bytes: int, n_expert: int) -> None:
    """Map a streaming cache's budget into its pools now, at load (`kinds`: each layer's
    pool): each pool the slots its layers' share of the budget holds (every layer routes
    the same number of experts a token, so the cache's mix follows the layers'), at most
    its layers' experts. The pools then make room for one another (`SlotPool.new`)."""
    pools = list(dict.fromkeys(kinds))
    for pool in pools:
        pool.siblings = tuple(p for p in pools if p is not pool)
        layers = kinds.count(pool)
        share = budget_bytes * layers // len(kinds)
        pool.fault(min(layers * n_expert, share // pool.nbytes))
