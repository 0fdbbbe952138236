"""qwen3moe's synthetic writer: its `qwen3moe.*` keys and a layer's tensors (per-head q/k
norms, GQA projections, a router and SwiGLU experts: `tensors.plain_layer`)."""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from abbench.engine.synth.spec import SynthSpec
from abbench.engine.synth.tensors import Make, Planned, moe_keys, ones, plain_layer


def add_keys(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    """The `qwen3moe.*` hyperparameters (w's architecture is qwen3moe)."""
    moe_keys(w, spec, rope_freq_base=10000.0, rms_eps=1e-6)


def layer_tensors(spec: SynthSpec, rng: np.random.Generator, layer: int,
                  router: Make) -> Iterator[Planned]:
    hd = spec.head_dim
    return plain_layer(spec, rng, layer, router, (hd, ones(hd)), (hd, ones(hd)))
