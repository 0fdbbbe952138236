"""Architecture lookup: a table keyed by GGUF `general.architecture`."""

from __future__ import annotations

from types import ModuleType

from abbench.engine.arch import qwen3moe
from abbench.errors import ModelFileError

ARCHITECTURES: dict[str, ModuleType] = {qwen3moe.ARCH: qwen3moe}


def architecture(name: str, path: object) -> ModuleType:
    module = ARCHITECTURES.get(name)
    if module is None:
        raise ModelFileError(
            f"{path}: architecture `{name}` is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return module
