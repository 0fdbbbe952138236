"""Tensors and graphs over memory this process owns, on ggml's CPU kernels.

Every tensor made here is a view of memory this process owns (numpy arrays, the experts'
arena mappings): the contexts allocate no data, and each tensor's `data` and strides are
set from Python through the mirror of `struct ggml_tensor` (`abi.TensorStruct`, checked
when the library loads: `library.py`).

ggml aborts the process on a failed assertion, so every shape is checked here before a
call that would assert.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import c_int64

import numpy as np

from abbench.engine.ggml.abi import (
    F32,
    I32,
    SORT_DESC,
    STATUS_SUCCESS,
    InitParams,
    TensorStruct,
    ThreadpoolParams,
)
from abbench.engine.ggml.library import Lib, type_name
from abbench.errors import EngineError


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
