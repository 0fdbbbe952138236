"""qwen35moe's layers as llama.cpp's graph (src/models/qwen35moe.cpp, delta-net-base.cpp):
the weights one layer reads, its recurrent state, and the graph of one pass over `t`
tokens, op for op with ggml's own ops (docs/qwen35moe.md §3 has them in order).

A gated delta-net layer: the qkv, z, beta and alpha products; sigmoid(beta);
softplus(alpha + dt) * a; the conv input as `concat(conv state, qkv^T)`, its last K-1
columns copied back to the state; `ssm_conv`, SiLU; the q, k, v views, q and k
L2-normalised as `build_gdn_l2_norm` (rms_norm at eps/S, scaled by 1/sqrt(S)); the fused
`gated_delta_net` (K = 1: the output, then the final state, copied back); RMSNorm times
`ssm_norm` times silu(z); `ssm_out`. A full layer: the q product (each head's query then
its gate), q/k RMSNorm, the interleaved multi-section RoPE (`rope_multi`, IMROPE, four
positions a token: p, p, p, 0), the KV cache and attention as qwen3moe's graph, the heads
times sigmoid(gate), `attn_output`. Then the residual add, `post_attention_norm`, the
router's softmax and argsort, and the shared expert (SwiGLU, times sigmoid of its gate
row's product), which `graph.GraphModel` adds to the routed experts' sum.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import numpy as np

from abbench.engine.arch.qwen35moe.args import ModelArgs
from abbench.engine.arch.shared.graph import (
    ROPE_PLAIN,
    LayerCache,
    RingWrites,
    cache_attention,
)
from abbench.engine.arch.shared.pieces import Pieces
from abbench.engine.arch.shared.token_graph import ExpertNodes
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import WEIGHT_SUM_MIN, QuantTeam, Weight

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile

ROPE_IMROPE = 40  # GGML_ROPE_TYPE_IMROPE: interleaved sections, NeoX pairs


class GraphModel(Protocol):
    """What a layer's graph reads of its model (`graph.GraphModel`): the header,
    the ggml team, the layers' weights and states, and the buffers a pass fills."""

    args: ModelArgs
    team: QuantTeam
    kv_size: int
    weights: list[LayerWeights]

    def inputs(self, t: int) -> tuple[np.ndarray, np.ndarray]: ...

    def positions(self, t: int) -> np.ndarray: ...

    def mask(self, t: int, n_kv: int) -> np.ndarray: ...


def _vec(mf: ModelFile, name: str) -> np.ndarray:
    return np.ascontiguousarray(mf.read_dense(name, True), dtype=np.float32)


class DeltaNetWeights:
    """A gated delta-net layer's weights and its one sequence's recurrent state, laid out
    as llama.cpp's recurrent memory holds them."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, team: QuantTeam,
                 pinned: bool) -> None:
        b = f"blk.{layer}."
        self.wqkv, self.wz, self.wbeta, self.walpha, self.wo = (
            team.matrix(mf, b + n, pinned) for n in (
                "attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
                "ssm_out.weight"))
        self.conv_w = _vec(mf, b + "ssm_conv1d.weight")  # (C, K)
        self.dt = _vec(mf, b + "ssm_dt.bias")  # (Hv,)
        self.a = _vec(mf, b + "ssm_a")  # (Hv,) = -exp(A_log)
        self.norm = _vec(mf, b + "ssm_norm.weight")  # (S,)
        s, hv = args.ssm_state_size, args.ssm_time_step_rank
        channels, taps = self.conv_w.shape
        self.conv_state = np.zeros((channels, taps - 1), np.float32)  # ggml (K-1, C)
        self.state = np.zeros((hv, s, s), np.float32)  # ggml (S, S, Hv): row j over keys i

    def matrices(self) -> list[Weight]:
        return [self.wqkv, self.wz, self.wbeta, self.walpha, self.wo]

    def reset(self) -> None:
        self.conv_state.fill(0)
        self.state.fill(0)


class AttentionWeights:
    """A full layer's weights and its KV cache (`shared/graph.LayerCache`: F32, K by rows,
    V transposed; F16 for flash attention)."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, team: QuantTeam,
                 pinned: bool, kv_size: int, flash_attn: bool) -> None:
        b = f"blk.{layer}."
        self.wq, self.wk, self.wv, self.wo = (
            team.matrix(mf, b + n, pinned) for n in ("attn_q.weight", "attn_k.weight",
                                                     "attn_v.weight", "attn_output.weight"))
        self.q_norm = _vec(mf, b + "attn_q_norm.weight")  # (hd,)
        self.k_norm = _vec(mf, b + "attn_k_norm.weight")  # (hd,)
        self.cache = LayerCache.new(False, kv_size, args.head_count_kv * args.key_length,
                                    flash_attn)

    def matrices(self) -> list[Weight]:
        return [self.wq, self.wk, self.wv, self.wo]


class LayerWeights:
    """One layer: its mixer's weights, the norms, the router (F32) and the shared expert."""

    def __init__(self, mf: ModelFile, args: ModelArgs, layer: int, team: QuantTeam,
                 pinned: bool, kv_size: int, flash_attn: bool = False) -> None:
        b = f"blk.{layer}."
        self.attn_norm = _vec(mf, b + "attn_norm.weight")  # (d,)
        self.post_norm = _vec(mf, b + "post_attention_norm.weight")  # (d,)
        self.mixer: DeltaNetWeights | AttentionWeights = (
            DeltaNetWeights(mf, args, layer, team, pinned) if args.recurrent_layers[layer]
            else AttentionWeights(mf, args, layer, team, pinned, kv_size, flash_attn))
        self.router = _vec(mf, b + "ffn_gate_inp.weight")  # (n_expert, d)
        self.sh_gate, self.sh_up, self.sh_down = (
            team.matrix(mf, b + f"ffn_{n}_shexp.weight", pinned) for n in ("gate", "up", "down"))
        self.sh_inp = _vec(mf, b + "ffn_gate_inp_shexp.weight")  # (d,)

    def matrices(self) -> list[Weight]:
        return [*self.mixer.matrices(), self.sh_gate, self.sh_up, self.sh_down]


def scratch_bytes(a: ModelArgs, t: int, n_kv: int) -> int:
    """An upper bound on one layer graph's results for `t` tokens (either kind)."""
    d, hd, s, hv = a.embedding_length, a.key_length, a.ssm_state_size, a.ssm_time_step_rank
    conv = 2 * a.ssm_group_count * s + a.ssm_inner_size
    per_token = (16 * d + 8 * conv + 12 * a.ssm_inner_size + 16 * hv
                 + 10 * (a.head_count + a.head_count_kv) * hd + 3 * n_kv * a.head_count
                 + 6 * a.expert_count + 6 * a.expert_shared_feed_forward_length)
    fixed = 2 * (a.ssm_conv_kernel * conv + s * s * hv)
    return 4 * (t * per_token + fixed) + (1 << 16)


class LayerGraph:
    """One layer's graph for `t` tokens (a full layer attending over `n_kv` positions):
    from the residual stream `h` (t, d) to the FFN's input `ffn_inp` (t, d), the experts'
    input `x` (t, d), the `k` experts chosen and their weights (t, k), and the gated shared
    expert's output `shared` (t, d). A linear layer's pass moves its state on."""

    def __init__(self, model: GraphModel, layer: int, t: int, n_kv: int, k: int,
                 stream: int | None = None) -> None:
        """stream: the layer before's end (d, 1) in a token's one graph (`TokenGraph`),
        which then computes this layer's nodes too (this one builds no graph of its
        own); None: the stream in `model.inputs(t)`."""
        a = model.args
        w = self.w = model.weights[layer]
        ctx = self.ctx = ggml.Context(model.team.g, 192, 256, scratch_bytes(a, t, n_kv))
        self.p = Pieces(ctx, model.team.repacker, a.layer_norm_rms_epsilon)  # leaves and norms
        self.model, self.t = model, t
        self.writes: list[int] = []  # the state copies and KV writes the graph must run
        self.ring: RingWrites | None = None  # a full layer's KV writes, moved per pass
        h_buf, _ = model.inputs(t)
        h = (ctx.tensor(ggml.F32, (a.embedding_length, t), h_buf.ctypes.data)
             if stream is None else stream)
        x = self.p.rms(h, w.attn_norm)  # (d, t)
        mixer = (self._delta_net(w.mixer, x) if isinstance(w.mixer, DeltaNetWeights)
                 else self._attention(w.mixer, x, n_kv))  # (d, t)
        ffn_inp = ctx.op("add", mixer, h)  # (d, t)
        xf = self.p.rms(ffn_inp, w.post_norm)  # (d, t)
        top, weights = self._router(w, xf, k)  # (k, t) I32, (k, t)
        shared = self._shared(w, xf)  # (d, t)
        if stream is None:
            self.graph = ctx.graph([*self.writes, weights, shared], model.team.threads_pool)
        # the tensors a token's one graph goes on from
        self.nodes = (xf, top, weights, shared, ffn_inp)
        self.write_nodes = self.writes
        d, e = a.embedding_length, a.expert_count
        self.ffn_inp = ctx.array(ffn_inp, (t, d), np.float32)
        self.x = ctx.array(xf, (t, d), np.float32)
        # the top k are the first k of each row of the whole descending argsort
        self.ids = ctx.array(ggml.TensorStruct.from_address(top).view_src, (t, e),
                             np.int32)[:, :k]
        self.weights = ctx.array(weights, (t, k), np.float32)
        self.shared = ctx.array(shared, (t, d), np.float32)
        # the first token's rows, as decode reads them on every layer of every token
        self.first = (self.x[0], self.ids[0], self.weights[0], self.shared[0], self.ffn_inp[0])
        self.top = self.ids  # (t, k)

    def end(self, experts: ExpertNodes) -> int:
        """This layer's end (d, 1) in a token's one graph, as llama.cpp ends it: the
        experts' weighted sum plus the shared expert's output, plus `ffn_inp`."""
        ctx, shared, ffn_inp = experts.ctx, self.nodes[3], self.nodes[4]
        return ctx.add(ctx.add(experts.sum, shared), ffn_inp)

    def _delta_net(self, w: DeltaNetWeights, x: int) -> int:
        """build_layer_attn_linear: x (d, t) → (d, t); the conv and delta states move on."""
        a, t, op = self.model.args, self.t, self.ctx.op
        s, hk, hv = a.ssm_state_size, a.ssm_group_count, a.ssm_time_step_rank
        channels, k1 = w.conv_state.shape  # C, K-1
        qkv = op("mul_mat", self.p.matrix(w.wqkv), x)  # (C, t)
        z = op("mul_mat", self.p.matrix(w.wz), x)  # (Hv*S, t)
        beta = op("sigmoid", op("reshape_4d", op("mul_mat", self.p.matrix(w.wbeta), x),
                                1, hv, t, 1))  # (1, Hv, t, 1)
        alpha = op("mul_mat", self.p.matrix(w.walpha), x)  # (Hv, t)
        gate = op("mul", op("softplus", op("add", alpha, self.p.vector(w.dt))),
                  self.p.vector(w.a))  # (Hv, t)
        gate = op("reshape_4d", gate, 1, hv, t, 1)
        # the conv's input: the state's K-1 earlier inputs, then this pass's
        conv_state = self.p.vector(w.conv_state)  # (K-1, C)
        conv_in = op("concat", op("reshape_3d", conv_state, k1, channels, 1),
                     op("transpose", op("reshape_3d", qkv, channels, t, 1)), 0)  # (K-1+t, C, 1)
        last = op("view_3d", conv_in, k1, channels, 1, (k1 + t) * 4, (k1 + t) * channels * 4,
                  t * 4)  # (K-1, C, 1): the pass's last K-1 inputs
        self.writes.append(op("cpy", last, op("reshape_3d", conv_state, k1, channels, 1)))
        conv = op("silu", op("ssm_conv", conv_in, self.p.vector(w.conv_w)))  # (C, t, 1)
        row = channels * 4

        def heads(n: int, offset: int) -> int:  # (S, n, t, 1) a view of conv's channels
            return op("view_4d", conv, s, n, t, 1, s * 4, row, row * t, offset)

        def l2(v: int) -> int:  # build_gdn_l2_norm
            return op("scale", op("rms_norm", v, a.layer_norm_rms_epsilon / s),
                      1.0 / math.sqrt(s))

        q, k = l2(heads(hk, 0)), l2(heads(hk, hk * s * 4))  # (S, Hk, t, 1)
        v = heads(hv, 2 * hk * s * 4)  # (S, Hv, t, 1)
        state = self.ctx.tensor(ggml.F32, (s, s, hv, 1), w.state.ctypes.data)
        out = op("gated_delta_net", q, k, v, gate, beta, state, 1)  # output, then state
        o = op("view_4d", out, s, hv, t, 1, s * 4, s * hv * 4, s * hv * t * 4, 0)
        new_state = op("view_4d", out, s, s, hv, 1, s * 4, s * s * 4, s * s * hv * 4,
                       s * hv * t * 4)  # (S, S, Hv, 1)
        self.writes.append(op("cpy", new_state, state))
        z4 = op("reshape_4d", z, s, hv, t, 1)
        y = op("mul", self.p.rms(o, w.norm), op("silu", z4))  # (S, Hv, t, 1)
        y = op("reshape_3d", y, s * hv, t, 1)
        return op("reshape_2d", op("mul_mat", self.p.matrix(w.wo), y),
                  a.embedding_length, t)  # (d, t)

    def _attention(self, w: AttentionWeights, x: int, n_kv: int) -> int:
        """build_layer_attn: x (d, t) → (d, t); the pass's keys and values join the cache
        at the model's position (`set_position`)."""
        m, ctx, t = self.model, self.ctx, self.t
        a, op = m.args, ctx.op
        hd, nq, nkv = a.key_length, a.head_count, a.head_count_kv
        q_full = op("mul_mat", self.p.matrix(w.wq), x)  # (2*hd*nq, t): per head q, then gate
        k = op("reshape_3d", op("mul_mat", self.p.matrix(w.wk), x), hd, nkv, t)
        v = op("mul_mat", self.p.matrix(w.wv), x)  # (nkv*hd, t)
        q = op("view_3d", q_full, hd, nq, t, hd * 2 * 4, hd * 2 * nq * 4, 0)  # (hd, nq, t)
        gate = op("cont_2d", op("view_3d", q_full, hd, nq, t, hd * 2 * 4, hd * 2 * nq * 4,
                                hd * 4), hd * nq, t)  # (nq*hd, t)
        pos = ctx.tensor(ggml.I32, (4 * t,), m.positions(t).ctypes.data)
        sections = ggml.rope_sections(a.rope_dimension_sections)
        rope = (a.rope_dimension_count, sections, ROPE_IMROPE, a.context_length,
                a.rope_freq_base, *ROPE_PLAIN)
        q = op("rope_multi", self.p.rms(q, w.q_norm), pos, None, *rope)  # (hd, nq, t)
        k = op("rope_multi", self.p.rms(k, w.k_norm), pos, None, *rope)  # (hd, nkv, t)
        # the pass's keys and values into the cache, moved to its position per pass
        self.ring = RingWrites(ctx, w.cache, op("reshape_2d", k, nkv * hd, t), v, t, 0)
        self.writes += self.ring.copies
        mask = m.mask_tensor(ctx, m.mask(t, n_kv))  # (n_kv, t)
        heads = cache_attention(ctx, w.cache, q, mask, n_kv, (hd, nq, t),
                                1.0 / math.sqrt(hd))  # (nq*hd, t)
        gated = op("mul", heads, op("sigmoid", gate))  # (nq*hd, t)
        return op("mul_mat", self.p.matrix(w.wo), gated)  # (d, t)

    def _router(self, w: LayerWeights, xf: int, k: int) -> tuple[int, int]:
        """build_moe_ffn's routing (softmax gating, weights renormalised): the softmax over
        every expert, its top k (a view of the descending argsort), their probabilities
        over their sum clamped below → the ids (k, t) I32 and the weights (k, t)."""
        ctx, op = self.ctx, self.ctx.op
        e, t = w.router.shape[0], self.t
        probs = op("soft_max", op("mul_mat", self.p.vector(w.router), xf))  # (E, t)
        top = ctx.top_k(probs, k)  # (k, t)
        weights = op("reshape_2d", ctx.get_rows(op("reshape_3d", probs, 1, e, t), top), k, t)
        total = op("clamp", op("sum_rows", weights), WEIGHT_SUM_MIN, math.inf)  # (1, t)
        return top, op("div", weights, total)  # (k, t)

    def _shared(self, w: LayerWeights, xf: int) -> int:
        """build_ffn (SwiGLU) of the shared expert, times sigmoid(its gate row · xf)."""
        op = self.ctx.op
        up = op("mul_mat", self.p.matrix(w.sh_up), xf)  # (Fs, t)
        act = op("swiglu_split", op("mul_mat", self.p.matrix(w.sh_gate), xf), up)  # (Fs, t)
        out = op("mul_mat", self.p.matrix(w.sh_down), act)  # (d, t)
        gate = op("sigmoid", op("mul_mat", self.p.vector(w.sh_inp), xf))  # (1, t)
        return op("mul", out, gate)  # (d, t)

    def set_position(self, pos: int) -> None:
        """Where a full layer's keys and values go: cache position `pos` on."""
        if self.ring is not None:
            self.ring.set_position(pos)
