"""The plain MoE decoder's hyperparameters: `PlainArgs`, read from a GGUF header and
checked against the file's tensors before any weight is loaded (`plain_model.py` is the
numpy model built from them; `plain_graph.py` llama.cpp's graph of it).

The plain decoder is qwen3moe's skeleton: RMSNorm, GQA attention with q/k RMSNorm and
NeoX RoPE, a softmax router over the experts, top-k, SwiGLU experts, nothing shared. An
architecture built on it (qwen3moe, olmoe) subclasses `PlainArgs`, `PlainModel` and
`PlainGraphModel` and sets `Plain`, what it does its own way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from abbench.engine.arch.shared.args import CoreArgs, Header
from abbench.engine.arch.shared.common import check_header, expert_stacks
from abbench.errors import ModelFileError

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile


@dataclass(frozen=True)
class Plain:
    """What an architecture on the plain skeleton does its own way."""

    # q/k RMSNorm over each whole projection, one weight per row of it (olmoe); else per
    # head, one weight per head dimension shared by the heads (qwen3moe)
    qk_norm_whole: bool = False
    renormalise: bool = True  # the top-k weights renormalised to sum 1 (llama.cpp's norm_w)
    expert_ff_key: str = "expert_feed_forward_length"  # the header key of the experts' width


@dataclass(frozen=True)
class PlainArgs(CoreArgs):
    """Field names follow the GGUF keys (`ARCH.<key>`)."""

    PLAIN: ClassVar[Plain] = Plain()

    @classmethod
    def from_file(cls, mf: ModelFile) -> PlainArgs:
        """Read and check the header against the tensors: a file whose numbers disagree
        with its tensors fails here, naming the key, not later in a reshape."""
        header = Header.of(mf)
        args = cls(**header.core(mf, rms_eps=1e-6, rope_base=1_000_000.0, context=4096,
                                 expert_ff_key=cls.PLAIN.expert_ff_key))
        args._check(mf)
        return args

    def _check(self, mf: ModelFile) -> None:
        check_header(mf, self, self.dense_shapes(mf) | self.expert_shapes())
        if not (math.isfinite(self.rope_freq_base) and self.rope_freq_base > 0):
            raise ModelFileError(f"{mf.path}: metadata `{mf.architecture}.rope.freq_base` is "
                                 f"{self.rope_freq_base}, must be positive")

    def dense_shapes(self, mf: ModelFile) -> dict[str, tuple[int, ...]]:
        """Every dense tensor the forward pass reads, with its numpy shape."""
        d, hd = self.embedding_length, self.key_length
        q, kv = self.head_count * hd, self.head_count_kv * hd
        q_norm, k_norm = (q, kv) if self.PLAIN.qk_norm_whole else (hd, hd)
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.vocab_size, d),
            "output_norm.weight": (d,),
        }
        if "output.weight" in mf.tensors:
            shapes["output.weight"] = (self.vocab_size, d)
        for i in range(self.block_count):
            b = f"blk.{i}."
            shapes |= {
                b + "attn_norm.weight": (d,),
                b + "attn_q.weight": (q, d),
                b + "attn_k.weight": (kv, d),
                b + "attn_v.weight": (kv, d),
                b + "attn_output.weight": (d, q),
                b + "attn_q_norm.weight": (q_norm,),
                b + "attn_k_norm.weight": (k_norm,),
                b + "ffn_norm.weight": (d,),
                b + "ffn_gate_inp.weight": (self.expert_count, d),
            }
        return shapes

    def expert_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every layer's stacked experts, with their numpy shapes: checked against the
        header too, so that an expert the header says is small is not read as a large one."""
        shapes: dict[str, tuple[int, ...]] = {}
        for i in range(self.block_count):
            shapes |= expert_stacks(self, i)
        return shapes

    def context_bytes(self, n_ctx: int) -> int:
        """Bytes a context of `n_ctx` positions allocates at load, at least: every layer's
        KV cache (K rows of hd, V rows of hd + 1: `Attention`) and the RoPE tables (F64
        angles and cosines while they are computed, then cos and sin in F32)."""
        kv = self.block_count * self.head_count_kv * n_ctx * (2 * self.key_length + 1) * 4
        return kv + n_ctx * (self.key_length // 2) * (8 + 8 + 4 + 4)
