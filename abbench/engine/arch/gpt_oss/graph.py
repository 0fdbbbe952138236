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
`arch/shared/plain_graph.py`: weights → one layer's graph → the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.gpt_oss.args import ModelArgs
from abbench.engine.arch.shared.graph import (
    DecodeGraphs,
    GraphFace,
    LayerCache,
    OutputGraph,
    RingWrites,
    cache_attention,
    expert_sum,
)
from abbench.engine.arch.shared.masks import SlidingMasks, attended
from abbench.engine.arch.shared.pieces import Pieces
from abbench.engine.arch.shared.token_graph import ExpertNodes, TokenGraph, token_graph
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import QuantTeam, Weight, weighted_sum

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.streaming.slots import SlotPool


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


class LayerGraph:
    """One layer's graph for `t` tokens at positions pos.. attending over `n_kv` cells of
    its cache: from the residual stream `h` (t, d) to the FFN's input `ffn_inp` (t, d),
    the experts' input `x` (t, d), the router's ranking `order` (t, n_expert) and the
    selected experts' weights `weights` (t, k)."""

    def __init__(self, model: GraphModel, layer: int, t: int, n_kv: int, pos: int,
                 residual: np.ndarray | None = None, stream: int | None = None) -> None:
        """residual: the layer before's `ffn_inp` (1, d), when this decode graph finishes
        that layer (its experts' outputs and weights in `model.moe_y`, `model.moe_w`)
        rather than read the stream the caller finished. stream: the layer before's end
        (d, 1) in a token's one graph (`TokenGraph`), which then computes this layer's
        nodes too (this one builds no graph of its own)."""
        a, w = model.args, model.weights[layer]
        d, hd, nq, nkv = a.embedding_length, a.key_length, a.head_count, a.head_count_kv
        n_expert = a.expert_count
        self.cache = cache = model.caches[layer]
        scratch = 4 * t * (8 * d + 4 * (nq + 2 * nkv) * hd + 3 * n_kv * nq + 6 * n_expert
                           + 2 * model.k * d)
        ctx = self.ctx = ggml.Context(model.team.g, 160, 256, scratch + (1 << 16))
        op = ctx.op

        pieces = Pieces(ctx, model.team.repacker, a.layer_norm_rms_epsilon)
        matrix, vector, rms = pieces.matrix, pieces.vector, pieces.rms

        def linear(m: Weight, bias: np.ndarray, x: int) -> int:  # build_qkv, wo: bias after
            return ctx.add(op("mul_mat", matrix(m), x), vector(bias))

        pos_buf = model.inputs(t)[1]
        h = stream if stream is not None else self._stream(model, residual, t)  # (d, t)
        positions = ctx.tensor(ggml.I32, (t,), pos_buf.ctypes.data)
        mask = model.mask_tensor(ctx, model.sliding.mask(cache.swa, t, n_kv))  # (n_kv, t)
        x = rms(h, w.attn_norm)  # (d, t)
        rope = a.rope(cache.swa)
        q = ctx.rope_ext(op("reshape_3d", linear(w.wq, w.bq, x), hd, nq, t), positions,
                         rope)  # (hd, nq, t)
        k = ctx.rope_ext(op("reshape_3d", linear(w.wk, w.bk, x), hd, nkv, t), positions,
                         rope)  # (hd, nkv, t)
        v = linear(w.wv, w.bv, x)  # (nkv*hd, t)
        self.writes = RingWrites(ctx, cache, op("reshape_2d", k, nkv * hd, t), v, t, pos)
        # kq_scale as llama.cpp computes it, in float32: 1.0f/sqrtf(n_rot)
        scale = float(np.float32(1.0) / np.sqrt(np.float32(hd)))
        heads = cache_attention(ctx, cache, q, mask, n_kv, (hd, nq, t), scale,
                                vector(w.sinks))  # (nq*hd, t)
        ffn_inp = ctx.add(linear(w.wo, w.bo, heads), h)  # (d, t)
        xf = rms(ffn_inp, w.post_norm)  # (d, t)
        order, weights = self._router(w, xf, model.k, n_expert, t)
        if stream is None:
            self.graph = ctx.graph([*self.writes.copies, order, weights],
                                   model.team.threads_pool)
        # the tensors a token's one graph goes on from: x, the top k (a view of the
        # argsort), their weights, ffn_inp
        self.nodes = (xf, op("view_2d", order, model.k, t, n_expert * 4, 0), weights, ffn_inp)
        self.write_nodes = self.writes.copies
        self.h = ctx.array(h, (t, d), np.float32)  # the stream this layer read
        self.ffn_inp = ctx.array(ffn_inp, (t, d), np.float32)
        self.x = ctx.array(xf, (t, d), np.float32)
        self.order = ctx.array(order, (t, n_expert), np.int32)
        self.weights = ctx.array(weights, (t, model.k), np.float32)
        self.top = self.order[:, : model.k]  # (t, k) each token's experts

    def end(self, experts: ExpertNodes) -> int:
        """This layer's end (d, 1) in a token's one graph, as llama.cpp ends it: its
        experts' weighted sum plus `ffn_inp`."""
        return experts.ctx.add(experts.sum, self.nodes[3])

    def set_position(self, pos: int) -> None:
        """Where this pass's keys and values go: cell (pos + i) mod cells for token i."""
        self.writes.set_position(pos)

    def _stream(self, model: GraphModel, residual: np.ndarray | None, t: int) -> int:
        """The stream this layer reads (d, t): the caller's, or the layer before's end as
        llama.cpp ends a layer, its experts' weighted sum plus its `ffn_inp`."""
        ctx, d = self.ctx, model.args.embedding_length
        if residual is None:
            return ctx.tensor(ggml.F32, (d, t), model.inputs(t)[0].ctypes.data)
        return ctx.add(expert_sum(ctx, model.moe_y, model.moe_w),
                       ctx.tensor(ggml.F32, (d, 1), residual.ctypes.data))  # (d, 1)

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


class GraphModel(GraphFace):
    """The whole decoder on ggml graphs; the interface of `gpt_oss.Model`."""

    def __init__(self, mf: ModelFile, args: ModelArgs, experts: ExpertRunner,
                 team: QuantTeam, pinned: bool, n_ctx: int, n_expert_used: int | None = None,
                 flash_attn: bool = False) -> None:
        self._init_face(mf, args, experts, team, pinned, n_ctx, n_expert_used, flash_attn)
        # a sliding layer's ring (llama.cpp's -ub 512) and the masks
        self.sliding = SlidingMasks(args.swa_cells(n_ctx), args.sliding_window, self._half,
                                    self._half_masks)
        rows = args.head_count_kv * args.key_length
        self.weights = [LayerWeights(mf, i, team, pinned) for i in range(args.block_count)]
        self.caches = [LayerCache.new(swa, self.sliding.swa_size if swa else self.kv_size, rows,
                                      flash_attn) for swa in args.swa_layers]
        # a decode layer's experts' outputs and weights, which the next layer's graph sums
        self.moe_y = np.zeros((self.k, args.embedding_length), np.float32)  # (k, d)
        self.moe_w = np.zeros(self.k, np.float32)  # (k,)
        self._graphs: DecodeGraphs[list[LayerGraph]] = DecodeGraphs()  # by n_kv
        self._output = (mf.read_dense("output_norm.weight", True),
                        team.matrix(mf, "output.weight", pinned))
        self._output_graph: OutputGraph | None = None

    # -- the interface the engine and predictors use -------------------------------------

    def router_bias(self, layer: int) -> np.ndarray | None:
        """What the router adds to its logits before ranking them (n_expert,)."""
        return self.weights[layer].router_b

    def dense_matrices(self) -> list[Weight]:
        return [*(m for w in self.weights for m in (w.wq, w.wk, w.wv, w.wo)), self._output[1]]

    # -- passes -------------------------------------------------------------------------

    def _begin(self, tokens: list[int], pos: int) -> tuple[np.ndarray, tuple[int, int]]:
        """Fill the inputs of a pass of `tokens` at positions pos..: the residual stream
        (t, d), the positions, the ring's cells and both caches' masks → the stream and
        the attended cells (full, sliding)."""
        t, end = len(tokens), pos + len(tokens)
        if end > self.kv_size:
            raise ValueError(f"position {end} past the context ({self.kv_size})")
        n_kv = (attended(end, self.kv_size), attended(end, self.sliding.swa_size))
        h, positions = self.inputs(t)
        h[...] = self.token_embd[tokens]  # (t, d)
        positions[...] = np.arange(pos, end, dtype=np.int32)
        self.sliding.place(positions, n_kv)
        return h, n_kv

    def _graph(self, layer: int, t: int, n_kv: tuple[int, int], pos: int) -> LayerGraph:
        return LayerGraph(self, layer, t, n_kv[self.caches[layer].swa], pos)

    def _decode_graphs(self, pos: int, n_kv: tuple[int, int]) -> list[LayerGraph]:
        """The layers' graphs for one token, built once per attended length."""

        def build() -> list[LayerGraph]:
            graphs: list[LayerGraph] = []
            for i, cache in enumerate(self.caches):  # each finishes the layer before it
                residual = graphs[-1].ffn_inp if graphs else None
                graphs.append(LayerGraph(self, i, 1, n_kv[cache.swa], pos, residual))
            return graphs

        graphs = self._graphs.get(n_kv, build)
        for g in graphs:
            g.set_position(pos)
        return graphs

    def _routed(self, g: LayerGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x = g.x[0]  # (d,)
        return x, x, g.order[0, : self.k].astype(np.int64), g.weights[0].copy()

    def _finish_layer(self, layer: int, g: LayerGraph, kept: np.ndarray, y: np.ndarray) -> None:
        n = len(kept)
        if layer + 1 < len(self.weights):  # the next layer's graph finishes this one
            self.moe_y[:n], self.moe_w[:n] = y[:n], kept
            if n < self.k:
                self.moe_y[n:], self.moe_w[n:] = 0.0, 0.0
        else:
            h = self.inputs(1)[0]  # (1, d): the stream
            np.add(weighted_sum(kept, y[:n]), g.ffn_inp[0], out=h[0])  # (d,)

    def _token_graph(self, pos: int, n_kv: tuple[int, int],
                     stacks: list[tuple[SlotPool, int]]) -> TokenGraph:
        """A decode token as one graph (each layer's, its experts', the output's), built
        once per attended length."""
        return self._token_graphs.get(n_kv, lambda: token_graph(
            self, stacks,
            lambda i, _, end: LayerGraph(self, i, 1, n_kv[self.caches[i].swa], pos,
                                         stream=end),
            lambda _, end: OutputGraph(self, *self._output, stream=end)))

    def _batch_layer(self, t: int, pos: int, n_kv: tuple[int, int]
                     ) -> Callable[[int, Any, int | None], Any]:
        return lambda i, _, end: LayerGraph(self, i, t, n_kv[self.caches[i].swa], pos,
                                            stream=end)

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Prompt tokens at positions pos .. pos+n-1 as one batch, filling the KV caches
        (their logits are not needed): one graph where it may (`_prefill_in_graph`), else
        a graph per layer and the experts between them."""
        hook, k = self.routing_hook, self.k
        h, n_kv = self._begin(tokens, pos)
        if self._prefill_in_graph(len(tokens), pos, n_kv):
            return
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
