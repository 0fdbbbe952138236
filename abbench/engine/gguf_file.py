"""A GGUF model file, opened for streaming: metadata, a tensor index, dense reads by offset.

Parsing is done by the `gguf` package (llama.cpp's own reader). This module adds what a
streaming engine needs on top: absolute file offsets and byte sizes of every tensor,
validation that each tensor lies inside the file, and one clear `ModelFileError` for every
way a file can be unusable (bad magic, truncated, duplicate or missing tensor, unknown type).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES
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
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelFileError(
                f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')",
                tip="pass a .gguf model, or `synthetic:tiny|small|default`",
            )
        try:
            reader = GGUFReader(self.path, "r")
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
            raise ModelFileError(
                f"{self.path}: unreadable GGUF header or tensor table ({e})"
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
                self.metadata[key] = field.contents()
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            info = TensorInfo(t.name, t.tensor_type, shape, int(t.data_offset), int(t.n_bytes))
            if info.offset + info.nbytes > self.file_size:
                raise ModelFileError(
                    f"{self.path}: truncated: tensor `{t.name}` ends at byte "
                    f"{info.offset + info.nbytes} but the file has {self.file_size} bytes"
                )
            self.tensors[t.name] = info
        # The reader's memmap stays open for `--dense mmap` views.
        self._reader = reader

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
        return None if field is None else list(field.contents())

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
        raw = np.empty(info.nbytes, dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(info.offset)
            got = f.readinto(memoryview(raw))
        if got != info.nbytes:
            raise ModelFileError(f"{self.path}: truncated while reading tensor `{name}`")
        return to_f32(raw, info.ggml_type, info.shape)

    def close(self) -> None:
        mm = getattr(self._reader.data, "_mmap", None)
        if mm is not None:
            # A dense view may still point into it; the GC closes it later then.
            with contextlib.suppress(BufferError, ValueError):
                mm.close()
