"""Architecture lookup: a table keyed by GGUF `general.architecture`."""

from __future__ import annotations

from types import ModuleType

from abbench.engine.arch import (
    gemma4,
    gemma4_graph,
    gpt_oss,
    gpt_oss_graph,
    qwen3moe,
    qwen3moe_graph,
    qwen35moe,
    qwen35moe_graph,
)
from abbench.errors import ModelFileError

ARCHITECTURES: dict[str, ModuleType] = {qwen3moe.ARCH: qwen3moe, gpt_oss.ARCH: gpt_oss,
                                        qwen35moe.ARCH: qwen35moe, gemma4.ARCH: gemma4}
# The same architectures as llama.cpp's graphs, for files computed in their own types
# (`--kernels ggml`): their `GraphModel` has the interface of the module's `Model`.
GRAPHS: dict[str, ModuleType] = {qwen3moe.ARCH: qwen3moe_graph, gpt_oss.ARCH: gpt_oss_graph,
                                  qwen35moe.ARCH: qwen35moe_graph, gemma4.ARCH: gemma4_graph}
# Those whose graph model is `--kernels auto`'s choice for F32 experts too, where it decodes
# faster than their numpy model (gemma4: 2.1x, docs/gemma4.md §6; qwen35moe: about 2x,
# docs/qwen35moe.md §7).
GRAPH_FOR_F32: frozenset[str] = frozenset({gemma4.ARCH, qwen35moe.ARCH})


def architecture(name: str, path: object) -> ModuleType:
    module = ARCHITECTURES.get(name)
    if module is None:
        raise ModelFileError(
            f"{path}: architecture `{name}` is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return module
