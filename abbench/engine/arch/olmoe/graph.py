"""OLMoE as llama.cpp's graph (models/olmoe.cpp): the plain skeleton's
(`arch/shared/plain_graph.py`) with OLMoE's `Plain` (`args.py`)."""

from __future__ import annotations

from abbench.engine.arch.shared.plain_graph import PlainGraphModel


class GraphModel(PlainGraphModel):
    """The whole decoder on ggml graphs; the interface of `olmoe.model.Model`."""
