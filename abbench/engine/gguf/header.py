"""The walk of a GGUF file's header: metadata, tensor table, where the data starts.

The `gguf` package's `GGUFReader` builds numpy views for every item of every metadata
array, about 1.6 KiB an item: a header holding one array of a million empty strings (a 9 MB
file) took 17 s and 1.6 GiB before `abbench model info` printed a line. This walk costs
memory in proportion to what abbench keeps, not to what a header claims: scalars and
strings are decoded, an array is kept as where it lies and how many items it claims and is
decoded only when asked for (`read_array`), and the number of entries is bounded. It reads
with the `gguf` package's own constants (value types, tensor types and their block sizes,
the default alignment) and names the first defect in one `ModelFileError`: where the file
is truncated, an unsupported version, an unknown value or tensor type, a key or tensor
name that is not UTF-8, a duplicate, a tensor whose data lies past the end of the file,
off the alignment, or over another tensor's bytes.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from abbench.errors import ModelFileError
from abbench.records.text import ascii_clip
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION

# GGUF v2/v3 layout (all integers in the file's byte order, little-endian unless the
# version reads byte-swapped):
#   magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
#   n_kv x    key: string | value type u32 | value
#   n_tensors x  name: string | n_dims u32 | dims u64 x n_dims | type u32 | offset u64
#   padding to `general.alignment` (default 32), then tensor data; offsets are relative
#   to the start of the data.
# string = length u64 | UTF-8 bytes; array value = item type u32 | count u64 | items.
GGUF_VERSIONS = (2, GGUF_VERSION)  # what the `gguf` package reads
# Far above any real model (a 94-layer MoE has ~1,400 tensors and ~50 keys), far below
# what the kept entries would cost (a few hundred bytes each).
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
MAX_DIMS = 8  # ggml uses 4; anything far above is a corrupt count
# struct (and numpy) format of each scalar type
_SCALARS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
# The fewest bytes an entry can take: a metadata pair (key length u64, value type u32, a
# one-byte value) and a tensor entry (name length u64, n_dims u32, type u32, offset u64).
_MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8


def show(text: str, n: int = 60) -> str:
    """A key or tensor name from the file, safe inside one message line."""
    return ascii_clip(text, n)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in the file. `shape` is numpy order (outermost first)."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the tensor's data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.ggml_type.name

    def row_bytes(self, n_elements: int) -> int:
        """Bytes that `n_elements` consecutive values occupy in this tensor's type."""
        block, size = GGML_QUANT_SIZES[self.ggml_type]
        if n_elements % block:
            raise ModelFileError(
                f"tensor `{self.name}`: {n_elements} elements is not a whole number of "
                f"{self.type_name} blocks of {block}"
            )
        return n_elements // block * size


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array as the header holds it, not yet decoded."""

    key: str
    item_type: GGUFValueType
    count: int
    start: int  # file offset of the first item

    def describe(self) -> str:
        """`1000000 strings`, `259 int32 values`."""
        if self.item_type == GGUFValueType.STRING:
            return f"{self.count} strings"
        return f"{self.count} {self.item_type.name.lower()} values"


@dataclass(frozen=True)
class Header:
    """What the walk keeps of a header."""

    order: str  # struct's byte order of the file's numbers
    alignment: int
    data_offset: int  # absolute offset of the tensor data
    metadata: dict[str, Any]  # every value that is not an array, decoded
    arrays: dict[str, ArrayInfo]
    tensors: dict[str, TensorInfo]  # in the tensor table's order


def read_array(buf: memoryview, info: ArrayInfo, order: str, path: Path) -> list[Any]:
    """The items of a walked array, read from `buf` (the whole file)."""
    if info.item_type != GGUFValueType.STRING:
        dtype = np.dtype(order + _SCALARS[info.item_type])
        items: list[Any] = np.frombuffer(buf, dtype, info.count, info.start).tolist()
        return items
    length = struct.Struct(order + "Q").unpack_from
    out: list[Any] = []
    pos = info.start
    try:
        for _ in range(info.count):
            n = length(buf, pos)[0]
            out.append(str(buf[pos + 8 : pos + 8 + n], "utf-8"))
            pos += 8 + n
    except UnicodeDecodeError:
        raise ModelFileError(
            f"{path}: corrupt metadata: `{show(info.key)}` is not valid UTF-8"
        ) from None
    return out


class _Cursor:
    """Bounds-checked reads over the file; running off the end names what was being read."""

    def __init__(self, buf: mmap.mmap, path: Path, order: str, pos: int) -> None:
        self.buf, self.path, self.order, self.pos = buf, path, order, pos

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise ModelFileError(
                f"{self.path}: truncated: the file ends inside {what}: it has "
                f"{len(self.buf)} bytes, {self.pos + n} needed"
            )

    def take(self, n: int, what: str) -> int:
        self.need(n, what)
        self.pos += n
        return self.pos - n

    def unpack(self, fmt: str, size: int, what: str) -> Any:
        return struct.unpack_from(self.order + fmt, self.buf, self.take(size, what))[0]

    def u32(self, what: str) -> int:
        return int(self.unpack("I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.unpack("Q", 8, what))

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, what)
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError:
            raise ModelFileError(
                f"{self.path}: corrupt GGUF header: {what} is not valid UTF-8"
            ) from None

    def value(self, vtype: int, what: str) -> Any:
        """A metadata value that is not an array, decoded."""
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype in _SCALARS:
            fmt = _SCALARS[GGUFValueType(vtype)]
            return self.unpack(fmt, struct.calcsize(fmt), what)
        raise ModelFileError(f"{self.path}: corrupt metadata: {what} has unknown type {vtype}")

    def array(self, key: str, what: str) -> ArrayInfo:
        """Step over an array value; where it lies and what it claims."""
        itype, count = self.u32(what), self.u64(what)
        start = self.pos
        if itype in _SCALARS:
            self.take(count * struct.calcsize(_SCALARS[GGUFValueType(itype)]), what)
        elif itype == GGUFValueType.STRING:
            self.need(count * 8, what)  # each string has at least its length: a cut
            self._skip_strings(count, what)  # or absurd count fails here, not after a walk
        else:
            raise ModelFileError(
                f"{self.path}: corrupt metadata: {what} is an array of unknown type {itype}"
            )
        return ArrayInfo(key, GGUFValueType(itype), count, start)

    def _skip_strings(self, count: int, what: str) -> None:
        """Step over `count` strings by their lengths alone, decoding and keeping nothing
        (a million take ~0.1 s)."""
        length, end, pos = struct.Struct(self.order + "Q").unpack_from, len(self.buf), self.pos
        for _ in range(count):
            if pos + 8 > end:
                pos += 8
                break
            pos += 8 + length(self.buf, pos)[0]
        self.need(pos - self.pos, what)
        self.pos = pos


def read_header(path: Path) -> Header:
    """Walk a GGUF file's header and tensor table (magic already checked)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        size = len(buf)
        order = "<"
        if size >= 8 and struct.unpack_from("<I", buf, 4)[0] & 0xFFFF == 0:
            order = ">"  # written for the opposite byte order (as `GGUFReader` decides)
        cur = _Cursor(buf, path, order, 4)
        n_tensors, n_kv = _counts(cur, path, size)
        metadata, arrays = _metadata(cur, path, n_kv)
        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        entries = _tensor_table(cur, path, n_tensors)
        data_offset = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, ggml_type, shape, offset, nbytes in entries:
        # gguf's writer places every tensor at a multiple of the alignment (llama.cpp
        # refuses a file that does not): an offset off it is a corrupt or edited table.
        if offset % alignment:
            raise ModelFileError(
                f"{path}: tensor `{show(name)}` starts at data offset {offset}, not a "
                f"multiple of the alignment ({alignment})"
            )
        end = data_offset + offset + nbytes
        if end > size:
            raise ModelFileError(
                f"{path}: truncated: tensor `{show(name)}` ends at byte {end} but the file "
                f"has {size} bytes"
            )
        tensors[name] = TensorInfo(name, ggml_type, shape, data_offset + offset, nbytes)
    _check_overlaps(path, tensors)
    return Header(order, alignment, data_offset, metadata, arrays, tensors)


def _counts(cur: _Cursor, path: Path, size: int) -> tuple[int, int]:
    """(tensor count, metadata count) after the version, checked against the file size."""
    version = cur.u32("the header (version)")
    if version not in GGUF_VERSIONS:
        raise ModelFileError(
            f"{path}: GGUF version {version} is not supported "
            f"(supported: {', '.join(map(str, GGUF_VERSIONS))})"
        )
    n_tensors = cur.u64("the header (tensor count)")
    n_kv = cur.u64("the header (metadata count)")
    # A corrupt count fails here, before a walk through garbage or a huge allocation.
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES > size - cur.pos:
        raise ModelFileError(
            f"{path}: truncated or corrupt header: it claims {n_kv} metadata entries and "
            f"{n_tensors} tensors, more than its {size} bytes can hold"
        )
    if n_kv > MAX_KEYS or n_tensors > MAX_TENSORS:
        raise ModelFileError(
            f"{path}: the header claims {n_kv} metadata entries and {n_tensors} tensors; "
            f"abbench reads at most {MAX_KEYS} of each (real models have a few thousand)"
        )
    return n_tensors, n_kv


def _metadata(cur: _Cursor, path: Path, n_kv: int) -> tuple[dict[str, Any],
                                                             dict[str, ArrayInfo]]:
    """Walk the metadata: the values that are not arrays, and where the arrays lie."""
    metadata: dict[str, Any] = {}
    arrays: dict[str, ArrayInfo] = {}
    for i in range(n_kv):
        key = cur.string(f"the metadata (key {i + 1} of {n_kv})")
        if key in metadata or key in arrays:
            raise ModelFileError(f"{path}: duplicate metadata key `{show(key)}`")
        what = f"the metadata (value of `{show(key)}`)"
        vtype = cur.u32(what)
        if vtype == GGUFValueType.ARRAY:
            arrays[key] = cur.array(key, what)
            continue
        metadata[key] = cur.value(vtype, what)
        if key == "general.alignment":
            alignment = metadata[key]
            if vtype != GGUFValueType.UINT32 or alignment == 0 or alignment & (alignment - 1):
                raise ModelFileError(
                    f"{path}: `general.alignment` is {alignment!r}, not a power of two "
                    "stored as uint32"
                )
    return metadata, arrays


def _tensor_table(cur: _Cursor, path: Path, n_tensors: int,
                  ) -> list[tuple[str, GGMLQuantizationType, tuple[int, ...], int, int]]:
    """Walk the tensor table: (name, type, numpy shape, offset from the data start, bytes)
    per entry."""
    entries = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"the tensor table (entry {i + 1} of {n_tensors})")
        shown = show(name)
        where = f"the tensor table (entry for `{shown}`)"
        n_dims = cur.u32(where)
        if n_dims > MAX_DIMS:
            raise ModelFileError(
                f"{path}: corrupt tensor table: `{shown}` has {n_dims} dimensions"
            )
        dims = [cur.u64(where) for _ in range(n_dims)]  # innermost first
        type_id = cur.u32(where)
        offset = cur.u64(where)
        try:
            ggml_type = GGMLQuantizationType(type_id)
        except ValueError:
            raise ModelFileError(f"{path}: tensor `{shown}` has unknown type id {type_id}") \
                from None
        if name in names:
            raise ModelFileError(f"{path}: duplicate tensor `{shown}`")
        names.add(name)
        block, type_bytes = GGML_QUANT_SIZES[ggml_type]
        if dims and dims[0] % block:
            raise ModelFileError(
                f"{path}: tensor `{shown}`: rows of {dims[0]} elements are not a whole "
                f"number of {ggml_type.name} blocks of {block}"
            )
        shape = tuple(reversed(dims))
        entries.append((name, ggml_type, shape, offset, math.prod(dims) // block * type_bytes))
    return entries


def _check_overlaps(path: Path, tensors: dict[str, TensorInfo]) -> None:
    """No two tensors share a byte: a tensor whose header claims more than its place (an
    8M-row embedding laid over the rest of the file) is refused before anything reads it."""
    reach, owner = 0, ""  # the furthest end so far, and whose
    for t in sorted(tensors.values(), key=lambda t: (t.offset, t.nbytes)):
        if t.offset < reach:
            raise ModelFileError(
                f"{path}: tensors `{show(owner)}` and `{show(t.name)}` overlap: "
                f"`{show(t.name)}` starts at byte {t.offset}, inside `{show(owner)}` "
                f"(which ends at byte {reach})"
            )
        if t.offset + t.nbytes > reach:
            reach, owner = t.offset + t.nbytes, t.name
