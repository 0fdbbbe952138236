"""Expert slices on disk and the reader lanes that stream them into page-aligned buffers.

Expert `e` of a projection tensor `blk.L.ffn_{gate,up,down}_exps.weight` (experts
outermost) is the contiguous slice at `tensor.offset + e * slice_bytes`. An expert's three
slices land in one page-aligned F32 buffer laid out `[gate | up | down]`, so gate and up
form one `(2*ff, d)` matrix and the expert's first GEMV is a single call.

Where experts are computed in the file's own types (`qcompute.py`), the three slices land
as they are in a slot of a `slots.SlotPool` instead, each part on a page boundary.

Reads are `os.preadv` on one file descriptor per lane. O_DIRECT (the default) needs the
file offset, the length and the buffer address aligned to the device block; when a slice
is kept as it is (F32 into an F32 buffer, any type into a slot) and aligned (the synthetic
models are written so) it is read straight into the buffer the compute uses. Otherwise the
lane reads the aligned range that covers the slice into its own bounce buffer and copies or
converts from there; a part its slot holds re-laid for ggml's repacked kernels is read
there too and laid into the slot from it (`SliceReader`'s `relay`).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from abbench.engine.gguf.model_file import ModelFile, TensorInfo, to_f32
from abbench.engine.streaming.memory import out_of_memory
from abbench.engine.streaming.slots import Part, RawSlot, SlotLayout
from abbench.errors import EngineError, ModelFileError

ALIGN = 4096  # O_DIRECT alignment that every Linux block device accepts


HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and arm64 (4 KiB base pages)
PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def aligned_empty(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """Anonymous page-aligned memory (untouched until written) and a uint8 view of it."""
    mm = mmap.mmap(-1, max(nbytes, 1))
    return mm, np.frombuffer(mm, dtype=np.uint8, count=nbytes)


class BufferArena:
    """Page-aligned expert buffers carved from large private anonymous mappings that ask
    for transparent huge pages (`MADV_HUGEPAGE`, where the kernel offers them).

    Why not one small mapping per buffer: an O_DIRECT read pins every destination page and
    hands the device one segment per physically contiguous run, so where the bytes land
    decides how fast they arrive. Measured on a 2-core VM, 4 lanes of 512 KiB reads: into
    huge-page-backed arena memory 1436-1602 MiB/s, into one shared 1.5 MiB mapping per
    buffer 820-1087 MiB/s (three processes; the latter also varied most from one process to
    the next). GEMVs over the two ran at the same speed. Pages are touched only as buffers
    are used, so memory held still follows the buffers handed out (plus at most the huge
    page the newest buffer ends in). A forked process inherits the mappings (copy on
    write, and buffers it only reads are never copied).
    """

    def __init__(self, chunk_bytes: int = 64 << 20) -> None:
        self.chunk_bytes = chunk_bytes
        self._mm: mmap.mmap | None = None
        self._chunks: list[mmap.mmap] = []
        self._next = 0
        self._end = 0

    def take(self, nbytes: int) -> tuple[mmap.mmap, int]:
        """A mapping and the offset in it of `nbytes` bytes, page aligned, never handed out
        before. The mapping stays alive as long as a buffer holds it."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if self._mm is None or self._next + size > self._end:
            length = max(self.chunk_bytes, size)
            try:
                mm = mmap.mmap(-1, length + HUGE_PAGE, flags=PRIVATE)
            except OSError as e:  # out of memory or address space: one error, said so
                raise out_of_memory(length, "expert and weight buffers", e) from None
            with contextlib.suppress(AttributeError, OSError):  # no THP here: plain pages
                mm.madvise(mmap.MADV_HUGEPAGE)
            probe = np.frombuffer(mm, dtype=np.uint8, count=1)
            start = -probe.ctypes.data % HUGE_PAGE  # the first buffer starts a huge page
            del probe
            self._mm, self._next, self._end = mm, start, start + length
            self._chunks.append(mm)
        offset = self._next
        self._next += size
        return self._mm, offset

    def release(self) -> None:
        """Give every page of the arena back (what its buffers held is gone): memory that
        would otherwise stay until the collector finds the buffers' owners."""
        for mm in self._chunks:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_DONTNEED)


def arena_copy(arena: BufferArena, a: np.ndarray) -> np.ndarray:
    """A copy of `a` in `arena`'s memory: pinned dense matrices live there, in huge pages
    where the kernel offers them, as the experts do. Measured here, a GEMV over a 1.5 MiB
    matrix in huge pages took 60-67 us against 76-78 us in numpy's own allocation (4 KiB
    pages below 4 MiB: a TLB miss, and the hardware prefetcher stopping, every 4 KiB)."""
    mm, offset = arena.take(a.nbytes)
    out = np.frombuffer(mm, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
    out[...] = a
    return out


@dataclass(frozen=True)
class Slice:
    """One projection of one expert: where it is in the file and where it goes."""

    offset: int  # absolute file offset
    nbytes: int  # bytes in the file
    ggml_type: GGMLQuantizationType
    shape: tuple[int, int]  # numpy shape once converted to F32
    dest: int  # byte offset inside the expert's buffer
    raw: bool = False  # kept as the file has it (a slot), not converted to F32
    part: int = 0  # 0 gate, 1 up, 2 down

    @property
    def dest_bytes(self) -> int:
        """Bytes it takes in the buffer."""
        return self.nbytes if self.raw else self.shape[0] * self.shape[1] * 4


@dataclass(frozen=True)
class LayerExperts:
    """The expert tensors of one layer."""

    gate: TensorInfo  # (n_expert, ff, d)
    up: TensorInfo  # (n_expert, ff, d)
    down: TensorInfo  # (n_expert, d, ff)
    ff: int
    d: int

    @property
    def buffer_bytes(self) -> int:
        """F32 bytes one resident expert holds (gate + up + down)."""
        return 3 * self.ff * self.d * 4

    @property
    def file_bytes(self) -> int:
        """Bytes one expert occupies in the file (its three slices)."""
        return sum(t.nbytes // t.shape[0] for t in (self.gate, self.up, self.down))

    @property
    def slot_layout(self) -> SlotLayout:
        """The expert as a slot holds it (the file's bytes: `slots.py`)."""
        gate, up, down = (Part(int(t.ggml_type), t.shape[1], t.shape[2], t.nbytes // t.shape[0])
                          for t in (self.gate, self.up, self.down))
        return SlotLayout(gate, up, down)

    def slices(self, expert: int, raw: bool = False) -> tuple[Slice, Slice, Slice]:
        """Expert `expert`'s three slices, into an F32 buffer or (`raw`) a slot."""
        fd = self.ff * self.d * 4
        dests = self.slot_layout.offsets if raw else (0, fd, 2 * fd)
        out = []
        for part, (t, dest) in enumerate(zip((self.gate, self.up, self.down), dests)):
            per = t.nbytes // t.shape[0]
            out.append(Slice(t.offset + expert * per, per, t.ggml_type, t.shape[1:], dest,  # type: ignore[arg-type]
                             raw, part))
        return out[0], out[1], out[2]


def expert_layout(mf: ModelFile, n_layer: int, n_expert: int) -> list[LayerExperts]:
    layers = []
    for i in range(n_layer):
        b = f"blk.{i}."
        gate = mf.tensor(b + "ffn_gate_exps.weight")
        up = mf.tensor(b + "ffn_up_exps.weight")
        down = mf.tensor(b + "ffn_down_exps.weight")
        if len(gate.shape) != 3 or gate.shape != up.shape or gate.shape[0] != n_expert:
            raise ModelFileError(
                f"{mf.path}: `{gate.name}` has shape {gate.shape}, expected ({n_expert}, ff, d) "
                f"matching `{up.name}`"
            )
        _, ff, d = gate.shape
        if down.shape != (n_expert, d, ff):
            raise ModelFileError(
                f"{mf.path}: `{down.name}` has shape {down.shape}, expected {(n_expert, d, ff)}"
            )
        for t in (gate, up, down):
            t.row_bytes(ff * d)  # raises if an expert is not a whole number of quant blocks
        layers.append(LayerExperts(gate, up, down, ff, d))
    return layers


class ExpertBuffer:
    """One expert's weights in F32: `gate_up` (2*ff, d) and `down` (d, ff)."""

    __slots__ = ("mm", "offset", "data", "floats", "gate_up", "down", "nbytes", "kind")

    def __init__(self, ff: int, d: int, arena: BufferArena | None = None,
                 kind: F32Kind | None = None) -> None:
        self.nbytes = 3 * ff * d * 4
        self.kind = kind  # what made it (the cache keeps freed buffers by kind)
        if arena is None:
            self.mm, self.offset = mmap.mmap(-1, max(self.nbytes, 1), flags=PRIVATE), 0
        else:
            self.mm, self.offset = arena.take(self.nbytes)
        self.data = np.frombuffer(self.mm, dtype=np.uint8, count=self.nbytes,
                                  offset=self.offset)
        self.floats = self.data.view(np.float32)  # (3*ff*d,)
        self.gate_up = self.floats[: 2 * ff * d].reshape(2 * ff, d)  # (2ff, d)
        self.down = self.floats[2 * ff * d :].reshape(d, ff)  # (d, ff)

    def trim(self) -> None:
        """Give the buffer's pages back (its contents are gone; written again on reuse)."""
        length = -(-self.nbytes // ALIGN) * ALIGN
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(mmap.MADV_DONTNEED, self.offset, length)


class F32Kind:
    """F32 expert buffers of one shape, from one arena (`cache.BufferKind`)."""

    def __init__(self, ff: int, d: int, arena: BufferArena) -> None:
        self.ff, self.d, self.arena = ff, d, arena
        self.nbytes = 3 * ff * d * 4

    def new(self) -> ExpertBuffer:
        return ExpertBuffer(self.ff, self.d, self.arena, self)

    def release(self) -> None:
        self.arena.release()


Buffer = ExpertBuffer | RawSlot  # where an expert's bytes land: F32, or the file's own

# Lays part `part` of a slot from `src`, that part's bytes as the file has them, re-laid
# for ggml's repacked kernels → False where the slot keeps the part as the file has it
# (`QuantTeam.relay_part`). A lane calls it as the part lands.
Relay = Callable[[RawSlot, int, np.ndarray], bool]


class ReadTicket:
    """A queued read of one expert. `wait()` returns when its bytes are in the buffer (and
    re-laid, where the reader re-lays them).

    Its slices are separate queue items, so an expert's three projections are read by up
    to three lanes at once; the last lane to finish one completes the ticket.
    """

    __slots__ = ("slices", "buffer", "event", "t_issued", "t_done", "nbytes", "error",
                 "cancelled", "skipped", "_pending", "_lock")

    def __init__(self, slices: tuple[Slice, ...], buffer: Buffer) -> None:
        self.slices = slices
        self.buffer = buffer
        self.event = threading.Event()
        self.t_issued = time.perf_counter()
        self.t_done = 0.0
        self.nbytes = 0  # bytes actually transferred (aligned ranges included)
        self.error: BaseException | None = None
        self.cancelled = False  # set by the caller: lanes skip slices not yet started
        self.skipped = 0
        self._pending = len(slices)
        self._lock = threading.Lock()

    def _slice_done(self, nbytes: int, error: BaseException | None, skipped: bool = False) -> None:
        with self._lock:
            self.nbytes += nbytes
            self.skipped += skipped
            if error is not None and self.error is None:
                self.error = error
            self._pending -= 1
            last = self._pending == 0
        if last:
            self.t_done = time.perf_counter()
            self.event.set()

    def wait(self) -> None:
        """Until the bytes are in the buffer; raises if the read failed."""
        self.event.wait()
        if self.error is not None:
            raise EngineError(f"expert read failed: {self.error}") from self.error


class SliceReader:
    """`lanes` reader threads, each with its own descriptor, pulling from one queue."""

    def __init__(self, path: str | os.PathLike[str], lanes: int, o_direct: bool,
                 relay: Relay | None = None) -> None:
        """`relay`: lays each raw part a lane reads into its slot, where the slot's pool
        re-lays that part (the part is read into the lane's own buffer first)."""
        self.path = str(path)
        self.relay = relay
        self.lanes = lanes
        self.o_direct = o_direct and hasattr(os, "O_DIRECT") and self._o_direct_works()
        if o_direct and not self.o_direct:
            warnings.warn(
                f"O_DIRECT refused for {self.path} (filesystem does not support it): "
                "falling back to buffered reads; telemetry records o_direct=0",
                RuntimeWarning,
                stacklevel=2,
            )
        flags = os.O_RDONLY | (os.O_DIRECT if self.o_direct else 0)
        self._queue: queue.SimpleQueue[tuple[ReadTicket, Slice] | None] = queue.SimpleQueue()
        self._threads = []
        for i in range(lanes):
            fd = os.open(self.path, flags)
            t = threading.Thread(target=self._lane, args=(fd,), name=f"io-lane-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _o_direct_works(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            return False
        try:
            mm, _ = aligned_empty(ALIGN)
            os.preadv(fd, [mm], 0)
            return True
        except OSError as e:
            if e.errno == errno.EINVAL:
                return False
            raise
        finally:
            os.close(fd)

    def submit(self, slices: tuple[Slice, ...], buffer: Buffer) -> ReadTicket:
        ticket = ReadTicket(slices, buffer)
        for s in slices:
            self._queue.put((ticket, s))
        return ticket

    def read_now(self, slices: tuple[Slice, ...], buffer: Buffer) -> int:
        ticket = self.submit(slices, buffer)
        ticket.wait()
        return ticket.nbytes

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=5)

    # -- lane ----------------------------------------------------------------------

    def _lane(self, fd: int) -> None:
        bounce_mm: mmap.mmap | None = None
        bounce = np.empty(0, np.uint8)
        try:
            while (item := self._queue.get()) is not None:
                ticket, s = item
                if ticket.cancelled:
                    ticket._slice_done(0, None, skipped=True)
                    continue
                got = 0
                error: BaseException | None = None
                try:
                    buffer = ticket.buffer
                    dest = buffer.data[s.dest : s.dest + s.dest_bytes]
                    relaid = (self.relay is not None and isinstance(buffer, RawSlot)
                              and buffer.kind.repack[s.part])
                    if (s.raw or s.ggml_type == GGMLQuantizationType.F32) and not relaid and (
                        not self.o_direct or (s.offset % ALIGN == 0 and s.nbytes % ALIGN == 0)
                    ):
                        got = _pread_full(fd, dest, s.offset)
                    else:
                        start = s.offset - s.offset % ALIGN if self.o_direct else s.offset
                        end = s.offset + s.nbytes
                        if self.o_direct:
                            end += -end % ALIGN
                        if bounce.size < end - start:
                            bounce_mm, bounce = aligned_empty(end - start)
                        got = _pread_full(fd, bounce[: end - start], start, allow_eof=True)
                        if got < s.offset - start + s.nbytes:  # the file ended inside the slice
                            raise EngineError(f"{self.path}: short read at offset {s.offset}")
                        raw = bounce[s.offset - start : s.offset - start + s.nbytes]
                        if relaid:
                            self.relay(buffer, s.part, raw)  # type: ignore[misc,arg-type]
                        elif s.raw:
                            dest[...] = raw
                        else:
                            f32 = dest.view(np.float32).reshape(s.shape)
                            f32[...] = to_f32(raw, s.ggml_type, s.shape)
                except BaseException as e:  # handed to the waiting thread, never lost
                    error = e
                ticket._slice_done(got, error)
        finally:
            os.close(fd)
            del bounce_mm


def _pread_full(fd: int, dest: np.ndarray, offset: int, allow_eof: bool = False) -> int:
    """preadv until `dest` is full (short reads happen); returns bytes read."""
    view = memoryview(dest)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            if allow_eof:
                break
            raise EngineError(f"unexpected end of file at offset {offset + done}")
        done += n
    return done
