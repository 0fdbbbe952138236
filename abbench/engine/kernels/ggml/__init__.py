"""ggml's CPU kernels through ctypes: the one package of abbench that touches a foreign
function.

- `abi.py`: the C interface mirrored — enum values, structs, every function's prototype;
- `library.py`: finding and loading `libggml-base` / `libggml-cpu` (`ABBENCH_GGML_LIB`
  points at another build), declaring the prototypes, checking the struct mirror;
- `context.py`: tensors and graphs over memory this process owns (`Context`, `Graph`,
  `Threads`; a pass's memory kept from pass to pass: `Arena`, `scratch_from`) and the
  repacked layout (`Repacker`);
- `quantizer.py`: ggml's quantizer and its check of quantized rows.

Callers import this face (`from abbench.engine import ggml`; `ggml.lib()`,
`ggml.Context`, `ggml.Q4_K`, `ggml.Rope`, ...).
"""

from __future__ import annotations

from abbench.engine.kernels.ggml.abi import (
    BF16,
    F16,
    F32,
    GGML_MAX_DIMS,
    GGML_MAX_N_THREADS,
    GGML_MAX_NAME,
    GGML_MAX_OP_PARAMS,
    GGML_MAX_SRC,
    GGML_OBJECT_SIZE,
    I32,
    LOG_CALLBACK,
    LOG_WARN,
    MXFP4,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    Q8_K,
    ROPE_NEOX,
    ROPE_NORMAL,
    SORT_DESC,
    STATUS_SUCCESS,
    CPlan,
    InitParams,
    Rope,
    TensorStruct,
    ThreadpoolParams,
    rope_sections,
)
from abbench.engine.kernels.ggml.context import (
    Arena,
    Context,
    Graph,
    Repacker,
    Threads,
    scratch_from,
)
from abbench.engine.kernels.ggml.library import (
    LIB_ENV,
    Lib,
    block_size,
    lib,
    library_dir,
    row_bytes,
    type_name,
)
from abbench.engine.kernels.ggml.quantizer import quantize, valid_rows
from abbench.errors import ArenaFull, EngineError, GgmlUnavailable

__all__ = [
    "Arena", "ArenaFull", "BF16", "F16", "F32", "GGML_MAX_DIMS", "GGML_MAX_NAME",
    "GGML_MAX_N_THREADS", "GGML_MAX_OP_PARAMS", "GGML_MAX_SRC", "GGML_OBJECT_SIZE", "I32",
    "LIB_ENV",
    "LOG_CALLBACK", "LOG_WARN", "MXFP4", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0",
    "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_K", "ROPE_NEOX", "ROPE_NORMAL", "SORT_DESC",
    "STATUS_SUCCESS", "CPlan", "Context", "EngineError", "GgmlUnavailable", "Graph",
    "InitParams", "Lib", "Repacker", "Rope", "TensorStruct", "Threads", "ThreadpoolParams",
    "block_size", "lib", "library_dir", "quantize", "rope_sections", "row_bytes", "scratch_from",
    "type_name", "valid_rows",
]
