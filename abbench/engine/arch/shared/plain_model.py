"""The plain MoE decoder in numpy (qwen3moe's skeleton, `plain_args.py`): RMSNorm, GQA
attention with q/k RMSNorm (per head, or over each whole projection) and NeoX RoPE, a
softmax router → top-k → (renormalised) weights, SwiGLU experts, no shared expert.

Skeleton (as every architecture's model): args → attention → sparse MoE block → decoder
layer → model. Dense weights live here; expert weights are streamed by the `ExpertRunner`
the model is given (cache, reads, the drop and speculation policies beside it), which also
runs the experts' FFN: here plain SwiGLU without biases (`plain_expert_ffn`, the shared
`compute.SwiGLU`), and the router has no bias (`router_bias`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.arch.shared.common import (
    rms_norm,
    rms_norm_rows,
    rope_matrix,
    rope_rows,
    rope_tables,
)
from abbench.engine.arch.shared.moe import SparseMoE
from abbench.engine.arch.shared.numpy_face import NumpyFace
from abbench.engine.arch.shared.plain_args import PlainArgs
from abbench.engine.kernels.compute import SWIGLU, MatMulT, MatVec, matmul_t
from abbench.engine.kernels.expert_ffn import ExpertFFN
from abbench.engine.streaming.streamer import BufferArena, arena_copy

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile

SAFE_EXP = 60.0  # |score| up to this: exp() stays finite and positive in F32 over 2^20 terms
_vecdot = np.vecdot  # row-wise dot products: one light call (einsum parses its subscripts)


def plain_expert_ffn(mf: ModelFile, args: PlainArgs) -> ExpertFFN:
    """The experts' FFN the shared expert side runs: silu(gate) * up, nothing per expert."""
    return SWIGLU


class Attention:
    """GQA attention with q/k RMSNorm and NeoX RoPE over a pre-allocated KV cache."""

    def __init__(self, mf: ModelFile, args: PlainArgs, layer: int, arena: BufferArena | None,
                 n_ctx: int):
        """`arena`: where pinned dense weights go (None: mapped from the file)."""
        b = f"blk.{layer}."
        pinned = arena is not None
        self.n_head, self.n_kv, self.hd = args.head_count, args.head_count_kv, args.key_length
        self.eps = args.layer_norm_rms_epsilon
        wq = mf.read_dense(b + "attn_q.weight", pinned)  # (n_head*hd, d)
        wk = mf.read_dense(b + "attn_k.weight", pinned)  # (n_kv*hd, d)
        wv = mf.read_dense(b + "attn_v.weight", pinned)  # (n_kv*hd, d)
        self.q_rows, self.k_rows = wq.shape[0], wk.shape[0]
        self.wqkv: np.ndarray | None = None
        self.wo = mf.read_dense(b + "attn_output.weight", pinned)  # (d, n_head*hd)
        if arena is not None:
            # One GEMV instead of three when the weights are ours to lay out; the separate
            # matrices become views of the fused one, so memory is not held twice.
            self.wqkv = arena_copy(arena, np.concatenate([wq, wk, wv]))  # (q+k+v rows, d)
            wq, wk, wv = np.split(self.wqkv, [self.q_rows, self.q_rows + self.k_rows])
            self.wo = arena_copy(arena, self.wo)
        self.wq, self.wk, self.wv = wq, wk, wv
        qk_rows = self.q_rows + self.k_rows
        self._qkv = np.empty(qk_rows + wv.shape[0], np.float32)  # (q+k+v rows,)
        self._qk = self._qkv[:qk_rows].reshape(self.n_head + self.n_kv, self.hd)  # views
        self._v = self._qkv[qk_rows:].reshape(self.n_kv, self.hd)
        self._out = np.empty(self.wo.shape[0], np.float32)  # (d,)
        q_norm = mf.read_dense(b + "attn_q_norm.weight", True)  # (hd,) | (n_head*hd,)
        k_norm = mf.read_dense(b + "attn_k_norm.weight", True)  # (hd,) | (n_kv*hd,)
        self.whole = args.PLAIN.qk_norm_whole
        self._norm_weights(q_norm, k_norm)
        self.k_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)
        # Each value row carries a 1 after it: the softmax's weighted sum of the values then
        # gives its denominator too (column hd), without a separate sum over the scores.
        self.v_cache = np.zeros((self.n_kv, n_ctx, self.hd + 1), np.float32)  # (n_kv, T_max, hd+1)
        self.v_cache[..., self.hd] = 1.0

    def _norm_weights(self, q_norm: np.ndarray, k_norm: np.ndarray) -> None:
        """The q and k norms as one weight row per head (n_head + n_kv, hd): q and k heads
        are normalised and rotated together. The attention scale 1/sqrt(hd) is folded
        into the q rows (RoPE is linear), and so is the norm's 1/D over D values:
        x / sqrt(sum(x²)/D + eps) = sqrt(D) x / sqrt(sum(x²) + D eps), which leaves small
        calls for the norm's scale (`_scales`)."""
        nq, nkv, hd = self.n_head, self.n_kv, self.hd
        if self.whole:  # D: each whole projection, its own weight in every cell
            rows = [q_norm.astype(np.float64).reshape(nq, hd) * np.sqrt(np.float64(nq)),
                    k_norm.astype(np.float64).reshape(nkv, hd) * np.sqrt(np.float64(nkv * hd))]
            self.eps_q, self.eps_k = np.float32(self.eps * nq * hd), np.float32(self.eps * nkv * hd)
            self._shift = True  # a head's part of a normalised projection has no small bound
        else:  # D = hd: a head, one weight row shared by the heads
            rows = [np.tile(q_norm.astype(np.float64), (nq, 1)),
                    np.tile(k_norm.astype(np.float64) * np.sqrt(np.float64(hd)), (nkv, 1))]
            # The rows are RMS-normalised and RoPE turns them without stretching them, so
            # |q.k| <= sqrt(hd) max|q_norm| max|k_norm|. When that is small, exp(scores)
            # can neither overflow nor vanish, and softmax needs no shift by the maximum.
            bound = np.sqrt(hd) * np.abs(q_norm).max() * np.abs(k_norm).max()
            self._shift = not bound <= SAFE_EXP
        self.qk_norm = np.concatenate(rows).astype(np.float32)  # (n_head + n_kv, hd)
        self.eps_hd = np.float32(self.eps * hd)

    def _scales(self, qk: np.ndarray) -> np.ndarray:
        """qk: (..., n_head + n_kv, hd) → (..., n_head + n_kv, 1) each row's norm scale
        over sqrt(D) (the sqrt(D) is in the weights, `_norm_weights`)."""
        if not self.whole:
            return head_scales(qk, self.eps_hd)
        nq = self.n_head
        q, k = qk[..., :nq, :], qk[..., nq:, :]
        scales = np.empty(qk.shape[:-1], np.float32)  # (..., n_head + n_kv)
        scales[..., :nq] = (_vecdot(q, q).sum(-1, keepdims=True) + self.eps_q) ** -0.5
        scales[..., nq:] = (_vecdot(k, k).sum(-1, keepdims=True) + self.eps_k) ** -0.5
        return scales[..., None]

    def matrices(self) -> tuple[np.ndarray, ...]:
        """The matrices a call multiplies through `mv`."""
        qkv = (self.wqkv,) if self.wqkv is not None else (self.wq, self.wk, self.wv)
        return (*qkv, self.wo)

    def __call__(self, x: np.ndarray, pos: int, rope: np.ndarray, mv: MatVec,
                 heads: np.ndarray) -> np.ndarray:
        """x: (d,) normalised input; rope: (hd, hd) this position's rotation → (d,), valid
        until the next call. `mv(w, x, out)` is w @ x (it may use a second core); `heads`
        (n_head*hd,), where the attention's output goes before the output projection (the
        team's `input`, so that `mv` need not copy it), may be x's own memory."""
        nq, nkv, hd = self.n_head, self.n_kv, self.hd
        if self.wqkv is not None:
            mv(self.wqkv, x, self._qkv)  # (q+k+v rows,) seen as _qk and _v
        else:
            np.concatenate([mv(self.wq, x), mv(self.wk, x), mv(self.wv, x)], out=self._qkv)
        qk = (self._qk * self._scales(self._qk) * self.qk_norm) @ rope  # (heads, hd)
        self.k_cache[:, pos] = qk[nq:]
        self.v_cache[:, pos, :hd] = self._v
        keys = self.k_cache[:, : pos + 1]  # (n_kv, T, hd)
        values = self.v_cache[:, : pos + 1]  # (n_kv, T, hd+1)
        qg = qk[:nq].reshape(nkv, nq // nkv, hd)  # (n_kv, g, hd), already scaled
        scores = qg @ keys.transpose(0, 2, 1)  # (n_kv, g, T)
        if self._shift:
            scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)  # unnormalised softmax
        out = scores @ values  # (n_kv, g, hd+1): the weighted values, then the weights' sum
        np.divide(out[..., :hd], out[..., hd:], heads.reshape(nkv, nq // nkv, hd))
        return mv(self.wo, heads, self._out)  # (d,)

    def prefill(self, x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray,
                mm: MatMulT = matmul_t) -> np.ndarray:
        """x: (n, d) normalised inputs of positions pos .. pos+n-1; cos, sin: (n, hd/2)
        their rotations → (n, d). Causal attention over the cache and the batch itself;
        the batch's keys and values join the cache. `mm(x, w)` is x @ w.T (it may use a
        second core)."""
        nq, nkv, hd = self.n_head, self.n_kv, self.hd
        n = x.shape[0]
        # One GEMM over the fused matrix, as pinned weights have it: the same split, so the
        # same bits whether the dense weights are pinned or mapped.
        w = self.wqkv if self.wqkv is not None else np.concatenate([self.wq, self.wk, self.wv])
        qkv = mm(x, w)  # (n, q+k+v rows)
        qk_rows = self.q_rows + self.k_rows
        qk = qkv[:, :qk_rows].reshape(n, nq + nkv, hd)  # (n, n_head + n_kv, hd)
        v = qkv[:, qk_rows:].reshape(n, nkv, hd)  # (n, n_kv, hd)
        qk = qk * self._scales(qk) * self.qk_norm  # (n, heads, hd)
        qk = rope_rows(qk, cos[:, None], sin[:, None])  # (n, heads, hd)
        end = pos + n
        self.k_cache[:, pos:end] = qk[:, nq:].transpose(1, 0, 2)  # (n_kv, n, hd)
        self.v_cache[:, pos:end, :hd] = v.transpose(1, 0, 2)
        keys = self.k_cache[:, :end]  # (n_kv, T, hd)
        values = self.v_cache[:, :end]  # (n_kv, T, hd+1)
        g = nq // nkv
        qg = qk[:, :nq].reshape(n, nkv, g, hd).transpose(1, 2, 0, 3)  # (n_kv, g, n, hd)
        scores = qg @ keys.transpose(0, 2, 1)[:, None]  # (n_kv, g, n, T), already scaled
        future = np.arange(end)[None, :] > (pos + np.arange(n))[:, None]  # (n, T) causal
        scores[..., future] = -np.inf
        if self._shift:
            scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)  # unnormalised softmax; exp(-inf) = 0
        out = scores @ values[:, None]  # (n_kv, g, n, hd+1): as in decode
        out = out[..., :hd] / out[..., hd:]  # (n_kv, g, n, hd)
        heads = out.transpose(2, 0, 1, 3).reshape(n, nq * hd)  # (n, n_head*hd)
        return mm(heads, self.wo)  # (n, d)


def head_scales(x: np.ndarray, eps_hd: np.float32) -> np.ndarray:
    """x: (..., hd) → (..., 1): each row's RMS-norm scale over sqrt(hd), 1/sqrt(sum(x²) +
    hd eps) (the sqrt(hd) is in the norm weights, see `Attention.qk_norm`)."""
    return ((_vecdot(x, x) + eps_hd) ** -0.5)[..., None]


class DecoderLayer:
    def __init__(self, mf: ModelFile, args: PlainArgs, layer: int, arena: BufferArena | None,
                 n_ctx: int, experts: ExpertRunner, k: int) -> None:
        b = f"blk.{layer}."
        self.attn_norm = mf.read_dense(b + "attn_norm.weight", True)  # (d,)
        self.attention = Attention(mf, args, layer, arena, n_ctx)
        self.ffn_norm = mf.read_dense(b + "ffn_norm.weight", True)  # (d,)
        self.moe = SparseMoE(mf, layer, arena, experts, k, args.PLAIN.renormalise)


class PlainModel(NumpyFace):
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""

    def __init__(
        self,
        mf: ModelFile,
        args: PlainArgs,
        experts: ExpertRunner,
        pinned: bool,
        n_ctx: int,
        n_expert_used: int | None = None,
    ) -> None:
        # The pinned matrices the GEMVs stream, in huge pages (`arena_copy`).
        self.arena = BufferArena() if pinned else None
        self._init_model(mf, args, experts, pinned, n_expert_used,
                         lambda i: DecoderLayer(mf, args, i, self.arena, n_ctx, experts, self.k))
        if self.arena is not None:
            self.output = arena_copy(self.arena, self.output)
        self.cos, self.sin = rope_tables(args.key_length, n_ctx, args.rope_freq_base)  # (T, hd/2)

    def gemv_matrices(self) -> list[np.ndarray]:
        """The dense matrices `forward` multiplies through `self.matvec`."""
        fused = [lay.moe.router_and_next for lay in self.layers]
        return [*(m for lay in self.layers for m in lay.attention.matrices()), self.output,
                *(m for m in fused if m is not None)]

    def router_matrix(self, layer: int) -> np.ndarray:
        return self.layers[layer].moe.router  # (n_expert, d)

    def router_bias(self, layer: int) -> np.ndarray | None:
        """What the router adds to its logits before ranking them: nothing here."""
        return None

    def fuse_next_routers(self) -> None:
        """Stack each layer's router over the next one's, for a stale-gate predictor: its
        hook then receives the next layer's ranking from the router's own GEMV and sort
        (decode only)."""
        for this, nxt in zip(self.layers, self.layers[1:]):
            n = this.moe.router.shape[0]
            both = np.vstack([this.moe.router, nxt.moe.router])  # (2 n_expert, d)
            this.moe.router_and_next = both if self.arena is None else arena_copy(self.arena,
                                                                                  both)
            this.moe.router = this.moe.router_and_next[:n]  # the same values, shared

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Run prompt tokens at positions pos .. pos+n-1 as one batch per layer
        (docs/engine.md#how-a-token-is-computed), filling the KV cache; their logits are not
        needed (the prompt's last token runs through `forward`, which samples the first
        output token)."""
        h = self.token_embd[tokens].astype(np.float32)  # (n, d)
        cos, sin = self.cos[pos : pos + len(tokens)], self.sin[pos : pos + len(tokens)]
        for layer in self.layers:
            h += layer.attention.prefill(rms_norm_rows(h, layer.attn_norm, self.eps), pos,
                                         cos, sin, self.matmul_t)
            h += layer.moe.prefill(rms_norm_rows(h, layer.ffn_norm, self.eps),
                                   self.routing_hook)

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        h = self.token_embd[token].astype(np.float32, copy=True)  # (d,)
        rope = rope_matrix(self.cos[pos], self.sin[pos])  # (hd, hd)
        mv, eps, hook = self.matvec, self.eps, self.routing_hook
        # Each GEMV's input is computed where the team reads it (no copy on the way): the
        # norms' outputs and the attention's heads, each dead once its GEMVs are done.
        x = self.vector(h.shape[0])  # (d,)
        heads = self.vector(self.args.head_count * self.args.key_length)  # (n_head*hd,)
        for layer in self.layers:
            h += layer.attention(rms_norm(h, layer.attn_norm, eps, x), pos, rope, mv, heads)
            h += layer.moe(rms_norm(h, layer.ffn_norm, eps, x), phase, hook, mv)
        return mv(self.output, rms_norm(h, self.output_norm, eps, x))  # (vocab,)
