"""Qwen3-MoE: RMSNorm, GQA attention with per-head q/k RMSNorm and NeoX RoPE, a softmax
router → top-k → renormalised weights, SwiGLU experts, no shared expert.

Skeleton (as every architecture file here): ModelArgs → attention → sparse MoE block →
decoder layer → model. Dense weights live here; expert weights are streamed by the
`ExpertRunner` the model is given, which also runs the experts' SwiGLU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.arch.common import RoutingHook, rms_norm, rms_norm_rows, rope_tables, softmax

if TYPE_CHECKING:
    from abbench.engine.experts import ExpertRunner
    from abbench.engine.gguf_file import ModelFile

ARCH = "qwen3moe"


@dataclass(frozen=True)
class ModelArgs:
    """Field names follow the GGUF keys (`qwen3moe.<key>`)."""

    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    layer_norm_rms_epsilon: float
    rope_freq_base: float
    expert_count: int
    expert_used_count: int
    expert_feed_forward_length: int
    context_length: int
    vocab_size: int

    @classmethod
    def from_file(cls, mf: ModelFile) -> ModelArgs:
        p = mf.architecture + "."
        d = int(mf.require(p + "embedding_length"))
        n_head = int(mf.require(p + "attention.head_count"))
        head_dim = int(mf.get(p + "attention.key_length", d // n_head))
        return cls(
            block_count=int(mf.require(p + "block_count")),
            embedding_length=d,
            head_count=n_head,
            head_count_kv=int(mf.get(p + "attention.head_count_kv", n_head)),
            key_length=head_dim,
            value_length=int(mf.get(p + "attention.value_length", head_dim)),
            layer_norm_rms_epsilon=float(mf.get(p + "attention.layer_norm_rms_epsilon", 1e-6)),
            rope_freq_base=float(mf.get(p + "rope.freq_base", 1_000_000.0)),
            expert_count=int(mf.require(p + "expert_count")),
            expert_used_count=int(mf.require(p + "expert_used_count")),
            expert_feed_forward_length=int(mf.require(p + "expert_feed_forward_length")),
            context_length=int(mf.get(p + "context_length", 4096)),
            vocab_size=mf.tensor("token_embd.weight").shape[0],
        )


class Attention:
    """GQA attention with per-head q/k RMSNorm and NeoX RoPE over a pre-allocated KV cache."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, pinned: bool, n_ctx: int):
        b = f"blk.{layer}."
        self.n_head, self.n_kv, self.hd = args.head_count, args.head_count_kv, args.key_length
        self.eps = args.layer_norm_rms_epsilon
        wq = mf.read_dense(b + "attn_q.weight", pinned)  # (n_head*hd, d)
        wk = mf.read_dense(b + "attn_k.weight", pinned)  # (n_kv*hd, d)
        wv = mf.read_dense(b + "attn_v.weight", pinned)  # (n_kv*hd, d)
        self.q_rows, self.k_rows = wq.shape[0], wk.shape[0]
        self.wqkv: np.ndarray | None = None
        if pinned:
            # One GEMV instead of three when the weights are ours to lay out; the separate
            # matrices become views of the fused one, so memory is not held twice.
            self.wqkv = np.concatenate([wq, wk, wv])  # (q+k+v rows, d)
            wq, wk, wv = np.split(self.wqkv, [self.q_rows, self.q_rows + self.k_rows])
        self.wq, self.wk, self.wv = wq, wk, wv
        self.wo = mf.read_dense(b + "attn_output.weight", pinned)  # (d, n_head*hd)
        q_norm = mf.read_dense(b + "attn_q_norm.weight", True)  # (hd,)
        k_norm = mf.read_dense(b + "attn_k_norm.weight", True)  # (hd,)
        # q and k heads are normalised and rotated together: one norm weight row per head.
        self.qk_norm = np.concatenate(  # (n_head + n_kv, hd)
            [np.tile(q_norm, (self.n_head, 1)), np.tile(k_norm, (self.n_kv, 1))]
        )
        self.k_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)
        self.v_cache = np.zeros((self.n_kv, n_ctx, self.hd), np.float32)  # (n_kv, T_max, hd)
        self.scale = np.float32(1.0 / np.sqrt(self.hd))

    def __call__(self, x: np.ndarray, pos: int, rope: np.ndarray) -> np.ndarray:
        """x: (d,) normalised input; rope: (hd, hd) this position's rotation → (d,)."""
        nq, nkv, hd = self.n_head, self.n_kv, self.hd
        if self.wqkv is not None:
            qkv = self.wqkv @ x  # (q+k+v rows,)
        else:
            qkv = np.concatenate([self.wq @ x, self.wk @ x, self.wv @ x])
        qk = qkv[: self.q_rows + self.k_rows].reshape(nq + nkv, hd)  # (n_head + n_kv, hd)
        qk = rms_norm_rows(qk, self.qk_norm, self.eps) @ rope  # (n_head + n_kv, hd)
        self.k_cache[:, pos] = qk[nq:]
        self.v_cache[:, pos] = qkv[self.q_rows + self.k_rows :].reshape(nkv, hd)
        keys = self.k_cache[:, : pos + 1]  # (n_kv, T, hd)
        values = self.v_cache[:, : pos + 1]  # (n_kv, T, hd)
        qg = qk[:nq].reshape(nkv, nq // nkv, hd)  # (n_kv, g, hd)
        scores = qg @ keys.transpose(0, 2, 1)  # (n_kv, g, T)
        scores *= self.scale
        probs = softmax(scores, axis=-1)  # (n_kv, g, T)
        out = probs @ values  # (n_kv, g, hd)
        return self.wo @ out.reshape(-1)  # (d,)


def rope_matrix(cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX RoPE at one position as a right-multiplied (hd, hd) matrix.

    Dimension i pairs with i + hd/2: out_i = x_i cos - x_{i+h} sin,
    out_{i+h} = x_{i+h} cos + x_i sin. Built once per token, shared by every layer.
    """
    half = cos.shape[0]
    r = np.zeros((2 * half, 2 * half), np.float32)
    idx = np.arange(half)
    r[idx, idx] = cos
    r[idx + half, idx + half] = cos
    r[idx + half, idx] = -sin
    r[idx, idx + half] = sin
    return r


class SparseMoE:
    """Router → softmax → top-k → renormalise; the experts run in the ExpertRunner."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, pinned: bool):
        self.layer = layer
        self.k = args.expert_used_count
        self.router = mf.read_dense(f"blk.{layer}.ffn_gate_inp.weight", pinned)  # (n_expert, d)

    def route(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        probs = softmax(self.router @ x)  # (n_expert,)
        # Stable sort on the negated probabilities: ties resolve to the lower expert id.
        ids = np.argsort(-probs, kind="stable")[:k]  # (k,)
        weights = probs[ids]
        return ids, (weights / weights.sum()).astype(np.float32)  # (k,), (k,)


class DecoderLayer:
    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, pinned: bool, n_ctx: int):
        b = f"blk.{layer}."
        self.attn_norm = mf.read_dense(b + "attn_norm.weight", True)  # (d,)
        self.attention = Attention(mf, args, layer, pinned, n_ctx)
        self.ffn_norm = mf.read_dense(b + "ffn_norm.weight", True)  # (d,)
        self.moe = SparseMoE(mf, args, layer, pinned)


class Model:
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""

    def __init__(
        self,
        mf: ModelFile,
        args: ModelArgs,
        experts: ExpertRunner,
        pinned: bool,
        n_ctx: int,
        n_expert_used: int | None = None,
    ) -> None:
        self.args = args
        self.experts = experts
        self.k = n_expert_used or args.expert_used_count
        self.eps = args.layer_norm_rms_epsilon
        self.token_embd = mf.read_dense("token_embd.weight", pinned)  # (vocab, d)
        self.layers = [DecoderLayer(mf, args, i, pinned, n_ctx) for i in range(args.block_count)]
        self.output_norm = mf.read_dense("output_norm.weight", True)  # (d,)
        name = "output.weight" if "output.weight" in mf.tensors else "token_embd.weight"
        self.output = mf.read_dense(name, pinned)  # (vocab, d)
        self.cos, self.sin = rope_tables(args.key_length, n_ctx, args.rope_freq_base)  # (T, hd/2)
        self.routing_hook: RoutingHook | None = None
        # The dense weights the forward pass reads after each layer's experts, in order.
        nxt = [(a.wqkv if a.wqkv is not None else a.wq, a.wo, lay.moe.router)
               for lay in self.layers[1:] for a in (lay.attention,)]
        self._warm: list[tuple[np.ndarray, ...]] = [*nxt, (self.output,)]

    def router_matrix(self, layer: int) -> np.ndarray:
        return self.layers[layer].moe.router  # (n_expert, d)

    def forward(self, token: int, pos: int, phase: int) -> np.ndarray:
        h = self.token_embd[token].astype(np.float32, copy=True)  # (d,)
        rope = rope_matrix(self.cos[pos], self.sin[pos])  # (hd, hd)
        for i, layer in enumerate(self.layers):
            h += layer.attention(rms_norm(h, layer.attn_norm, self.eps), pos, rope)
            x = rms_norm(h, layer.ffn_norm, self.eps)  # (d,) the router's input
            ids, weights = layer.moe.route(x, self.k)
            if self.routing_hook is not None:
                self.routing_hook(i, x, ids, weights, phase)
            h += self.experts.forward(i, x, ids, weights, phase, self._warm[i])
        return self.output @ rms_norm(h, self.output_norm, self.eps)  # (vocab,)
