"""OLMoE's hyperparameters: the plain skeleton's (`arch/shared/plain_args.py`), with the
q/k norms over each whole projection, top-k weights as the softmax gives them, and the
experts' width under `olmoe.feed_forward_length` (models/olmoe.cpp reads no
expert_feed_forward_length)."""

from __future__ import annotations

from typing import ClassVar

from abbench.engine.arch.shared.plain_args import Plain, PlainArgs


class ModelArgs(PlainArgs):
    """Field names follow the GGUF keys (`olmoe.<key>`)."""

    PLAIN: ClassVar[Plain] = Plain(qk_norm_whole=True, renormalise=False,
                                   expert_ff_key="feed_forward_length")
