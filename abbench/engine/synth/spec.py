"""What a synthetic model is: its spec (architecture, geometry, routing knobs, storage
types, tokenizer), the presets, and real models' shapes at a layer count of one's choosing.

`synth.py` writes a spec to a GGUF file; the knobs are explained there.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from abbench.engine.architectures import NAMES, TABLE, preset_fields, preset_name
from abbench.errors import UsageError

ARCHS = NAMES  # `general.architecture`, the table's rows
SWA_ARCHS = tuple(a.name for a in TABLE if a.sliding_window)  # with sliding-window layers
# "llama": SentencePiece with byte tokens; "gpt2": byte-level BPE, Qwen's specials and
# `qwen2` pre-tokenizer; "gpt-4o": byte-level BPE, gpt-oss's harmony specials and `gpt-4o`;
# "qwen35": "gpt2" with Qwen3.5's `qwen35` pre-tokenizer; "gemma4": BPE on raw text
# with byte tokens, Gemma's specials.
TOKENIZERS = ("llama", "gpt2", "gpt-4o", "qwen35", "gemma4")

# Tensor types written as they are; the mixes below choose among them per tensor.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                "Q4_K", "Q5_K", "Q6_K", "MXFP4")
# llama.cpp's mixes: (the base type, the type of the tensors it gives more bits)
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}
TYPES = TENSOR_TYPES + tuple(MIXES)


@dataclass(frozen=True)
class SynthSpec:
    n_layer: int
    n_expert: int
    n_expert_used: int
    d_model: int
    n_head: int
    n_head_kv: int
    head_dim: int
    expert_ff: int
    context_length: int = 2048
    seed: int = 0
    popularity_skew: float = 1.0
    update_early: float = 0.35
    update_late: float = 0.08
    update_decay_layers: float = 3.0
    router_scale: float = 1.0
    dense_type: str = "F32"
    expert_type: str = "F32"
    tokenizer: str = "llama"  # one of TOKENIZERS
    # Fields added since the first files: written into a file only when not at these
    # defaults (`described`), so that qwen3moe files stay byte-identical.
    arch: str = "qwen3moe"
    sliding_window: int = 0  # gpt-oss: the SWA layers' window (positions, self included)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise UsageError(f"arch must be one of {', '.join(ARCHS)} (got {self.arch!r})")
        if (self.arch in SWA_ARCHS) != (self.sliding_window > 0):
            raise UsageError(f"sliding_window must be positive for {', '.join(SWA_ARCHS)} "
                             "and 0 otherwise "
                             f"(got {self.sliding_window} for {self.arch})")
        for key in ("expert_type", "dense_type"):
            if getattr(self, key) not in TYPES:
                raise UsageError(f"{key} must be one of {', '.join(TYPES)} "
                                 f"(got {getattr(self, key)!r})")
        if self.tokenizer not in TOKENIZERS:
            raise UsageError(f"tokenizer must be one of {', '.join(TOKENIZERS)} "
                             f"(got {self.tokenizer!r})")
        if self.n_expert_used > self.n_expert:
            raise UsageError("n_expert_used must not exceed n_expert")
        if self.n_head % self.n_head_kv:
            raise UsageError("n_head must be a multiple of n_head_kv")
        if self.head_dim % 2:
            raise UsageError("head_dim must be even (RoPE)")

    @property
    def expert_bytes(self) -> int:
        return 3 * self.expert_ff * self.d_model * 4

    def described(self) -> dict[str, str | int | float]:
        """The spec as the file records it (`general.description`, `abbench.synthetic.*`):
        every field, less those added since the first files while at their defaults."""
        return {k: v for k, v in asdict(self).items()
                if not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}


ADDED_FIELDS: dict[str, str | int | float] = {"arch": "qwen3moe", "sliding_window": 0}


# The presets, every architecture's from its row of the table (engine/architectures.py).
PRESETS: dict[str, SynthSpec] = {name: SynthSpec(**fields)  # type: ignore[arg-type]
                                 for name, fields in preset_fields().items()}


# Real models' geometries, written with `n_layer` chosen by the caller (`shape()`).
SHAPES: dict[str, SynthSpec] = {
    # Qwen3-30B-A3B: 48 layers of 128 experts (top-8) in the real model
    "qwen3-30b-a3b": SynthSpec(n_layer=48, n_expert=128, n_expert_used=8, d_model=2048,
                               n_head=32, n_head_kv=4, head_dim=128, expert_ff=768,
                               context_length=4096, tokenizer="gpt2"),
    # gpt-oss-20b: 24 layers of 32 experts (top-4), 64 q / 8 kv heads of 64, window 128
    "gpt-oss-20b": SynthSpec(n_layer=24, n_expert=32, n_expert_used=4, d_model=2880,
                             n_head=64, n_head_kv=8, head_dim=64, expert_ff=2880,
                             context_length=4096, expert_type="MXFP4", tokenizer="gpt-4o",
                             arch="gpt-oss", sliding_window=128),
}


def shape(name: str, n_layer: int, seed: int = 0) -> SynthSpec:
    if name not in SHAPES:
        raise UsageError(f"unknown model shape `{name}`", tip=f"shapes: {', '.join(SHAPES)}")
    real = SHAPES[name].n_layer  # more layers than the model has is no model, only disk
    if not 1 <= n_layer <= real:
        raise UsageError(f"`--layers` must be in 1 .. {real}, the layers {name} has "
                         f"(got {n_layer})")
    return replace(SHAPES[name], n_layer=n_layer, seed=seed)


_SHAPED = re.compile(r"(?P<shape>.+)-(?P<layers>[0-9]+)L-(?P<type>[A-Z0-9_]+)\Z")


def named(name: str, seed: int = 0) -> SynthSpec:
    """A preset (`default`, `gpt-oss-tiny`), or a shape at a layer count in a type, every
    matrix in it (`qwen3-30b-a3b-4L-Q4_K_M`: as llama-quantize writes a Q4_K_M file) — but
    MXFP4 only for the experts, the other matrices Q8_0, as llama-quantize's MXFP4_MOE."""
    m = _SHAPED.match(name)
    if name in PRESETS or m is None or m["shape"] not in SHAPES:
        return preset(name, seed)
    if m["type"] not in TYPES:
        raise UsageError(f"unknown type `{m['type']}` in `{name}`",
                         tip=f"types: {', '.join(TYPES)}")
    dense = "Q8_0" if m["type"] == "MXFP4" else m["type"]
    return replace(shape(m["shape"], int(m["layers"]), seed), expert_type=m["type"],
                   dense_type=dense)


def arch_preset(arch: str, name: str, seed: int = 0) -> SynthSpec:
    """Architecture `arch`'s preset `name` (`tiny`): qwen3moe's go by their bare names,
    the others' as `ARCH-NAME` (`gpt-oss-tiny`, what `synthetic:gpt-oss-tiny` names)."""
    if arch not in ARCHS:
        raise UsageError(f"unknown architecture `{arch}`", tip=f"architectures: "
                         f"{', '.join(ARCHS)}")
    full = preset_name(arch, name)
    if full not in PRESETS or PRESETS[full].arch != arch:
        have = [k for k, v in PRESETS.items() if v.arch == arch]
        raise UsageError(f"{arch} has no preset `{name}`",
                         tip="presets: " + ", ".join(k.removeprefix(f"{arch}-") for k in have))
    return preset(full, seed)


def preset(name: str, seed: int = 0) -> SynthSpec:
    if name not in PRESETS:
        raise UsageError(
            f"unknown synthetic preset `{name}`",
            tip=f"presets: {', '.join(PRESETS)}; or a real shape as SHAPE-NL-TYPE, e.g. "
            f"qwen3-30b-a3b-4L-Q4_K_M (shapes: {', '.join(SHAPES)})")
    return replace(PRESETS[name], seed=seed)
