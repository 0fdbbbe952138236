"""gpt-oss's hyperparameters: `ModelArgs`, read from a GGUF header as llama.cpp reads them
(its defaults where a key is absent) and checked against the file's tensors before any
weight is loaded.

What sets gpt-oss apart from qwen3moe in the header (docs/engine.md, "Architectures"):
sliding-window attention on a pattern of layers (`attention.sliding_window`, the pattern
`attention.sliding_window_pattern`: a bool per layer, or every n-th layer full, default 2:
even layers slide), YaRN RoPE (`rope.scaling.*`), and the expert FFN's width only
(`expert_feed_forward_length`, required). The RoPE scalars a layer passes to ggml's
`rope_ext` are computed here once, in llama.cpp's float32 arithmetic (`rope`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.arch.shared.args import CoreArgs, Header
from abbench.engine.arch.shared.common import check_header, pad
from abbench.engine.kernels.ggml import ROPE_NEOX, Rope
from abbench.engine.kernels.ggml.libm import logf
from abbench.errors import ModelFileError

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile

ARCH = "gpt-oss"
SCALINGS = ("none", "linear", "yarn")

def yarn_attn_factor(freq_scale: float, attn_factor: float) -> float:
    """llama.cpp's YaRN magnitude for positions scaled by `freq_scale` (a context extended
    1/freq_scale times), in its float32 order: get_mscale(factor) = 0.1·logf(factor) + 1,
    divided back out by the same (ggml's rope applies it), times the file's
    `rope.scaling.attn_factor`."""
    f32 = np.float32
    one = f32(1.0)
    factor = float(one / f32(freq_scale))
    mscale = one if factor <= 1.0 else f32(f32(0.1) * f32(1.0)) * logf(factor) + one
    cancel = one / (one + f32(0.1) * logf(factor))
    return float(f32(f32(mscale * cancel) * f32(attn_factor)))


@dataclass(frozen=True)
class ModelArgs(CoreArgs):
    """Field names follow the GGUF keys (`gpt-oss.<key>`)."""

    rope_freq_base_swa: float
    rope_scaling_type: str
    rope_scaling_factor: float  # 0: none
    rope_scaling_original_context_length: int
    rope_scaling_attn_factor: float
    sliding_window: int
    swa_layers: tuple[bool, ...]  # per layer: attends over a sliding window

    @classmethod
    def from_file(cls, mf: ModelFile) -> ModelArgs:
        """Read and check the header against the tensors: a file whose numbers disagree
        with its tensors fails here, naming the key, not later in a reshape."""
        header = Header.of(mf)
        num, p = header.num, header.prefix
        core = header.core(mf, rms_eps=None, rope_base=10000.0, context=None)
        n_layer, ctx, base = core["block_count"], core["context_length"], core["rope_freq_base"]
        args = cls(
            **core, rope_freq_base_swa=num("rope.freq_base_swa", float, base),
            rope_scaling_type=str(mf.get(p + "rope.scaling.type", "linear")),
            rope_scaling_factor=num("rope.scaling.factor", float, 0.0),
            rope_scaling_original_context_length=num(
                "rope.scaling.original_context_length", int, ctx),
            rope_scaling_attn_factor=num("rope.scaling.attn_factor", float, 1.0),
            sliding_window=num("attention.sliding_window", int),
            swa_layers=_swa_pattern(mf, p, n_layer),
        )
        args._check(mf, p)
        return args

    def _check(self, mf: ModelFile, p: str) -> None:
        """qwen3moe's checks (`common.check_header`) and gpt-oss's own keys'."""
        check_header(mf, self, self.dense_shapes() | self.expert_shapes())

        def bad(key: str, why: str) -> ModelFileError:
            return ModelFileError(f"{mf.path}: metadata `{p}{key}` {why}")

        for key, value in (("rope.freq_base", self.rope_freq_base),
                           ("rope.freq_base_swa", self.rope_freq_base_swa)):
            if not (math.isfinite(value) and value > 0):
                raise bad(key, f"is {value}, must be positive")
        if self.rope_scaling_type not in SCALINGS:
            raise bad("rope.scaling.type", f"is {self.rope_scaling_type!r}: the engine "
                      f"computes {', '.join(SCALINGS)}")
        if not (math.isfinite(self.rope_scaling_factor) and self.rope_scaling_factor >= 0):
            raise bad("rope.scaling.factor", f"is {self.rope_scaling_factor}, must be >= 0")
        if self.sliding_window < 1:
            raise bad("attention.sliding_window", f"is {self.sliding_window}, must be >= 1")

    def dense_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every dense tensor the forward pass reads, with its numpy shape: qwen3moe's
        without the q/k norms, with biases on q/k/v/o and the router, a sink per head,
        and the FFN's norm named `post_attention_norm`. The output matrix is its own
        (llama.cpp requires it: no tied embedding)."""
        d, hd, e = self.embedding_length, self.key_length, self.expert_count
        q, kv = self.head_count * hd, self.head_count_kv * hd
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.vocab_size, d), "output_norm.weight": (d,),
            "output.weight": (self.vocab_size, d),
        }
        for i in range(self.block_count):
            b = f"blk.{i}."
            shapes |= {
                b + "attn_norm.weight": (d,), b + "post_attention_norm.weight": (d,),
                b + "attn_q.weight": (q, d), b + "attn_q.bias": (q,),
                b + "attn_k.weight": (kv, d), b + "attn_k.bias": (kv,),
                b + "attn_v.weight": (kv, d), b + "attn_v.bias": (kv,),
                b + "attn_output.weight": (d, q), b + "attn_output.bias": (d,),
                b + "attn_sinks.weight": (self.head_count,),
                b + "ffn_gate_inp.weight": (e, d), b + "ffn_gate_inp.bias": (e,),
            }
        return shapes

    def expert_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every layer's stacked experts and their biases (one row per expert), with their
        numpy shapes."""
        e, ff, d = self.expert_count, self.expert_feed_forward_length, self.embedding_length
        shapes: dict[str, tuple[int, ...]] = {}
        for i in range(self.block_count):
            b = f"blk.{i}."
            shapes |= {
                b + "ffn_gate_exps.weight": (e, ff, d), b + "ffn_gate_exps.bias": (e, ff),
                b + "ffn_up_exps.weight": (e, ff, d), b + "ffn_up_exps.bias": (e, ff),
                b + "ffn_down_exps.weight": (e, d, ff), b + "ffn_down_exps.bias": (e, d),
            }
        return shapes

    def rope(self, swa: bool) -> Rope:
        """The scalars llama.cpp passes to `rope_ext` for a layer (a sliding one takes the
        `_swa` base): YaRN extends the context `factor` times with ext_factor 1; "none"
        scales nothing; "linear" scales positions only."""
        factor = self.rope_scaling_factor
        scale = 1.0 if self.rope_scaling_type == "none" or factor == 0 else float(
            np.float32(1.0) / np.float32(factor))
        yarn = self.rope_scaling_type == "yarn"
        attn = (yarn_attn_factor(scale, self.rope_scaling_attn_factor) if yarn
                else float(np.float32(self.rope_scaling_attn_factor)))
        # beta_fast/slow: llama.cpp's defaults (32, 1), which it does not read from gpt-oss
        # files; NeoX: the halves (i, i + n/2) rotate together
        return Rope(
            n_dims=self.key_length, mode=ROPE_NEOX,
            n_ctx_orig=self.rope_scaling_original_context_length,
            freq_base=self.rope_freq_base_swa if swa else self.rope_freq_base,
            freq_scale=scale, ext_factor=1.0 if yarn else 0.0, attn_factor=attn)

    def swa_cells(self, n_ctx: int, n_ubatch: int = 512) -> int:
        """The cells of a sliding layer's cache, as llama.cpp sizes it: the window and one
        batch, within the context's, in blocks of 256 (position p lands in cell p mod it)."""
        return pad(min(pad(n_ctx), self.sliding_window + n_ubatch))

    def context_bytes(self, n_ctx: int) -> int:
        """Bytes a context of `n_ctx` positions allocates at load, at least: every layer's
        K and V cache (a sliding layer's in its own smaller ring)."""
        row = self.head_count_kv * self.key_length * 4 * 2
        cells = sum(self.swa_cells(n_ctx) if s else pad(n_ctx) for s in self.swa_layers)
        return cells * row


def _swa_pattern(mf: ModelFile, p: str, n_layer: int) -> tuple[bool, ...]:
    """Which layers slide, as llama.cpp reads it: `attention.sliding_window_pattern` as a
    bool per layer, or as n — every n-th layer (the last of each n) attends in full, 0:
    every layer slides — default 2: the even layers slide."""
    # a list is a metadata array, kept apart from the scalars (`ModelFile.array`)
    listed = mf.array(p + "attention.sliding_window_pattern")
    value = listed if listed is not None else mf.get(p + "attention.sliding_window_pattern", 2)
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise ModelFileError(f"{mf.path}: metadata `{p}attention.sliding_window_pattern` "
                                 f"has {len(value)} values for {n_layer} layers")
        return tuple(bool(v) for v in value)
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ModelFileError(f"{mf.path}: metadata `{p}attention.sliding_window_pattern` is "
                             f"{value!r}, not a number or a list") from None
    if n < 0:
        raise ModelFileError(f"{mf.path}: metadata `{p}attention.sliding_window_pattern` is "
                             f"{n}, must be >= 0")
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))
