"""gpt-oss as llama.cpp's graph: the model for files computed in their own types (MXFP4
experts, so `--kernels auto` takes it).

Each layer is the graph llama.cpp builds for it (models/openai-moe.cpp; docs/gpt-oss.md
§3-§7), op for op with ggml's own ops, so every transcendental and sort is ggml's:
RMSNorm and its weight, the Q, K, V products each plus its bias, YaRN NeoX RoPE
(`ModelArgs.rope`), the layer's KV cache (F32, K by rows, V transposed; a sliding layer's
is a ring of `swa_cells` cells, position p in cell p mod it, as llama.cpp's iSWA cache
places one sequence), attended over llama.cpp's n_kv (a multiple of 256) under its mask,
KQ, the scaled masked softmax with the layer's sinks, KQV, the output product plus its
bias and the residual add, `post_attention_norm`, then the router: its product plus its
bias, the descending argsort's top k, and the softmax of the k selected logits (no
softmax over every expert). The experts run from the cache (`ExpertRunner` on
`qcompute.ExpertGraph` with `gpt_oss.OaiExperts`' steps: add_id, swiglu_oai, add_id);
their weighted sum and the residual add, in llama.cpp's order, are the next layer's first
ops in a decode pass (one numpy pass fewer a layer), numpy's `qcompute.weighted_sum` (the
same arithmetic) after the last layer and in prefill. The same skeleton as
`qwen3moe_graph.py`: weights → one layer's graph → the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine import ggml
from abbench.engine.arch.common import RoutingHook, embedding
from abbench.engine.arch.gpt_oss_args import KV_PAD, ModelArgs, pad
from abbench.engine.arch.graph_common import OutputGraph
from abbench.engine.qcompute import QuantTeam, Weight, weighted_sum

if TYPE_CHECKING:
    from abbench.engine.experts import ExpertRunner
    from abbench.engine.gguf_file import ModelFile


class LayerWeights:
    """One layer's dense weights as the graph reads them: norms, biases, sinks and the
    router F32, matrices as the file stores them."""

    def __init__(self, mf: ModelFile, layer: int, team: QuantTeam, pinned: bool) -> None:
        b = f"blk.{layer}."

        def vec(name: str) -> np.ndarray:
            return np.ascontiguousarray(mf.read_dense(b + name, True), dtype=np.float32)

        self.attn_norm = vec("attn_norm.weight")  # (d,)
        self.post_norm = vec("post_attention_norm.weight")  # (d,)
        self.bq, self.bk, self.bv = (vec(f"attn_{p}.bias") for p in "qkv")  # (nq*hd,) ...
        self.bo = vec("attn_output.bias")  # (d,)
        self.sinks = vec("attn_sinks.weight")  # (n_head,)
        self.wq, self.wk, self.wv, self.wo = (
            team.matrix(mf, b + n, pinned) for n in ("attn_q.weight", "attn_k.weight",
                                                     "attn_v.weight", "attn_output.weight"))
        self.router = vec("ffn_gate_inp.weight")  # (n_expert, d) F32
        self.router_b = vec("ffn_gate_inp.bias")  # (n_expert,)


@dataclass(frozen=True)
class LayerCache:
    """One layer's KV cache: `cells` cells (a sliding layer's ring, or the context's),
    K (cells, nkv*hd) by rows, V (nkv*hd, cells) transposed, as llama.cpp lays them."""

    swa: bool
    k: np.ndarray  # (cells, nkv*hd)
    v: np.ndarray  # (nkv*hd, cells)

    @property
    def cells(self) -> int:
        return self.k.shape[0]


def attended(end: int, cells: int) -> int:
    """llama.cpp's n_kv for a cache of `cells` cells once positions below `end` are in it:
    the cells used, at least 256, in blocks of 256, within the cache."""
    return min(cells, max(KV_PAD, pad(end)))


class LayerGraph:
    """One layer's graph for `t` tokens at positions pos.. attending over `n_kv` cells of
    its cache: from the residual stream `h` (t, d) to the FFN's input `ffn_inp` (t, d),
    the experts' input `x` (t, d), the router's ranking `order` (t, n_expert) and the
    selected experts' weights `weights` (t, k)."""

    def __init__(self, model: GraphModel, layer: int, t: int, n_kv: int, pos: int,
                 residual: np.ndarray | None = None) -> None:
        """residual: the layer before's `ffn_inp` (1, d), when this decode graph finishes
        that layer (`_finish`) rather than read the stream the caller finished."""
        a, w = model.args, model.weights[layer]
        d, hd, nq, nkv = a.embedding_length, a.key_length, a.head_count, a.head_count_kv
        n_expert = a.expert_count
        self.cache = cache = model.caches[layer]
        scratch = 4 * t * (8 * d + 4 * (nq + 2 * nkv) * hd + 3 * n_kv * nq + 6 * n_expert
                           + 2 * model.k * d)
        ctx = self.ctx = ggml.Context(model.team.g, 160, 256, scratch + (1 << 16))
        op, f32 = ctx.op, ggml.F32

        def matrix(m: Weight) -> int:
            return m.tensor(ctx, model.team.repacker)

        def vector(v: np.ndarray) -> int:
            return ctx.tensor(f32, (v.shape[0],), v.ctypes.data)

        def rms(x: int, weight: np.ndarray) -> int:  # build_norm(LLM_NORM_RMS)
            return op("mul", op("rms_norm", x, a.layer_norm_rms_epsilon), vector(weight))

        def linear(m: Weight, bias: np.ndarray, x: int) -> int:  # build_qkv, wo: bias after
            return ctx.add(op("mul_mat", matrix(m), x), vector(bias))

        h_buf, pos_buf = model.inputs(t)
        h = (ctx.tensor(f32, (d, t), h_buf.ctypes.data) if residual is None
             else self._finish(model, residual))  # (d, t)
        positions = ctx.tensor(ggml.I32, (t,), pos_buf.ctypes.data)
        mask = ctx.tensor(f32, (n_kv, t), model.mask(cache.swa, t, n_kv).ctypes.data)
        x = rms(h, w.attn_norm)  # (d, t)
        rope = a.rope(cache.swa)
        q = ctx.rope_ext(op("reshape_3d", linear(w.wq, w.bq, x), hd, nq, t), positions,
                         rope)  # (hd, nq, t)
        k = ctx.rope_ext(op("reshape_3d", linear(w.wk, w.bk, x), hd, nkv, t), positions,
                         rope)  # (hd, nkv, t)
        v = linear(w.wv, w.bv, x)  # (nkv*hd, t)
        writes = self._writes(op("reshape_2d", k, nkv * hd, t), v, t, pos)
        heads = self._attention(q, mask, vector(w.sinks), n_kv, hd, nq, nkv, t)
        ffn_inp = ctx.add(linear(w.wo, w.bo, heads), h)  # (d, t)
        xf = rms(ffn_inp, w.post_norm)  # (d, t)
        order, weights = self._router(w, xf, model.k, n_expert, t)
        self.graph = ctx.graph([*writes, order, weights], model.team.threads_pool)
        self.h = ctx.array(h, (t, d), np.float32)  # the stream this layer read
        self.ffn_inp = ctx.array(ffn_inp, (t, d), np.float32)
        self.x = ctx.array(xf, (t, d), np.float32)
        self.order = ctx.array(order, (t, n_expert), np.int32)
        self.weights = ctx.array(weights, (t, model.k), np.float32)

    def _finish(self, model: GraphModel, residual: np.ndarray) -> int:
        """The layer before's output, as llama.cpp ends a layer: its experts' outputs
        (`model.moe_y`, (k, d)) times their weights (`model.moe_w`, (k,)), added in
        routing order, plus its `ffn_inp` → (d, 1). The rows of experts a policy dropped
        hold zeros (adding +0 changes no bits)."""
        ctx, op, f32 = self.ctx, self.ctx.op, ggml.F32
        k, d = model.moe_y.shape
        y = ctx.tensor(f32, (d, k), model.moe_y.ctypes.data)  # (d, k)
        scaled = op("mul", y, ctx.tensor(f32, (1, k), model.moe_w.ctypes.data))  # (d, k)
        moe = op("view_2d", scaled, d, 1, d * 4, 0)  # (d, 1)
        for j in range(1, k):
            moe = op("add", moe, op("view_2d", scaled, d, 1, d * 4, j * d * 4))
        return op("add", moe, ctx.tensor(f32, (d, 1), residual.ctypes.data))  # (d, 1)

    def _writes(self, k: int, v: int, t: int, pos: int) -> list[int]:
        """This pass's keys k (nkv*hd, t) and values v (nkv*hd, t) into the cache's cells
        from pos mod cells on: one copy each, or two where the pass wraps past the ring's
        end. A copy's result is a view of its destination, and the copy writes there: both
        move with the pass's position (`set_position`)."""
        op, cells = self.ctx.op, self.cache.cells
        rows = self.cache.k.shape[1]  # nkv*hd
        k_cache = self.ctx.tensor(ggml.F32, (rows, cells), self.cache.k.ctypes.data)
        v_cache = self.ctx.tensor(ggml.F32, (cells, rows), self.cache.v.ctypes.data)
        first = min(t, cells - pos % cells)
        # per moving tensor: its header, the cache's address, a cell's bytes there, the
        # token its first cell is for (set per decode step: looked up once)
        self._moves: list[tuple[ggml.TensorStruct, int, int, int]] = []
        k_at, v_at = self.cache.k.ctypes.data, self.cache.v.ctypes.data
        out = []
        for t0, n in ((0, first), (first, t - first)):
            if n == 0:
                continue
            k_dst = op("view_2d", k_cache, rows, n, rows * 4, 0)  # (nkv*hd, n)
            v_dst = op("view_2d", v_cache, n, rows, cells * 4, 0)  # (n, nkv*hd)
            k_src = op("view_2d", k, rows, n, rows * 4, t0 * rows * 4)  # (nkv*hd, n)
            v_src = op("transpose", op("view_2d", v, rows, n, rows * 4, t0 * rows * 4))
            kc, vc = op("cpy", k_src, k_dst), op("cpy", v_src, v_dst)
            self._moves += [(ggml.TensorStruct.from_address(k_dst), k_at, rows * 4, t0),
                            (ggml.TensorStruct.from_address(kc), k_at, rows * 4, t0),
                            (ggml.TensorStruct.from_address(v_dst), v_at, 4, t0),
                            (ggml.TensorStruct.from_address(vc), v_at, 4, t0)]
            out += [kc, vc]
        self.set_position(pos)
        return out

    def set_position(self, pos: int) -> None:
        """Where this pass's keys and values go: cell (pos + i) mod cells for token i."""
        cells = self.cache.cells
        for head, at, cell_bytes, t0 in self._moves:
            head.data = at + (pos + t0) % cells * cell_bytes

    def _attention(self, q: int, mask: int, sinks: int, n_kv: int, hd: int, nq: int,
                   nkv: int, t: int) -> int:
        """build_attn_mha without flash attention: q (hd, nq, t) over the cache's first
        n_kv cells → the heads (nq*hd, t)."""
        op, cells = self.ctx.op, self.cache.cells
        k_cache = self.ctx.tensor(ggml.F32, (nkv * hd, cells), self.cache.k.ctypes.data)
        v_cache = self.ctx.tensor(ggml.F32, (cells, nkv * hd), self.cache.v.ctypes.data)
        keys = op("permute", op("view_3d", k_cache, hd, nkv, n_kv, hd * 4, nkv * hd * 4, 0),
                  0, 2, 1, 3)  # (hd, n_kv, nkv)
        values = op("permute", op("view_3d", v_cache, n_kv, nkv, hd, cells * hd * 4,
                                  cells * 4, 0), 0, 2, 1, 3)  # (n_kv, hd, nkv)
        kq = op("mul_mat", keys, op("permute", q, 0, 2, 1, 3))  # (n_kv, t, nq)
        # kq_scale as llama.cpp computes it, in float32: 1.0f/sqrtf(n_rot)
        scale = float(np.float32(1.0) / np.sqrt(np.float32(hd)))
        kq = self.ctx.soft_max_ext(kq, mask, scale, 0.0)  # (n_kv, t, nq)
        self.ctx.soft_max_add_sinks(kq, sinks)  # the sink's mass joins each denominator
        kqv = op("permute", op("mul_mat", values, kq), 0, 2, 1, 3)  # (hd, nq, t)
        return op("reshape_2d", op("cont", kqv), hd * nq, t)  # (nq*hd, t)

    def _router(self, w: LayerWeights, xf: int, k: int, n_expert: int, t: int
                ) -> tuple[int, int]:
        """build_moe_ffn's routing with SOFTMAX_WEIGHT: the biased logits (n_expert, t),
        their descending argsort (its first k rows the experts), and the softmax of the
        k selected logits (k, t) → the argsort, the weights."""
        ctx, op = self.ctx, self.ctx.op
        router = ctx.tensor(ggml.F32, (w.router.shape[1], n_expert), w.router.ctypes.data)
        bias = ctx.tensor(ggml.F32, (n_expert,), w.router_b.ctypes.data)
        logits = ctx.add(op("mul_mat", router, xf), bias)  # (n_expert, t)
        order = ctx.argsort_desc(logits)  # (n_expert, t) I32
        # ggml_argsort_top_k: the argsort's first k rows, a view (its sort is std::sort:
        # ties fall as llama.cpp's fall)
        selected = op("view_2d", order, k, t, n_expert * 4, 0)  # (k, t)
        chosen = ctx.get_rows(op("reshape_3d", logits, 1, n_expert, t), selected)  # (1, k, t)
        weights = op("soft_max", op("reshape_2d", chosen, k, t))  # (k, t)
        return order, weights


class GraphModel:
    """The whole decoder on ggml graphs; the interface of `gpt_oss.Model`."""

    def __init__(self, mf: ModelFile, args: ModelArgs, experts: ExpertRunner,
                 team: QuantTeam, pinned: bool, n_ctx: int, n_expert_used: int | None = None
                 ) -> None:
        self.args, self.experts, self.team = args, experts, team
        self.k = n_expert_used or args.expert_used_count
        self.kv_size = pad(n_ctx)
        self.swa_size = args.swa_cells(n_ctx)  # a sliding layer's ring (llama.cpp's -ub 512)
        rows = args.head_count_kv * args.key_length
        self.token_embd = embedding(mf, "token_embd.weight", pinned)  # (vocab, d)
        self.weights = [LayerWeights(mf, i, team, pinned) for i in range(args.block_count)]
        self.caches = [LayerCache(swa, np.zeros((n, rows), np.float32),
                                  np.zeros((rows, n), np.float32))
                       for swa in args.swa_layers
                       for n in [self.swa_size if swa else self.kv_size]]
        # the position each ring cell holds (-1: empty), one for every sliding layer
        self.swa_pos = np.full(self.swa_size, -1, np.int64)  # (swa_size,)
        # a decode layer's experts' outputs and weights, which the next layer's graph sums
        self.moe_y = np.zeros((self.k, args.embedding_length), np.float32)  # (k, d)
        self.moe_w = np.zeros(self.k, np.float32)  # (k,)
        self._inputs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._masks: dict[tuple[bool, int, int], np.ndarray] = {}
        # the last pass, where it was one decode step: its position and attended cells
        self._decoded: tuple[int, tuple[int, int]] | None = None
        self._graphs: dict[tuple[int, int], list[LayerGraph]] = {}  # decode's, by n_kv
        self._output = (mf.read_dense("output_norm.weight", True),
                        team.matrix(mf, "output.weight", pinned))
        self._output_graph: OutputGraph | None = None
        self.routing_hook: RoutingHook | None = None
        # What the session sets on a model; the graphs compute without them.
        self.matvec: Any = None
        self.matmul_t: Any = None
        self.vector: Any = None

    # -- the interface the engine and predictors use -------------------------------------

    def router_matrix(self, layer: int) -> np.ndarray:
        return self.weights[layer].router  # (n_expert, d)

    def router_bias(self, layer: int) -> np.ndarray | None:
        """What the router adds to its logits before ranking them (n_expert,)."""
        return self.weights[layer].router_b

    def fuse_next_routers(self) -> None:
        """Nothing to fuse: a predictor computes the next layer's routing itself."""

    def gemv_matrices(self) -> list[Any]:
        return []

    def dense_matrices(self) -> list[Weight]:
        return [*(m for w in self.weights for m in (w.wq, w.wk, w.wv, w.wo)), self._output[1]]

    def dense_types(self) -> list[str]:
        from gguf import GGMLQuantizationType

        return sorted({GGMLQuantizationType(m.ggml_type).name for m in self.dense_matrices()})

    # -- passes -------------------------------------------------------------------------

    def inputs(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The buffers a pass of `t` tokens reads: h (t, d) and its positions (t,)."""
        if t not in self._inputs:
            self._inputs[t] = (np.zeros((t, self.args.embedding_length), np.float32),
                               np.zeros(t, np.int32))
        return self._inputs[t]

    def mask(self, swa: bool, t: int, n_kv: int) -> np.ndarray:
        """(t, n_kv) a cache's mask buffer (0 where a token sees a cell, else -inf), filled
        per pass by `_begin`."""
        return self._masks.setdefault((swa, t, n_kv), np.zeros((t, n_kv), np.float32))

    def _begin(self, tokens: list[int], pos: int) -> tuple[np.ndarray, tuple[int, int]]:
        """Fill the inputs of a pass of `tokens` at positions pos..: the residual stream
        (t, d), the positions, the ring's cells and both caches' masks → the stream and
        the attended cells (full, sliding)."""
        t, end = len(tokens), pos + len(tokens)
        if end > self.kv_size:
            raise ValueError(f"position {end} past the context ({self.kv_size})")
        n_kv = (attended(end, self.kv_size), attended(end, self.swa_size))
        h, positions = self.inputs(t)
        h[...] = self.token_embd[tokens]  # (t, d)
        positions[...] = np.arange(pos, end, dtype=np.int32)
        self.swa_pos[positions % self.swa_size] = positions
        if t == 1 and self._decoded == (pos - 1, n_kv):
            self._step_masks(pos, n_kv)
        else:
            self._fill_masks(positions, n_kv)
        self._decoded = (pos, n_kv) if t == 1 else None
        return h, n_kv

    def _fill_masks(self, positions: np.ndarray, n_kv: tuple[int, int]) -> None:
        """Both caches' masks for queries at `positions` (t,): causal over the full
        cache's cells; over the ring's, llama.cpp's is_masked_swa too (a key p0 is hidden
        from p1 once p1 - p0 >= window) and empty cells hidden."""
        t = len(positions)
        p1 = positions[:, None].astype(np.int64)  # (t, 1) each query's position
        full = self.mask(False, t, n_kv[0])
        full[...] = np.where(np.arange(n_kv[0])[None, :] <= p1, 0.0, -np.inf)
        p0 = self.swa_pos[None, : n_kv[1]]  # (1, n_kv_swa)
        hidden = (p0 < 0) | (p0 > p1) | (p1 - p0 >= self.args.sliding_window)
        self.mask(True, t, n_kv[1])[...] = np.where(hidden, -np.inf, 0.0)

    def _step_masks(self, pos: int, n_kv: tuple[int, int]) -> None:
        """The decode masks of position pos-1 moved on to pos (what `_fill_masks` would
        write, in three cells rather than every cell): the full cache sees cell pos, the
        ring its cell of pos and no longer that of pos - window."""
        self.mask(False, 1, n_kv[0])[0, pos] = 0.0
        ring = self.mask(True, 1, n_kv[1])
        ring[0, pos % self.swa_size] = 0.0
        if pos >= self.args.sliding_window:
            ring[0, (pos - self.args.sliding_window) % self.swa_size] = -np.inf

    def _graph(self, layer: int, t: int, n_kv: tuple[int, int], pos: int) -> LayerGraph:
        return LayerGraph(self, layer, t, n_kv[self.caches[layer].swa], pos)

    def _decode_graphs(self, pos: int, n_kv: tuple[int, int]) -> list[LayerGraph]:
        """The layers' graphs for one token, built once per attended length."""
        graphs = self._graphs.get(n_kv)
        if graphs is None:  # the graphs of a shorter attended length are done with
            graphs = []
            for i, cache in enumerate(self.caches):  # each finishes the layer before it
                residual = graphs[-1].ffn_inp if graphs else None
                graphs.append(LayerGraph(self, i, 1, n_kv[cache.swa], pos, residual))
            self._graphs = {n_kv: graphs}
        for g in graphs:
            g.set_position(pos)
        return graphs

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        """One token through every layer → the next-token logits (vocab,)."""
        hook, k = self.routing_hook, self.k
        h, n_kv = self._begin([token], pos)
        for layer, g in enumerate(self._decode_graphs(pos, n_kv)):
            g.graph.compute()
            ids = g.order[0, :k].astype(np.int64)  # (k,)
            weights = g.weights[0].copy()  # (k,)
            x = g.x[0]  # (d,)
            if hook is not None:
                hook(layer, x, ids, weights, phase)
            kept, y = self.experts.run_routed(layer, x, ids, weights, phase)  # (k',), (k', d)
            n = len(kept)
            if layer + 1 < len(self.weights):  # the next layer's graph finishes this one
                self.moe_y[:n], self.moe_w[:n] = y[:n], kept
                if n < k:
                    self.moe_y[n:], self.moe_w[n:] = 0.0, 0.0
            else:
                np.add(weighted_sum(kept, y[:n]), g.ffn_inp[0], out=h[0])  # (d,)
        if self._output_graph is None:
            self._output_graph = OutputGraph(self, *self._output)
        self._output_graph.graph.compute()
        return self._output_graph.logits.copy()

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Prompt tokens at positions pos .. pos+n-1 as one batch per layer, filling the
        KV caches (their logits are not needed)."""
        hook, k = self.routing_hook, self.k
        h, n_kv = self._begin(tokens, pos)
        for layer in range(len(self.weights)):
            # one layer's graph at a time: its scratch is the batch's size
            g = self._graph(layer, len(tokens), n_kv, pos)
            g.graph.compute()
            ids = g.order[:, :k].astype(np.int64)  # (n, k)
            weights = g.weights.copy()  # (n, k)
            if hook is not None:
                hook(layer, g.x, ids, weights, 0)
            moe = self.experts.prefill(layer, g.x, ids, weights)  # (n, d)
            np.add(moe, g.ffn_inp, out=h)
            del g
