"""OLMoE's synthetic writer: its `olmoe.*` keys and a layer's tensors (q/k norms over each
whole projection, projections without biases, a router and SwiGLU experts).

llama.cpp's loader (models/olmoe.cpp) takes q as (n_embd, n_embd) and both norms as
(n_embd,): a file has as many k heads as q heads, of n_embd / n_head each. The norms'
weights are drawn around 1, so that a norm applied per head instead of over the whole
projection, or to the wrong cells, shows in the logits."""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from abbench.engine.synth.spec import SynthSpec
from abbench.engine.synth.tensors import Make, Planned, moe_keys, plain_layer
from abbench.errors import UsageError

NORM_SPREAD = 0.1  # the q/k norm weights: 1 + this * a unit normal


def add_keys(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    """The `olmoe.*` hyperparameters (w's architecture is olmoe)."""
    if spec.n_head_kv != spec.n_head or spec.n_head * spec.head_dim != spec.d_model:
        raise UsageError("olmoe needs n_head_kv = n_head and n_head * head_dim = d_model "
                         f"(got {spec.n_head_kv}, {spec.n_head} x {spec.head_dim}, "
                         f"{spec.d_model}): llama.cpp loads nothing else")
    moe_keys(w, spec, rope_freq_base=10000.0, rms_eps=1e-5)


def layer_tensors(spec: SynthSpec, rng: np.random.Generator, layer: int,
                  router: Make) -> Iterator[Planned]:
    q, kv = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    return plain_layer(spec, rng, layer, router, (q, _around_one(rng, q)),
                       (kv, _around_one(rng, kv)))


def _around_one(rng: np.random.Generator, n: int) -> Make:
    return lambda: (1.0 + NORM_SPREAD * rng.standard_normal(n)).astype(np.float32)
