"""ggml's CPU kernels through ctypes: the one module of abbench that touches a foreign
function.

The library is the `libggml-base` / `libggml-cpu` pair that `llama-cpp-python` builds and
ships in `llama_cpp/lib/` (a dependency of abbench, built for this machine at install
time); `ABBENCH_GGML_LIB=DIR` points at another build (a folder holding both). The package
itself is never imported — it would load libllama too — only its folder is found.

Every tensor made here is a view of memory this process owns (numpy arrays, the experts'
arena mappings): the contexts allocate no data, and each tensor's `data` and strides are
set from Python through a mirror of `struct ggml_tensor`. That mirror is checked against
the library when it is loaded (its size, and fields read back after ggml wrote them), so
a library of another layout is refused with a message instead of corrupting memory.

ggml aborts the process on a failed assertion, so every shape is checked here before a
call that would assert.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from ctypes import (
    POINTER,
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
from pathlib import Path

import numpy as np

from abbench.errors import EngineError, GgmlUnavailable

LIB_ENV = "ABBENCH_GGML_LIB"

# enum ggml_type (ggml.h): the types abbench computes with.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
I32, BF16 = 26, 30
GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
GGML_MAX_N_THREADS = 512
GGML_OBJECT_SIZE = 32  # struct ggml_object: offs, size, next, type + 4 bytes of padding
STATUS_SUCCESS = 0
SORT_DESC = 1  # enum ggml_sort_order


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


def library_dir() -> Path | None:
    """The folder holding libggml-base and libggml-cpu: `ABBENCH_GGML_LIB`, else the
    `llama_cpp/lib` folder of the installed llama-cpp-python (found, not imported)."""
    env = os.environ.get(LIB_ENV)
    if env:
        return Path(env)
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _declare(lib: ctypes.CDLL, name: str, restype: object, *argtypes: object) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


class Lib:
    """The loaded pair and its declared functions (`base` and `cpu`)."""

    def __init__(self, folder: Path) -> None:
        names = {"base": "libggml-base.so", "cpu": "libggml-cpu.so"}
        paths = {k: folder / v for k, v in names.items()}
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            raise GgmlUnavailable(f"ggml's library is not there: {', '.join(missing)}")
        try:
            self.base = ctypes.CDLL(str(paths["base"]), mode=ctypes.RTLD_GLOBAL)
            self.cpu = ctypes.CDLL(str(paths["cpu"]), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise GgmlUnavailable(f"ggml's library in {folder} does not load: {e}") from e
        self.folder = folder
        b, c, t, vp = self.base, self.cpu, c_void_p, c_void_p
        try:
            # struct ggml_context * ggml_init(struct ggml_init_params params);
            _declare(b, "ggml_init", vp, InitParams)
            _declare(b, "ggml_free", None, vp)
            _declare(b, "ggml_tensor_overhead", c_size_t)
            _declare(b, "ggml_graph_overhead_custom", c_size_t, c_size_t, c_bool)
            _declare(b, "ggml_type_size", c_size_t, c_int)
            _declare(b, "ggml_blck_size", c_int64, c_int)
            _declare(b, "ggml_row_size", c_size_t, c_int, c_int64)
            _declare(b, "ggml_type_name", c_char_p, c_int)
            _declare(b, "ggml_nbytes", c_size_t, t)
            _declare(b, "ggml_get_data", vp, t)
            _declare(b, "ggml_set_name", t, t, c_char_p)
            # struct ggml_tensor * ggml_new_tensor(ctx, enum ggml_type, int n_dims,
            #                                      const int64_t * ne);
            _declare(b, "ggml_new_tensor", t, vp, c_int, c_int, POINTER(c_int64))
            _declare(b, "ggml_mul_mat", t, vp, t, t)
            _declare(b, "ggml_mul_mat_id", t, vp, t, t, t)
            _declare(b, "ggml_swiglu_split", t, vp, t, t)
            _declare(b, "ggml_soft_max", t, vp, t)
            # struct ggml_tensor * ggml_soft_max_ext(ctx, a, mask, float scale,
            #                                        float max_bias);
            _declare(b, "ggml_soft_max_ext", t, vp, t, t, c_float, c_float)
            _declare(b, "ggml_rms_norm", t, vp, t, c_float)
            _declare(b, "ggml_mul", t, vp, t, t)
            _declare(b, "ggml_add", t, vp, t, t)
            _declare(b, "ggml_cpy", t, vp, t, t)
            _declare(b, "ggml_cont", t, vp, t)
            _declare(b, "ggml_transpose", t, vp, t)
            _declare(b, "ggml_permute", t, vp, t, c_int, c_int, c_int, c_int)
            _declare(b, "ggml_reshape_2d", t, vp, t, c_int64, c_int64)
            _declare(b, "ggml_reshape_3d", t, vp, t, c_int64, c_int64, c_int64)
            # ggml_view_2d(ctx, a, ne0, ne1, size_t nb1, size_t offset); _3d adds ne2, nb2
            _declare(b, "ggml_view_2d", t, vp, t, c_int64, c_int64, c_size_t, c_size_t)
            _declare(b, "ggml_view_3d", t, vp, t, c_int64, c_int64, c_int64, c_size_t,
                     c_size_t, c_size_t)
            # ggml_rope_ext(ctx, a, b (positions, I32), c (freq factors or NULL), int n_dims,
            #     int mode, int n_ctx_orig, float freq_base, float freq_scale,
            #     float ext_factor, float attn_factor, float beta_fast, float beta_slow)
            _declare(b, "ggml_rope_ext", t, vp, t, t, t, c_int, c_int, c_int, c_float,
                     c_float, c_float, c_float, c_float, c_float)
            # struct ggml_tensor * ggml_argsort(ctx, a, enum ggml_sort_order order);
            _declare(b, "ggml_argsort", t, vp, t, c_int)
            _declare(b, "ggml_new_graph_custom", vp, vp, c_size_t, c_bool)
            _declare(b, "ggml_build_forward_expand", None, vp, t)
            _declare(b, "ggml_graph_n_nodes", c_int, vp)
            # size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst,
            #     int64_t start, int64_t nrows, int64_t n_per_row, const float * imatrix);
            _declare(b, "ggml_quantize_chunk", c_size_t, c_int, POINTER(c_float), vp,
                     c_int64, c_int64, c_int64, POINTER(c_float))
            _declare(b, "ggml_quantize_requires_imatrix", c_bool, c_int)
            _declare(b, "ggml_validate_row_data", c_bool, c_int, vp, c_size_t)
            _declare(b, "ggml_threadpool_params_init", None, POINTER(ThreadpoolParams), c_int)
            # the backend registry, for the CPU backend's "extra" buffer types (repack)
            _declare(c, "ggml_backend_cpu_reg", vp)
            _declare(b, "ggml_backend_reg_dev_get", vp, vp, c_size_t)
            _declare(b, "ggml_backend_reg_get_proc_address", vp, vp, c_char_p)
            _declare(b, "ggml_backend_buft_name", c_char_p, vp)
            _declare(b, "ggml_backend_buft_alloc_buffer", vp, vp, c_size_t)
            _declare(b, "ggml_backend_buffer_init_tensor", c_int, vp, t)
            # void ggml_backend_tensor_set(tensor, const void * data, size_t offset,
            #                              size_t size);
            _declare(b, "ggml_backend_tensor_set", None, t, vp, c_size_t, c_size_t)
            # void ggml_log_set(ggml_log_callback log_callback, void * user_data);
            _declare(b, "ggml_log_set", None, vp, vp)
            _declare(c, "ggml_cpu_init", None)
            _declare(c, "ggml_threadpool_new", vp, POINTER(ThreadpoolParams))
            _declare(c, "ggml_threadpool_free", None, vp)
            _declare(c, "ggml_graph_plan", CPlan, vp, c_int, vp)
            _declare(c, "ggml_graph_compute", c_int, vp, POINTER(CPlan))
            _declare(c, "ggml_cpu_has_avx2", c_int)
            _declare(c, "ggml_cpu_has_avx512", c_int)
            _declare(c, "ggml_cpu_has_neon", c_int)
            _declare(c, "ggml_cpu_has_dotprod", c_int)
        except AttributeError as e:
            raise GgmlUnavailable(f"ggml's library in {folder} lacks a function: {e}") from e
        c.ggml_cpu_init()
        self._check_layout()
        # ggml's informational lines (one per repacked tensor, ...) would interleave with
        # abbench's output: only its warnings and errors reach stderr.
        self._log = LOG_CALLBACK(_log_warnings)
        b.ggml_log_set(ctypes.cast(self._log, c_void_p), None)

    def extra_buffer_type(self, name: str) -> int | None:
        """The CPU backend's extra buffer type called `name` (CPU_REPACK, AMX), or None."""
        reg = self.cpu.ggml_backend_cpu_reg()
        dev = self.base.ggml_backend_reg_dev_get(reg, 0)
        fn = self.base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if not dev or not fn:
            return None
        types = ctypes.CFUNCTYPE(POINTER(c_void_p), c_void_p)(fn)(dev)
        i = 0
        while types and types[i]:
            if self.base.ggml_backend_buft_name(types[i]) == name.encode():
                return int(types[i])
            i += 1
        return None

    def _check_layout(self) -> None:
        """Refuse a library whose `struct ggml_tensor` is not the mirror's."""
        b = self.base
        if b.ggml_tensor_overhead() != GGML_OBJECT_SIZE + ctypes.sizeof(TensorStruct):
            raise GgmlUnavailable(
                f"ggml in {self.folder}: struct ggml_tensor has another size "
                f"({b.ggml_tensor_overhead() - GGML_OBJECT_SIZE} bytes, this module mirrors "
                f"{ctypes.sizeof(TensorStruct)})")
        ctx = Context(self, 2)
        ne = (64, 3)
        t = ctx.tensor(Q8_0, ne, 0x1000)
        b.ggml_set_name(t, b"probe")
        s = TensorStruct.from_address(t)
        if (s.type != Q8_0 or tuple(s.ne[:2]) != ne or s.nb[1] != b.ggml_row_size(Q8_0, 64)
                or b.ggml_get_data(t) != 0x1000 or s.name != b"probe"
                or b.ggml_nbytes(t) != 3 * b.ggml_row_size(Q8_0, 64)):
            raise GgmlUnavailable(f"ggml in {self.folder}: struct ggml_tensor's fields are "
                                  "not where this module expects them")

    def cpu_features(self) -> str:
        c = self.cpu
        have = [n for n, f in (("avx2", c.ggml_cpu_has_avx2), ("avx512", c.ggml_cpu_has_avx512),
                               ("neon", c.ggml_cpu_has_neon), ("dotprod", c.ggml_cpu_has_dotprod))
                if f()]
        return "+".join(have) or "generic"


# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text,
#                                   void * user_data);
LOG_CALLBACK = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
LOG_WARN = 3  # enum ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT


def _log_warnings(level: int, text: bytes | None, _: object) -> None:
    if level >= LOG_WARN and level != 5 and text:
        sys.stderr.write("ggml: " + text.decode(errors="replace"))


class Repacker:
    """ggml's CPU_REPACK buffer type: a quantized matrix re-laid at load (rows interleaved
    for this CPU's SIMD kernels, the same size), which ggml's matrix products then read
    with other kernels — llama.cpp's default (`--repack`). A tensor is marked repacked by
    pointing it at a token buffer of that type (its memory stays ours); only types and
    shapes the CPU has a layout for take it (`attach`)."""

    def __init__(self, g: Lib) -> None:
        self.g = g
        buft = g.extra_buffer_type("CPU_REPACK")
        if buft is None:
            raise EngineError("this ggml has no CPU_REPACK buffer type")
        self.buffer = g.base.ggml_backend_buft_alloc_buffer(buft, 4096)
        if not self.buffer:
            raise EngineError("ggml: cannot allocate a CPU_REPACK buffer")

    def attach(self, t: int) -> bool:
        """Mark `t` (its data already ours) as repacked, if its type and shape have a
        layout here; → whether they do."""
        s = TensorStruct.from_address(t)
        s.buffer = self.buffer
        self.g.base.ggml_backend_buffer_init_tensor(self.buffer, t)
        if not s.extra:
            s.buffer = None
            return False
        return True

    def write(self, t: int, src: int) -> None:
        """Lay `t`'s plain bytes, read from address `src`, into `t`'s memory (an attached
        tensor; `src` elsewhere)."""
        self.g.base.ggml_backend_tensor_set(t, src, 0, self.g.base.ggml_nbytes(t))


@functools.cache
def _load(folder: str) -> Lib:
    return Lib(Path(folder))


def lib() -> Lib:
    """ggml, loaded once per process; `GgmlUnavailable` says why not."""
    folder = library_dir()
    if folder is None:
        raise GgmlUnavailable(
            "ggml's library was not found: llama-cpp-python is not installed",
            tip=f"pip install -e . installs it; or set {LIB_ENV} to a folder with "
                "libggml-base.so and libggml-cpu.so")
    return _load(str(folder))


def type_name(gtype: int) -> str:
    return lib().base.ggml_type_name(gtype).decode()


def row_bytes(gtype: int, n: int) -> int:
    return int(lib().base.ggml_row_size(gtype, n))


def block_size(gtype: int) -> int:
    return int(lib().base.ggml_blck_size(gtype))


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


class Context:
    """A ggml context of tensor headers only: every tensor points at memory the caller
    owns and keeps alive for as long as the context's graphs run."""

    def __init__(self, g: Lib, n_tensors: int, graph_size: int = 0,
                 scratch_bytes: int = 0) -> None:
        self.g = g
        self._scratch = np.zeros(max(1, scratch_bytes), np.uint8)  # results of `op`
        self._scratch_used = 0
        size = n_tensors * g.base.ggml_tensor_overhead() + 1024
        self.graph_size = graph_size  # nodes and leaves a graph of this context may have
        if graph_size:
            size += g.base.ggml_graph_overhead_custom(graph_size, False)
        self._mem = np.zeros(size, np.uint8)  # the headers live here, freed with the context
        self.ctx = g.base.ggml_init(InitParams(size, self._mem.ctypes.data, True))
        if not self.ctx:
            raise EngineError("ggml_init failed")

    def close(self) -> None:
        if self.ctx:
            self.g.base.ggml_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()

    def tensor(self, gtype: int, ne: Sequence[int], data: int,
               nb: Sequence[int] | None = None) -> int:
        """A tensor of `gtype` with ggml's extents `ne` (innermost first) at address
        `data`, with strides `nb` (bytes, innermost first; default: contiguous)."""
        if ne[0] % self.g.base.ggml_blck_size(gtype):
            raise EngineError(f"{ne[0]} values are not whole {type_name(gtype)} blocks")
        dims = (c_int64 * len(ne))(*ne)
        t = self.g.base.ggml_new_tensor(self.ctx, gtype, len(ne), dims)
        if not t:
            raise EngineError("ggml_new_tensor failed: the context is full")
        s = TensorStruct.from_address(t)
        s.data = data
        if nb is not None:
            for i, v in enumerate(nb):
                s.nb[i] = v
        return t

    def set_data(self, t: int, data: int) -> None:
        TensorStruct.from_address(t).data = data

    def array(self, t: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """A numpy view of `t`'s memory (which must outlive it: the context's scratch, or
        the caller's buffer)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if nbytes > self.g.base.ggml_nbytes(t):
            raise EngineError("array: larger than the tensor")
        raw = (ctypes.c_uint8 * nbytes).from_address(TensorStruct.from_address(t).data)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def mul_mat(self, a: int, b: int, out: int) -> int:
        """a (ne: k, m[, ...]) times b (k, n[, ...]) → (m, n[, ...]) F32 at `out`."""
        sa, sb = TensorStruct.from_address(a), TensorStruct.from_address(b)
        if sa.ne[0] != sb.ne[0] or sb.type != F32:
            raise EngineError(f"mul_mat: ({sa.ne[0]}, {sa.ne[1]}) by ({sb.ne[0]}, {sb.ne[1]})")
        return self._result(self.g.base.ggml_mul_mat(self.ctx, a, b), out)

    def mul_mat_id(self, as_: int, b: int, ids: int, out: int) -> int:
        """Matrices `as_` (k, m, n_as) chosen by `ids` (I32: n_used, n_tokens) times b
        (k, 1 or n_used, n_tokens) → (m, n_used, n_tokens) F32 at `out`."""
        sa, sb, si = (TensorStruct.from_address(x) for x in (as_, b, ids))
        if (sa.ne[0] != sb.ne[0] or si.type != I32 or si.ne[1] != sb.ne[2]
                or si.ne[0] % sb.ne[1] or sb.type != F32 or sa.nb[0] > sa.nb[1]):
            raise EngineError("mul_mat_id: shapes do not fit")
        return self._result(self.g.base.ggml_mul_mat_id(self.ctx, as_, b, ids), out)

    def swiglu_split(self, gate: int, up: int, out: int) -> int:
        """silu(gate) * up, elementwise (F32, same shapes) → at `out`."""
        sg, su = TensorStruct.from_address(gate), TensorStruct.from_address(up)
        if tuple(sg.ne) != tuple(su.ne):
            raise EngineError("swiglu: gate and up differ in shape")
        return self._result(self.g.base.ggml_swiglu_split(self.ctx, gate, up), out)

    def soft_max(self, a: int, out: int) -> int:
        """softmax over each row of F32 `a` → at `out` (ggml's own exp and sums)."""
        if TensorStruct.from_address(a).type != F32:
            raise EngineError("soft_max: not F32")
        return self._result(self.g.base.ggml_soft_max(self.ctx, a), out)

    def argsort_desc(self, a: int, out: int) -> int:
        """Each row's indices from its largest value down (I32) → at `out`."""
        if TensorStruct.from_address(a).type != F32:
            raise EngineError("argsort: not F32")
        return self._result(self.g.base.ggml_argsort(self.ctx, a, SORT_DESC), out)

    def _result(self, t: int, out: int) -> int:
        if not t:
            raise EngineError("ggml: the context is full")
        TensorStruct.from_address(t).data = out
        return t

    # -- ops whose results live in the context's own scratch (`scratch_bytes`) ---------
    # A view (reshape, permute, view, transpose, the result of a cpy) points into its
    # source and needs no memory; any other result gets the scratch's next bytes. Their
    # shapes are checked by ggml, which aborts on a mismatch: callers build fixed graphs
    # from shapes checked once (`arch/qwen3moe_graph.py`).

    def op(self, name: str, *args: object) -> int:
        """ggml_<name>(ctx, *args), its result given memory if it is not a view."""
        t = getattr(self.g.base, "ggml_" + name)(self.ctx, *args)
        if not t:
            raise EngineError(f"ggml_{name} failed: the context is full")
        s = TensorStruct.from_address(t)
        if not s.view_src:
            nbytes = self.g.base.ggml_nbytes(t)
            at = -(-self._scratch_used // 64) * 64
            if at + nbytes > self._scratch.nbytes:
                raise EngineError(f"ggml scratch of {self._scratch.nbytes} bytes is full")
            s.data = self._scratch.ctypes.data + at
            self._scratch_used = at + nbytes
        elif not s.data:
            raise EngineError(f"ggml_{name}: a view of a tensor without memory")
        return t

    def graph(self, outputs: Sequence[int], threads: Threads) -> Graph:
        return Graph(self, outputs, threads)


class Threads:
    """ggml's persistent thread pool of `n` threads (the caller is the first); graphs
    computed with it reuse its threads."""

    def __init__(self, g: Lib, n: int) -> None:
        self.g, self.n = g, max(1, n)
        params = ThreadpoolParams()
        g.base.ggml_threadpool_params_init(ctypes.byref(params), self.n)
        self.pool = g.cpu.ggml_threadpool_new(ctypes.byref(params))
        if not self.pool:
            raise EngineError("ggml_threadpool_new failed")

    def close(self) -> None:
        if self.pool:
            self.g.cpu.ggml_threadpool_free(self.pool)
            self.pool = None


class Graph:
    """A graph over a context's tensors, planned once; `compute()` runs it."""

    def __init__(self, ctx: Context, outputs: Sequence[int], threads: Threads) -> None:
        g = ctx.g
        self.ctx = ctx
        if not ctx.graph_size:
            raise EngineError("the context has no room for a graph")
        self.graph = g.base.ggml_new_graph_custom(ctx.ctx, ctx.graph_size, False)
        for t in outputs:
            g.base.ggml_build_forward_expand(self.graph, t)
        self.plan = g.cpu.ggml_graph_plan(self.graph, threads.n, threads.pool)
        self._work = np.empty(max(1, self.plan.work_size), np.uint8)
        self.plan.work_data = self._work.ctypes.data
        self._plan_ref = ctypes.byref(self.plan)
        self._compute = g.cpu.ggml_graph_compute

    def compute(self) -> None:
        status = self._compute(self.graph, self._plan_ref)
        if status != STATUS_SUCCESS:
            raise EngineError(f"ggml_graph_compute failed (status {status})")
