"""A run's route trace (`--route-trace`): the writer, opened with what each layer of the
model reads — its experts' bytes and its other (dense) tensors' bytes."""

from __future__ import annotations

from typing import Any

from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.streaming.streamer import LayerExperts
from abbench.records.route_trace import RouteTraceWriter


def open_route_trace(path: str, mf: ModelFile, layout: list[LayerExperts],
                     info: dict[str, Any], k: int) -> RouteTraceWriter:
    """The writer of a trace of `k` routed experts per token over `mf`'s layers (`info`:
    the model's `model_info`)."""
    expert_names = {t.name for le in layout for t in (le.gate, le.up, le.down)}
    layer_bytes = []
    for i, le in enumerate(layout):
        prefix = f"blk.{i}."
        dense = sum(t.nbytes for n, t in mf.tensors.items()
                    if n.startswith(prefix) and n not in expert_names)
        layer_bytes.append((le.file_bytes, dense))
    return RouteTraceWriter(path, str(info["name"] or info["path"]), info["architecture"],
                            info["n_layer"], info["n_expert"], k, layer_bytes)
