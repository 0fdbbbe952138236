"""gemma4's hyperparameters (Gemma 4 MoE): `ModelArgs`, read from a GGUF header as
llama.cpp reads them (src/models/gemma4.cpp L3-36, src/llama-model.cpp L1400-1470; its
defaults where a key is absent) and checked against the file's tensors before any weight
is loaded.

What sets gemma4 apart from qwen3moe in the header (docs/gemma4.md §1): a bool per layer
for the sliding-window layers (`attention.sliding_window_pattern`, required) and their
window; sliding layers with their own head size (`attention.key_length_swa`), RoPE width
(`rope.dimension_count_swa`) and base (`rope.freq_base_swa`); a dense FFN's width
(`feed_forward_length`) beside the experts'; the final logits' softcap
(`final_logit_softcapping`, default 30). What the engine does not compute is refused,
naming its key or tensor: KV shared across layers, per-layer embeddings (Gemma 4's small
dense models), fused qkv or gate_up tensors, layers without experts, scaled RoPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from abbench.engine.arch.shared.args import CoreArgs, Header
from abbench.engine.arch.shared.common import check_header, expert_stacks, pad
from abbench.errors import ModelFileError

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile

ARCH = "gemma4"
SCALINGS = ("none", "linear")
# Tensors of real files the engine has no path for: (name in a layer, what it is).
UNSUPPORTED = (("attn_qkv.weight", "fused q/k/v"), ("ffn_gate_up_exps.weight",
                                                     "fused expert gate/up"),
               ("inp_gate.weight", "per-layer embeddings"))


@dataclass(frozen=True)
class ModelArgs(CoreArgs):
    """Field names follow the GGUF keys (`gemma4.<key>`); `*_swa` are the sliding layers';
    `head_count_kv` is the largest of `kv_heads`."""

    feed_forward_length: int  # the dense FFN's
    kv_heads: tuple[int, ...]  # per layer (`attention.head_count_kv`, a number or a list)
    key_length_swa: int
    value_length_swa: int
    rope_dimension_count: int
    rope_dimension_count_swa: int
    rope_freq_base_swa: float
    rope_freq_scale: float  # 1 / rope.scaling.factor (linear), else 1
    sliding_window: int
    swa_layers: tuple[bool, ...]  # per layer: attends over a sliding window
    final_logit_softcapping: float  # 0: none
    v_layers: tuple[bool, ...]  # per layer: has `attn_v` (else V is K's projection)
    own_output: bool  # `output.weight` (else the embedding, tied)
    output_scales: bool  # `layer_output_scale` on every layer
    expert_scales: bool  # `ffn_down_exps.scale` on every layer

    @classmethod
    def from_file(cls, mf: ModelFile) -> ModelArgs:
        """Read and check the header against the tensors: a file whose numbers disagree
        with its tensors fails here, naming the key, not later in a reshape."""
        header = Header.of(mf)
        num, p, hd = header.num, header.prefix, header.head_dim
        n_layer = num("block_count", int)
        kv = _per_layer(mf, p + "attention.head_count_kv", n_layer, header.n_head)
        hd_swa = num("attention.key_length_swa", int, hd)
        has = mf.tensors.__contains__
        args = cls(
            **header.core(mf, rms_eps=None, rope_base=10000.0, context=None,
                          head_count_kv=max(kv)),
            feed_forward_length=num("feed_forward_length", int), kv_heads=kv,
            key_length_swa=hd_swa,
            value_length_swa=num("attention.value_length_swa", int, hd_swa),
            rope_dimension_count=num("rope.dimension_count", int, hd),
            rope_dimension_count_swa=num("rope.dimension_count_swa", int,
                                         num("rope.dimension_count", int, hd)),
            rope_freq_base_swa=num("rope.freq_base_swa", float, 10000.0),
            rope_freq_scale=_freq_scale(mf, p),
            sliding_window=num("attention.sliding_window", int),
            swa_layers=_swa_pattern(mf, p, n_layer),
            final_logit_softcapping=num("final_logit_softcapping", float, 30.0),
            v_layers=tuple(has(f"blk.{i}.attn_v.weight") for i in range(n_layer)),
            own_output=has("output.weight"),
            output_scales=has("blk.0.layer_output_scale.weight"),
            expert_scales=has("blk.0.ffn_down_exps.scale"),
        )
        args._check(mf, p)
        return args

    def head_dim(self, layer: int) -> int:
        return self.key_length_swa if self.swa_layers[layer] else self.key_length

    def rope_dims(self, layer: int) -> int:
        return (self.rope_dimension_count_swa if self.swa_layers[layer]
                else self.rope_dimension_count)

    def _check(self, mf: ModelFile, p: str) -> None:
        """qwen3moe's checks (`common.check_header`, every tensor's shape) and gemma4's."""
        def bad(key: str, why: str) -> ModelFileError:
            return ModelFileError(f"{mf.path}: metadata `{p}{key}` {why}")

        for key, got in (("attention.shared_kv_layers", mf.get(p + "attention.shared_kv_layers",
                                                                0)),
                         ("embedding_length_per_layer_input",
                          mf.require(p + "embedding_length_per_layer_input"))):
            if got != 0:
                raise bad(key, f"is {got!r}: the engine computes gemma4 files with 0 "
                          "(the MoE model's)")
        for name, what in UNSUPPORTED:
            if f"blk.0.{name}" in mf.tensors:
                raise ModelFileError(f"{mf.path}: tensor `blk.0.{name}` ({what}) is not "
                                     "computed by the engine")
        check_header(mf, self, self.dense_shapes() | self.expert_shapes())
        if self.key_length_swa < 2 or self.key_length_swa % 2 \
                or self.value_length_swa != self.key_length_swa:
            raise bad("attention.key_length_swa", f"is {self.key_length_swa}, must be even "
                      f"and equal attention.value_length_swa ({self.value_length_swa})")
        for i, kv in enumerate(self.kv_heads):
            if kv < 1 or self.head_count % kv:
                raise bad("attention.head_count_kv", f"is {kv} on layer {i}, must divide "
                          f"attention.head_count ({self.head_count})")
        for key, n_rot, hd in (("rope.dimension_count", self.rope_dimension_count,
                                self.key_length),
                               ("rope.dimension_count_swa", self.rope_dimension_count_swa,
                                self.key_length_swa)):
            if n_rot < 2 or n_rot % 2 or n_rot > hd:
                raise bad(key, f"is {n_rot}, must be even and at most the head size ({hd})")
        for key, value in (("rope.freq_base", self.rope_freq_base),
                           ("rope.freq_base_swa", self.rope_freq_base_swa)):
            if not (math.isfinite(value) and value > 0):
                raise bad(key, f"is {value}, must be positive")
        cap = self.final_logit_softcapping
        if not (math.isfinite(cap) and cap >= 0):
            raise bad("final_logit_softcapping", f"is {cap}, must be >= 0 (0: none)")
        if self.sliding_window < 1:
            raise bad("attention.sliding_window", f"is {self.sliding_window}, must be >= 1")

    def dense_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every dense tensor the forward pass reads, with its numpy shape."""
        d, e, ff = self.embedding_length, self.expert_count, self.feed_forward_length
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.vocab_size, d), "output_norm.weight": (d,)}
        if self.own_output:
            shapes["output.weight"] = (self.vocab_size, d)
        if not all(self.swa_layers):
            shapes["rope_freqs.weight"] = (self.rope_dimension_count // 2,)
        for i in range(self.block_count):
            b, hd = f"blk.{i}.", self.head_dim(i)
            q, kv = self.head_count * hd, self.kv_heads[i] * hd
            shapes |= {b + n: (d,) for n in (
                "attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight",
                "post_ffw_norm.weight", "pre_ffw_norm_2.weight", "post_ffw_norm_1.weight",
                "post_ffw_norm_2.weight", "ffn_gate_inp.scale")}
            shapes |= {
                b + "attn_q.weight": (q, d), b + "attn_k.weight": (kv, d),
                b + "attn_output.weight": (d, q), b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,), b + "ffn_gate.weight": (ff, d),
                b + "ffn_up.weight": (ff, d), b + "ffn_down.weight": (d, ff),
                b + "ffn_gate_inp.weight": (e, d)}
            if self.v_layers[i]:
                shapes[b + "attn_v.weight"] = (kv, d)
            if self.output_scales:
                shapes[b + "layer_output_scale.weight"] = (1,)
        return shapes

    def expert_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every layer's stacked experts (and their output scales), with numpy shapes."""
        shapes: dict[str, tuple[int, ...]] = {}
        for i in range(self.block_count):
            shapes |= expert_stacks(self, i)
            if self.expert_scales:
                shapes[f"blk.{i}.ffn_down_exps.scale"] = (self.expert_count,)
        return shapes

    def context_bytes(self, n_ctx: int, n_ubatch: int = 512) -> int:
        """Bytes a context of `n_ctx` positions allocates at load, at least: every layer's
        K and V cache, a sliding layer's as llama.cpp sizes its ring (the window and one
        batch, in blocks of 256)."""
        swa_cells = pad(min(pad(n_ctx), self.sliding_window + n_ubatch))
        return sum((swa_cells if s else pad(n_ctx)) * kv * self.head_dim(i) * 4 * 2
                   for i, (s, kv) in enumerate(zip(self.swa_layers, self.kv_heads,
                                                   strict=True)))


def _per_layer(mf: ModelFile, key: str, n_layer: int, default: int) -> tuple[int, ...]:
    """A key llama.cpp reads as one number or one per layer (`get_key_or_arr`)."""
    array = mf.array(key)  # metadata arrays are read on their own
    value = mf.get(key, default) if array is None else array
    values = list(value) if isinstance(value, list) else [value] * n_layer
    if len(values) != n_layer or not all(isinstance(v, int) and not isinstance(v, bool)
                                         for v in values):
        raise ModelFileError(f"{mf.path}: metadata `{key}` is {value!r}, not a count or "
                             f"one per layer ({n_layer})")
    return tuple(values)


def _freq_scale(mf: ModelFile, p: str) -> float:
    kind = str(mf.get(p + "rope.scaling.type", "linear"))
    if kind not in SCALINGS:
        raise ModelFileError(f"{mf.path}: metadata `{p}rope.scaling.type` is {kind!r}: the "
                             f"engine computes gemma4 with {', '.join(SCALINGS)}")
    factor = float(mf.get(p + "rope.scaling.factor", 0.0) or 0.0)
    return 1.0 if kind == "none" or factor == 0 else 1.0 / factor


def _swa_pattern(mf: ModelFile, p: str, n_layer: int) -> tuple[bool, ...]:
    """Which layers slide: gemma4 requires a bool per layer (llama.cpp's `get_arr`)."""
    key = p + "attention.sliding_window_pattern"
    value = mf.array(key)
    if value is None:
        value = mf.require(key)  # a number where a list belongs, or missing (named)
    if not isinstance(value, list) or len(value) != n_layer:
        raise ModelFileError(f"{mf.path}: metadata `{key}` must be a bool per layer "
                             f"({n_layer}), not {value!r}")
    return tuple(bool(v) for v in value)
