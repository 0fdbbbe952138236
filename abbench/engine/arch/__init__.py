"""Architecture lookup: a table keyed by GGUF `general.architecture`."""

from __future__ import annotations

from types import ModuleType

from abbench.engine.arch import gpt_oss, qwen3moe, qwen3moe_graph
from abbench.errors import ModelFileError

ARCHITECTURES: dict[str, ModuleType] = {qwen3moe.ARCH: qwen3moe, gpt_oss.ARCH: gpt_oss}
# The same architectures as llama.cpp's graphs, for files computed in their own types
# (`--kernels ggml`): their `GraphModel` has the interface of the module's `Model`.
GRAPHS: dict[str, ModuleType] = {qwen3moe.ARCH: qwen3moe_graph}


def architecture(name: str, path: object) -> ModuleType:
    module = ARCHITECTURES.get(name)
    if module is None:
        raise ModelFileError(
            f"{path}: architecture `{name}` is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return module
