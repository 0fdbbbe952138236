"""A synthetic `gpt-oss` model: the `gpt-oss.*` keys llama.cpp reads for it and one
layer's tensors, generated as qwen3moe's are (`tensors.py`: the same routing knobs
and rng discipline) plus what gpt-oss has beside them.

What llama.cpp requires (src/models/openai-moe.cpp): the RMS epsilon, the experts' feed
forward length and the sliding window; without `rope.scaling.type` it would take linear
RoPE scaling, so YaRN is written with its factor and original context as gpt-oss's files
have them. Per layer exactly 19 tensors (its loader refuses any other): q/k/v/o with
biases and no q/k norm, per-head attention sinks, the FFN norm named
`post_attention_norm`, a router with a bias, and gate/up/down expert stacks each with a
bias stack.

Generators: the biases are small beside what they are added to; the sinks are N(0, 2²), so
some heads put most of their attention mass on the sink; gate and up pre-activations have
σ ≈ 2.5, so a few tenths of a percent of them reach SWIGLU_OAI's ±7 clamps (the clamps are
exercised, not a rarity); down is sized so the expert update is the layer's `upd`, as
qwen3moe's (the rms of swiglu_oai at σ 2.5 is about 4.66).
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from abbench.engine.synth import tensors
from abbench.engine.synth.spec import SynthSpec
from abbench.engine.synth.tensors import Make, Planned

ROPE_FREQ_BASE = 150000.0
YARN_FACTOR = 32.0  # rope.scaling.factor: llama.cpp's freq_scale is its inverse
YARN_ORIGINAL_CONTEXT = 4096
RMS_EPS = 1e-5

BIAS_SHARE = 0.2  # q/k/v/o and down biases, as a share of their outputs' scale
SINK_SCALE = 2.0
ROUTER_BIAS = 0.25  # times router_scale: small beside the logits' spread
PRE_ACTIVATION = 2.5  # σ of gate and up before their biases
EXPERT_BIAS = 0.5  # gate and up biases
SWIGLU_OAI_RMS = 4.66  # rms of swiglu_oai(gate, up) at PRE_ACTIVATION


def add_keys(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    """The `gpt-oss.*` hyperparameters (w's architecture is gpt-oss)."""
    tensors.transformer_keys(w, spec, ROPE_FREQ_BASE, RMS_EPS)
    w.add_sliding_window(spec.sliding_window)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN_FACTOR)
    w.add_rope_scaling_orig_ctx_len(YARN_ORIGINAL_CONTEXT)


def layer_tensors(spec: SynthSpec, rng: np.random.Generator, layer: int,
                  router: Make) -> Iterator[Planned]:
    """Layer `layer`'s 19 tensors in file order (a `tensors.LayerTensors`)."""
    b = f"blk.{layer}."
    d, dense = spec.d_model, spec.dense_type
    upd = tensors.layer_update_scale(spec, layer)
    q_rows, kv_rows = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    yield b + "attn_norm.weight", (d,), "F32", tensors.ones(d)
    yield b + "post_attention_norm.weight", (d,), "F32", tensors.ones(d)
    for name, rows in (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows)):
        yield b + name + ".weight", (rows, d), dense, tensors.projection(rng, rows, d,
                                                                         over=np.sqrt(d))
        yield b + name + ".bias", (rows,), "F32", _normal(rng, (rows,), BIAS_SHARE)
    # Attention outputs have unit-scale components: the update is `upd` of the stream.
    yield b + "attn_output.weight", (d, q_rows), dense, tensors.projection(
        rng, d, q_rows, upd / np.sqrt(q_rows))
    yield b + "attn_output.bias", (d,), "F32", _normal(rng, (d,), upd * BIAS_SHARE)
    yield b + "attn_sinks.weight", (spec.n_head,), "F32", _normal(rng, (spec.n_head,),
                                                                 SINK_SCALE)
    yield b + "ffn_gate_inp.weight", (spec.n_expert, d), "F32", router
    yield b + "ffn_gate_inp.bias", (spec.n_expert,), "F32", _normal(
        rng, (spec.n_expert,), ROUTER_BIAS * spec.router_scale)
    yield from _expert_tensors(spec, rng, b, upd)


def _expert_tensors(spec: SynthSpec, rng: np.random.Generator, b: str,
                    upd: float) -> Iterator[Planned]:
    d, ff, e, experts = spec.d_model, spec.expert_ff, spec.n_expert, spec.expert_type
    for proj in ("gate", "up"):
        yield b + f"ffn_{proj}_exps.weight", (e, ff, d), experts, tensors.experts_of(
            rng, e, ff, d, PRE_ACTIVATION / np.sqrt(d))
        yield b + f"ffn_{proj}_exps.bias", (e, ff), "F32", _normal(rng, (e, ff), EXPERT_BIAS)
    yield b + "ffn_down_exps.weight", (e, d, ff), experts, tensors.experts_of(
        rng, e, d, ff, upd / (SWIGLU_OAI_RMS * np.sqrt(ff)))
    yield b + "ffn_down_exps.bias", (e, d), "F32", _normal(rng, (e, d), upd * BIAS_SHARE)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> Make:
    """Unit normals of `shape` * scale, drawn in F32."""
    return lambda: rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
