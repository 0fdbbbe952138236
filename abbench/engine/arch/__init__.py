"""The architectures' code, found through the table (engine/architectures.py): a row's
package `engine/arch/<package>/` has `args.py` (`ModelArgs`, the header read and checked),
`model.py` (the numpy `Model`, its `expert_ffn` and `ARCH`) and `graph.py` (llama.cpp's
graph of it, `GraphModel`, with the interface of `Model`), over `engine/arch/shared/`."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

from abbench.engine.architectures import TABLE
from abbench.errors import ModelFileError


class _Parts(Mapping[str, ModuleType]):
    """Every architecture's module `part` (model, graph) by its name, each imported when
    first asked for: a run imports its own architecture's code, not every one's (they
    were a third of an engine child's start)."""

    def __init__(self, part: str) -> None:
        self._part = part
        self._packages = {a.name: a.package for a in TABLE}

    def __getitem__(self, name: str) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self._packages[name]}.{self._part}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._packages)

    def __len__(self) -> int:
        return len(self._packages)


ARCHITECTURES: Mapping[str, ModuleType] = _Parts("model")
# The same architectures as llama.cpp's graphs, for files computed in their own types
# (`--kernels ggml`)
GRAPHS: Mapping[str, ModuleType] = _Parts("graph")
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
