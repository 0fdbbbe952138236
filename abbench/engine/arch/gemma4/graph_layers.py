"""One gemma4 layer as llama.cpp's graph (models/gemma4.cpp; docs/gemma4.md §3), op for op
with ggml's own ops, for `graph.GraphModel`.

A layer's graph begins with the end of the layer before it (that layer's experts run
between the two graphs, from the cache): the experts' sum normed, plus the dense FFN's
output, normed again, plus `attn_out`, times the layer's scalar — or with the scaled
embedding on the first layer. Then: the attention norm, the Q, K (and V, or K's own
projection) products, the per-head norms (V's without a weight), NeoX RoPE with the
layer kind's base and, on a full layer, `rope_freqs`; the keys and values into the
layer's cache (F32, K by rows, V transposed; a sliding layer's is a ring of cells,
position p in cell p mod its size, as llama.cpp's iSWA cache places one sequence); KQ
unscaled, the masked softmax, KQV, the output product, its norm and the residual add
(`attn_out`); the dense GeGLU FFN (geglu_split: ggml's GELU table) and its norm; the
experts' input (`pre_ffw_norm_2`); the router on `attn_out` RMS-normed without a weight,
scaled by 1/sqrt(d) and its per-channel scale, its softmax over every expert, their
descending argsort and the top k's weights (renormalised as build_moe_ffn does).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.gemma4.args import ModelArgs
from abbench.engine.arch.gemma4.model import DecoderLayer
from abbench.engine.arch.shared.graph import (
    RingWrites,
    cache_attention,
    expert_sum,
)
from abbench.engine.arch.shared.pieces import Pieces
from abbench.engine.arch.shared.token_graph import ExpertNodes
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import WEIGHT_SUM_MIN, QuantTeam, Weight

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile


class LayerWeights:
    """One layer's dense weights as the graph reads them: norms and scales F32, matrices
    as the file stores them; `folded` the router as one F32 matrix on its normed input
    (the predictor's, as the numpy model's)."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, team: QuantTeam,
                 pinned: bool) -> None:
        b = f"blk.{layer}."

        def vec(name: str) -> np.ndarray:
            return np.ascontiguousarray(mf.read_dense(b + name, True), dtype=np.float32)

        def matrix(name: str) -> Weight:
            return team.matrix(mf, b + name, pinned)

        self.norm = {n: vec(n + ".weight") for n in DecoderLayer.NORMS}  # (d,) each
        self.q_norm, self.k_norm = vec("attn_q_norm.weight"), vec("attn_k_norm.weight")
        self.router_scale = vec("ffn_gate_inp.scale")  # (d,)
        self.out_scale = vec("layer_output_scale.weight") if args.output_scales else None
        self.wq, self.wk, self.wo = (matrix(f"attn_{p}.weight") for p in ("q", "k", "output"))
        self.wv = matrix("attn_v.weight") if args.v_layers[layer] else None
        self.gate, self.up, self.down = (matrix(f"ffn_{p}.weight")
                                         for p in ("gate", "up", "down"))
        self.router = matrix("ffn_gate_inp.weight")  # (n_expert, d)
        inv_sqrt_d = np.float32(1) / np.sqrt(np.float32(args.embedding_length))
        self.folded = mf.read_dense(b + "ffn_gate_inp.weight", False) * (
            self.router_scale * inv_sqrt_d)[None, :]  # (n_expert, d)

    def matrices(self) -> list[Weight]:
        return [m for m in (self.wq, self.wk, self.wv, self.wo, self.gate, self.up,
                            self.down, self.router) if m is not None]


class LayerGraph:
    """One layer's graph (of `model`, a `graph.GraphModel`) for `t` tokens at
    positions pos.. attending over `n_kv` cells of its cache, from the layer before's end
    (`prev`: its graph, whose experts' sum is in `model.moe_out(t)`, or a decode graph
    (`decode`), whose experts' outputs and weights are in `model.moe_y`, `model.moe_w`;
    None: the embedding in `model.inputs(t)`) to the experts' input `x` (t, d), the
    router's input `unit` (t, d), its ranking `order` (t, n_expert) and the top k's
    `weights` (t, k); `mlp_at` and `attn_out_at` the addresses of its dense FFN's output
    and of `attn_out` (d, t), for the next graph."""

    def __init__(self, model: Any, layer: int, t: int, n_kv: int, pos: int,
                 prev: LayerGraph | None, decode: bool = False, moe: int | None = None
                 ) -> None:
        """moe: the layer before's experts' sum (d, 1) in a token's one graph
        (`TokenGraph`), which then computes this layer's nodes too (this one builds no
        graph of its own)."""
        a, w = model.args, model.weights[layer]
        self.decode = decode
        d, hd, nq, nkv = a.embedding_length, a.head_dim(layer), a.head_count, a.kv_heads[layer]
        n_expert, self.eps = a.expert_count, a.layer_norm_rms_epsilon
        self.cache = cache = model.caches[layer]
        self.model, self.w = model, w
        scratch = 4 * t * (20 * d + 6 * (nq + 2 * nkv) * hd + 3 * n_kv * nq
                           + 3 * a.feed_forward_length + 4 * n_expert)
        ctx = self.ctx = ggml.Context(model.team.g, 192, 512, scratch + (1 << 16))
        self.p = Pieces(ctx, model.team.repacker, self.eps)  # leaves and norms
        op = ctx.op
        pos_buf = model.inputs(t)[1]
        h = ending(ctx, model, prev, t, moe)  # (d, t)
        positions = ctx.tensor(ggml.I32, (t,), pos_buf.ctypes.data)
        mask = model.mask_tensor(ctx, model.sliding.mask(cache.swa, t, n_kv))  # (n_kv, t)
        x = self.p.rms(h, w.norm["attn_norm"])  # (d, t)
        rope = model.rope(layer)
        factors = None if cache.swa else self.p.vector(model.rope_freqs)
        q = op("reshape_3d", op("mul_mat", self.p.matrix(w.wq), x), hd, nq, t)  # (hd, nq, t)
        q = ctx.rope_ext(self.p.rms(q, w.q_norm), positions, rope, factors)
        k_proj = op("mul_mat", self.p.matrix(w.wk), x)  # (nkv*hd, t)
        # a layer without `attn_v` takes K's projection (before K's norm) as V
        v_proj = k_proj if w.wv is None else op("mul_mat", self.p.matrix(w.wv), x)
        k = ctx.rope_ext(self.p.rms(op("reshape_3d", k_proj, hd, nkv, t), w.k_norm),
                         positions, rope, factors)  # (hd, nkv, t)
        v = op("rms_norm", op("reshape_3d", v_proj, hd, nkv, t), self.eps)  # (hd, nkv, t)
        self.writes = RingWrites(ctx, cache, op("reshape_2d", k, nkv * hd, t),
                                 op("reshape_2d", v, nkv * hd, t), t, pos)
        # build_attn_mha with kq_scale 1
        heads = cache_attention(ctx, cache, q, mask, n_kv, (hd, nq, t), 1.0)  # (nq*hd, t)
        attn = self.p.rms(op("mul_mat", self.p.matrix(w.wo), heads), w.norm["post_attention_norm"])
        attn_out = ctx.add(attn, h)  # (d, t)
        mlp = self._dense_ffn(attn_out)  # (d, t)
        xe = self.p.rms(attn_out, w.norm["pre_ffw_norm_2"])  # (d, t) the experts' input
        unit, order, weights = self._router(attn_out, model.k, t)
        if moe is None:
            self.graph = ctx.graph([*self.writes.copies, mlp, xe, weights],
                                   model.team.threads_pool)
        # the tensors a token's one graph goes on from: the experts' input, the top k (a
        # view of the argsort), their weights; the dense FFN's output and `attn_out`
        self.nodes = (xe, op("view_2d", order, model.k, t, n_expert * 4, 0), weights)
        self.ends = (mlp, attn_out)
        self.write_nodes = self.writes.copies
        self.x = ctx.array(xe, (t, d), np.float32)
        self.unit = ctx.array(unit, (t, d), np.float32)
        self.order = ctx.array(order, (t, n_expert), np.int32)  # its first k: the experts
        self.weights = ctx.array(weights, (t, model.k), np.float32)
        self.mlp_at = ggml.TensorStruct.from_address(mlp).data
        self.attn_out_at = ggml.TensorStruct.from_address(attn_out).data
        self.top = self.order[:, : model.k]  # (t, k) each token's experts

    def end(self, experts: ExpertNodes) -> int:
        """What a token's one graph carries to the next layer's graph: the experts' sum,
        with which that graph ends this layer (`ending`)."""
        return experts.sum

    # -- the graph's pieces ---------------------------------------------------------------

    def _dense_ffn(self, attn_out: int) -> int:
        """build_ffn(LLM_FFN_GELU, LLM_FFN_PAR) on the FFN-normed `attn_out`, then its norm
        (`post_ffw_norm_1`) → (d, t)."""
        op, w = self.ctx.op, self.w
        xf = self.p.rms(attn_out, w.norm["ffn_norm"])  # (d, t)
        up = op("mul_mat", self.p.matrix(w.up), xf)  # (ff, t)
        gate = op("mul_mat", self.p.matrix(w.gate), xf)  # (ff, t)
        out = op("mul_mat", self.p.matrix(w.down), op("geglu_split", gate, up))  # (d, t)
        return self.p.rms(out, w.norm["post_ffw_norm_1"])

    def _router(self, attn_out: int, k: int, t: int) -> tuple[int, int, int]:
        """gemma4.cpp's router input (`attn_out` RMS-normed without a weight, times
        1/sqrtf(d), times `ffn_gate_inp.scale`) and its logits, then build_moe_ffn's
        SOFTMAX gating with norm_w: the softmax over every expert, its descending argsort
        (the first k the experts), their probabilities over their sum clamped to F16's
        least normal → the normed input (d, t), the argsort (n_expert, t), the weights
        (k, t)."""
        ctx, op, w = self.ctx, self.ctx.op, self.w
        a = self.model.args
        unit = op("rms_norm", attn_out, self.eps)  # (d, t)
        inv_sqrt_d = float(np.float32(1) / np.sqrt(np.float32(a.embedding_length)))
        r = op("mul", op("scale", unit, inv_sqrt_d), self.p.vector(w.router_scale))
        probs = op("soft_max", op("mul_mat", self.p.matrix(w.router), r))  # (n_expert, t)
        order = ctx.argsort_desc(probs)  # (n_expert, t) I32
        top = op("view_2d", order, k, t, a.expert_count * 4, 0)  # (k, t) argsort_top_k
        chosen = op("reshape_2d", ctx.get_rows(
            op("reshape_3d", probs, 1, a.expert_count, t), top), k, t)  # (k, t)
        total = op("clamp", op("sum_rows", chosen), WEIGHT_SUM_MIN, math.inf)  # (1, t)
        return unit, order, op("div", chosen, total)

    def set_position(self, pos: int) -> None:
        """Where this pass's keys and values go: cell (pos + i) mod cells for token i."""
        self.writes.set_position(pos)


def ending(ctx: ggml.Context, model: Any, prev: LayerGraph | None, t: int,
           moe: int | None = None) -> int:
    """The residual stream entering a layer (d, t), as a tensor of `ctx`: the scaled
    embedding (`model.inputs`) for the first layer, else the end of the layer before
    (gemma4.cpp L339-395): its experts' sum normed (`post_ffw_norm_2`), plus its dense
    FFN's output, normed (`post_ffw_norm`), plus its `attn_out`, times its scalar. After a
    decode graph the sum is made here as build_moe_ffn makes it (each output times its
    weight, then added in routing order: `model.moe_y`, `model.moe_w`), else it is
    `model.moe_out` (numpy's, the same arithmetic). In a token's one graph, `moe` is the
    sum's tensor and the layer before's are its own tensors (`prev.ends`)."""
    d, op = model.args.embedding_length, ctx.op
    if prev is None:
        return ctx.tensor(ggml.F32, (d, t), model.inputs(t)[0].ctypes.data)
    w, eps = prev.w, prev.eps

    def rms(x: int, weight: np.ndarray) -> int:
        return op("mul", op("rms_norm", x, eps), ctx.tensor(ggml.F32, (d,),
                                                           weight.ctypes.data))

    if moe is not None:
        mlp, attn_out = prev.ends
    else:
        if prev.decode:
            moe = expert_sum(ctx, model.moe_y, model.moe_w)  # (d, 1)
        else:
            moe = ctx.tensor(ggml.F32, (d, t), model.moe_out(t).ctypes.data)
        mlp = ctx.tensor(ggml.F32, (d, t), prev.mlp_at)
        attn_out = ctx.tensor(ggml.F32, (d, t), prev.attn_out_at)
    if prev.decode and model.moe_w.shape[0] == 1:
        moe = op("cont", moe)
    cur = ctx.add(mlp, rms(moe, w.norm["post_ffw_norm_2"]))  # (d, t)
    cur = ctx.add(rms(cur, w.norm["post_ffw_norm"]), attn_out)  # (d, t)
    if w.out_scale is not None:
        cur = op("mul", cur, ctx.tensor(ggml.F32, (1,), w.out_scale.ctypes.data))
    return cur

