"""A GGUF model file, opened for streaming: metadata, a tensor index, dense reads by offset.

The header is walked by `gguf/header.py` (with the `gguf` package's constants; its reader
materialises every metadata array, so it is not used here) in memory bounded by what the
engine keeps. This module adds what a streaming engine needs on top: absolute file offsets
and byte sizes of every tensor, metadata arrays decoded when asked for and only up to what
the engine can use (the tokenizer's, against a vocabulary limit and each other), the
embedding checked against the vocabulary before anything is read, and one clear
`ModelFileError` for every way a file can be unusable (bad magic, truncated and where,
duplicate or missing tensor, overlapping tensors, unknown or unsupported type).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from abbench.engine.architectures import PRESET_NAMES
from abbench.engine.gguf.header import ArrayInfo, TensorInfo, read_array, read_header, show
from abbench.errors import ModelFileError
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

__all__ = ["CONVERTED_TYPES", "F32_TYPES", "SUPPORTED_TYPES", "ModelFile", "TensorInfo",
           "to_f32"]

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
    GGMLQuantizationType.MXFP4,  # gpt-oss's experts: ggml computes them in their type
}
SUPPORTED_TYPES = F32_TYPES | CONVERTED_TYPES

# The metadata arrays the engine reads, and how many items it reads of each: the largest
# real vocabularies have 256k-262k tokens, and BPE merges can outnumber them (Llama 3: 280k
# merges for 128k tokens). Any other array is read up to ARRAY_READ_MAX items; a longer one
# is left unread (`model info` lists it).
TOKENS, SCORES, TOKEN_TYPES = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                               "tokenizer.ggml.token_type")
MAX_VOCAB = 1 << 20
READ_LIMITS = {TOKENS: MAX_VOCAB, SCORES: MAX_VOCAB, TOKEN_TYPES: MAX_VOCAB,
               "tokenizer.ggml.merges": 2 * MAX_VOCAB}
ARRAY_READ_MAX = 1 << 16
# llama.cpp's tensors of one row per token (every architecture names them so).
VOCAB_TENSORS = ("token_embd.weight", "output.weight")
_LAYER = re.compile(r"blk\.(\d+)\.")


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
                tip=f"pass a .gguf model, or `synthetic:PRESET` ({PRESET_NAMES})",
            )
        header = read_header(self.path)
        self.alignment, self.data_offset = header.alignment, header.data_offset
        self.metadata: dict[str, Any] = header.metadata
        self._arrays: dict[str, ArrayInfo] = header.arrays
        self._order = header.order
        self.tensors: dict[str, TensorInfo] = header.tensors
        # Tensor data is read by offset (`read_raw`); this mapping serves `--dense mmap`
        # views and the metadata arrays decoded when asked for.
        self._data = np.memmap(self.path, mode="r")
        self._check_block_count()
        self._check_vocabulary()

    def _check_block_count(self) -> None:
        """A layer count the tensor table cannot back is corrupt: every llama.cpp
        architecture names layer tensors `blk.N.`, and an architecture's checks walk every
        claimed layer (2**31 of them would not end)."""
        arch = self.metadata.get("general.architecture")
        n = self.metadata.get(f"{arch}.block_count") if isinstance(arch, str) else None
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 1:
            return  # absent, not a number or below 1: the architecture's check names it
        layers = {m[1] for name in self.tensors if (m := _LAYER.match(name))}
        if n > len(layers):
            raise ModelFileError(
                f"{self.path}: metadata `{show(arch)}.block_count` is {n}, but the tensor "
                f"table has `blk.N.` tensors for {len(layers)} layers"
            )

    def _check_vocabulary(self) -> None:
        """The tokenizer's arrays against their limits and each other, and the tensors of
        one row per token against the vocabulary, from the header's counts alone: an
        8M-row embedding for a 259-token vocabulary is refused before a byte of it is read
        (it was read, 5.8 GiB at peak, and the model ran). llama.cpp requires the same
        equality (`token_embd` is {n_embd, n_vocab}, n_vocab the token count)."""
        for key, limit in READ_LIMITS.items():
            info = self._arrays.get(key)
            if info is not None and info.count > limit:
                raise ModelFileError(
                    f"{self.path}: metadata `{key}` holds {info.describe()}, more than "
                    f"abbench reads ({limit})"
                )
        tokens = self._arrays.get(TOKENS)
        n = tokens.count if tokens is not None and tokens.count else None
        for key in (SCORES, TOKEN_TYPES):
            info = self._arrays.get(key)
            if n is not None and info is not None and info.count != n:
                raise ModelFileError(
                    f"{self.path}: metadata `{key}` has {info.count} entries for {n} tokens "
                    f"(`{TOKENS}`)"
                )
        for name in VOCAB_TENSORS:
            t = self.tensors.get(name)
            if t is None or len(t.shape) != 2:
                continue  # absent or not a matrix: the architecture's checks name it
            if n is not None and t.shape[0] != n:
                raise ModelFileError(
                    f"{self.path}: tensor `{name}` has {t.shape[0]} rows, but the vocabulary "
                    f"(`{TOKENS}`) has {n} tokens"
                )
            if t.shape[0] > MAX_VOCAB:
                raise ModelFileError(
                    f"{self.path}: tensor `{name}` has {t.shape[0]} rows, more tokens than "
                    f"abbench reads ({MAX_VOCAB})"
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
        """A metadata array's items, decoded now; None if the file has no such array."""
        info = self._arrays.get(key)
        if info is None:
            return None
        limit = READ_LIMITS.get(key, ARRAY_READ_MAX)
        if info.count > limit:
            raise ModelFileError(
                f"{self.path}: metadata `{show(key)}` holds {info.describe()}, more than "
                f"abbench reads ({limit})"
            )
        return read_array(memoryview(self._data), info, self._order, self.path)

    def unread_arrays(self) -> dict[str, str]:
        """The metadata arrays too long to be read (`array` refuses them), described."""
        return {key: info.describe() for key, info in self._arrays.items()
                if info.count > READ_LIMITS.get(key, ARRAY_READ_MAX)}

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
            view = self._data[info.offset : info.offset + info.nbytes]
            return view.view(np.float32).reshape(info.shape)
        return to_f32(self.read_raw(name), info.ggml_type, info.shape)

    def mapped(self, name: str) -> np.ndarray:
        """A tensor's bytes as a view of the file's mapping (uint8; the page cache's)."""
        info = self.tensor(name)
        return self._data[info.offset : info.offset + info.nbytes]

    def read_raw(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """A tensor's bytes as the file stores them (uint8), into `out` if given.

        The caller keeps its own copy (pinned, converted, re-laid), so the page cache's
        copy is let go after the read: under a memory limit (a phone, a cell's
        `memory_limit_mib`) it is charged to the process too, and 48 layers of
        Qwen3-30B-A3B's dense weights left 542 MiB of it there."""
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
            with contextlib.suppress(AttributeError, OSError):  # advice only; not on macOS
                os.posix_fadvise(f.fileno(), info.offset, info.nbytes, os.POSIX_FADV_DONTNEED)
        return raw

    def close(self) -> None:
        mm = getattr(self._data, "_mmap", None)
        if mm is not None:
            # A dense view may still point into it; the GC closes it later then.
            with contextlib.suppress(BufferError, ValueError):
                mm.close()
