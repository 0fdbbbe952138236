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
import mmap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from ctypes import c_int64

import numpy as np

from abbench.engine.kernels.ggml.abi import (
    F16,
    F32,
    I32,
    PREC_F32,
    SORT_DESC,
    STATUS_SUCCESS,
    InitParams,
    Rope,
    TensorStruct,
    ThreadpoolParams,
)
from abbench.engine.kernels.ggml.library import Lib, type_name
from abbench.errors import ArenaFull, EngineError


class Arena:
    """Memory that the results of a pass's graph take, kept from pass to pass as
    llama.cpp keeps its compute buffer: the contexts made inside `scratch_from(arena)`
    take their scratch here, one after the other, and their graphs their work buffers.
    A fresh allocation per pass would fault its pages in on every pass (a prefill
    pass's graph: about 10 000 faults of 4 KiB here). `reset` hands it out again: every
    graph made from it is then done with. Mapped on first use."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._mem: np.ndarray | None = None
        self._used = 0

    def take(self, nbytes: int) -> np.ndarray:
        """The next `nbytes` (64-byte aligned), or `ArenaFull`."""
        at = -(-self._used // 64) * 64
        if at + nbytes > self.nbytes:
            raise ArenaFull(f"{at + nbytes} bytes asked of an arena of {self.nbytes}")
        if self._mem is None:
            try:
                self._mem = _small_pages(self.nbytes)
            except OSError as e:  # no address space left for it (ulimit -v): another way
                raise ArenaFull(f"an arena of {self.nbytes} bytes cannot be mapped: {e}") from e
        self._used = at + nbytes
        return self._mem[at : at + nbytes]

    def reset(self) -> None:
        self._used = 0


def _small_pages(nbytes: int) -> np.ndarray:
    """`nbytes` of anonymous memory in the kernel's small pages: numpy asks transparent
    huge pages for a large array, whose first touch may wait on the kernel's compaction
    (a prefill graph's 42 MiB first touched in 5 to 81 ms here, 31 ms in small pages)."""
    mm = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mm.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mm, np.uint8)


# The arena that contexts made now take their scratch from (`scratch_from`): the layers
# of a pass's graph are made by each architecture's code, which need not pass it on.
_ARENA: ContextVar[Arena | None] = ContextVar("abbench_ggml_arena", default=None)


@contextmanager
def scratch_from(arena: Arena) -> Iterator[Arena]:
    """Contexts made inside take their scratch from `arena`, and their graphs their work
    buffers (`ArenaFull` where it has no room)."""
    token = _ARENA.set(arena)
    try:
        yield arena
    finally:
        _ARENA.reset(token)


class Context:
    """A ggml context of tensor headers only: every tensor points at memory the caller
    owns and keeps alive for as long as the context's graphs run."""

    def __init__(self, g: Lib, n_tensors: int, graph_size: int = 0,
                 scratch_bytes: int = 0) -> None:
        self.g = g
        self.n_tensors = n_tensors
        # results of `op`: each from the arena in force, as it is made (what it takes,
        # not the most it might), else from memory of its own
        self.arena = _ARENA.get()
        self._scratch = np.zeros(max(1, scratch_bytes if self.arena is None else 0), np.uint8)
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

    def mul_mat_id(self, as_: int, b: int, ids: int, out: int | None = None) -> int:
        """Matrices `as_` (k, m, n_as) chosen by `ids` (I32: n_used, n_tokens) times b
        (k, 1 or n_used, n_tokens) → (m, n_used, n_tokens) F32 at `out` (None: the
        scratch's next bytes)."""
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

    def argsort_desc(self, a: int, out: int | None = None) -> int:
        """Each row's indices from its largest value down (I32) → at `out`."""
        if TensorStruct.from_address(a).type != F32:
            raise EngineError("argsort: not F32")
        return self._result(self.g.base.ggml_argsort(self.ctx, a, SORT_DESC), out)

    # -- the ops gpt-oss's graph adds (biases, YaRN, sinks, its router and experts) -----
    # Each checks what ggml would assert on; with `out` None the result takes the
    # scratch's next bytes, as `op`'s results do.

    def add(self, a: int, b: int, out: int | None = None) -> int:
        """a + b, F32, b repeated over a's extents (a bias (n,) over (n, t)) → at `out`."""
        base = self.g.base
        if _s(a).type != F32 or _s(b).type != F32 or not base.ggml_can_repeat(b, a):
            raise EngineError(f"add: {_shape(b)} does not repeat over {_shape(a)}")
        return self._result(base.ggml_add(self.ctx, a, b), out)

    def add_id(self, a: int, b: int, ids: int, out: int | None = None) -> int:
        """Each row (i1, i2) of `a` (n, n_ids, t) plus row `ids[i1, i2]` of `b` (n, rows):
        per-expert biases on `mul_mat_id`'s results, `ids` (I32: n_ids, t) the experts
        → (n, n_ids, t) F32 at `out`. An id outside b's rows aborts the computation
        (ggml asserts it there, on data this cannot see): callers pass checked ids."""
        sa, sb, si = _s(a), _s(b), _s(ids)
        if (sa.ne[0] != sb.ne[0] or sa.ne[1] != si.ne[0] or sa.ne[2] != si.ne[1]
                or sa.type != F32 or sb.type != F32 or si.type != I32
                or sa.nb[0] != 4 or sb.nb[0] != 4):
            raise EngineError(f"add_id: {_shape(a)} plus rows of {_shape(b)} "
                              f"chosen by {_shape(ids)}")
        return self._result(self.g.base.ggml_add_id(self.ctx, a, b, ids), out)

    def swiglu_oai(self, gate: int, up: int, alpha: float, limit: float,
                   out: int | None = None) -> int:
        """gpt-oss's clamped SwiGLU, elementwise over F32 gate and up of one shape (rows
        contiguous): x = min(gate, limit), y = clamp(up, -limit, limit),
        x / (1 + e^(-alpha x)) * (y + 1) — the gate clamped above only → at `out`."""
        base = self.g.base
        if (_s(gate).type != F32 or _s(up).type != F32 or not base.ggml_are_same_shape(gate, up)
                or not base.ggml_is_contiguous_1(gate) or not base.ggml_is_contiguous_1(up)):
            raise EngineError(f"swiglu_oai: gate {_shape(gate)} and up {_shape(up)} are not "
                              "F32 of one shape with contiguous rows")
        return self._result(base.ggml_swiglu_oai(self.ctx, gate, up, alpha, limit), out)

    def soft_max_ext(self, a: int, mask: int | None, scale: float, max_bias: float = 0.0,
                     out: int | None = None) -> int:
        """softmax(a * scale + mask) over each row of contiguous F32 `a` (n, rows, heads,
        ...): the mask (F32 or F16, n by at least `rows`, contiguous) repeats over heads,
        or is None; `max_bias` > 0 weighs it per head (ALiBi) → at `out`."""
        sa, base = _s(a), self.g.base
        if sa.type != F32 or not base.ggml_is_contiguous(a) or (max_bias > 0 and not mask):
            raise EngineError(f"soft_max_ext: {_shape(a)} is not contiguous F32, or ALiBi "
                              "without a mask")
        if mask:
            sm = _s(mask)
            if (sm.type not in (F32, F16) or not base.ggml_is_contiguous(mask)
                    or sm.ne[0] != sa.ne[0] or sm.ne[1] < sa.ne[1]
                    or sa.ne[2] % sm.ne[2] or sa.ne[3] % sm.ne[3]):
                raise EngineError(f"soft_max_ext: mask {_shape(mask)} does not fit "
                                  f"{_shape(a)}")
        return self._result(base.ggml_soft_max_ext(self.ctx, a, mask, scale, max_bias), out)

    def soft_max_add_sinks(self, kq: int, sinks: int) -> None:
        """Give the softmax node `kq` (a `soft_max_ext` result) one sink per head (F32:
        heads,): a logit that joins each row's max unscaled and adds e^(sink - max) to
        its denominator with no value, so the row sums to less than one."""
        s, ss = _s(kq), _s(sinks)
        if self.g.base.ggml_op_name(s.op) != b"SOFT_MAX" or s.src[2]:
            raise EngineError("soft_max_add_sinks: not a softmax without sinks")
        if ss.type != F32 or ss.nb[0] != 4 or _s(s.src[0]).ne[2] != ss.ne[0]:
            raise EngineError(f"soft_max_add_sinks: sinks {_shape(sinks)} for "
                              f"{_s(s.src[0]).ne[2]} heads")
        self.g.base.ggml_soft_max_add_sinks(kq, sinks)

    def flash_attn_ext(self, q: int, k: int, v: int, mask: int, scale: float,
                       sinks: int | None = None) -> int:
        """Flash attention as llama.cpp's default computes it (build_attn_mha): q (hd, t,
        nq) F32, k and v (hd, n_kv, nkv) F16 with contiguous rows, the mask (n_kv, t) F16
        (0 where a query sees a key, else -inf), KQ times `scale`, the layer's `sinks`
        (F32: nq,) where it has them, F32 accumulators → (hd, nq, t) F32, at the scratch's
        next bytes."""
        sq, sk, sv, sm = _s(q), _s(k), _s(v), _s(mask)
        if (sq.type != F32 or sk.type != F16 or sv.type != F16 or sm.type != F16
                or sk.ne[0] != sq.ne[0] or sv.ne[0] != sq.ne[0] or sk.ne[1] != sv.ne[1]
                or sq.ne[2] % sk.ne[2] or sm.ne[0] != sk.ne[1] or sm.ne[1] < sq.ne[1]
                or sq.nb[0] != 4 or sk.nb[0] != 2 or sv.nb[0] != 2
                or not self.g.base.ggml_is_contiguous(mask)):
            raise EngineError(f"flash_attn_ext: q {_shape(q)}, k {_shape(k)}, v {_shape(v)}, "
                              f"mask {_shape(mask)}")
        base = self.g.base
        t = self._result(base.ggml_flash_attn_ext(self.ctx, q, k, v, mask, scale, 0.0, 0.0),
                         None)
        if sinks is not None:
            if _s(sinks).type != F32 or _s(sinks).ne[0] != sq.ne[2]:
                raise EngineError(f"flash_attn_ext: sinks {_shape(sinks)} for {sq.ne[2]} heads")
            base.ggml_flash_attn_ext_add_sinks(t, sinks)
        base.ggml_prec_set_acc(t, PREC_F32)
        return t

    def get_rows(self, a: int, rows: int, out: int | None = None) -> int:
        """The rows of `a` (n, m, b2, b3) that `rows` (I32: k, b2, b3) names in each batch
        → (n, k, b2, b3), F32 (I32 if `a` is) at `out`: an embedding lookup, or the
        routing logits of the experts chosen."""
        sa, sr = _s(a), _s(rows)
        if sr.type != I32 or sa.ne[2] != sr.ne[1] or sa.ne[3] != sr.ne[2] or sr.ne[3] != 1:
            raise EngineError(f"get_rows: rows {_shape(rows)} of {_shape(a)}")
        return self._result(self.g.base.ggml_get_rows(self.ctx, a, rows), out)

    def top_k(self, a: int, k: int, out: int | None = None) -> int:
        """The indices of each row's `k` largest values, the largest first (I32: k, rows,
        ...): a view of ggml's descending argsort, as `ggml_argsort_top_k` builds it (its
        sort is std::sort: ties fall as llama.cpp's fall). The whole argsort is at `out`."""
        if not 0 < k <= _s(a).ne[0]:
            raise EngineError(f"top_k: {k} of rows of {_s(a).ne[0]}")
        order = self.argsort_desc(a, out)
        so = _s(order)
        return self.op("view_4d", order, k, so.ne[1], so.ne[2], so.ne[3], so.nb[1], so.nb[2],
                       so.nb[3], 0)

    def rope_ext(self, a: int, pos: int, rope: Rope, freq_factors: int | None = None,
                 out: int | None = None) -> int:
        """`a` (head_dim, heads, t) F32 rotated by `pos` (I32: t,) with `rope`'s scalars,
        in ggml's own cosf/sinf/powf (numpy's differ in the last place); dimensions past
        `rope.n_dims` pass through; `freq_factors` (F32, n_dims/2 or more) divide each
        pair's angle, or None → at `out`."""
        sa, sp = _s(a), _s(pos)
        if (sa.type != F32 or sa.nb[0] != 4 or sp.type != I32 or sp.ne[0] != sa.ne[2]
                or tuple(sp.ne[1:]) != (1, 1, 1) or rope.n_dims > sa.ne[0]):
            raise EngineError(f"rope_ext: {_shape(a)} by positions {_shape(pos)}, "
                              f"{rope.n_dims} dimensions")
        if freq_factors and (_s(freq_factors).type != F32
                             or _s(freq_factors).ne[0] < rope.n_dims // 2):
            raise EngineError(f"rope_ext: freq_factors {_shape(freq_factors)}")
        t = self.g.base.ggml_rope_ext(self.ctx, a, pos, freq_factors, *rope.args())
        return self._result(t, out)

    def _result(self, t: int, out: int | None) -> int:
        """`t` given its memory: `out`, else the scratch's next bytes."""
        if not t:
            raise EngineError("ggml: the context is full")
        TensorStruct.from_address(t).data = self._scratch_for(t) if out is None else out
        return t

    def _scratch_for(self, t: int) -> int:
        nbytes = self.g.base.ggml_nbytes(t)
        if self.arena is not None:
            return int(self.arena.take(nbytes).ctypes.data)
        at = -(-self._scratch_used // 64) * 64
        if at + nbytes > self._scratch.nbytes:
            raise EngineError(f"ggml scratch of {self._scratch.nbytes} bytes is full")
        self._scratch_used = at + nbytes
        return self._scratch.ctypes.data + at

    # -- ops whose results live in the context's own scratch (`scratch_bytes`) ---------
    # A view (reshape, permute, view, transpose, the result of a cpy) points into its
    # source and needs no memory; any other result gets the scratch's next bytes. Their
    # shapes are checked by ggml, which aborts on a mismatch: callers build fixed graphs
    # from shapes checked once (`arch/shared/plain_graph.py`).

    def op(self, name: str, *args: object) -> int:
        """ggml_<name>(ctx, *args), its result given memory if it is not a view."""
        t = getattr(self.g.base, "ggml_" + name)(self.ctx, *args)
        if not t:
            raise EngineError(f"ggml_{name} failed: the context is full")
        s = TensorStruct.from_address(t)
        if not s.view_src:
            s.data = self._scratch_for(t)
        elif not s.data:
            raise EngineError(f"ggml_{name}: a view of a tensor without memory")
        return t

    def graph(self, outputs: Sequence[int], threads: Threads) -> Graph:
        return Graph(self, outputs, threads)


def _s(t: int) -> TensorStruct:
    return TensorStruct.from_address(t)


def _shape(t: int) -> tuple[int, ...]:
    """ggml's extents of `t` (innermost first), its trailing ones left out."""
    ne = list(_s(t).ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


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
        size = max(1, self.plan.work_size)
        self._work = np.empty(size, np.uint8) if ctx.arena is None else ctx.arena.take(size)
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
