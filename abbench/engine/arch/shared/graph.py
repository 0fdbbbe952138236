"""What the architectures' ggml graph models share: the output graph, the KV cache (its
record, the ring writes, the attention over it), the in-graph weighted sum of a decode
layer's experts, the decode graphs' cache and the interface every `GraphModel` answers
alike, a prefill batch as one graph included. The attended lengths and the masks are
`masks.py`.

Each `*_graph.py` builds its layers as llama.cpp's graph for its architecture; the final
norm and the output projection are the same graph for every one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from abbench.engine.arch.shared.common import RoutingHook, embedding, pad
from abbench.engine.arch.shared.token_graph import TokenGraph, token_graph, weighted_experts
from abbench.engine.experts.in_graph import in_graph, layer_stack
from abbench.engine.kernels import ggml

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.kernels.qcompute import QuantTeam, Weight
    from abbench.engine.streaming.slots import SlotPool

T = TypeVar("T")

# llama.cpp's RoPE settings without scaling: freq_scale, ext_factor, attn_factor,
# beta_fast, beta_slow (llama_hparams' defaults; ext_factor 0 turns YaRN off)
ROPE_PLAIN = (1.0, 0.0, 1.0, 32.0, 1.0)

# The most memory a prefill pass's one graph may give its results (two layers' at a time,
# each in half of it, where a graph a layer holds one layer's; kept from pass to pass, as
# llama.cpp keeps its compute buffer): past it, the pass runs a graph a layer.
PREFILL_GRAPH_BYTES = 256 << 20


class OutputGraph:
    """The final norm and the output projection for one token. `model`: a graph model
    (its `args` with `embedding_length` and `layer_norm_rms_epsilon`, its `team`, and
    `inputs(1)`: the residual stream's buffer (1, d) this graph reads)."""

    def __init__(self, model: Any, norm: np.ndarray, output: Weight,
                 stream: int | None = None) -> None:
        """stream: the last layer's end (d, 1) in a token's one graph (`TokenGraph`), which
        then computes this one's nodes too; None: read `model.inputs(1)`."""
        d = model.args.embedding_length
        rows = output.rows
        self.norm, self.output = norm, output
        ctx = self.ctx = ggml.Context(model.team.g, 8, 16, 4 * (3 * d + rows) + 4096)
        h = (ctx.tensor(ggml.F32, (d, 1), model.inputs(1)[0].ctypes.data) if stream is None
             else stream)
        x = ctx.op("mul", ctx.op("rms_norm", h, model.args.layer_norm_rms_epsilon),
                   ctx.tensor(ggml.F32, (d,), norm.ctypes.data))
        logits = self.tensor = ctx.op("mul_mat", output.tensor(ctx, model.team.repacker), x)
        if stream is None:
            self.graph = ctx.graph([logits], model.team.threads_pool)
        self.logits = ctx.array(logits, (rows,), np.float32)


@dataclass(frozen=True)
class LayerCache:
    """One layer's KV cache: `cells` cells (a sliding layer's ring, or the context's), as
    llama.cpp lays them: F32, K (cells, nkv*hd) by rows and V (nkv*hd, cells) transposed;
    or, for flash attention (`flash`), F16 with V by rows like K."""

    swa: bool
    k: np.ndarray  # (cells, nkv*hd)
    v: np.ndarray  # (nkv*hd, cells); flash: (cells, nkv*hd)
    flash: bool = False

    @classmethod
    def new(cls, swa: bool, cells: int, rows: int, flash: bool) -> LayerCache:
        """An empty cache of `cells` cells of `rows` (nkv*hd) values each."""
        if flash:
            return cls(swa, np.zeros((cells, rows), np.float16),
                       np.zeros((cells, rows), np.float16), True)
        return cls(swa, np.zeros((cells, rows), np.float32), np.zeros((rows, cells), np.float32))

    @property
    def cells(self) -> int:
        return self.k.shape[0]

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    def tensors(self, ctx: ggml.Context) -> tuple[int, int]:
        """K (nkv*hd, cells) and V as tensors of `ctx`: V (cells, nkv*hd), or for flash
        attention (nkv*hd, cells) like K."""
        gtype = ggml.F16 if self.flash else ggml.F32
        k = ctx.tensor(gtype, (self.rows, self.cells), self.k.ctypes.data)
        v_ne = (self.rows, self.cells) if self.flash else (self.cells, self.rows)
        return k, ctx.tensor(gtype, v_ne, self.v.ctypes.data)


class RingWrites:
    """A pass's keys k (nkv*hd, t) and values v (nkv*hd, t) into `cache`'s cells from
    pos mod cells on: one copy each (`copies`), or two where the pass wraps past the ring's
    end. A copy's result is a view of its destination, and the copy writes there: both
    move with the pass's position (`set_position`)."""

    def __init__(self, ctx: ggml.Context, cache: LayerCache, k: int, v: int, t: int,
                 pos: int) -> None:
        op, cells, rows = ctx.op, cache.cells, cache.rows  # rows: nkv*hd
        size = cache.k.itemsize  # F32, or F16 for flash attention (the copy converts)
        k_cache, v_cache = cache.tensors(ctx)
        first = min(t, cells - pos % cells)
        # per moving tensor: its header, the cache's address, a cell's bytes there, the
        # pass's token its first cell is for (set per decode step: looked up once)
        self._moves: list[tuple[ggml.TensorStruct, int, int, int]] = []
        self._cells = cells
        k_at, v_at = cache.k.ctypes.data, cache.v.ctypes.data
        v_cell = rows * size if cache.flash else size  # V by rows, or transposed
        self.copies: list[int] = []
        for t0, n in ((0, first), (first, t - first)):
            if n == 0:
                continue
            k_dst = op("view_2d", k_cache, rows, n, rows * size, 0)  # (nkv*hd, n)
            k_src = op("view_2d", k, rows, n, rows * 4, t0 * rows * 4)  # (nkv*hd, n)
            v_src = op("view_2d", v, rows, n, rows * 4, t0 * rows * 4)  # (nkv*hd, n)
            if cache.flash:
                v_dst = op("view_2d", v_cache, rows, n, rows * size, 0)  # (nkv*hd, n)
            else:
                v_dst = op("view_2d", v_cache, n, rows, cells * size, 0)  # (n, nkv*hd)
                v_src = op("transpose", v_src)
            kc, vc = op("cpy", k_src, k_dst), op("cpy", v_src, v_dst)
            self._moves += [(ggml.TensorStruct.from_address(k_dst), k_at, rows * size, t0),
                            (ggml.TensorStruct.from_address(kc), k_at, rows * size, t0),
                            (ggml.TensorStruct.from_address(v_dst), v_at, v_cell, t0),
                            (ggml.TensorStruct.from_address(vc), v_at, v_cell, t0)]
            self.copies += [kc, vc]
        self.set_position(pos)

    def set_position(self, pos: int) -> None:
        """Where this pass's keys and values go: cell (pos + i) mod cells for token i."""
        for head, at, cell_bytes, t0 in self._moves:
            head.data = at + (pos + t0) % self._cells * cell_bytes


def cache_attention(ctx: ggml.Context, cache: LayerCache, q: int, mask: int, n_kv: int,
                    heads: tuple[int, int, int], scale: float, sinks: int | None = None
                    ) -> int:
    """build_attn_mha: q (hd, nq, t) over the cache's first n_kv cells, KQ times `scale`
    under `mask` (n_kv, t; F32, or F16 for flash attention: `GraphFace.mask_tensor`),
    softmaxed (with the layer's `sinks`, where it has them: the sink's mass joins each
    denominator) → the heads (nq*hd, t). `heads`: (hd, nq, t).
    Without flash attention: KQ, the masked softmax, KQV over the F32 cache; with it
    (`cache.flash`), ggml's flash attention over the F16 cache, under the mask in F16."""
    op, cells = ctx.op, cache.cells
    hd, nq, t = heads
    nkv = cache.rows // hd
    if cache.flash:
        k_cache, v_cache = cache.tensors(ctx)
        k, v = (op("permute", op("view_3d", c, hd, nkv, n_kv, hd * 2, nkv * hd * 2, 0),
                   0, 2, 1, 3) for c in (k_cache, v_cache))  # (hd, n_kv, nkv) each
        if ggml.TensorStruct.from_address(mask).type != ggml.F16:
            mask = op("cast", mask, ggml.F16)  # llama.cpp's flash attention reads F16
        out = ctx.flash_attn_ext(op("permute", q, 0, 2, 1, 3), k, v, mask, scale,
                                 sinks)  # (hd, nq, t)
        return op("reshape_2d", out, hd * nq, t)  # (nq*hd, t)
    k_cache, v_cache = cache.tensors(ctx)
    keys = op("permute", op("view_3d", k_cache, hd, nkv, n_kv, hd * 4, nkv * hd * 4, 0),
              0, 2, 1, 3)  # (hd, n_kv, nkv)
    values = op("permute", op("view_3d", v_cache, n_kv, nkv, hd, cells * hd * 4,
                              cells * 4, 0), 0, 2, 1, 3)  # (n_kv, hd, nkv)
    kq = op("mul_mat", keys, op("permute", q, 0, 2, 1, 3))  # (n_kv, t, nq)
    kq = ctx.soft_max_ext(kq, mask, scale, 0.0)  # (n_kv, t, nq)
    if sinks is not None:
        ctx.soft_max_add_sinks(kq, sinks)
    kqv = op("permute", op("mul_mat", values, kq), 0, 2, 1, 3)  # (hd, nq, t)
    return op("reshape_2d", op("cont", kqv), hd * nq, t)  # (nq*hd, t)


def expert_sum(ctx: ggml.Context, moe_y: np.ndarray, moe_w: np.ndarray) -> int:
    """A decode layer's experts' outputs `moe_y` (k, d) times their weights `moe_w` (k,),
    added in routing order, as build_moe_ffn sums them → (d, 1). The rows of experts a
    policy dropped hold zeros (adding +0 changes no bits)."""
    k, d = moe_y.shape
    return weighted_experts(ctx, ctx.tensor(ggml.F32, (d, k), moe_y.ctypes.data),
                            ctx.tensor(ggml.F32, (1, k), moe_w.ctypes.data), k, d)


class GraphFace:
    """What every graph model answers alike, the interface the engine and predictors use
    (`*_graph.GraphModel`s: their `args`, `weights` (each with its `router`, (n_expert, d)
    F32), `dense_matrices()` and the `_inputs` dict they set up)."""

    args: Any
    weights: list[Any]
    _output: tuple[np.ndarray, Weight]  # the output norm and matrix
    _output_graph: OutputGraph | None  # built on the first decode pass's end

    def _init_face(self, mf: ModelFile, args: Any, experts: ExpertRunner, team: QuantTeam,
                   pinned: bool, n_ctx: int, n_expert_used: int | None,
                   flash_attn: bool = False) -> None:
        """What every graph model sets first: its args, expert side and team, the experts a
        token takes, the full caches' cells, the token embedding (vocab, d), and whether
        its attention is flash attention over F16 caches (`LayerCache.new`)."""
        self.args, self.experts, self.team = args, experts, team
        self.flash_attn = flash_attn
        # flash attention's F16 masks, by their F32 mask's id: (the mask, its twin)
        self._half: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.k = n_expert_used or args.expert_used_count
        self.kv_size = pad(n_ctx)
        self.token_embd = embedding(mf, "token_embd.weight", pinned)  # (vocab, d)
        self._inputs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.routing_hook: RoutingHook | None = None
        # A decode token, or a prefill batch, as one graph (`TokenGraph`) where the expert
        # side allows it (`_token_stacks`); False: a graph per layer and the experts
        # between them, as every other pass computes (the tests compare the two).
        self.one_graph = True
        self._stacks: list[tuple[SlotPool, int] | None] | None = None
        self._token_graphs: DecodeGraphs[TokenGraph] = DecodeGraphs()
        self._batch_arenas: list[ggml.Arena] = []  # a prefill graph's memory, on use
        self._over_budget: set[tuple[int, Hashable]] = set()  # prefill passes (t, n_kv)
        # What the session sets on a model; the graphs compute without them.
        self.matvec: Any = None
        self.matmul_t: Any = None
        self.vector: Any = None

    def router_matrix(self, layer: int) -> np.ndarray:
        return self.weights[layer].router  # (n_expert, d)

    def mask_tensor(self, ctx: ggml.Context, mask: np.ndarray) -> int:
        """A mask buffer (t, n_kv) F32 as a graph reads it: itself, or for flash attention
        an F16 twin (llama.cpp builds that mask in F16), which `_half_masks` refreshes
        from it per pass."""
        if not self.flash_attn:
            return ctx.tensor(ggml.F32, mask.shape[::-1], mask.ctypes.data)
        if id(mask) not in self._half:  # made as the pass's graphs are: as filled now
            self._half[id(mask)] = (mask, mask.astype(np.float16))
        return ctx.tensor(ggml.F16, mask.shape[::-1], self._half[id(mask)][1].ctypes.data)

    def _half_masks(self, t: int) -> None:
        """The F16 twins of a pass of `t` tokens' masks, from the masks just filled."""
        for mask, half in self._half.values():
            if mask.shape[0] == t:
                np.copyto(half, mask)

    def _token_stacks(self, phase: int) -> list[tuple[SlotPool, int]] | None:
        """Each layer's expert stack (`ExpertNodes`), where this pass may compute as one
        graph: no routing hook (it sees each layer's routing before that layer's experts
        run), the expert side's `in_graph` for the pass's phase, and every layer's experts
        in consecutive slots. None: a graph per layer."""
        if not self.one_graph or self.routing_hook is not None \
                or not in_graph(self.experts, phase):
            return None
        if self._stacks is None:
            self._stacks = [layer_stack(self.experts, i) for i in range(len(self.weights))]
        stacks = self._stacks
        return None if any(s is None for s in stacks) else stacks  # type: ignore[return-value]

    def _prefill_in_graph(self, t: int, pos: int, n_kv: Hashable) -> bool:
        """A prefill pass of `t` tokens at pos.. over `n_kv` attended cells, its inputs
        filled, as one graph — every layer's and its experts' (`mul_mat_id` over the
        pass's tokens), as llama.cpp computes a batch — where the expert side allows it
        (`_token_stacks`) and its results fit `PREFILL_GRAPH_BYTES` → whether it ran
        (False: the caller runs a graph a layer, which computes the same bits)."""
        stacks = self._token_stacks(0)
        if stacks is None or (t, n_kv) in self._over_budget:
            return False
        if not self._batch_arenas:  # the layers' results in turn, kept from pass to pass
            self._batch_arenas = [ggml.Arena(PREFILL_GRAPH_BYTES // 2) for _ in range(2)]
        try:
            graph = token_graph(self, stacks, self._batch_layer(t, pos, n_kv), None, t,
                                self._batch_arenas)
        except ggml.ArenaFull:
            self._over_budget.add((t, n_kv))
            return False
        graph.run_batch(pos, self.experts)
        return True

    def _batch_layer(self, t: int, pos: int, n_kv: Any) -> Callable[[int, Any, int | None], Any]:
        """How a prefill pass's one graph makes layer i's graph for `t` tokens at pos..
        (`token_graph`'s `layer`: from the layer before's graph and end, None for the
        first layer, which reads the stream `_begin` filled)."""
        raise NotImplementedError

    def router_bias(self, layer: int) -> np.ndarray | None:
        """What the router adds to its logits before ranking them: nothing here."""
        return None

    def fuse_next_routers(self) -> None:
        """Nothing to fuse: a predictor computes the next layer's routing itself."""

    def _next_routing(self, g: Any) -> tuple[np.ndarray, np.ndarray] | tuple[()]:
        """What a fused next router made of layer graph `g`'s input: its top k (k,) and
        logits (n_expert,); or nothing, where none is fused."""
        return ()

    def gemv_matrices(self) -> list[Any]:
        return []

    def dense_matrices(self) -> list[Weight]:
        raise NotImplementedError

    def dense_types(self) -> list[str]:
        from gguf import GGMLQuantizationType

        return sorted({GGMLQuantizationType(m.ggml_type).name for m in self.dense_matrices()})

    def inputs(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The buffers a pass of `t` tokens reads: h (t, d) and its positions (t,)."""
        if t not in self._inputs:
            self._inputs[t] = (np.zeros((t, self.args.embedding_length), np.float32),
                               np.zeros(t, np.int32))
        return self._inputs[t]

    # -- a decode token: the skeleton every graph model runs ------------------------------

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        """One token through every layer → the next-token logits (vocab,): as one graph
        where the pass may (`_token_stacks`), else each layer's graph, its routing shown
        to the hook and its experts run on the expert side, then the layer finished (the
        architecture's `_routed` and `_finish_layer`)."""
        hook = self.routing_hook
        n_kv = self._begin_token(token, pos)
        stacks = self._token_stacks(phase)
        if stacks is not None:
            return self._token_graph(pos, n_kv, stacks).run(pos, self.experts)
        for layer, g in enumerate(self._layer_graphs(pos, n_kv)):
            g.graph.compute()
            x, seen, ids, weights = self._routed(g)  # (d,), what the hook sees, (k,), (k,)
            if hook is not None:  # with what a fused next router made of `seen`, if any
                hook(layer, seen, ids, weights, phase, *self._next_routing(g))
            kept, y = self.experts.run_routed(layer, x, ids, weights, phase)  # (k',), (k', d)
            self._finish_layer(layer, g, kept, y)
        return self._logits()

    def _begin_token(self, token: int, pos: int) -> Any:
        """A decode pass's inputs filled (`_begin`) → its attended cells."""
        return self._begin([token], pos)[1]

    def _layer_graphs(self, pos: int, n_kv: Any) -> list[Any]:
        return self._decode_graphs(pos, n_kv)  # type: ignore[no-any-return]

    def _logits(self) -> np.ndarray:
        """The output graph after the last layer → a copy of its logits (vocab,)."""
        if self._output_graph is None:
            self._output_graph = OutputGraph(self, *self._output)
        self._output_graph.graph.compute()
        return self._output_graph.logits.copy()

    def _begin(self, tokens: list[int], pos: int) -> Any:
        """A pass's inputs filled → (the stream (t, d), its attended cells)."""
        raise NotImplementedError

    def _decode_graphs(self, pos: int, n_kv: Any) -> Any:
        """The layers' graphs of a decode pass at `pos` over `n_kv` cells."""
        raise NotImplementedError

    def _token_graph(self, pos: int, n_kv: Any,
                     stacks: list[tuple[SlotPool, int]]) -> TokenGraph:
        """A decode token as one graph (each layer's, its experts', the output's)."""
        raise NotImplementedError

    def _routed(self, g: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A decode layer's graph computed → the experts' input (d,), what the routing hook
        sees of it, and the routing: ids (k,) and weights (k,)."""
        raise NotImplementedError

    def _finish_layer(self, layer: int, g: Any, kept: np.ndarray, y: np.ndarray) -> None:
        """The layer's experts' weights (k',) and outputs (k', d) → the layer ended (into
        the stream, or for the next layer's graph to sum)."""
        raise NotImplementedError


class DecodeGraphs(Generic[T]):
    """Decode's graphs (`T`: a model's layer graphs, or those and its output graph), built
    once per attended length: those of a shorter attended length are done with."""

    def __init__(self) -> None:
        self._key: Hashable = None
        self._built: T | None = None

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The graphs for attended length `key`, built (by `build`) where they are not."""
        if self._built is None or self._key != key:
            self._built, self._key = build(), key
        return self._built
