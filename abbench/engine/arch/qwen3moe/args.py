"""Qwen3-MoE's hyperparameters: the plain skeleton's (`arch/shared/plain_args.py`) as
they are, per-head q/k norms and renormalised top-k weights."""

from __future__ import annotations

from abbench.engine.arch.shared.plain_args import PlainArgs


class ModelArgs(PlainArgs):
    """Field names follow the GGUF keys (`qwen3moe.<key>`)."""
