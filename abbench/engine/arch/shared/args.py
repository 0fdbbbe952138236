"""What every architecture's `ModelArgs` starts from: the hyperparameters they all have
(`CoreArgs`, named as the GGUF keys) and the first reads of `from_file` (`Header`): the
file's numbers under its architecture, the model width, the q heads and the head size.

An architecture's `ModelArgs` is a frozen dataclass over `CoreArgs` with its own fields;
its `from_file` is `Header.of(mf)`, then `cls(**header.core(mf, ...its defaults), ...its
own fields)`, then its checks (`common.check_header` and its own)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from abbench.engine.arch.shared.common import header_numbers
from abbench.errors import ModelFileError

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile


@dataclass(frozen=True)
class CoreArgs:
    """Field names follow the GGUF keys (`ARCH.<key>`)."""

    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    layer_norm_rms_epsilon: float
    rope_freq_base: float
    expert_count: int
    expert_used_count: int
    expert_feed_forward_length: int
    context_length: int
    vocab_size: int


@dataclass(frozen=True)
class Header:
    """The first reads of a `from_file`: `num(key, kind, default=None)` the header's
    numbers (`common.header_numbers`), `prefix` its keys' (`ARCH.`), the width `d`, the q
    heads (at least 1) and the head size (`attention.key_length`, else d over the heads)."""

    num: Callable[..., Any]
    prefix: str
    d: int
    n_head: int
    head_dim: int

    @classmethod
    def of(cls, mf: ModelFile) -> Header:
        num = header_numbers(mf)
        p = mf.architecture + "."
        d, n_head = num("embedding_length", int), num("attention.head_count", int)
        if n_head < 1:
            raise ModelFileError(f"{mf.path}: `{p}attention.head_count` must be >= 1")
        return cls(num, p, d, n_head, num("attention.key_length", int, d // n_head))

    def core(self, mf: ModelFile, *, rms_eps: float | None, rope_base: float,
             context: int | None, expert_ff_key: str = "expert_feed_forward_length",
             head_count_kv: int | None = None) -> dict[str, Any]:
        """`CoreArgs`' fields as the file gives them, with the architecture's defaults
        (None: the key is required, as llama.cpp requires it); `head_count_kv` where the
        architecture reads it its own way (gemma4: one per layer)."""
        num, hd = self.num, self.head_dim
        if head_count_kv is None:
            head_count_kv = num("attention.head_count_kv", int, self.n_head)
        return dict(
            block_count=num("block_count", int), embedding_length=self.d,
            head_count=self.n_head, head_count_kv=head_count_kv,
            key_length=hd, value_length=num("attention.value_length", int, hd),
            layer_norm_rms_epsilon=num("attention.layer_norm_rms_epsilon", float, rms_eps),
            rope_freq_base=num("rope.freq_base", float, rope_base),
            expert_count=num("expert_count", int),
            expert_used_count=num("expert_used_count", int),
            expert_feed_forward_length=num(expert_ff_key, int),
            context_length=num("context_length", int, context),
            vocab_size=mf.tensor("token_embd.weight").shape[0],
        )
