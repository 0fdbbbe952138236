"""A synthetic `qwen35moe` model (Qwen3.5/3.6 MoE): the `qwen35moe.*` keys llama.cpp reads
for it and one layer's tensors, generated as qwen3moe's are (`tensors.py`: the same
routing knobs and rng discipline) plus what the hybrid stack has beside them.

What llama.cpp requires (src/models/qwen35moe.cpp L4-26): the RMS epsilon, the RoPE
sections, and the five `ssm.*` sizes of the gated delta-net layers; which layers are full
attention comes from `full_attention_interval` (every n-th layer, the last of each n).

The geometry of the linear-attention layers is derived from the spec's attention fields,
so that no new spec field is needed: `n_head` value heads and `n_head_kv` key heads
(groups), both of `head_dim` (the delta rule's state is head_dim x head_dim per value
head), a causal convolution over CONV_KERNEL tokens. The full-attention layers rotate the
first ROPE_SHARE of each head's dimensions (Qwen3.5's partial RoPE). The shared expert is
as wide as a routed one.

Generators: the projections keep unit-scale activations; the decay rates A are drawn so
that a head keeps a few tokens' memory (exp(g) ≈ 0.5-0.95 per token), not Qwen's wider
range, where most heads forget within a token at this scale; the out projections and the
down matrices give the layer's `upd`, as qwen3moe's.
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from abbench.engine.synth.spec import SynthSpec
from abbench.engine.synth.tensors import (
    Make,
    Planned,
    attention_tensors,
    experts_of,
    layer_update_scale,
    moe_keys,
    ones,
    projection,
)

ROPE_FREQ_BASE = 10_000_000.0  # Qwen3.5's (unverified: from memory of the released config)
RMS_EPS = 1e-6
FULL_ATTENTION_INTERVAL = 4  # every 4th layer (3, 7, ...) attends in full, as Qwen3.5's
CONV_KERNEL = 4
ROPE_SHARE = 4  # 1/4 of a head's dimensions rotate (partial_rotary_factor 0.25)
SWIGLU_RMS = 0.6  # rms of silu(g)*u for unit-variance g and u (as tensors.py's experts)


def geometry(spec: SynthSpec) -> dict[str, int]:
    """The linear-attention sizes the spec implies: value heads, key heads (groups), the
    state size (a head's width), the inner (value) width and the convolved channels."""
    v_heads, k_heads, state = spec.n_head, spec.n_head_kv, spec.head_dim
    return {"v_heads": v_heads, "k_heads": k_heads, "state": state,
            "inner": v_heads * state, "conv": 2 * k_heads * state + v_heads * state}


def rope_dims(spec: SynthSpec) -> int:
    return max(2, spec.head_dim // ROPE_SHARE // 2 * 2)


def rope_sections(n_rot: int) -> list[int]:
    """Four section sizes over the n_rot/2 rotated pairs, as Qwen3.5's [11, 11, 10, 0] are
    over 32: interleaved, pair i on axis i mod 3, so that every pair turns with a text
    token's position (a pair of the 4th axis would not: its position is 0)."""
    pairs = n_rot // 2
    return [len(range(axis, pairs, 3)) for axis in range(3)] + [0]


def is_recurrent(layer: int) -> bool:
    return (layer + 1) % FULL_ATTENTION_INTERVAL != 0


def add_keys(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    """The `qwen35moe.*` hyperparameters (w's architecture is qwen35moe)."""
    g = geometry(spec)
    moe_keys(w, spec, ROPE_FREQ_BASE, RMS_EPS)
    w.add_expert_shared_feed_forward_length(spec.expert_ff)
    n_rot = rope_dims(spec)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections(rope_sections(n_rot))
    w.add_ssm_conv_kernel(CONV_KERNEL)
    w.add_ssm_inner_size(g["inner"])
    w.add_ssm_state_size(g["state"])
    w.add_ssm_time_step_rank(g["v_heads"])
    w.add_ssm_group_count(g["k_heads"])
    w.add_full_attention_interval(FULL_ATTENTION_INTERVAL)


def layer_tensors(spec: SynthSpec, rng: np.random.Generator, layer: int,
                  router: Make) -> Iterator[Planned]:
    """Layer `layer`'s tensors in file order (a `tensors.LayerTensors`)."""
    b = f"blk.{layer}."
    d = spec.d_model
    upd = layer_update_scale(spec, layer)
    yield b + "attn_norm.weight", (d,), "F32", ones(d)
    yield b + "post_attention_norm.weight", (d,), "F32", ones(d)
    if is_recurrent(layer):
        yield from _delta_net_tensors(spec, rng, b, upd)
    else:
        yield from _gated_attention_tensors(spec, rng, b, upd)
    yield b + "ffn_gate_inp.weight", (spec.n_expert, d), "F32", router
    yield from _expert_tensors(spec, rng, b, upd)


def _delta_net_tensors(spec: SynthSpec, rng: np.random.Generator, b: str,
                       upd: float) -> Iterator[Planned]:
    d, dense, g = spec.d_model, spec.dense_type, geometry(spec)
    h, conv, inner = g["v_heads"], g["conv"], g["inner"]
    yield b + "attn_qkv.weight", (conv, d), dense, projection(rng, conv, d, over=np.sqrt(d))
    yield b + "attn_gate.weight", (inner, d), dense, projection(rng, inner, d,
                                                               over=np.sqrt(d))
    yield b + "ssm_conv1d.weight", (conv, CONV_KERNEL), "F32", projection(
        rng, conv, CONV_KERNEL, over=np.sqrt(CONV_KERNEL))
    yield b + "ssm_dt.bias", (h,), "F32", lambda: (
        rng.standard_normal(h).astype(np.float32) * np.float32(0.5))
    # ssm_a = -A (the file holds -exp(A_log)): decay per token exp(-A softplus(.))
    yield b + "ssm_a", (h,), "F32", lambda: -rng.uniform(0.05, 1.0, h).astype(np.float32)
    yield b + "ssm_beta.weight", (h, d), dense, projection(rng, h, d, over=np.sqrt(d))
    yield b + "ssm_alpha.weight", (h, d), dense, projection(rng, h, d, 0.5, over=np.sqrt(d))
    yield b + "ssm_norm.weight", (g["state"],), "F32", ones(g["state"])
    yield b + "ssm_out.weight", (d, inner), dense, projection(rng, d, inner,
                                                             upd / np.sqrt(inner))


def _gated_attention_tensors(spec: SynthSpec, rng: np.random.Generator, b: str,
                             upd: float) -> Iterator[Planned]:
    hd = spec.head_dim
    yield from attention_tensors(spec, rng, b, upd, gated=True)
    yield b + "attn_q_norm.weight", (hd,), "F32", ones(hd)
    yield b + "attn_k_norm.weight", (hd,), "F32", ones(hd)


def _expert_tensors(spec: SynthSpec, rng: np.random.Generator, b: str,
                    upd: float) -> Iterator[Planned]:
    """The routed experts (as qwen3moe's), then the shared expert and its gate row."""
    d, ff, e, experts = spec.d_model, spec.expert_ff, spec.n_expert, spec.expert_type
    for proj in ("gate", "up"):
        yield b + f"ffn_{proj}_exps.weight", (e, ff, d), experts, experts_of(
            rng, e, ff, d, 1.0 / np.sqrt(d))
    yield b + "ffn_down_exps.weight", (e, d, ff), experts, experts_of(
        rng, e, d, ff, upd / (SWIGLU_RMS * np.sqrt(ff)))
    yield b + "ffn_gate_inp_shexp.weight", (d,), "F32", lambda: (
        rng.standard_normal(d).astype(np.float32) / np.float32(np.sqrt(d)))
    dense = spec.dense_type
    yield b + "ffn_gate_shexp.weight", (ff, d), dense, projection(rng, ff, d, over=np.sqrt(d))
    yield b + "ffn_up_shexp.weight", (ff, d), dense, projection(rng, ff, d, over=np.sqrt(d))
    yield b + "ffn_down_shexp.weight", (d, ff), dense, projection(
        rng, d, ff, upd / (SWIGLU_RMS * np.sqrt(ff)))
