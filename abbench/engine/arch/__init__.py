"""The architectures' code, found through the table (engine/architectures.py): a row's
package `engine/arch/<package>/` has `args.py` (`ModelArgs`, the header read and checked),
`model.py` (the numpy `Model`, its `expert_ffn` and `ARCH`) and `graph.py` (llama.cpp's
graph of it, `GraphModel`, with the interface of `Model`), over `engine/arch/shared/`."""

from __future__ import annotations

import importlib
from types import ModuleType

from abbench.engine.architectures import TABLE
from abbench.errors import ModelFileError


def _part(package: str, part: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{package}.{part}")


ARCHITECTURES: dict[str, ModuleType] = {a.name: _part(a.package, "model") for a in TABLE}
# The same architectures as llama.cpp's graphs, for files computed in their own types
# (`--kernels ggml`)
GRAPHS: dict[str, ModuleType] = {a.name: _part(a.package, "graph") for a in TABLE}
# Those whose graph model is `--kernels auto`'s choice for F32 experts too
GRAPH_FOR_F32: frozenset[str] = frozenset(a.name for a in TABLE if a.graph_for_f32)


def architecture(name: str, path: object) -> ModuleType:
    module = ARCHITECTURES.get(name)
    if module is None:
        raise ModelFileError(
            f"{path}: architecture `{name}` is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return module
