"""gpt-oss (OpenAI's MoE): qwen3moe's skeleton with biases on q/k/v/o, no q/k norm, a
learned attention sink per head, sliding-window attention on a pattern of layers, YaRN
RoPE, a router with a bias whose top-k logits are softmaxed, and experts with a bias after
each product and the clamped SwiGLU (`OaiExperts`). What it computes and where it differs
from qwen3moe: docs/engine.md, "Architectures".

Skeleton (as every architecture file here): ModelArgs (`args.py`) → attention →
sparse MoE block → decoder layer → model. Dense weights live here; expert weights are
streamed by the shared `ExpertRunner`, which runs this architecture's expert FFN
(`expert_ffn`). This is the numpy model (`--kernels numpy`: every weight in F32), written
for clarity over speed; its transcendentals are numpy's, so it agrees with llama.cpp to
float rounding, not to the bit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.gpt_oss.args import ModelArgs
from abbench.engine.arch.shared.common import RoutingHook, hidden_keys, rms_norm, rms_norm_rows
from abbench.engine.arch.shared.numpy_face import NumpyFace
from abbench.engine.kernels import ggml
from abbench.engine.kernels.compute import MatMulT, MatVec, matmul_t, matvec
from abbench.engine.kernels.expert_ffn import FFNGraph

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.kernels.ggml import Context

ARCH = "gpt-oss"
ALPHA, LIMIT = 1.702, 7.0  # SWIGLU_OAI's constants, as llama.cpp passes them

__all__ = ["ARCH", "Model", "ModelArgs", "OaiExperts", "expert_ffn", "yarn_tables"]


class OaiExperts:
    """gpt-oss's expert FFN (an `expert_ffn.ExpertFFN`): gate and up each plus its expert's
    bias, x = min(gate, 7), y = clip(up, -7, 7), x / (1 + e^(-1.702 x)) · (y + 1), then the
    down product plus its bias. Its bias stacks (per layer, F32, a row per expert id) are
    the file's (`expert_ffn` reads them once)."""

    by_expert = True

    def __init__(self, gate_b: list[np.ndarray], up_b: list[np.ndarray],
                 down_b: list[np.ndarray]) -> None:
        self.gate_b = gate_b  # per layer (n_expert, ff)
        self.up_b = up_b  # per layer (n_expert, ff)
        self.down_b = down_b  # per layer (n_expert, d)

    def act(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray, layer: int,
            experts: Any) -> None:
        g = np.minimum(gate + self.gate_b[layer][experts], np.float32(LIMIT))  # (..., ff)
        u = np.clip(up + self.up_b[layer][experts], np.float32(-LIMIT), np.float32(LIMIT))
        out[...] = g / (1 + np.exp(np.float32(-ALPHA) * g)) * (u + 1)

    def post(self, y: np.ndarray, layer: int, experts: Any) -> None:
        y += self.down_b[layer][experts]  # (..., d)

    def graph_bytes(self, rows: int, ff: int, d: int) -> int:
        return 4 * rows * (3 * ff + d) + 4 * 64  # two biased inputs, the act, the output

    def graph(self, ctx: Context, eids: int) -> FFNGraph:
        return _OaiGraph(self, ctx, eids)


class _OaiGraph:
    """`OaiExperts` as steps of ggml's expert graph: add_id, swiglu_oai, add_id (as
    llama.cpp's `build_moe_ffn` adds the bias rows of the rows' experts)."""

    def __init__(self, ffn: OaiExperts, ctx: Context, eids: int) -> None:
        self.ffn, self.ctx, self.eids = ffn, ctx, eids
        stacks = (ffn.gate_b, ffn.up_b, ffn.down_b)
        self.biases = [ctx.tensor(ggml.F32, (s[0].shape[1], s[0].shape[0]), s[0].ctypes.data)
                       for s in stacks]  # (n, n_expert) each
        # set per expert call: the headers and each layer's addresses, looked up once
        self._heads = [ggml.TensorStruct.from_address(t) for t in self.biases]
        self._at = [[m.ctypes.data for m in s] for s in stacks]  # per part, per layer

    def act(self, gate: int, up: int) -> int:
        ctx, (gb, ub, _) = self.ctx, self.biases
        return ctx.swiglu_oai(ctx.add_id(gate, gb, self.eids), ctx.add_id(up, ub, self.eids),
                              ALPHA, LIMIT)

    def post(self, down: int) -> int:
        return self.ctx.add_id(down, self.biases[2], self.eids)

    def set_layer(self, layer: int) -> None:
        for head, at in zip(self._heads, self._at, strict=True):
            head.data = at[layer]


def expert_ffn(mf: ModelFile, args: ModelArgs) -> OaiExperts:
    """The file's expert FFN: its bias stacks, read once, F32 (the partner process forks
    after this, so it shares them)."""
    def stacks(part: str) -> list[np.ndarray]:
        return [mf.read_dense(f"blk.{i}.ffn_{part}_exps.bias", True)
                for i in range(args.block_count)]

    return OaiExperts(stacks("gate"), stacks("up"), stacks("down"))


def yarn_tables(r: ggml.Rope, n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: (n_ctx, n_dims/2) of NeoX RoPE with YaRN, in ggml's float32 steps: each
    pair's angle is the position times the running product of base^(-2/n_dims) (as ggml
    accumulates it, rounding each step), mixed between its interpolated (scaled) and its
    extrapolated value by a ramp over the pairs between the correction dimensions; both
    tables carry YaRN's magnitude. cos and sin themselves are numpy's, correctly rounded
    from float64 (glibc's cosf/sinf agree with them but in rare last bits)."""
    f32, half = np.float32, r.n_dims // 2

    def corr_dim(beta: float) -> float:
        return r.n_dims * math.log(r.n_ctx_orig / (beta * 2 * math.pi)) / (
            2 * math.log(r.freq_base))

    low = max(0.0, math.floor(corr_dim(r.beta_fast)))
    high = min(r.n_dims - 1.0, math.ceil(corr_dim(r.beta_slow)))
    step = f32(r.freq_base ** (-2.0 / r.n_dims))
    extrap = np.empty((n_ctx, half), f32)  # (n_ctx, half)
    extrap[:, 0] = np.arange(n_ctx, dtype=f32)
    for i in range(1, half):
        np.multiply(extrap[:, i - 1], step, out=extrap[:, i])
    theta = f32(r.freq_scale) * extrap
    mscale = f32(r.attn_factor)
    if r.ext_factor != 0:
        ramp = f32(1) - np.clip((np.arange(half, dtype=f32) - f32(low))
                                / f32(max(0.001, high - low)), 0, 1).astype(f32)  # (half,)
        mix = ramp * f32(r.ext_factor)
        theta = theta * (f32(1) - mix) + extrap * mix
        mscale = mscale * (f32(1) + f32(0.1) * f32(math.log(1 / r.freq_scale)))
    t64 = theta.astype(np.float64)
    return np.cos(t64).astype(f32) * mscale, np.sin(t64).astype(f32) * mscale


def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX RoPE: x (..., hd), cos and sin broadcasting to (..., hd/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


class Attention:
    """GQA attention with q/k/v/o biases, YaRN NeoX RoPE, a sink per head (a logit in the
    softmax's denominator with no value), causal, over a window of `sliding_window`
    positions (itself included) on a sliding layer."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, n_ctx: int) -> None:
        b = f"blk.{layer}."
        self.n_head, self.n_kv, self.hd = args.head_count, args.head_count_kv, args.key_length
        read = mf.read_dense
        self.wqkv = np.concatenate([read(b + f"attn_{p}.weight", False)  # (q+k+v rows, d)
                                    for p in "qkv"])
        self.bqkv = np.concatenate([read(b + f"attn_{p}.bias", True) for p in "qkv"])
        self.wo = read(b + "attn_output.weight", False)  # (d, n_head*hd)
        self.bo = read(b + "attn_output.bias", True)  # (d,)
        self.sinks = read(b + "attn_sinks.weight", True)  # (n_head,)
        self.window = args.sliding_window if args.swa_layers[layer] else None
        self.scale = np.float32(1.0 / math.sqrt(self.hd))
        self.k_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)
        self.v_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)

    def __call__(self, x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray,
                 mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) normalised inputs at positions pos .. pos+n-1; cos, sin: (n, hd/2)
        their rotations → (n, d). The batch's keys and values join the cache."""
        nq, nkv, hd = self.n_head, self.n_kv, self.hd
        n, end = x.shape[0], pos + x.shape[0]
        qkv = mm(x, self.wqkv) + self.bqkv  # (n, q+k+v rows)
        q = rope_rows(qkv[:, : nq * hd].reshape(n, nq, hd), cos[:, None], sin[:, None])
        k = rope_rows(qkv[:, nq * hd:(nq + nkv) * hd].reshape(n, nkv, hd), cos[:, None],
                      sin[:, None])  # (n, n_kv, hd)
        self.k_cache[:, pos:end] = k.transpose(1, 0, 2)
        self.v_cache[:, pos:end] = qkv[:, (nq + nkv) * hd:].reshape(n, nkv, hd).transpose(1, 0, 2)
        g = nq // nkv
        qg = q.reshape(n, nkv, g, hd).transpose(1, 2, 0, 3)  # (n_kv, g, n, hd)
        keys_t = self.k_cache[:, None, :end].transpose(0, 1, 3, 2)  # (n_kv, 1, hd, T)
        scores = qg @ keys_t * self.scale  # (n_kv, g, n, T)
        scores[..., hidden_keys(pos, n, self.window)] = -np.inf
        sink = self.sinks.reshape(nkv, g, 1, 1)  # (n_kv, g, 1, 1)
        top = np.maximum(scores.max(axis=-1, keepdims=True), sink)
        e = np.exp(scores - top)  # (n_kv, g, n, T)
        denom = e.sum(axis=-1, keepdims=True) + np.exp(sink - top)
        out = (e @ self.v_cache[:, None, :end]) / denom  # (n_kv, g, n, hd)
        heads = out.transpose(2, 0, 1, 3).reshape(n, nq * hd)  # (n, n_head*hd)
        return mm(heads, self.wo) + self.bo  # (n, d)


class SparseMoE:
    """Router (with its bias) → top-k logits → their softmax → drop policy → load →
    experts (`OaiExperts`, run by the shared runner) → weighted sum."""

    def __init__(self, mf: ModelFile, layer: int, experts: ExpertRunner, k: int) -> None:
        self.layer, self.k, self.experts = layer, k, experts
        self.router = mf.read_dense(f"blk.{layer}.ffn_gate_inp.weight", False)  # (n_expert, d)
        self.bias = mf.read_dense(f"blk.{layer}.ffn_gate_inp.bias", True)  # (n_expert,)

    def logits(self, x: np.ndarray, mv: MatVec = matvec) -> np.ndarray:
        return mv(self.router, x) + self.bias  # (n_expert,)

    def top_k(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """logits: (..., n_expert) → the top-k ids (ties to the lower id) and the softmax of
        their logits, (..., k) each."""
        ids = np.argsort(-logits, axis=-1, kind="stable")[..., : self.k]  # (..., k)
        top = np.take_along_axis(logits, ids, axis=-1)  # (..., k)
        w = np.exp(top - top[..., :1])
        return ids, w / w.sum(axis=-1, keepdims=True)

    def __call__(self, x: np.ndarray, phase: int, hook: RoutingHook | None,
                 next_moe: SparseMoE | None, mv: MatVec = matvec) -> np.ndarray:
        """x: (d,) → (d,). A hook with the next layer's router fused in (`next_moe`) is
        given the next layer's ranking of this input too (the stale-gate prediction)."""
        ids, weights = self.top_k(self.logits(x, mv))  # (k,), (k,)
        if hook is not None and next_moe is not None and phase == 1:
            nxt = next_moe.logits(x, mv)  # (n_expert,) with its bias
            hook(self.layer, x, ids, weights, phase, next_moe.top_k(nxt)[0], nxt)
        elif hook is not None:
            hook(self.layer, x, ids, weights, phase)
        kept, y = self.experts.run_routed(self.layer, x, ids, weights, phase)
        return kept @ y  # (k',) @ (k', d) → (d,)

    def prefill(self, x: np.ndarray, hook: RoutingHook | None) -> np.ndarray:
        """x: (n, d) → (n, d)."""
        ids, w = self.top_k(x @ self.router.T + self.bias)  # (n, k), (n, k)
        if hook is not None:
            hook(self.layer, x, ids, w, 0)
        return self.experts.prefill(self.layer, x, ids, w)  # (n, d)


class DecoderLayer:
    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, n_ctx: int,
                 experts: ExpertRunner, k: int) -> None:
        b = f"blk.{layer}."
        self.attn_norm = mf.read_dense(b + "attn_norm.weight", True)  # (d,)
        self.attention = Attention(mf, args, layer, n_ctx)
        self.ffn_norm = mf.read_dense(b + "post_attention_norm.weight", True)  # (d,)
        self.moe = SparseMoE(mf, layer, experts, k)
        self.swa = args.swa_layers[layer]


class Model(NumpyFace):
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""

    LAYER = DecoderLayer
    args: ModelArgs

    def _init_positions(self, mf: ModelFile, n_ctx: int) -> None:
        # (n_ctx, hd/2) each, for the full layers and the sliding ones (their own base)
        self.tables = {swa: yarn_tables(self.args.rope(swa), n_ctx) for swa in (False, True)}
        self.fused = False  # a stale-gate predictor asked for the next layer's ranking

    def gemv_matrices(self) -> list[np.ndarray]:
        """The dense matrices `forward` multiplies through `self.matvec`."""
        return [*(lay.moe.router for lay in self.layers), self.output]

    def router_matrix(self, layer: int) -> np.ndarray:
        return self.layers[layer].moe.router  # (n_expert, d)

    def router_bias(self, layer: int) -> np.ndarray | None:
        """What the router adds to its logits before ranking them (n_expert,)."""
        return self.layers[layer].moe.bias

    def fuse_next_routers(self) -> None:
        self.fused = True

    def _layers(self, x: np.ndarray, pos: int, phase: int | None) -> np.ndarray:
        """x: (n, d) embeddings at positions pos .. → (n, d) the last layer's output;
        `phase` None: a prompt batch, else one decode token's MoE path."""
        h = x
        n = x.shape[0]
        for i, layer in enumerate(self.layers):
            cos, sin = (t[pos:pos + n] for t in self.tables[layer.swa])
            h = h + layer.attention(rms_norm_rows(h, layer.attn_norm, self.eps), pos, cos, sin,
                                    self.matmul_t)
            if phase is None:
                h = h + layer.moe.prefill(rms_norm_rows(h, layer.ffn_norm, self.eps),
                                          self.routing_hook)
                continue
            nxt = self.layers[i + 1].moe if self.fused and i + 1 < len(self.layers) else None
            h = h + layer.moe(rms_norm(h[0], layer.ffn_norm, self.eps), phase,
                              self.routing_hook, nxt, self.matvec)[None]
        return h

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Run prompt tokens at positions pos .. pos+n-1 as one batch per layer, filling the
        KV caches."""
        self._layers(self.token_embd[tokens].astype(np.float32), pos, None)

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        h = self._layers(self.token_embd[[token]].astype(np.float32), pos, phase)[0]  # (d,)
        return self.matvec(self.output, rms_norm(h, self.output_norm, self.eps))  # (vocab,)
