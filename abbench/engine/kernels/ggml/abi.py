"""ggml's C interface as abbench uses it, mirrored for ctypes: the enum values, the
structs whose fields Python reads or writes, and every function's prototype (the C
declaration quoted above it where the types alone do not say it). `library.py` declares
the prototypes on the loaded library and checks the `struct ggml_tensor` mirror there.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from ctypes import (
    POINTER,
    Array,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_void_p,
)
from dataclasses import dataclass

from abbench.errors import EngineError

# enum ggml_type (ggml.h): the types abbench computes with.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
I32, BF16 = 26, 30
# 32 values a block in 17 bytes: one E8M0 scale (a power of two) and 32 E2M1 codes, the
# first 16 values in the low nibbles; gpt-oss's experts ship in it.
MXFP4 = 39
GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
GGML_MAX_N_THREADS = 512
GGML_OBJECT_SIZE = 32  # struct ggml_object: offs, size, next, type + 4 bytes of padding
STATUS_SUCCESS = 0
SORT_DESC = 1  # enum ggml_sort_order
PREC_F32 = 10  # enum ggml_prec: F32 accumulators
ROPE_NORMAL, ROPE_NEOX = 0, 2  # GGML_ROPE_TYPE_*: pairs (2i, 2i+1), or (i, i + n_dims/2)


def rope_sections(sections: Sequence[int]) -> Array[c_int]:
    """`ggml_rope_multi`'s `int sections[4]` (M-RoPE's dimensions per position kind)."""
    return (c_int * 4)(*sections)


@dataclass(frozen=True)
class Rope:
    """The scalars `ggml_rope_ext` takes after its tensors, in its order. The defaults
    are plain RoPE (llama.cpp's when a file names no scaling); YaRN is `ext_factor` 1
    with `freq_scale` = 1/factor, its ramp between the dimensions that `beta_fast` and
    `beta_slow` rotations fit in `n_ctx_orig` positions, and `attn_factor` scaling
    cos and sin (ggml multiplies it by its own 1 + 0.1 ln(factor) when YaRN is on)."""

    n_dims: int  # the leading dimensions of each head that rotate; the rest pass through
    mode: int  # ROPE_NORMAL or ROPE_NEOX
    n_ctx_orig: int
    freq_base: float
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self) -> None:
        # ggml asserts on an odd n_dims and on the modes this type does not take (MROPE
        # and VISION have other entry points), aborting the process.
        if self.n_dims <= 0 or self.n_dims % 2:
            raise EngineError(f"rope: n_dims {self.n_dims} is not a positive even number")
        if self.mode not in (ROPE_NORMAL, ROPE_NEOX):
            raise EngineError(f"rope: mode {self.mode} is neither normal (0) nor NeoX (2)")
        if self.n_ctx_orig < 0:
            raise EngineError(f"rope: n_ctx_orig {self.n_ctx_orig} is negative")
        scalars = (self.freq_base, self.freq_scale, self.ext_factor, self.attn_factor,
                   self.beta_fast, self.beta_slow)
        if not all(math.isfinite(v) for v in scalars):
            raise EngineError(f"rope: a scalar is not finite: {scalars}")
        if self.freq_base <= 0 or self.freq_scale <= 0:
            raise EngineError(f"rope: freq_base {self.freq_base} and freq_scale "
                              f"{self.freq_scale} must be positive")

    def args(self) -> tuple[int, int, int, float, float, float, float, float, float]:
        """`ggml_rope_ext`'s arguments after a, b and c."""
        return (self.n_dims, self.mode, self.n_ctx_orig, self.freq_base, self.freq_scale,
                self.ext_factor, self.attn_factor, self.beta_fast, self.beta_slow)


# struct ggml_tensor {
#     enum ggml_type type; struct ggml_backend_buffer * buffer;
#     int64_t ne[GGML_MAX_DIMS]; size_t nb[GGML_MAX_DIMS];
#     enum ggml_op op; int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)];
#     int32_t flags; struct ggml_tensor * src[GGML_MAX_SRC];
#     struct ggml_tensor * view_src; size_t view_offs; void * data;
#     char name[GGML_MAX_NAME]; void * extra; char padding[8];
# };
class TensorStruct(Structure):
    _fields_ = [
        ("type", c_int), ("buffer", c_void_p),
        ("ne", c_int64 * GGML_MAX_DIMS), ("nb", c_size_t * GGML_MAX_DIMS),
        ("op", c_int), ("op_params", c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", c_int32), ("src", c_void_p * GGML_MAX_SRC),
        ("view_src", c_void_p), ("view_offs", c_size_t), ("data", c_void_p),
        ("name", c_char * GGML_MAX_NAME), ("extra", c_void_p), ("padding", c_char * 8),
    ]


# struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; };
class InitParams(Structure):
    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


# struct ggml_cplan { size_t work_size; uint8_t * work_data; int n_threads;
#     struct ggml_threadpool * threadpool; ggml_abort_callback abort_callback;
#     void * abort_callback_data; bool use_ref; }: made by ggml_graph_plan, then passed back
# by pointer with `work_data` set.
class CPlan(Structure):
    _fields_ = [("work_size", c_size_t), ("work_data", c_void_p), ("n_threads", c_int),
                ("threadpool", c_void_p), ("abort_callback", c_void_p),
                ("abort_callback_data", c_void_p), ("use_ref", c_bool)]


# struct ggml_threadpool_params { bool cpumask[GGML_MAX_N_THREADS]; int n_threads;
#     enum ggml_sched_priority prio; uint32_t poll; bool strict_cpu; bool paused; };
class ThreadpoolParams(Structure):
    _fields_ = [("cpumask", c_bool * GGML_MAX_N_THREADS), ("n_threads", c_int),
                ("prio", c_int), ("poll", c_uint32), ("strict_cpu", c_bool),
                ("paused", c_bool)]


# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text,
#                                   void * user_data);
LOG_CALLBACK = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
LOG_WARN = 3  # enum ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT

T = c_void_p  # struct ggml_tensor *
P = c_void_p  # any other pointer: a context, graph, buffer, threadpool, ...

# (library, function, return type, argument types), in the order they are declared: the
# `base` library's and the `cpu` one's (libggml-base.so, libggml-cpu.so).
PROTOTYPES: tuple[tuple[str, str, object, tuple[object, ...]], ...] = (
    # struct ggml_context * ggml_init(struct ggml_init_params params);
    ("base", "ggml_init", P, (InitParams,)),
    ("base", "ggml_free", None, (P,)),
    ("base", "ggml_tensor_overhead", c_size_t, ()),
    ("base", "ggml_graph_overhead_custom", c_size_t, (c_size_t, c_bool)),
    ("base", "ggml_type_size", c_size_t, (c_int,)),
    ("base", "ggml_blck_size", c_int64, (c_int,)),
    ("base", "ggml_row_size", c_size_t, (c_int, c_int64)),
    ("base", "ggml_type_name", c_char_p, (c_int,)),
    ("base", "ggml_nbytes", c_size_t, (T,)),
    ("base", "ggml_op_name", c_char_p, (c_int,)),
    ("base", "ggml_is_contiguous", c_bool, (T,)),
    ("base", "ggml_is_contiguous_1", c_bool, (T,)),  # every dimension but the second
    ("base", "ggml_are_same_shape", c_bool, (T, T)),
    # bool ggml_can_repeat(t0, t1): t1's extents are whole multiples of t0's
    ("base", "ggml_can_repeat", c_bool, (T, T)),
    ("base", "ggml_get_data", P, (T,)),
    ("base", "ggml_set_name", T, (T, c_char_p)),
    # struct ggml_tensor * ggml_new_tensor(ctx, enum ggml_type, int n_dims,
    #                                      const int64_t * ne);
    ("base", "ggml_new_tensor", T, (P, c_int, c_int, POINTER(c_int64))),
    ("base", "ggml_mul_mat", T, (P, T, T)),
    ("base", "ggml_mul_mat_id", T, (P, T, T, T)),
    ("base", "ggml_swiglu_split", T, (P, T, T)),
    # ggml_swiglu_oai(ctx, a (gate), b (up), float alpha, float limit)
    ("base", "ggml_swiglu_oai", T, (P, T, T, c_float, c_float)),
    ("base", "ggml_soft_max", T, (P, T)),
    # struct ggml_tensor * ggml_soft_max_ext(ctx, a, mask, float scale,
    #                                        float max_bias);
    ("base", "ggml_soft_max_ext", T, (P, T, T, c_float, c_float)),
    # void ggml_soft_max_add_sinks(struct ggml_tensor * a, struct ggml_tensor * sinks);
    ("base", "ggml_soft_max_add_sinks", None, (T, T)),
    # flash attention, as llama.cpp's default computes it on CPU (`--flash-attn`):
    # ggml_flash_attn_ext(ctx, q, k, v, mask (F16), float scale, float max_bias,
    #     float logit_softcap); its sinks; bool ggml_prec_set_acc(a, enum ggml_prec);
    # ggml_cast(ctx, a, enum ggml_type) (the F16 mask)
    ("base", "ggml_flash_attn_ext", T, (P, T, T, T, T, c_float, c_float, c_float)),
    ("base", "ggml_flash_attn_ext_add_sinks", None, (T, T)),
    ("base", "ggml_prec_set_acc", c_bool, (T, c_int)),
    ("base", "ggml_cast", T, (P, T, c_int)),
    ("base", "ggml_rms_norm", T, (P, T, c_float)),
    ("base", "ggml_mul", T, (P, T, T)),
    ("base", "ggml_add", T, (P, T, T)),
    # dst[i0, i1, i2] = a[i0, i1, i2] + b[i0, ids[i1, i2]]
    ("base", "ggml_add_id", T, (P, T, T, T)),
    # ggml_get_rows(ctx, a (data), b (I32 row indices))
    ("base", "ggml_get_rows", T, (P, T, T)),
    ("base", "ggml_cpy", T, (P, T, T)),
    ("base", "ggml_cont", T, (P, T)),
    ("base", "ggml_cont_2d", T, (P, T, c_int64, c_int64)),
    ("base", "ggml_transpose", T, (P, T)),
    ("base", "ggml_permute", T, (P, T, c_int, c_int, c_int, c_int)),
    ("base", "ggml_reshape_1d", T, (P, T, c_int64)),
    ("base", "ggml_reshape_2d", T, (P, T, c_int64, c_int64)),
    ("base", "ggml_reshape_3d", T, (P, T, c_int64, c_int64, c_int64)),
    ("base", "ggml_reshape_4d", T, (P, T, c_int64, c_int64, c_int64, c_int64)),
    # ggml_view_1d(ctx, a, ne0, size_t offset); _2d(ctx, a, ne0, ne1, size_t nb1,
    # size_t offset); _3d adds ne2, nb2; _4d adds ne3, nb3
    ("base", "ggml_view_1d", T, (P, T, c_int64, c_size_t)),
    ("base", "ggml_view_2d", T, (P, T, c_int64, c_int64, c_size_t, c_size_t)),
    ("base", "ggml_view_3d", T, (P, T, c_int64, c_int64, c_int64, c_size_t, c_size_t,
                                 c_size_t)),
    ("base", "ggml_view_4d", T, (P, T, c_int64, c_int64, c_int64, c_int64, c_size_t,
                                 c_size_t, c_size_t, c_size_t)),
    # ggml_rope_ext(ctx, a, b (positions, I32), c (freq factors or NULL), int n_dims,
    #     int mode, int n_ctx_orig, float freq_base, float freq_scale,
    #     float ext_factor, float attn_factor, float beta_fast, float beta_slow)
    ("base", "ggml_rope_ext", T, (P, T, T, T, c_int, c_int, c_int, c_float, c_float, c_float,
                                  c_float, c_float, c_float)),
    # struct ggml_tensor * ggml_argsort(ctx, a, enum ggml_sort_order order);
    ("base", "ggml_argsort", T, (P, T, c_int)),
    # qwen35moe's graph: the gates' unary ops, the L2 norm's scale, the causal conv over
    # concat(state, inputs), the fused delta rule, the multi-section RoPE
    ("base", "ggml_sigmoid", T, (P, T)),
    ("base", "ggml_silu", T, (P, T)),
    ("base", "ggml_softplus", T, (P, T)),
    ("base", "ggml_scale", T, (P, T, c_float)),
    # the router's weights as build_moe_ffn makes them: sum_rows, clamp(min, max), div
    ("base", "ggml_sum_rows", T, (P, T)),
    ("base", "ggml_clamp", T, (P, T, c_float, c_float)),
    ("base", "ggml_div", T, (P, T, T)),
    ("base", "ggml_concat", T, (P, T, T, c_int)),  # (ctx, a, b, int dim)
    ("base", "ggml_ssm_conv", T, (P, T, T)),  # (ctx, sx, c)
    # ggml_gated_delta_net(ctx, q, k, v, g, beta, state, int64_t K (state snapshots))
    ("base", "ggml_gated_delta_net", T, (P, T, T, T, T, T, T, c_int64)),
    # ggml_rope_multi(ctx, a, b (I32: 4 positions a token), c, int n_dims,
    #     int sections[4], int mode, int n_ctx_orig, float freq_base, float freq_scale,
    #     float ext_factor, float attn_factor, float beta_fast, float beta_slow)
    ("base", "ggml_rope_multi", T, (P, T, T, T, c_int, POINTER(c_int), c_int, c_int, c_float,
                                    c_float, c_float, c_float, c_float, c_float)),
    # gemma4's graph: GeGLU (ggml's GELU table on the gate, times up), the logits' softcap
    ("base", "ggml_geglu_split", T, (P, T, T)),
    ("base", "ggml_tanh", T, (P, T)),
    ("base", "ggml_new_graph_custom", P, (P, c_size_t, c_bool)),
    ("base", "ggml_build_forward_expand", None, (P, T)),
    ("base", "ggml_graph_n_nodes", c_int, (P,)),
    # size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst,
    #     int64_t start, int64_t nrows, int64_t n_per_row, const float * imatrix);
    ("base", "ggml_quantize_chunk", c_size_t, (c_int, POINTER(c_float), P, c_int64, c_int64,
                                               c_int64, POINTER(c_float))),
    ("base", "ggml_quantize_requires_imatrix", c_bool, (c_int,)),
    ("base", "ggml_validate_row_data", c_bool, (c_int, P, c_size_t)),
    ("base", "ggml_threadpool_params_init", None, (POINTER(ThreadpoolParams), c_int)),
    # the backend registry, for the CPU backend's "extra" buffer types (repack)
    ("cpu", "ggml_backend_cpu_reg", P, ()),
    ("base", "ggml_backend_reg_dev_get", P, (P, c_size_t)),
    ("base", "ggml_backend_reg_get_proc_address", P, (P, c_char_p)),
    ("base", "ggml_backend_buft_name", c_char_p, (P,)),
    ("base", "ggml_backend_buft_alloc_buffer", P, (P, c_size_t)),
    ("base", "ggml_backend_buffer_init_tensor", c_int, (P, T)),
    # void ggml_backend_tensor_set(tensor, const void * data, size_t offset,
    #                              size_t size);
    ("base", "ggml_backend_tensor_set", None, (T, P, c_size_t, c_size_t)),
    # void ggml_log_set(ggml_log_callback log_callback, void * user_data);
    ("base", "ggml_log_set", None, (P, P)),
    ("cpu", "ggml_cpu_init", None, ()),
    ("cpu", "ggml_threadpool_new", P, (POINTER(ThreadpoolParams),)),
    ("cpu", "ggml_threadpool_free", None, (P,)),
    ("cpu", "ggml_graph_plan", CPlan, (P, c_int, P)),
    ("cpu", "ggml_graph_compute", c_int, (P, POINTER(CPlan))),
    ("cpu", "ggml_cpu_has_avx2", c_int, ()),
    ("cpu", "ggml_cpu_has_avx512", c_int, ()),
    ("cpu", "ggml_cpu_has_neon", c_int, ()),
    ("cpu", "ggml_cpu_has_dotprod", c_int, ()),
)
