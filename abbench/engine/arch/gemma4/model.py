"""gemma4 (Gemma 4 MoE, e.g. gemma-4-26B-A4B): qwen3moe's skeleton with a scaled embedding,
sliding-window layers between full ones (each kind with its own head size and RoPE), q/k
norms and an unweighted norm on V, no q·k scaling, a norm closing the attention and the
FFN, a dense GeGLU FFN beside the routed experts (each side normed on its own, their sum
normed again), a router on its own normed input, GeGLU experts with an output scale each,
a scalar on the layer's output and softcapped final logits. What it computes and where it
differs from qwen3moe: docs/engine.md, "Architectures"; step by step: docs/gemma4.md.

Skeleton (as every architecture file here): ModelArgs (`args.py`) → attention →
dense FFN and sparse MoE block → decoder layer → model. Dense weights live here; expert
weights are streamed by the shared `ExpertRunner`, which runs this architecture's expert
FFN (`expert_ffn`). This is the numpy model (`--kernels numpy`: every weight in F32): GELU
is ggml's own table (its input and output rounded to F16, to the bit), the rest numpy's
float32 arithmetic, so it agrees with llama.cpp to float rounding, not to the bit. The
model `--kernels auto` runs is llama.cpp's graph (`graph.py`), to the bit.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.gemma4.args import ModelArgs
from abbench.engine.arch.shared.common import RoutingHook, hidden_keys, rms_norm, rms_norm_rows
from abbench.engine.arch.shared.numpy_face import NumpyFace
from abbench.engine.kernels import ggml
from abbench.engine.kernels.compute import MatMulT, MatVec, matmul_t, matvec
from abbench.engine.kernels.expert_ffn import FFNGraph

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.kernels.ggml import Context

ARCH = "gemma4"
GELU_A, SQRT_2_OVER_PI = np.float32(0.044715), np.float32(0.7978845608028654)
ROUTE_SUM_MIN = np.float32(6.103515625e-5)  # llama.cpp's floor on the top-k weights' sum

__all__ = ["ARCH", "GeluExperts", "Model", "ModelArgs", "expert_ffn", "gelu", "gelu_table",
           "rope_table"]


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) as ggml-cpu computes it in F32 (`GGML_GELU_FP16`): x rounded to F16
    and looked up in its table of F16 results (`gelu_table`); x <= -10 gives 0 and
    x >= 10 gives x."""
    g = gelu_table()[x.astype(np.float16).view(np.uint16)]  # (...,)
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, g))


@cache
def gelu_table() -> np.ndarray:
    """ggml's GELU of every F16 value, rounded to F16 (held in F32), (65536,) by the value's
    bits: 0.5·h·(1 + tanh(sqrt(2/π)·h·(1 + 0.044715·h·h))) in F32, as ggml-cpu's build
    computes it — its 1 + a·h·h contracted to one rounding (an FMA) and tanh correctly
    rounded (glibc's tanhf): equal to its table on all 65536 values (tested)."""
    f32 = np.float32
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(f32)  # (65536,)
    with np.errstate(invalid="ignore", over="ignore"):
        # a float64 product of two F32 values is exact: plus 1, rounded once to F32
        inner = (GELU_A * h).astype(np.float64) * h.astype(np.float64) + 1.0
        t = np.tanh((SQRT_2_OVER_PI * h * inner.astype(f32)).astype(np.float64)).astype(f32)
        g = (f32(0.5) * h) * (f32(1) + t)
    return g.astype(np.float16).astype(f32)


class GeluExperts:
    """gemma4's expert FFN (an `expert_ffn.ExpertFFN`): gelu(gate) · up, and the down
    product times its expert's scale (`ffn_down_exps.scale`, when the file has them)."""

    def __init__(self, scales: list[np.ndarray] | None) -> None:
        self.scales = scales  # per layer (n_expert,)
        self.by_expert = scales is not None

    def act(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray, layer: int,
            experts: Any) -> None:
        out[...] = gelu(gate) * up  # (..., ff)

    def post(self, y: np.ndarray, layer: int, experts: Any) -> None:
        if self.scales is not None:
            y *= np.asarray(self.scales[layer][experts])[..., None]  # (..., d)

    def graph_bytes(self, rows: int, ff: int, d: int) -> int:
        return 4 * rows * (ff + 2 + d) + 5 * 64  # the act, the ids, each row's scale, the scaled

    def graph(self, ctx: Context, eids: int) -> FFNGraph:
        return _GeluGraph(self, ctx, eids)


class _GeluGraph:
    """`GeluExperts` as steps of ggml's expert graph, as llama.cpp's `build_moe_ffn` takes
    them: geglu_split (ggml's own GELU table), and after the down product its rows times
    their experts' scales (`build_lora_mm_id`: get_rows of the scale stack by expert id,
    a mul broadcast over each row)."""

    def __init__(self, ffn: GeluExperts, ctx: Context, eids: int) -> None:
        self.ctx, self.eids = ctx, eids
        self._heads: list[ggml.TensorStruct] = []
        self._at: list[int] = []
        if ffn.scales is not None:
            n_expert = ffn.scales[0].shape[0]
            self.scales = ctx.tensor(ggml.F32, (1, n_expert), ffn.scales[0].ctypes.data)
            self._heads = [ggml.TensorStruct.from_address(self.scales)]
            self._at = [s.ctypes.data for s in ffn.scales]  # per layer

    def act(self, gate: int, up: int) -> int:
        return self.ctx.op("geglu_split", gate, up)  # (ff, n_used, t)

    def post(self, down: int) -> int:
        if not self._heads:
            return down
        ctx, op = self.ctx, self.ctx.op
        n_used, t = (ggml_ne(self.eids, i) for i in (0, 1))
        # a batch's ids are a view of each token's argsort: its first n_used of each row
        eids = self.eids if t == 1 else op("cont", self.eids)  # (n_used, t)
        rows = ctx.get_rows(self.scales, op("reshape_1d", eids, n_used * t))  # (1, n*t)
        return op("mul", down, op("reshape_3d", rows, 1, n_used, t))  # (d, n_used, t)

    def set_layer(self, layer: int) -> None:
        for head in self._heads:
            head.data = self._at[layer]


def ggml_ne(t: int, i: int) -> int:
    """ggml's extent i of tensor `t`."""
    return int(ggml.TensorStruct.from_address(t).ne[i])


def expert_ffn(mf: ModelFile, args: ModelArgs) -> GeluExperts:
    """The file's expert FFN: its per-expert scales, read once (F32)."""
    if not args.expert_scales:
        return GeluExperts(None)
    return GeluExperts([mf.read_dense(f"blk.{i}.ffn_down_exps.scale", True)
                        for i in range(args.block_count)])


def rope_table(n_rot: int, base: float, freq_scale: float, factors: np.ndarray | None,
               n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: (n_ctx, n_rot/2) of NeoX RoPE in ggml's float32 steps: pair i's angle is
    the position times base^(-2/n_rot) multiplied in i times (rounded each step), divided
    by the pair's frequency factor (`rope_freqs`: 1e30 leaves a pair unrotated), times
    `freq_scale`. cos and sin of that float32 angle are numpy's, from float64."""
    f32, half = np.float32, n_rot // 2
    step = f32(np.float32(base) ** f32(-2.0 / n_rot))
    theta = np.empty((n_ctx, half), f32)  # (n_ctx, half)
    theta[:, 0] = np.arange(n_ctx, dtype=f32)
    for i in range(1, half):
        np.multiply(theta[:, i - 1], step, out=theta[:, i])
    if factors is not None:
        theta = theta / factors[None, :half]
    theta = (f32(freq_scale) * theta).astype(np.float64)
    return np.cos(theta).astype(f32), np.sin(theta).astype(f32)


def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX RoPE on x's first 2·cos.shape[-1] dims (the rest as they are): x (..., hd)."""
    half = cos.shape[-1]
    a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)


class Attention:
    """GQA attention with q and k RMS-normed per head (weights), V RMS-normed (no weight;
    V is K's projection where the layer has no `attn_v`), NeoX RoPE, q·k unscaled, causal,
    over a window of `sliding_window` positions (itself included) on a sliding layer."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, n_ctx: int) -> None:
        b, read = f"blk.{layer}.", mf.read_dense
        self.n_head, self.n_kv = args.head_count, args.kv_heads[layer]
        self.hd = args.head_dim(layer)
        self.eps = args.layer_norm_rms_epsilon
        parts = ("q", "k", "v") if args.v_layers[layer] else ("q", "k")
        self.wqkv = np.concatenate([read(b + f"attn_{p}.weight", False) for p in parts])
        self.wo = read(b + "attn_output.weight", False)  # (d, n_head*hd)
        self.q_norm = read(b + "attn_q_norm.weight", True)  # (hd,)
        self.k_norm = read(b + "attn_k_norm.weight", True)  # (hd,)
        self.window = args.sliding_window if args.swa_layers[layer] else None
        self.k_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)
        self.v_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)

    def __call__(self, x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray,
                 mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) normalised inputs at positions pos .. pos+n-1; cos, sin: (n, n_rot/2)
        → (n, d). The batch's keys and values join the cache."""
        nq, nkv, hd, eps = self.n_head, self.n_kv, self.hd, self.eps
        n, end = x.shape[0], pos + x.shape[0]
        qkv = mm(x, self.wqkv)  # (n, q+k[+v] rows)
        q = qkv[:, : nq * hd].reshape(n * nq, hd)
        kv_end = (nq + nkv) * hd
        k_raw = qkv[:, nq * hd:kv_end].reshape(n * nkv, hd)
        # a layer without `attn_v` takes K's projection (before K's norm) as V
        v_raw = qkv[:, kv_end:].reshape(n * nkv, hd) if qkv.shape[1] > kv_end else k_raw
        q = rope_rows(rms_norm_rows(q, self.q_norm, eps).reshape(n, nq, hd),
                      cos[:, None], sin[:, None])  # (n, n_head, hd)
        k = rope_rows(rms_norm_rows(k_raw, self.k_norm, eps).reshape(n, nkv, hd),
                      cos[:, None], sin[:, None])  # (n, n_kv, hd)
        v = rms_norm_rows(v_raw, np.float32(1), eps).reshape(n, nkv, hd)
        self.k_cache[:, pos:end] = k.transpose(1, 0, 2)
        self.v_cache[:, pos:end] = v.transpose(1, 0, 2)
        g = nq // nkv
        qg = q.reshape(n, nkv, g, hd).transpose(1, 2, 0, 3)  # (n_kv, g, n, hd)
        scores = qg @ self.k_cache[:, None, :end].transpose(0, 1, 3, 2)  # (n_kv, g, n, T)
        scores[..., hidden_keys(pos, n, self.window)] = -np.inf
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (n_kv, g, n, T)
        out = (e @ self.v_cache[:, None, :end]) / e.sum(axis=-1, keepdims=True)
        heads = out.transpose(2, 0, 1, 3).reshape(n, nq * hd)  # (n, n_head*hd)
        return mm(heads, self.wo)  # (n, d)


class DenseFFN:
    """The FFN every layer has beside its experts: gelu(gate) · up, then down."""

    def __init__(self, mf: ModelFile, layer: int) -> None:
        b = f"blk.{layer}."
        self.w_gu = np.concatenate([mf.read_dense(b + "ffn_gate.weight", False),
                                    mf.read_dense(b + "ffn_up.weight", False)])  # (2ff, d)
        self.w_down = mf.read_dense(b + "ffn_down.weight", False)  # (d, ff)

    def __call__(self, x: np.ndarray, mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) → (n, d)."""
        gu = mm(x, self.w_gu)  # (n, 2ff)
        ff = gu.shape[1] // 2
        return mm(gelu(gu[:, :ff]) * gu[:, ff:], self.w_down)


class SparseMoE:
    """Router (on the layer's input RMS-normed without a weight, over sqrt(d), times a
    scale per channel) → softmax → top-k → renormalise → drop policy → load → experts
    (`GeluExperts`, run by the shared runner) → weighted sum."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, experts: ExpertRunner,
                 k: int) -> None:
        self.layer, self.k, self.experts = layer, k, experts
        self.router = mf.read_dense(f"blk.{layer}.ffn_gate_inp.weight", False)  # (n_expert, d)
        self.scale = mf.read_dense(f"blk.{layer}.ffn_gate_inp.scale", True)  # (d,)
        self.inv_sqrt_d = np.float32(1.0) / np.sqrt(np.float32(args.embedding_length))
        # What the router makes of the normed input in one matrix (the predictor's)
        self.folded = self.router * (self.scale * self.inv_sqrt_d)[None, :]  # (n_expert, d)

    def logits(self, unit: np.ndarray, mv: MatVec = matvec) -> np.ndarray:
        """unit: (d,) the layer's input RMS-normed → (n_expert,), in llama.cpp's order."""
        return mv(self.router, unit * self.inv_sqrt_d * self.scale)

    def top_k(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """logits: (..., n_expert) → the top-k ids by probability (ties to the lower id)
        and their probabilities renormalised to sum 1, (..., k) each."""
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = e / e.sum(axis=-1, keepdims=True)  # (..., n_expert)
        ids = np.argsort(-probs, axis=-1, kind="stable")[..., : self.k]  # (..., k)
        w = np.take_along_axis(probs, ids, axis=-1)  # (..., k)
        return ids, w / np.maximum(w.sum(axis=-1, keepdims=True), ROUTE_SUM_MIN)

    def __call__(self, unit: np.ndarray, x: np.ndarray, phase: int, hook: RoutingHook | None,
                 next_moe: SparseMoE | None, mv: MatVec = matvec) -> np.ndarray:
        """unit: (d,) the router's normed input, x: (d,) the experts' → (d,). The hook is
        given `unit`; with the next layer's router fused in (`next_moe`), also the next
        layer's ranking of it (the stale-gate prediction, with that layer's own scale)."""
        ids, weights = self.top_k(self.logits(unit, mv))  # (k,), (k,)
        if hook is not None and next_moe is not None and phase == 1:
            nxt = next_moe.logits(unit, mv)  # (n_expert,)
            hook(self.layer, unit, ids, weights, phase, next_moe.top_k(nxt)[0], nxt)
        elif hook is not None:
            hook(self.layer, unit, ids, weights, phase)
        kept, y = self.experts.run_routed(self.layer, x, ids, weights, phase)
        return kept @ y  # (k',) @ (k', d) → (d,)

    def prefill(self, unit: np.ndarray, x: np.ndarray, hook: RoutingHook | None) -> np.ndarray:
        """unit, x: (n, d) → (n, d)."""
        ids, w = self.top_k((unit * self.inv_sqrt_d * self.scale) @ self.router.T)  # (n, k)
        if hook is not None:
            hook(self.layer, unit, ids, w, 0)
        return self.experts.prefill(self.layer, x, ids, w)  # (n, d)


class DecoderLayer:
    NORMS = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm_1",
             "pre_ffw_norm_2", "post_ffw_norm_2", "post_ffw_norm")

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, n_ctx: int,
                 experts: ExpertRunner, k: int) -> None:
        b = f"blk.{layer}."
        self.norm = {n: mf.read_dense(b + n + ".weight", True) for n in self.NORMS}  # (d,)
        self.attention = Attention(mf, args, layer, n_ctx)
        self.dense = DenseFFN(mf, layer)
        self.moe = SparseMoE(mf, args, layer, experts, k)
        self.out_scale = (mf.read_dense(b + "layer_output_scale.weight", True)  # (1,)
                          if args.output_scales else None)
        self.swa = args.swa_layers[layer]


class Model(NumpyFace):
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""

    LAYER = DecoderLayer
    args: ModelArgs

    def _init_positions(self, mf: ModelFile, n_ctx: int) -> None:
        args = self.args
        self.embd_scale = np.sqrt(np.float32(args.embedding_length))
        self.softcap = args.final_logit_softcapping
        factors = None if all(args.swa_layers) else mf.read_dense("rope_freqs.weight", True)
        # (n_ctx, n_rot/2) each: the sliding layers' (their own base, no scaling or
        # factors, as llama.cpp's gemma4) and the full layers'
        self.tables = {
            True: rope_table(args.rope_dimension_count_swa, args.rope_freq_base_swa, 1.0,
                             None, n_ctx),
            False: rope_table(args.rope_dimension_count, args.rope_freq_base,
                              args.rope_freq_scale, factors, n_ctx)}
        self.fused = False  # a stale-gate predictor asked for the next layer's ranking

    def gemv_matrices(self) -> list[np.ndarray]:
        """The dense matrices `forward` multiplies through `self.matvec`."""
        return [*(lay.moe.router for lay in self.layers), self.output]

    def router_matrix(self, layer: int) -> np.ndarray:
        """The router as one matrix on the layer's input RMS-normed without a weight (what
        the routing hook is given): its 1/sqrt(d) and per-channel scale folded in."""
        return self.layers[layer].moe.folded  # (n_expert, d)

    def router_bias(self, layer: int) -> np.ndarray | None:
        return None

    def fuse_next_routers(self) -> None:
        self.fused = True

    def _layers(self, x: np.ndarray, pos: int, phase: int | None) -> np.ndarray:
        """x: (n, d) scaled embeddings at positions pos .. → (n, d) the last layer's output;
        `phase` None: a prompt batch, else one decode token's MoE path."""
        h, n, eps, mm = x, x.shape[0], self.eps, self.matmul_t
        for i, layer in enumerate(self.layers):
            norm = layer.norm
            cos, sin = (t[pos:pos + n] for t in self.tables[layer.swa])
            attn = layer.attention(rms_norm_rows(h, norm["attn_norm"], eps), pos, cos, sin, mm)
            h = h + rms_norm_rows(attn, norm["post_attention_norm"], eps)  # (n, d)
            mlp = rms_norm_rows(layer.dense(rms_norm_rows(h, norm["ffn_norm"], eps), mm),
                                norm["post_ffw_norm_1"], eps)
            unit = rms_norm_rows(h, np.float32(1), eps)  # the router's input
            x_moe = rms_norm_rows(h, norm["pre_ffw_norm_2"], eps)  # the experts'
            if phase is None:
                moe = layer.moe.prefill(unit, x_moe, self.routing_hook)
            else:
                nxt = self.layers[i + 1].moe if self.fused and i + 1 < len(self.layers) \
                    else None
                moe = layer.moe(unit[0], x_moe[0], phase, self.routing_hook, nxt,
                                self.matvec)[None]
            moe = rms_norm_rows(moe, norm["post_ffw_norm_2"], eps)
            h = h + rms_norm_rows(mlp + moe, norm["post_ffw_norm"], eps)
            if layer.out_scale is not None:
                h = h * layer.out_scale
        return h

    def _embed(self, tokens: list[int]) -> np.ndarray:
        return self.token_embd[tokens].astype(np.float32) * self.embd_scale  # (n, d)

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Run prompt tokens at positions pos .. pos+n-1 as one batch per layer, filling the
        KV caches."""
        self._layers(self._embed(tokens), pos, None)

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        h = self._layers(self._embed([token]), pos, phase)[0]  # (d,)
        logits = self.matvec(self.output, rms_norm(h, self.output_norm, self.eps))  # (vocab,)
        if self.softcap:
            logits = np.tanh(logits * (np.float32(1) / np.float32(self.softcap))) \
                * np.float32(self.softcap)
        return logits
