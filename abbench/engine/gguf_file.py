"""A GGUF model file, opened for streaming: metadata, a tensor index, dense reads by offset.

Parsing is done by the `gguf` package (llama.cpp's own reader). This module adds what a
streaming engine needs on top: absolute file offsets and byte sizes of every tensor, a
bounds-checked walk of the header first (the reader fails on a cut file with numpy's own
errors), and one clear `ModelFileError` for every way a file can be unusable (bad magic,
truncated and where, duplicate or missing tensor, unknown or unsupported type).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION
from gguf.quants import dequantize

from abbench.errors import ModelFileError

# Types the engine computes from directly (after one conversion to F32) or dequantizes
# through `gguf.quants`. Everything else is refused at load with its name.
F32_TYPES = {GGMLQuantizationType.F32}
CONVERTED_TYPES = {
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
}
SUPPORTED_TYPES = F32_TYPES | CONVERTED_TYPES


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


def to_f32(raw: np.ndarray, ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """Convert raw tensor bytes (uint8) of `ggml_type` into an F32 array of numpy `shape`."""
    if ggml_type == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape)
    if ggml_type == GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    rows = raw.reshape(-1, raw.size // int(np.prod(shape[:-1], dtype=np.int64)))
    return np.ascontiguousarray(dequantize(rows, ggml_type), dtype=np.float32).reshape(shape)


class ModelFile:
    """An opened GGUF file. Tensor data is never loaded here: callers read by offset."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ModelFileError(f"{self.path}: no such model file")
        if self.path.is_dir():
            raise ModelFileError(f"{self.path}: is a folder, not a GGUF model file")
        self.file_size = self.path.stat().st_size
        if self.file_size == 0:
            raise ModelFileError(f"{self.path}: empty file (0 bytes), not a GGUF model file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if len(magic) < 4 and b"GGUF".startswith(magic):
            raise ModelFileError(f"{self.path}: truncated: the file ends inside the magic")
        if magic != b"GGUF":
            raise ModelFileError(
                f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')",
                tip="pass a .gguf model, or `synthetic:tiny|small|default`",
            )
        # The `gguf` reader assumes a well-formed file and fails on a cut one with numpy's
        # own errors; walk the header first so that every defect is named.
        check_layout(self.path)
        try:
            reader = GGUFReader(self.path, "r")
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
            raise ModelFileError(
                f"{self.path}: unreadable GGUF header or tensor table ({_show(str(e), 200)})"
            ) from e
        except MemoryError as e:
            raise ModelFileError(f"{self.path}: corrupt GGUF header (absurd sizes)") from e
        self.alignment = int(reader.alignment)
        self.data_offset = int(reader.data_offset)
        self.metadata: dict[str, Any] = {}
        self._arrays: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            if field.types and field.types[0] == GGUFValueType.ARRAY:
                self._arrays[key] = field
            else:
                self.metadata[key] = self._contents(key, field)
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.tensors[t.name] = TensorInfo(
                t.name, t.tensor_type, shape, int(t.data_offset), int(t.n_bytes)
            )
        # The reader's memmap stays open for `--dense mmap` views.
        self._reader = reader
        self._check_block_count()

    def _check_block_count(self) -> None:
        """A layer count the tensor table cannot back is corrupt: every llama.cpp
        architecture names layer tensors `blk.N.`, and an architecture's checks walk every
        claimed layer (2**31 of them would not end)."""
        arch = self.metadata.get("general.architecture")
        n = self.metadata.get(f"{arch}.block_count") if isinstance(arch, str) else None
        if not isinstance(n, int) or n < 1:
            return  # absent or below 1: the architecture's own check names it
        layers = {m[1] for name in self.tensors if (m := _LAYER.match(name))}
        if n > len(layers):
            raise ModelFileError(
                f"{self.path}: metadata `{_show(arch)}.block_count` is {n}, but the tensor "
                f"table has `blk.N.` tensors for {len(layers)} layers"
            )

    # -- metadata ------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(f"{self.path}: missing metadata key `general.architecture`")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: missing metadata key `{key}`")
        return self.metadata[key]

    def array(self, key: str) -> list[Any] | None:
        field = self._arrays.get(key)
        return None if field is None else list(self._contents(key, field))

    def _contents(self, key: str, field: Any) -> Any:
        try:
            return field.contents()
        except UnicodeDecodeError:
            raise ModelFileError(
                f"{self.path}: corrupt metadata: `{_show(key)}` is not valid UTF-8"
            ) from None

    # -- tensors -------------------------------------------------------------------

    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{self.path}: missing tensor `{name}`")
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ModelFileError(
                f"{self.path}: tensor `{name}` has type {info.type_name}, which the engine "
                "does not support (supported: "
                f"{', '.join(sorted(t.name for t in SUPPORTED_TYPES))})"
            )
        return info

    def read_dense(self, name: str, pinned: bool) -> np.ndarray:
        """A dense tensor as F32 in numpy order.

        pinned: read into anonymous memory now (the seed's "pinned-dense").
        not pinned: an F32 tensor is a view of the file mapping, left to the page cache;
        other types must be converted, so they are read and converted like pinned ones.
        """
        info = self.tensor(name)
        if not pinned and info.ggml_type == GGMLQuantizationType.F32:
            view = self._reader.data[info.offset : info.offset + info.nbytes]
            return view.view(np.float32).reshape(info.shape)
        return to_f32(self.read_raw(name), info.ggml_type, info.shape)

    def mapped(self, name: str) -> np.ndarray:
        """A tensor's bytes as a view of the file's mapping (uint8; the page cache's)."""
        info = self.tensor(name)
        return self._reader.data[info.offset : info.offset + info.nbytes]

    def read_raw(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """A tensor's bytes as the file stores them (uint8), into `out` if given."""
        info = self.tensor(name)
        raw = np.empty(info.nbytes, dtype=np.uint8) if out is None else out
        view = memoryview(raw)
        got = 0
        with open(self.path, "rb", buffering=0) as f:
            f.seek(info.offset)
            # One read returns at most ~2 GiB (the kernel's cap per call): loop until done.
            while got < info.nbytes:
                n = f.readinto(view[got:])
                if not n:
                    raise ModelFileError(
                        f"{self.path}: truncated while reading tensor `{name}`")
                got += n
        return raw

    def close(self) -> None:
        mm = getattr(self._reader.data, "_mmap", None)
        if mm is not None:
            # A dense view may still point into it; the GC closes it later then.
            with contextlib.suppress(BufferError, ValueError):
                mm.close()


# -- header walk --------------------------------------------------------------------

# GGUF v2/v3 layout (all integers in the file's byte order, little-endian unless the
# version reads byte-swapped):
#   magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
#   n_kv x    key: string | value type u32 | value
#   n_tensors x  name: string | n_dims u32 | dims u64 x n_dims | type u32 | offset u64
#   padding to `general.alignment` (default 32), then tensor data; offsets are relative
#   to the start of the data.
# string = length u64 | UTF-8 bytes; array value = item type u32 | count u64 | items.
_SCALAR_BYTES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
GGUF_VERSIONS = (2, GGUF_VERSION)  # what `GGUFReader` reads
_MAX_DIMS = 8  # ggml uses 4; anything far above is a corrupt count
# The fewest bytes an entry can take: a metadata pair (key length u64, value type u32, a
# one-byte value) and a tensor entry (name length u64, n_dims u32, type u32, offset u64).
_MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8
_LAYER = re.compile(r"blk\.(\d+)\.")


def _show(text: str, n: int = 60) -> str:
    """A key or tensor name from the file, safe inside one message line: control
    characters escaped, clipped to `n` characters."""
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= n else shown[: n - 3] + "..."


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

    def u32(self, what: str) -> int:
        return int(struct.unpack_from(self.order + "I", self.buf, self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack_from(self.order + "Q", self.buf, self.take(8, what))[0])

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, what)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")

    def skip_value(self, vtype: int, what: str) -> None:
        if vtype == GGUFValueType.STRING:
            self.string(what)
        elif vtype in _SCALAR_BYTES:
            self.take(_SCALAR_BYTES[GGUFValueType(vtype)], what)
        elif vtype == GGUFValueType.ARRAY:
            itype, count = self.u32(what), self.u64(what)
            if itype in _SCALAR_BYTES:
                self.take(count * _SCALAR_BYTES[GGUFValueType(itype)], what)
            elif itype == GGUFValueType.STRING:
                self.need(count * 8, what)  # each string has at least its length: a cut
                for _ in range(count):  # or absurd count fails here, not after a long walk
                    self.string(what)
            else:
                raise ModelFileError(
                    f"{self.path}: corrupt metadata: {what} is an array of unknown type {itype}"
                )
        else:
            raise ModelFileError(
                f"{self.path}: corrupt metadata: {what} has unknown type {vtype}"
            )


def check_layout(path: Path) -> None:
    """Walk a GGUF file's header and tensor table (magic already checked) and raise
    `ModelFileError` naming the first defect: where the file is truncated, an unsupported
    version, an unknown value or tensor type, a duplicate key or tensor, a tensor whose
    data lies past the end of the file."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        size = len(buf)
        order = "<"
        if size >= 8 and struct.unpack_from("<I", buf, 4)[0] & 0xFFFF == 0:
            order = ">"  # written for the opposite byte order (as `GGUFReader` decides)
        cur = _Cursor(buf, path, order, 4)
        n_tensors, n_kv = _header(cur, path, size)
        alignment = _metadata(cur, path, n_kv)
        tensors = _tensor_table(cur, path, n_tensors)
        data_start = -(-cur.pos // alignment) * alignment
        for name, (offset, nbytes) in tensors.items():
            end = data_start + offset + nbytes
            if end > size:
                raise ModelFileError(
                    f"{path}: truncated: tensor `{_show(name)}` ends at byte {end} but the "
                    f"file has {size} bytes"
                )


def _header(cur: _Cursor, path: Path, size: int) -> tuple[int, int]:
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
    return n_tensors, n_kv


def _metadata(cur: _Cursor, path: Path, n_kv: int) -> int:
    """Walk the metadata; the data alignment it sets (`general.alignment`), else GGUF's."""
    alignment = GGUF_DEFAULT_ALIGNMENT
    keys: set[str] = set()
    for i in range(n_kv):
        key = cur.string(f"the metadata (key {i + 1} of {n_kv})")
        if key in keys:
            raise ModelFileError(f"{path}: duplicate metadata key `{_show(key)}`")
        keys.add(key)
        what = f"the metadata (value of `{_show(key)}`)"
        vtype = cur.u32(what)
        if key == "general.alignment" and vtype == GGUFValueType.UINT32:
            alignment = cur.u32(what)
            if alignment == 0 or alignment & (alignment - 1):
                raise ModelFileError(
                    f"{path}: `general.alignment` is {alignment}, not a power of two"
                )
        else:
            cur.skip_value(vtype, what)
    return alignment


def _tensor_table(cur: _Cursor, path: Path, n_tensors: int) -> dict[str, tuple[int, int]]:
    """Walk the tensor table: name -> (offset from the data start, bytes)."""
    tensors: dict[str, tuple[int, int]] = {}
    for i in range(n_tensors):
        name = cur.string(f"the tensor table (entry {i + 1} of {n_tensors})")
        shown = _show(name)
        where = f"the tensor table (entry for `{shown}`)"
        n_dims = cur.u32(where)
        if n_dims > _MAX_DIMS:
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
        if name in tensors:
            raise ModelFileError(f"{path}: duplicate tensor `{shown}`")
        block, type_bytes = GGML_QUANT_SIZES[ggml_type]
        if dims and dims[0] % block:
            raise ModelFileError(
                f"{path}: tensor `{shown}`: rows of {dims[0]} elements are not a whole "
                f"number of {ggml_type.name} blocks of {block}"
            )
        tensors[name] = (offset, math.prod(dims) // block * type_bytes)
    return tensors
