"""Qwen3-MoE as llama.cpp's graph (models/qwen3moe.cpp): the plain skeleton's
(`arch/shared/plain_graph.py`) as it is."""

from __future__ import annotations

from abbench.engine.arch.shared.plain_graph import PlainGraphModel


class GraphModel(PlainGraphModel):
    """The whole decoder on ggml graphs; the interface of `qwen3moe.model.Model`."""
