"""qwen3moe's synthetic writer: its `qwen3moe.*` keys and a layer's tensors (per-head q/k
norms, GQA projections, a router and SwiGLU experts)."""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from abbench.engine.synth.spec import SynthSpec
from abbench.engine.synth.tensors import (
    Make,
    Planned,
    attention_tensors,
    layer_update_scale,
    ones,
    swiglu_experts,
    transformer_keys,
)


def add_keys(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    """The `qwen3moe.*` hyperparameters (w's architecture is qwen3moe)."""
    transformer_keys(w, spec, rope_freq_base=10000.0, rms_eps=1e-6)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)


def layer_tensors(spec: SynthSpec, rng: np.random.Generator, layer: int,
                  router: Make) -> Iterator[Planned]:
    b = f"blk.{layer}."
    d, hd = spec.d_model, spec.head_dim
    upd = layer_update_scale(spec, layer)
    yield b + "attn_norm.weight", (d,), "F32", ones(d)
    yield b + "ffn_norm.weight", (d,), "F32", ones(d)
    yield b + "attn_q_norm.weight", (hd,), "F32", ones(hd)
    yield b + "attn_k_norm.weight", (hd,), "F32", ones(hd)
    yield from attention_tensors(spec, rng, b, upd)
    yield b + "ffn_gate_inp.weight", (spec.n_expert, d), "F32", router
    yield from swiglu_experts(spec, rng, b, upd)
