"""Qwen3-MoE (models/qwen3moe.cpp): the plain MoE decoder (`arch/shared/plain_model.py`)
as it is: RMSNorm, GQA attention with per-head q/k RMSNorm and NeoX RoPE, a softmax
router → top-k → renormalised weights, SwiGLU experts, no shared expert."""

from __future__ import annotations

from abbench.engine.arch.qwen3moe.args import ModelArgs as ModelArgs
from abbench.engine.arch.shared.plain_model import PlainModel, plain_expert_ffn

ARCH = "qwen3moe"
expert_ffn = plain_expert_ffn  # silu(gate) * up, nothing per expert


class Model(PlainModel):
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""
