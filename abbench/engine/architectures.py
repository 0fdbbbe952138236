"""The architectures the engine decodes: one row each, and every list of architectures or
synthetic presets anywhere in the project is derived from this table.

A row names the architecture as GGUF's `general.architecture` spells it and the package
that implements it: `engine/arch/<package>/` (its `args.py`, numpy `model.py` and ggml
`graph.py`, over `engine/arch/shared/`) and its synthetic writer `engine/synth/<package>.py`.
Both are found by that name (`arch.architecture`, `synth.writer_of`), so adding an
architecture is its package, its writer and one row here.

The row also holds its synthetic presets, as the fields of a `synth.spec.SynthSpec` beside
the architecture's own (`arch` is the row's name): `tiny` (a few MiB, unit tests and gates)
and `small` (tens of MiB, end-to-end runs and the parity benches) at least. The first row's
presets keep bare names (`tiny`, `small`, `default`); every other row's are `ARCH-NAME`
(`gpt-oss-tiny`), which is what `synthetic:gpt-oss-tiny` names.

This module is data only: it imports nothing of the engine, so every layer may read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PresetFields = Mapping[str, int | str]


@dataclass(frozen=True)
class Architecture:
    name: str  # GGUF `general.architecture`
    package: str  # engine/arch/<package>/ and engine/synth/<package>.py
    summary: str  # what sets it apart, in a few words (`abbench model synth --help`)
    presets: Mapping[str, PresetFields] = field(default_factory=dict)
    # `--kernels auto` runs its ggml graph for F32 experts too, where the graph decodes
    # faster than the numpy model (measured: gemma4 2.1x, docs/gemma4.md §6; qwen35moe
    # about 2x, docs/qwen35moe.md §7)
    graph_for_f32: bool = False
    sliding_window: bool = False  # has sliding-window layers (`SynthSpec.sliding_window`)

    def __post_init__(self) -> None:
        if not self.package.isidentifier():
            raise ValueError(f"{self.name}: package {self.package!r} is not a module name")
        if "tiny" not in self.presets or "small" not in self.presets:
            raise ValueError(f"{self.name}: every architecture has `tiny` and `small` presets")


_TINY: PresetFields = dict(n_layer=4, n_expert=8, n_expert_used=2, d_model=64, n_head=4,
                           n_head_kv=2, head_dim=16, expert_ff=32, context_length=512)
_SMALL: PresetFields = dict(n_layer=8, n_expert=16, n_expert_used=4, d_model=256, n_head=4,
                            n_head_kv=2, head_dim=64, expert_ff=128, context_length=1024)

TABLE: tuple[Architecture, ...] = (
    # RMSNorm, GQA with per-head q/k norms, NeoX RoPE, softmax top-k renormalised, SwiGLU
    Architecture("qwen3moe", "qwen3moe", "per-head q/k norms, renormalised top-k", presets={
        "tiny": _TINY,
        "small": _SMALL,
        # ~1.5 GiB: 16 layers x 64 experts of 1.5 MiB, top-8: a few hundred MiB of cache
        # streams
        "default": dict(n_layer=16, n_expert=64, n_expert_used=8, d_model=512, n_head=8,
                        n_head_kv=2, head_dim=64, expert_ff=256, context_length=2048),
    }),
    # SWA on even layers, YaRN, sinks, biases, MXFP4 experts: windows small enough that
    # the sliding window masks within a prompt and 64 tokens
    Architecture("gpt-oss", "gpt_oss", "sliding-window attention with sinks, YaRN RoPE, "
                 "biases, MXFP4 experts, harmony vocabulary", sliding_window=True, presets={
        "tiny": {**_TINY, "n_expert_used": 4, "expert_type": "MXFP4", "tokenizer": "gpt-4o",
                 "sliding_window": 16},
        "small": {**_SMALL, "n_head": 8, "expert_type": "MXFP4", "tokenizer": "gpt-4o",
                  "sliding_window": 32},
    }),
    # gated delta-net layers, a gated full-attention layer every 4th, a shared expert:
    # linear heads n_head (values) / n_head_kv (keys) of head_dim
    Architecture("qwen35moe", "qwen35moe", "gated delta-net layers with gated full "
                 "attention every 4th, a shared expert", graph_for_f32=True, presets={
        "tiny": {**_TINY, "tokenizer": "qwen35"},
        "small": {**_SMALL, "tokenizer": "qwen35"},
    }),
    # sliding layers with full ones every third, a dense FFN beside the experts, final
    # logit softcapping: windows that mask within 64 tokens
    Architecture("gemma4", "gemma4", "sliding and full layers, a dense FFN beside the "
                 "experts, softcapped logits", graph_for_f32=True, sliding_window=True,
                 presets={
        "tiny": {**_TINY, "tokenizer": "gemma4", "sliding_window": 16},
        "small": {**_SMALL, "tokenizer": "gemma4", "sliding_window": 32},
    }),
    # qwen3moe's skeleton; as many k heads as q heads, n_head * head_dim = d_model (llama.cpp)
    Architecture("olmoe", "olmoe", "q/k norms over each whole projection, top-k weights not "
                 "renormalised", presets={
                     "tiny": {**_TINY, "n_head_kv": 4},
                     "small": {**_SMALL, "n_head_kv": 4},
                 }),
)

BY_NAME: dict[str, Architecture] = {a.name: a for a in TABLE}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def preset_name(arch: str, name: str) -> str:
    """The preset's full name: the first row's by its bare name, the others' as ARCH-NAME."""
    return name if arch == TABLE[0].name else f"{arch}-{name}"


def preset_fields() -> dict[str, PresetFields]:
    """Every preset by its full name, in the table's order, with its row's `arch`."""
    return {preset_name(a.name, name): {**fields, "arch": a.name}
            for a in TABLE for name, fields in a.presets.items()}


# The presets as every message lists them (`synthetic:PRESET`).
PRESET_NAMES = ", ".join(preset_fields())
