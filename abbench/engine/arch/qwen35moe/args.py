"""Qwen3.5/3.6 MoE's hyperparameters: `ModelArgs`, read from a GGUF header as llama.cpp
reads them (src/models/qwen35moe.cpp L4-26, its defaults where a key is absent) and checked
against the file's tensors before any weight is loaded.

What sets qwen35moe apart from qwen3moe in the header (docs/qwen35moe.md): the gated
delta-net sizes (`ssm.*`, required), which layers are recurrent (`attention.
recurrent_layers`, else every layer but each `full_attention_interval`-th, default 4), the
rotated share of a head (`rope.dimension_count`) and its sections (required, though text
positions make them moot), and the shared expert's width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.arch.shared.args import CoreArgs, Header
from abbench.engine.arch.shared.common import check_header, expert_stacks
from abbench.errors import ModelFileError

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile


@dataclass(frozen=True)
class ModelArgs(CoreArgs):
    """Field names follow the GGUF keys (`qwen35moe.<key>`)."""

    rope_dimension_count: int
    rope_dimension_sections: tuple[int, ...]  # 4 sizes: text's 4th position is 0
    expert_shared_feed_forward_length: int
    ssm_conv_kernel: int
    ssm_inner_size: int
    ssm_state_size: int
    ssm_time_step_rank: int  # value heads of a linear-attention layer
    ssm_group_count: int  # key heads of a linear-attention layer
    recurrent_layers: tuple[bool, ...]  # per layer: a gated delta-net layer

    @classmethod
    def from_file(cls, mf: ModelFile) -> ModelArgs:
        header = Header.of(mf)
        num, p = header.num, header.prefix
        core = header.core(mf, rms_eps=None, rope_base=10000.0, context=4096)
        n_layer = core["block_count"]
        sections = mf.array(p + "rope.dimension_sections")
        if sections is None:  # llama.cpp refuses the file
            mf.require(p + "rope.dimension_sections")
        args = cls(
            **core, rope_dimension_count=num("rope.dimension_count", int, header.head_dim),
            rope_dimension_sections=_sections(mf, p, sections),
            expert_shared_feed_forward_length=num(
                "expert_shared_feed_forward_length", int, num("feed_forward_length", int, 0)),
            ssm_conv_kernel=num("ssm.conv_kernel", int),
            ssm_inner_size=num("ssm.inner_size", int),
            ssm_state_size=num("ssm.state_size", int),
            ssm_time_step_rank=num("ssm.time_step_rank", int),
            ssm_group_count=num("ssm.group_count", int),
            recurrent_layers=_recurrent(mf, p, n_layer, num("full_attention_interval", int, 4)),
        )
        args._check(mf, p)
        return args

    def _check(self, mf: ModelFile, p: str) -> None:
        """qwen3moe's checks (`common.check_header`) and the hybrid stack's own keys'."""
        def bad(key: str, why: str) -> ModelFileError:
            return ModelFileError(f"{mf.path}: metadata `{p}{key}` {why}")

        if not (math.isfinite(self.rope_freq_base) and self.rope_freq_base > 0):
            raise bad("rope.freq_base", f"is {self.rope_freq_base}, must be positive")
        n_rot = self.rope_dimension_count
        if n_rot < 2 or n_rot % 2 or n_rot > self.key_length:
            raise bad("rope.dimension_count", f"is {n_rot}, must be even and at most "
                      f"attention.key_length ({self.key_length})")
        if not any(self.rope_dimension_sections[:3]) or sum(
                self.rope_dimension_sections) > self.key_length:
            raise bad("rope.dimension_sections", f"is {list(self.rope_dimension_sections)}: "
                      "one of the first three must be positive, their sum at most "
                      f"attention.key_length ({self.key_length})")
        for key in ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
                    "expert_shared_feed_forward_length"):
            if getattr(self, key.replace(".", "_")) < 1:
                raise bad(key, "must be >= 1")
        heads, groups = self.ssm_time_step_rank, self.ssm_group_count
        if heads < 1 or heads % groups:
            raise bad("ssm.time_step_rank", f"is {heads}, must be a multiple of "
                      f"ssm.group_count ({groups})")
        if self.ssm_inner_size != heads * self.ssm_state_size:
            raise bad("ssm.inner_size", f"is {self.ssm_inner_size}, must be ssm.state_size "
                      f"x ssm.time_step_rank ({self.ssm_state_size * heads})")
        check_header(mf, self, self.dense_shapes(mf) | self.expert_shapes())

    def dense_shapes(self, mf: ModelFile) -> dict[str, tuple[int, ...]]:
        """Every dense tensor the forward pass reads, with its numpy shape: a full layer's
        gated attention (q rows and their gate rows, per head) or a linear layer's delta
        net, the post-attention norm, the router and the shared expert."""
        d, hd, e, fs = (self.embedding_length, self.key_length, self.expert_count,
                        self.expert_shared_feed_forward_length)
        q, kv = self.head_count * hd, self.head_count_kv * hd
        h, s, inner = self.ssm_time_step_rank, self.ssm_state_size, self.ssm_inner_size
        conv = 2 * self.ssm_group_count * s + inner
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.vocab_size, d), "output_norm.weight": (d,)}
        if "output.weight" in mf.tensors:
            shapes["output.weight"] = (self.vocab_size, d)
        for i in range(self.block_count):
            b = f"blk.{i}."
            shapes |= {
                b + "attn_norm.weight": (d,), b + "post_attention_norm.weight": (d,),
                b + "ffn_gate_inp.weight": (e, d), b + "ffn_gate_inp_shexp.weight": (d,),
                b + "ffn_gate_shexp.weight": (fs, d), b + "ffn_up_shexp.weight": (fs, d),
                b + "ffn_down_shexp.weight": (d, fs),
            }
            if self.recurrent_layers[i]:
                shapes |= {
                    b + "attn_qkv.weight": (conv, d), b + "attn_gate.weight": (inner, d),
                    b + "ssm_conv1d.weight": (conv, self.ssm_conv_kernel),
                    b + "ssm_dt.bias": (h,), b + "ssm_a": (h,),
                    b + "ssm_beta.weight": (h, d), b + "ssm_alpha.weight": (h, d),
                    b + "ssm_norm.weight": (s,), b + "ssm_out.weight": (d, inner),
                }
            else:
                shapes |= {
                    b + "attn_q.weight": (2 * q, d), b + "attn_k.weight": (kv, d),
                    b + "attn_v.weight": (kv, d), b + "attn_output.weight": (d, q),
                    b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,),
                }
        return shapes

    def expert_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for i in range(self.block_count):
            shapes |= expert_stacks(self, i)
        return shapes

    def rotated_pairs(self) -> np.ndarray:
        """(n_rot/2,) bool: which NeoX pairs turn with a text token's position. ggml's
        interleaved multi-axis RoPE gives pair i (its sector i mod the sections' sum) the
        1st, 2nd or 3rd position — all the token's position for text — when i mod 3 is 0,
        1 or 2 and i is below 3 times that section's size, else the 4th position, which is
        0 for text: that pair does not turn (ggml-cpu/ops.cpp `ggml_mrope_cache_init`,
        src/llama-graph.cpp L131-141)."""
        sections = self.rope_dimension_sections
        sector = np.arange(self.rope_dimension_count // 2) % max(1, sum(sections))
        axis = sector % 3
        return sector < 3 * np.array(sections[:3])[axis]

    def context_bytes(self, n_ctx: int) -> int:
        """Bytes a context of `n_ctx` positions allocates at load, at least: the full
        layers' K and V caches and the linear layers' conv and delta-rule states (one
        sequence's: they do not grow with the context)."""
        full = sum(not r for r in self.recurrent_layers)
        kv = full * self.head_count_kv * n_ctx * 2 * self.key_length * 4
        conv = (2 * self.ssm_group_count * self.ssm_state_size + self.ssm_inner_size) * (
            self.ssm_conv_kernel - 1)
        state = self.ssm_time_step_rank * self.ssm_state_size ** 2
        return kv + (self.block_count - full) * (conv + state) * 4


def _sections(mf: ModelFile, p: str, value: list[object]) -> tuple[int, ...]:
    """`rope.dimension_sections` as llama.cpp reads it: 4 non-negative sizes."""
    if len(value) != 4 or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ModelFileError(f"{mf.path}: metadata `{p}rope.dimension_sections` is {value!r}, "
                             "not 4 sizes")
    return tuple(int(v) for v in value)  # type: ignore[call-overload]


def _recurrent(mf: ModelFile, p: str, n_layer: int, interval: int) -> tuple[bool, ...]:
    """Which layers are gated delta-net layers, as llama.cpp reads it: a bool per layer in
    `attention.recurrent_layers`, else all but every `full_attention_interval`-th (the last
    of each interval)."""
    value = mf.array(p + "attention.recurrent_layers")
    if value is not None:
        if len(value) != n_layer:
            raise ModelFileError(f"{mf.path}: metadata `{p}attention.recurrent_layers` has "
                                 f"{len(value)} values for {n_layer} layers")
        return tuple(bool(v) for v in value)
    if interval < 1:
        raise ModelFileError(f"{mf.path}: metadata `{p}full_attention_interval` is "
                             f"{interval}, must be >= 1")
    return tuple((i + 1) % interval != 0 for i in range(n_layer))
