"""C's math library, for the few float32 functions llama.cpp computes with it where numpy's
own would differ in the last bit (the package that touches ctypes: docs/architecture.md)."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.logf.restype, _libm.logf.argtypes = ctypes.c_float, [ctypes.c_float]


def logf(x: float) -> np.float32:
    """C's `logf`: llama.cpp computes its YaRN factor with it, in float32; numpy's float32
    log is other code and may differ in the last bit."""
    return np.float32(_libm.logf(ctypes.c_float(x)))
