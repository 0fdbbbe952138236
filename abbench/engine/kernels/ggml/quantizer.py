"""ggml's quantizer, as llama-quantize runs it, and its check of quantized rows."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from ctypes import POINTER, c_float

import numpy as np

from abbench.engine.kernels.ggml.library import block_size, lib, row_bytes, type_name
from abbench.errors import EngineError


def quantize(a: np.ndarray, gtype: int) -> np.ndarray:
    """Rows of F32 `a` (..., n) in `gtype`, as llama-quantize writes them (no importance
    matrix), on every core: → uint8 (..., row bytes)."""
    g = lib()
    a = np.ascontiguousarray(a, dtype=np.float32)
    n = a.shape[-1]
    if n % block_size(gtype):
        raise EngineError(f"rows of {n} values are not whole {type_name(gtype)} blocks")
    if g.base.ggml_quantize_requires_imatrix(gtype):
        raise EngineError(f"{type_name(gtype)} needs an importance matrix to quantize")
    rows = a.size // n
    rb = row_bytes(gtype, n)
    out = np.empty((rows, rb), np.uint8)
    src = a.ctypes.data_as(POINTER(c_float))
    quantize_chunk = g.base.ggml_quantize_chunk

    def chunk(first: int) -> int:  # rows first .. first + step; ctypes lets go of the GIL
        return int(quantize_chunk(gtype, src, out.ctypes.data, first * n,
                                  min(step, rows - first), n, None))

    step = max(1, -(-rows // (4 * (os.cpu_count() or 1))))
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        done = sum(pool.map(chunk, range(0, rows, step)))
    if done != out.nbytes:
        raise EngineError(f"ggml_quantize_chunk wrote {done} bytes, {out.nbytes} expected")
    return out.reshape(*a.shape[:-1], rb)


def valid_rows(gtype: int, raw: np.ndarray) -> bool:
    """ggml's own check of quantized data (no NaN or inf in its scales or values)."""
    return bool(lib().base.ggml_validate_row_data(gtype, raw.ctypes.data, raw.nbytes))
