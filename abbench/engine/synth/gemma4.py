"""A synthetic `gemma4` model (Gemma 4 MoE, as gemma-4-26B-A4B): the `gemma4.*` keys
llama.cpp reads for it and one layer's tensors, generated as qwen3moe's are
(`tensors.py`: the same routing knobs and rng discipline) plus what Gemma 4 has
beside them. What llama.cpp computes for it: docs/gemma4.md.

What llama.cpp requires (src/models/gemma4.cpp L3-36): the sliding-window pattern as a
bool per layer, the window, the RMS epsilon, the per-layer-embedding width (0 here: the
MoE model has none) and the sliding layers' head sizes. As the real model: the full
layers have heads twice as wide as the sliding ones, their own RoPE base and a
"proportional" RoPE (the global `rope_freqs` leaves three quarters of each head
unrotated), and their V is their K (no `attn_v`); every layer has a dense GeGLU FFN beside
the routed experts, each side with its own norms, and a scalar on its output.

Generators: RMS norms set every scale, so the weights are sized for the norms' outputs.
The residual stream's components are ~sqrt(d) (the embedding is scaled by it), so the
norms that close the attention and the FFN carry `upd`·sqrt(d): each update is `upd` of
the stream, as qwen3moe's. q's norm carries hd^-1/2 (Gemma 4 scales q·k by 1), so the
scores have unit spread. The router's input is RMS-normed and divided by sqrt(d) before its
per-channel scale: that scale is sqrt(d), so the shared router (`router_of`) sees unit
inputs as qwen3moe's does. The experts' per-expert output scales spread over ±30%.
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from abbench.engine.synth import tensors
from abbench.engine.synth.spec import SynthSpec
from abbench.engine.synth.tensors import Make, Planned

ROPE_FREQ_BASE = 1_000_000.0  # full layers
ROPE_FREQ_BASE_SWA = 10_000.0
ROPE_ROTATED_FULL = 0.25  # the full layers' partial_rotary_factor ("proportional" RoPE)
RMS_EPS = 1e-6
FINAL_SOFTCAP = 30.0
FULL_HEAD = 2  # a full layer's head is this many times a sliding one's
DENSE_FF = 2  # the dense FFN's width, in expert widths
FULL_EVERY = 3  # every third layer attends in full (real Gemma 4: every sixth)
OUT_SCALE = 0.95  # layer_output_scale
EXPERT_SCALE_SPREAD = 0.3


def swa_layers(n_layer: int) -> list[bool]:
    return [i % FULL_EVERY != FULL_EVERY - 1 for i in range(n_layer)]


def add_keys(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    """The `gemma4.*` hyperparameters (w's architecture is gemma4)."""
    hd, full = spec.head_dim, spec.head_dim * FULL_HEAD
    tensors.size_keys(w, spec, spec.expert_ff * DENSE_FF)
    w.add_key_length(full)
    w.add_value_length(full)
    w.add_key_length_swa(hd)
    w.add_value_length_swa(hd)
    w.add_rope_dimension_count(full)
    w.add_rope_dimension_count_swa(hd)
    w.add_rope_freq_base(ROPE_FREQ_BASE)
    w.add_rope_freq_base_swa(ROPE_FREQ_BASE_SWA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_sliding_window(spec.sliding_window)
    w.add_sliding_window_pattern(swa_layers(spec.n_layer))
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(FINAL_SOFTCAP)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)


def layer_tensors(spec: SynthSpec, rng: np.random.Generator, layer: int,
                  router: Make) -> Iterator[Planned]:
    """Layer `layer`'s tensors in file order (a `tensors.LayerTensors`); layer 0's
    also the global `rope_freqs` the full layers share."""
    b = f"blk.{layer}."
    d, dense = spec.d_model, spec.dense_type
    swa = swa_layers(spec.n_layer)[layer]
    hd = spec.head_dim * (1 if swa else FULL_HEAD)
    closing = tensors.layer_update_scale(spec, layer) * np.sqrt(d)  # the closing norms' weight
    if layer == 0:
        half = spec.head_dim * FULL_HEAD // 2
        rotated = int(half * ROPE_ROTATED_FULL)
        yield "rope_freqs.weight", (half,), "F32", lambda: np.array(
            [1.0] * rotated + [1e30] * (half - rotated), np.float32)
    yield b + "attn_norm.weight", (d,), "F32", tensors.ones(d)
    q_rows, kv_rows = spec.n_head * hd, spec.n_head_kv * hd
    yield b + "attn_q.weight", (q_rows, d), dense, tensors.projection(rng, q_rows, d,
                                                                      over=np.sqrt(d))
    yield b + "attn_k.weight", (kv_rows, d), dense, tensors.projection(rng, kv_rows, d,
                                                                       over=np.sqrt(d))
    if swa:  # a full layer's V is its K (the real model's attention_k_eq_v)
        yield b + "attn_v.weight", (kv_rows, d), dense, tensors.projection(rng, kv_rows, d,
                                                                           over=np.sqrt(d))
    yield b + "attn_output.weight", (d, q_rows), dense, tensors.projection(rng, d, q_rows,
                                                                           over=np.sqrt(q_rows))
    yield b + "attn_q_norm.weight", (hd,), "F32", _const(hd, hd ** -0.5)
    yield b + "attn_k_norm.weight", (hd,), "F32", tensors.ones(hd)
    yield b + "post_attention_norm.weight", (d,), "F32", _const(d, closing)
    yield b + "layer_output_scale.weight", (1,), "F32", _const(1, OUT_SCALE)
    yield from _dense_ffn(spec, rng, b, closing)
    yield b + "ffn_gate_inp.weight", (spec.n_expert, d), "F32", router
    yield b + "ffn_gate_inp.scale", (d,), "F32", _const(d, np.sqrt(d))
    for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
        yield b + norm + ".weight", (d,), "F32", tensors.ones(d)
    yield from _expert_tensors(spec, rng, b)


def _dense_ffn(spec: SynthSpec, rng: np.random.Generator, b: str,
               closing: float) -> Iterator[Planned]:
    d, ff, dense = spec.d_model, spec.expert_ff * DENSE_FF, spec.dense_type
    yield b + "ffn_norm.weight", (d,), "F32", tensors.ones(d)
    yield b + "ffn_gate.weight", (ff, d), dense, tensors.projection(rng, ff, d, over=np.sqrt(d))
    yield b + "ffn_up.weight", (ff, d), dense, tensors.projection(rng, ff, d, over=np.sqrt(d))
    yield b + "ffn_down.weight", (d, ff), dense, tensors.projection(rng, d, ff, over=np.sqrt(ff))
    yield b + "post_ffw_norm.weight", (d,), "F32", _const(d, closing)


def _expert_tensors(spec: SynthSpec, rng: np.random.Generator, b: str) -> Iterator[Planned]:
    d, ff, e, experts = spec.d_model, spec.expert_ff, spec.n_expert, spec.expert_type
    for proj in ("gate", "up"):
        yield b + f"ffn_{proj}_exps.weight", (e, ff, d), experts, tensors.experts_of(
            rng, e, ff, d, 1.0 / np.sqrt(d))
    yield b + "ffn_down_exps.weight", (e, d, ff), experts, tensors.experts_of(
        rng, e, d, ff, 1.0 / np.sqrt(ff))
    yield b + "ffn_down_exps.scale", (e,), "F32", lambda: np.exp(
        rng.uniform(-EXPERT_SCALE_SPREAD, EXPERT_SCALE_SPREAD, e)).astype(np.float32)


def _const(n: int, value: float) -> Make:
    return lambda: np.full(n, value, np.float32)
