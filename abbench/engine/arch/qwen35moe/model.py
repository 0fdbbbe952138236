"""Qwen3.5/3.6 MoE (`qwen35moe`): a hybrid stack. Most layers are gated delta-net linear
attention (an input projection, a short causal convolution over the last few tokens, the
delta rule on a per-head state matrix, a gated RMSNorm, an output projection); every
`full_attention_interval`-th layer is gated full attention (q/k RMSNorm, partial NeoX RoPE,
the heads times a sigmoid gate the q projection also makes). Every layer's FFN is qwen3moe's
routed MoE plus a shared expert whose output a sigmoid gate scales. What it computes and
where it differs from qwen3moe: docs/engine.md, "Architectures"; llama.cpp's graph op by
op: docs/qwen35moe.md.

Skeleton (as every architecture file here): ModelArgs (`args.py`) → attention
(`GatedAttention`, `GatedDeltaNet`) → sparse MoE block (qwen3moe's `SparseMoE`, with the
`SharedExpert` beside it) → decoder layer → model. The routed experts are streamed by the
shared `ExpertRunner` and run as qwen3moe's (`expert_ffn`: plain SwiGLU). This is the numpy
model (`--kernels numpy`), in F32 with numpy's transcendentals: it agrees with llama.cpp to
float rounding, not to the bit.

State: the full layers' KV caches are indexed by position, as qwen3moe's; the linear
layers' conv and delta-rule states are one sequence's, carried from pass to pass, and are
zeroed when a pass starts at position 0 (a new sequence, as llama.cpp clears its recurrent
cells with its KV cache). A pass at any other position must continue the last one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.arch.qwen35moe.args import ModelArgs
from abbench.engine.arch.shared.common import (
    rms_norm,
    rms_norm_rows,
    rope_tables,
)
from abbench.engine.arch.shared.moe import SparseMoE
from abbench.engine.arch.shared.numpy_face import NumpyFace
from abbench.engine.kernels.compute import SWIGLU, MatMulT, matmul_t
from abbench.engine.kernels.expert_ffn import ExpertFFN
from abbench.errors import EngineError

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile

ARCH = "qwen35moe"

__all__ = ["ARCH", "GatedAttention", "GatedDeltaNet", "Model", "ModelArgs", "expert_ffn"]


def expert_ffn(mf: ModelFile, args: ModelArgs) -> ExpertFFN:
    """The routed experts' FFN: qwen3moe's, silu(gate) * up, nothing per expert."""
    return SWIGLU


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _head_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (..., hd) → (..., hd), RMS-normalised over each head's dimensions, times weight."""
    return x * ((x * x).mean(axis=-1, keepdims=True) + np.float32(eps)) ** -0.5 * weight


class GatedAttention:
    """A full layer: GQA over a KV cache with q/k RMSNorm, NeoX RoPE on the first
    `rope.dimension_count` dimensions of each head (the rest pass unrotated), and the heads'
    output times sigmoid of a gate that the q projection makes beside each head's query."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, n_ctx: int) -> None:
        b = f"blk.{layer}."
        read = mf.read_dense
        self.n_head, self.n_kv, self.hd = args.head_count, args.head_count_kv, args.key_length
        self.eps, self.half = args.layer_norm_rms_epsilon, args.rope_dimension_count // 2
        self.wqkv = np.concatenate([read(b + f"attn_{p}.weight", False)  # (2q+k+v rows, d)
                                    for p in "qkv"])
        self.wo = read(b + "attn_output.weight", False)  # (d, n_head*hd)
        self.q_norm = read(b + "attn_q_norm.weight", True)  # (hd,)
        self.k_norm = read(b + "attn_k_norm.weight", True)  # (hd,)
        self.scale = np.float32(1.0 / math.sqrt(self.hd))
        self.k_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)
        self.v_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x: (n, heads, hd); cos, sin: (n, 1, n_rot/2) → x with dimension i < n_rot/2
        turned with i + n_rot/2 (NeoX pairs), the dimensions from n_rot on unchanged."""
        h = self.half
        a, b = x[..., :h], x[..., h:2 * h]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * h:]], axis=-1)

    def __call__(self, x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray,
                 mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) normalised inputs at positions pos .. pos+n-1; cos, sin: (n, n_rot/2)
        → (n, d). The batch's keys and values join the cache."""
        nq, nkv, hd = self.n_head, self.n_kv, self.hd
        n, end = x.shape[0], pos + x.shape[0]
        qkv = mm(x, self.wqkv)  # (n, 2q+k+v rows)
        qg = qkv[:, : 2 * nq * hd].reshape(n, nq, 2, hd)  # per head: its query, its gate
        gate = qg[:, :, 1].reshape(n, nq * hd)  # (n, n_head*hd)
        k = qkv[:, 2 * nq * hd:(2 * nq + nkv) * hd].reshape(n, nkv, hd)
        v = qkv[:, (2 * nq + nkv) * hd:].reshape(n, nkv, hd)
        c, s = cos[:, None], sin[:, None]
        q = self.rope(_head_norm(qg[:, :, 0], self.q_norm, self.eps), c, s)  # (n, n_head, hd)
        self.k_cache[:, pos:end] = self.rope(_head_norm(k, self.k_norm, self.eps), c,
                                             s).transpose(1, 0, 2)
        self.v_cache[:, pos:end] = v.transpose(1, 0, 2)
        g = nq // nkv
        qh = q.reshape(n, nkv, g, hd).transpose(1, 2, 0, 3)  # (n_kv, g, n, hd)
        scores = qh @ self.k_cache[:, None, :end].transpose(0, 1, 3, 2) * self.scale
        future = np.arange(end)[None, :] > (pos + np.arange(n))[:, None]  # (n, T) causal
        scores[..., future] = -np.inf  # (n_kv, g, n, T)
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out = (e @ self.v_cache[:, None, :end]) / e.sum(axis=-1, keepdims=True)
        heads = out.transpose(2, 0, 1, 3).reshape(n, nq * hd)  # (n, n_head*hd)
        return mm(heads * _sigmoid(gate), self.wo)  # (n, d)


class GatedDeltaNet:
    """A linear-attention layer. One projection gives the convolved channels (q, k, v), the
    output gate z, and per value head the write strength beta and the decay's input alpha;
    the channels pass a causal depthwise convolution over the last `ssm.conv_kernel`
    inputs (`conv_state` holds the ones before the pass) and SiLU; q and k are
    L2-normalised; value head h reads key head h mod n_k. Per value head the state S
    (value x key) decays by exp(g), g = softplus(alpha + dt) * a, then takes the delta
    rule's write S += beta (v - S k) k^T; the output S q / sqrt(hd) is RMS-normalised per
    head, times silu(z), then projected out."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int) -> None:
        b = f"blk.{layer}."
        read = mf.read_dense
        self.h, self.hk, self.s = (args.ssm_time_step_rank, args.ssm_group_count,
                                   args.ssm_state_size)
        self.eps = args.layer_norm_rms_epsilon
        self.w_in = np.concatenate([read(b + n, False) for n in (  # (conv+inner+2h, d)
            "attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight")])
        self.conv_w = read(b + "ssm_conv1d.weight", True)  # (conv, K)
        self.dt = read(b + "ssm_dt.bias", True)  # (h,)
        self.a = read(b + "ssm_a", True)  # (h,) = -exp(A_log)
        self.norm = read(b + "ssm_norm.weight", True)  # (hd,)
        self.wo = read(b + "ssm_out.weight", False)  # (d, inner)
        self.conv = self.conv_w.shape[0]
        self.inner = self.h * self.s
        self.scale = np.float32(1.0 / math.sqrt(self.s))
        self.heads_k = np.arange(self.h) % self.hk  # (h,) the key head each value head reads
        # one sequence's state: the last K-1 inputs of the convolution, oldest first, and
        # per value head S as ggml lays it out: row j (a value dimension) over keys i
        self.conv_state = np.zeros((self.conv_w.shape[1] - 1, self.conv), np.float32)
        self.state = np.zeros((self.h, self.s, self.s), np.float32)  # (h, hd_v, hd_k)

    def reset(self) -> None:
        self.conv_state[:] = 0
        self.state[:] = 0

    def __call__(self, x: np.ndarray, mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) normalised inputs of the next n positions → (n, d); the states move
        on by n tokens (the recurrence runs token by token)."""
        n, h, hk, s, conv, inner = x.shape[0], self.h, self.hk, self.s, self.conv, self.inner
        proj = mm(x, self.w_in)  # (n, conv + inner + 2h)
        z = proj[:, conv:conv + inner].reshape(n, h, s)
        beta = _sigmoid(proj[:, conv + inner:conv + inner + h])  # (n, h)
        g = np.logaddexp(np.float32(0), proj[:, conv + inner + h:] + self.dt) * self.a  # (n, h)
        window = np.concatenate([self.conv_state, proj[:, :conv]])  # (K-1+n, conv)
        taps = np.lib.stride_tricks.sliding_window_view(window, self.conv_w.shape[1], axis=0)
        mixed = np.einsum("tck,ck->tc", taps, self.conv_w)  # (n, conv)
        self.conv_state[:] = window[n:]
        mixed *= _sigmoid(mixed)  # SiLU
        q = mixed[:, : hk * s].reshape(n, hk, s)
        k = mixed[:, hk * s: 2 * hk * s].reshape(n, hk, s)
        v = mixed[:, 2 * hk * s:].reshape(n, h, s)  # (n, h, hd)
        q = (q / np.sqrt((q * q).sum(-1, keepdims=True) + np.float32(self.eps)))[:, self.heads_k]
        k = (k / np.sqrt((k * k).sum(-1, keepdims=True) + np.float32(self.eps)))[:, self.heads_k]
        decay = np.exp(g)  # (n, h)
        out = np.empty((n, h, s), np.float32)
        st = self.state  # (h, hd_v, hd_k)
        for t in range(n):
            st *= decay[t][:, None, None]
            delta = (v[t] - (st @ k[t][:, :, None])[..., 0]) * beta[t][:, None]  # (h, hd_v)
            st += delta[:, :, None] * k[t][:, None, :]
            out[t] = (st @ q[t][:, :, None])[..., 0] * self.scale  # (h, hd_v)
        y = _head_norm(out, self.norm, self.eps) * (z * _sigmoid(z))  # (n, h, hd)
        return mm(y.reshape(n, inner), self.wo)  # (n, d)


class SharedExpert:
    """The expert every token runs: SwiGLU, its output times sigmoid(w · x)."""

    def __init__(self, mf: ModelFile, layer: int) -> None:
        b = f"blk.{layer}."
        read = mf.read_dense
        self.w_gate_up = np.concatenate([read(b + "ffn_gate_shexp.weight", False),
                                         read(b + "ffn_up_shexp.weight", False)])  # (2F, d)
        self.down = read(b + "ffn_down_shexp.weight", False)  # (d, F)
        self.gate = read(b + "ffn_gate_inp_shexp.weight", True)  # (d,)
        self.ff = self.down.shape[1]

    def __call__(self, x: np.ndarray, mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) → (n, d)."""
        gu = mm(x, self.w_gate_up)  # (n, 2F)
        act = gu[:, : self.ff] * _sigmoid(gu[:, : self.ff]) * gu[:, self.ff:]  # (n, F)
        return mm(act, self.down) * _sigmoid(x @ self.gate)[:, None]  # (n, d)


class DecoderLayer:
    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, n_ctx: int,
                 experts: ExpertRunner, k: int) -> None:
        b = f"blk.{layer}."
        self.attn_norm = mf.read_dense(b + "attn_norm.weight", True)  # (d,)
        self.recurrent = args.recurrent_layers[layer]
        self.mixer: GatedDeltaNet | GatedAttention = (
            GatedDeltaNet(mf, args, layer) if self.recurrent
            else GatedAttention(mf, args, layer, n_ctx))
        self.ffn_norm = mf.read_dense(b + "post_attention_norm.weight", True)  # (d,)
        self.moe = SparseMoE(mf, layer, None, experts, k)
        self.shared = SharedExpert(mf, layer)


class Model(NumpyFace):
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""

    LAYER = DecoderLayer
    args: ModelArgs

    def _init_positions(self, mf: ModelFile, n_ctx: int) -> None:
        args = self.args
        # (T, n_rot/2): text positions are equal on the first three RoPE axes and 0 on the
        # fourth, so the sections' rotation is NeoX's over the first n_rot dimensions with
        # the fourth axis's pairs left still
        self.cos, self.sin = rope_tables(args.rope_dimension_count, n_ctx, args.rope_freq_base)
        still = ~args.rotated_pairs()  # pairs on the 4th axis: position 0 for text
        self.cos[:, still], self.sin[:, still] = 1, 0
        self.next_pos = 0  # where the recurrent states stand

    def gemv_matrices(self) -> list[np.ndarray]:
        """The dense matrices `forward` multiplies through `self.matvec`."""
        fused = [lay.moe.router_and_next for lay in self.layers]
        return [self.output, *(m for m in fused if m is not None)]

    def router_matrix(self, layer: int) -> np.ndarray:
        return self.layers[layer].moe.router  # (n_expert, d)

    def router_bias(self, layer: int) -> np.ndarray | None:
        """What the router adds to its logits before ranking them: nothing here."""
        return None

    def fuse_next_routers(self) -> None:
        """Stack each layer's router over the next one's, for a stale-gate predictor (as
        qwen3moe's): every layer has the routed MoE, linear or full."""
        for this, nxt in zip(self.layers, self.layers[1:]):
            n = this.moe.router.shape[0]
            this.moe.router_and_next = np.vstack([this.moe.router, nxt.moe.router])
            this.moe.router = this.moe.router_and_next[:n]

    def reset(self) -> None:
        """Start a new sequence: the linear layers' states to zero (the KV caches are
        overwritten by position)."""
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                layer.mixer.reset()
        self.next_pos = 0

    def _layers(self, x: np.ndarray, pos: int, phase: int | None) -> np.ndarray:
        """x: (n, d) embeddings at positions pos .. → (n, d) the last layer's output;
        `phase` None: a prompt batch, else one decode token's MoE path."""
        if pos == 0:
            self.reset()
        elif pos != self.next_pos:
            raise EngineError(f"qwen35moe: a pass at position {pos}, but the recurrent "
                              f"state stands at {self.next_pos} (it can only go on)")
        n, h, eps = x.shape[0], x, self.eps
        self.next_pos = pos + n
        cos, sin = self.cos[pos:pos + n], self.sin[pos:pos + n]
        for layer in self.layers:
            xa = rms_norm_rows(h, layer.attn_norm, eps)  # (n, d)
            mixed = (layer.mixer(xa, self.matmul_t) if isinstance(layer.mixer, GatedDeltaNet)
                     else layer.mixer(xa, pos, cos, sin, self.matmul_t))
            h = h + mixed
            xf = rms_norm_rows(h, layer.ffn_norm, eps)  # (n, d)
            if phase is None:
                routed = layer.moe.prefill(xf, self.routing_hook)  # (n, d)
            else:
                routed = layer.moe(xf[0], phase, self.routing_hook, self.matvec)[None]
            h = (routed + layer.shared(xf, self.matmul_t)) + h
        return h

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Run prompt tokens at positions pos .. pos+n-1 as one batch per layer, filling the
        KV caches and moving the recurrent states on."""
        self._layers(self.token_embd[tokens].astype(np.float32), pos, None)

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        h = self._layers(self.token_embd[[token]].astype(np.float32), pos, phase)[0]  # (d,)
        return self.matvec(self.output, rms_norm(h, self.output_norm, eps=self.eps))  # (vocab,)
