"""OLMoE (models/olmoe.cpp): the plain MoE decoder (`arch/shared/plain_model.py`) with
q/k RMSNorm over each whole projection (one weight per row of it) before the heads are
split and NeoX RoPE, and the top-k routing weights as the router's softmax over every
expert gave them, not renormalised (`build_moe_ffn`'s norm_w false); SwiGLU experts."""

from __future__ import annotations

from abbench.engine.arch.olmoe.args import ModelArgs as ModelArgs
from abbench.engine.arch.shared.plain_model import PlainModel, plain_expert_ffn

ARCH = "olmoe"
expert_ffn = plain_expert_ffn  # silu(gate) * up, nothing per expert


class Model(PlainModel):
    """The whole decoder. `forward(token, pos)` returns the next-token logits."""
