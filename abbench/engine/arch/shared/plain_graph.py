"""The plain MoE decoder (`plain_args.py`) as llama.cpp's graph: the model for files
computed in their own types.

A quantized GEMV first quantizes its input per block (Q8_K, Q8_0). Where two engines'
inputs differ by one rounding, a block's int8 value can change — rarely, but once it does
the next layers differ by a percent, and a greedy token where two logits were that close.
So with `--kernels ggml` each layer's dense work is the graph llama.cpp builds for it
(models/qwen3moe.cpp, models/olmoe.cpp; `build_attn_mha` without flash attention;
`build_moe_ffn`'s router), op for op with ggml's own ops: RMSNorm and its weight, the Q,
K, V projections, RMSNorm per head (qwen3moe) or over each whole projection (olmoe) and
NeoX RoPE, the KV cache (K by rows, V transposed, F32, attended over a
multiple of 256 positions as llama.cpp pads it, the rest masked), KQ, the masked scaled
softmax, KQV, the output projection and the residual add, then the FFN norm and the
router's softmax and argsort. The experts run from the cache (`ExpertRunner`, on
`qcompute.ExpertGraph`: llama.cpp's `mul_mat_id` graph), and the routing weights and the
weighted sum are finished in numpy in llama.cpp's arithmetic (`qcompute.routing`,
`qcompute.weighted_sum`). The same skeleton as `plain_model.py`: weights
→ one layer's graph → the model, which `Engine` drives through the same interface
(`forward`, `prefill`, `routing_hook`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.shared.graph import (
    ROPE_PLAIN,
    DecodeGraphs,
    GraphFace,
    LayerCache,
    OutputGraph,
    RingWrites,
    cache_attention,
)
from abbench.engine.arch.shared.masks import attended, causal_mask
from abbench.engine.arch.shared.pieces import Pieces
from abbench.engine.arch.shared.plain_args import PlainArgs
from abbench.engine.arch.shared.token_graph import ExpertNodes, TokenGraph, token_graph
from abbench.engine.experts.predictor import top_k
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import WEIGHT_SUM_MIN, QuantTeam, Weight, routing, weighted_sum

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.streaming.slots import SlotPool



class LayerWeights:
    """One layer's dense weights as the graph reads them: norms F32, matrices as the file
    stores them."""

    def __init__(self, mf: ModelFile, layer: int, team: QuantTeam, pinned: bool) -> None:
        b = f"blk.{layer}."
        self.attn_norm = mf.read_dense(b + "attn_norm.weight", True)  # (d,)
        self.q_norm = mf.read_dense(b + "attn_q_norm.weight", True)  # (hd,) | (nq*hd,)
        self.k_norm = mf.read_dense(b + "attn_k_norm.weight", True)  # (hd,) | (nkv*hd,)
        self.ffn_norm = mf.read_dense(b + "ffn_norm.weight", True)  # (d,)
        self.wq, self.wk, self.wv, self.wo = (
            team.matrix(mf, b + n, pinned) for n in ("attn_q.weight", "attn_k.weight",
                                                     "attn_v.weight", "attn_output.weight"))
        router = mf.read_dense(b + "ffn_gate_inp.weight", True)  # (n_expert, d) F32
        self.router = np.ascontiguousarray(router, dtype=np.float32)


class LayerGraph:
    """One layer's graph for `t` tokens attending over `n_kv` cache positions: from the
    residual stream `h` (t, d) to the FFN's input `ffn_inp` (t, d), the experts' input `x`
    (t, d) and the router's probabilities and ranking (t, n_expert)."""

    def __init__(self, model: PlainGraphModel, w: LayerWeights, layer: int, t: int,
                 n_kv: int, stream: int | None = None, in_token: bool = False,
                 next_router: np.ndarray | None = None) -> None:
        """stream: the layer before's end (d, 1), or None: the stream in `model.inputs(t)`.
        in_token: a part of a token's one graph (`token_graph`), which then computes this
        layer's nodes, the routing weights among them (this one builds no graph of its
        own). next_router: the next layer's router (n_expert, d), multiplied by this
        layer's FFN input among the graph's nodes (`next_logits`: a stale-gate
        prediction, made on the graph's threads rather than on the caller after them)."""
        a = model.args
        d, hd, nq, nkv = a.embedding_length, a.key_length, a.head_count, a.head_count_kv
        n_expert = a.expert_count
        self.w = w
        scratch = 4 * t * (12 * d + 8 * (nq + 2 * nkv) * hd + 3 * n_kv * nq + 4 * n_expert)
        ctx = self.ctx = ggml.Context(model.team.g, 96, 128, scratch + (1 << 16))
        op, f32 = ctx.op, ggml.F32
        cache = model.caches[layer]

        pieces = Pieces(ctx, model.team.repacker, a.layer_norm_rms_epsilon)
        matrix, rms = pieces.matrix, pieces.rms

        h_buf, pos_buf = model.inputs(t)
        h = ctx.tensor(f32, (d, t), h_buf.ctypes.data) if stream is None else stream
        pos = ctx.tensor(ggml.I32, (t,), pos_buf.ctypes.data)
        mask = model.mask_tensor(ctx, model.mask(t, n_kv))  # (n_kv, t)
        x = rms(h, w.attn_norm)  # (d, t)
        q, k = op("mul_mat", matrix(w.wq), x), op("mul_mat", matrix(w.wk), x)  # (nq*hd, t), ..
        v = op("mul_mat", matrix(w.wv), x)  # (nkv*hd, t)
        whole = a.PLAIN.qk_norm_whole  # normed before the heads are split, or each head
        q = op("reshape_3d", rms(q, w.q_norm) if whole else q, hd, nq, t)  # (hd, nq, t)
        k = op("reshape_3d", rms(k, w.k_norm) if whole else k, hd, nkv, t)  # (hd, nkv, t)
        rope = (hd, ggml.ROPE_NEOX, a.context_length, a.rope_freq_base, *ROPE_PLAIN)
        q = op("rope_ext", q if whole else rms(q, w.q_norm), pos, None, *rope)  # (hd, nq, t)
        k = op("rope_ext", k if whole else rms(k, w.k_norm), pos, None, *rope)  # (hd, nkv, t)
        # This pass's keys and values into the cache (at `pos[0]`: `set_position`)
        self.ring = RingWrites(ctx, cache, op("reshape_2d", k, nkv * hd, t), v, t, 0)
        writes = self.ring.copies
        heads = cache_attention(ctx, cache, q, mask, n_kv, (hd, nq, t),
                                1.0 / math.sqrt(hd))  # (nq*hd, t)
        ffn_inp = op("add", op("mul_mat", matrix(w.wo), heads), h)  # (d, t)
        xf = rms(ffn_inp, w.ffn_norm)  # (d, t)
        probs = op("soft_max", op("mul_mat", ctx.tensor(f32, (d, n_expert),
                                                        w.router.ctypes.data), xf))
        order = op("argsort", probs, ggml.SORT_DESC)  # (n_expert, t) I32
        if in_token:
            self.nodes = (xf, *self._weights(probs, order, model.k, t, a.PLAIN.renormalise),
                          ffn_inp)
        else:
            outs = [*writes, order, *self._next_logits(next_router, xf, t)]
            self.graph = ctx.graph(outs, model.team.threads_pool)
        self.write_nodes = writes
        self.ffn_inp = ctx.array(ffn_inp, (t, d), np.float32)
        self.x = ctx.array(xf, (t, d), np.float32)
        self.probs = ctx.array(probs, (t, n_expert), np.float32)
        self.order = ctx.array(order, (t, n_expert), np.int32)
        self.top = self.order[:, : model.k]  # (t, k) each token's experts

    def _next_logits(self, router: np.ndarray | None, xf: int, t: int) -> list[int]:
        """The next layer's `router` (n_expert, d) times `xf` (d, t) → its node, the
        logits (n_expert, t), in `next_logits`; none without a router."""
        self.next_logits: np.ndarray | None = None
        if router is None:
            return []
        n_expert, d = router.shape
        node = self.ctx.op("mul_mat", self.ctx.tensor(ggml.F32, (d, n_expert),
                                                      router.ctypes.data), xf)
        self.next_logits = self.ctx.array(node, (t, n_expert), np.float32)
        return [node]

    def end(self, experts: ExpertNodes) -> int:
        """This layer's end (d, 1) in a token's one graph, as llama.cpp ends it: its
        experts' weighted sum plus `ffn_inp`."""
        return experts.ctx.add(experts.sum, self.nodes[3])

    def _weights(self, probs: int, order: int, k: int, t: int,
                 renormalise: bool) -> tuple[int, int]:
        """build_moe_ffn's top k of the router's softmax `probs` (n_expert, t) by its
        argsort `order` and their weights, the probabilities (`renormalise`: over their
        sum clamped below) → the ids (k, t) I32 (a view of the argsort), the weights
        (k, t)."""
        ctx, op = self.ctx, self.ctx.op
        n_expert = ggml.TensorStruct.from_address(probs).ne[0]
        top = op("view_2d", order, k, t, n_expert * 4, 0)  # (k, t) argsort_top_k
        chosen = op("reshape_2d", ctx.get_rows(op("reshape_3d", probs, 1, n_expert, t), top),
                    k, t)  # (k, t)
        if not renormalise:
            return top, chosen
        total = op("clamp", op("sum_rows", chosen), WEIGHT_SUM_MIN, math.inf)  # (1, t)
        return top, op("div", chosen, total)

    def set_position(self, pos: int) -> None:
        """Where this pass's keys and values go: cache position `pos` on."""
        self.ring.set_position(pos)


class PlainGraphModel(GraphFace):
    """The whole decoder on ggml graphs; the interface of `PlainModel`."""

    def __init__(self, mf: ModelFile, args: PlainArgs, experts: ExpertRunner,
                 team: QuantTeam, pinned: bool, n_ctx: int, n_expert_used: int | None = None,
                 flash_attn: bool = False) -> None:
        self._init_face(mf, args, experts, team, pinned, n_ctx, n_expert_used, flash_attn)
        kv_rows = args.head_count_kv * args.key_length
        self.weights = [LayerWeights(mf, i, team, pinned) for i in range(args.block_count)]
        self.caches = [LayerCache.new(False, self.kv_size, kv_rows, flash_attn)
                       for _ in self.weights]
        # Per pass size t: the residual stream (t, d) and the positions (t,) the graphs
        # read, and the causal mask (t, n_kv) per cache length.
        self._masks: dict[tuple[int, int], np.ndarray] = {}
        self._graphs: DecodeGraphs[list[LayerGraph]] = DecodeGraphs()
        self._fused = False  # the next layer's router in each decode graph (a predictor's)
        name = "output.weight" if "output.weight" in mf.tensors else "token_embd.weight"
        self._output = (mf.read_dense("output_norm.weight", True), team.matrix(mf, name, pinned))
        self._output_graph: OutputGraph | None = None

    # -- the interface the engine and predictors use -------------------------------------

    def dense_matrices(self) -> list[Weight]:
        return [*(m for w in self.weights for m in (w.wq, w.wk, w.wv, w.wo)), self._output[1]]

    # -- passes -------------------------------------------------------------------------

    def mask(self, t: int, n_kv: int) -> np.ndarray:
        """(t, n_kv) the causal mask's buffer (0 where a token sees a position, else -inf),
        filled per pass by `_begin`."""
        return self._masks.setdefault((t, n_kv), np.zeros((t, n_kv), np.float32))

    def _begin(self, tokens: list[int], pos: int) -> tuple[np.ndarray, int]:
        """Fill the inputs of a pass of `tokens` at positions pos..: the residual stream
        (t, d), the positions, the causal mask; → the stream and the attended length (a
        multiple of KV_PAD, as llama.cpp pads it)."""
        t = len(tokens)
        end = pos + t
        if end > self.kv_size:
            raise ValueError(f"position {end} past the context ({self.kv_size})")
        n_kv = attended(end, self.kv_size)
        h, positions = self.inputs(t)
        h[...] = self.token_embd[tokens]  # (t, d)
        positions[...] = np.arange(pos, end, dtype=np.int32)
        causal_mask(self.mask(t, n_kv), pos)
        self._half_masks(t)
        return h, n_kv

    def _decode_graphs(self, pos: int, n_kv: int) -> list[LayerGraph]:
        """The layers' graphs for one token, built once per attended length."""
        graphs = self._graphs.get(n_kv, lambda: [
            LayerGraph(self, w, i, 1, n_kv, next_router=r)
            for i, (w, r) in enumerate(zip(self.weights, self._next_routers()))])
        for g in graphs:
            g.set_position(pos)
        return graphs

    def _routed(self, g: LayerGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ids, weights = routing(g.probs[0], g.order[0], self.k, self.args.PLAIN.renormalise)
        return g.x[0], g.x[0], ids, weights  # (d,), (d,), (k,), (k,)

    def fuse_next_routers(self) -> None:
        """The next layer's router into each decode layer's graph, for a stale-gate
        predictor: the hook receives its logits and their ranking (`_next_routing`)."""
        self._fused = True
        self._graphs = DecodeGraphs()  # any built before are built again with it

    def _next_routers(self) -> list[np.ndarray | None]:
        """Per layer, the router its decode graph multiplies too: the next layer's, where
        they are fused (the last layer's: none)."""
        return [w.router if self._fused else None for w in self.weights[1:]] + [None]

    def _next_routing(self, g: LayerGraph) -> tuple[np.ndarray, np.ndarray] | tuple[()]:
        if g.next_logits is None:
            return ()
        logits = g.next_logits[0]  # (n_expert,)
        return top_k(logits, self.k), logits

    def _finish_layer(self, layer: int, g: LayerGraph, kept: np.ndarray, y: np.ndarray) -> None:
        h = self.inputs(1)[0]  # (1, d): the stream
        np.add(weighted_sum(kept, y[: len(kept)]), g.ffn_inp[0], out=h[0])  # (d,)

    def _token_graph(self, pos: int, n_kv: int,
                     stacks: list[tuple[SlotPool, int]]) -> TokenGraph:
        """A decode token as one graph (each layer's, its experts', the output's), built
        once per attended length."""
        return self._token_graphs.get(n_kv, lambda: token_graph(
            self, stacks,
            lambda i, _, end: LayerGraph(self, self.weights[i], i, 1, n_kv, end, True),
            lambda _, end: OutputGraph(self, *self._output, stream=end)))

    def _batch_layer(self, t: int, pos: int, n_kv: int) -> Callable[[int, Any, int | None], Any]:
        return lambda i, _, end: LayerGraph(self, self.weights[i], i, t, n_kv, end, True)

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Prompt tokens at positions pos .. pos+n-1 as one batch, filling the KV cache
        (their logits are not needed): one graph where it may (`_prefill_in_graph`), else
        a graph per layer and the experts between them."""
        hook = self.routing_hook
        h, n_kv = self._begin(tokens, pos)
        if self._prefill_in_graph(len(tokens), pos, n_kv):
            return
        for layer, w in enumerate(self.weights):
            # one layer's graph at a time: its scratch is the batch's size
            g = LayerGraph(self, w, layer, len(tokens), n_kv)
            g.set_position(pos)
            g.graph.compute()
            norm = self.args.PLAIN.renormalise
            top = [routing(p, o, self.k, norm) for p, o in zip(g.probs, g.order)]
            ids = np.stack([i for i, _ in top])  # (n, k)
            weights = np.stack([w for _, w in top])  # (n, k)
            if hook is not None:
                hook(layer, g.x, ids, weights, 0)
            moe = self.experts.prefill(layer, g.x, ids, weights)  # (n, d)
            np.add(moe, g.ffn_inp, out=h)
            del g
