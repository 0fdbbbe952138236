"""A planned cell's configuration (plan.json `cells[].config`): one kind per way a cell runs.

```
CellConfig = EmbeddedConfig    `engine` absent or "embedded": the engine's resolved flags
           | LlamaConfig       `engine` "llama-bench" | "llama-completion"
           | BmoeConfig        `engine` "bmoe": the phone-streaming engine's CLI
           | ExternalConfig    `engine` "external": a command and where its result is
           | ImportedConfig    `engine` "imported": a run made elsewhere (`abbench import`)
```

Each kind keeps the mapping plan.json holds (`resolved`) as it was written, so that a plan
reads back to the same bytes and `key` (the configuration's identity, kept in sentinel
histories) stays what it was; what the code reads of it is a typed field, read and checked
on construction. `cell_config` picks the kind from `engine`. Records know nothing of the
engine: that an embedded cell's flags make a valid `EngineConfig` is checked by the
campaign when it resolves the cell (`campaign.resolve`); here only the types of what is
read. A problem is a `ConfigError` whose `field` is the key's path within the config.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from abbench.errors import BadField, ConfigError
from abbench.records.schema import show, typed

LLAMA_TOOLS = ("llama-bench", "llama-completion")
# An external cell's `output`: a per-token CSV, an engine run JSON, or its stdout's
# `generation:` line (campaign/output.py reads each).
OUTPUT = re.compile(r"(bmoe-csv|json):.+\Z|stdout-summary\Z")
DEFAULT_TIMEOUT_S = 900.0  # where a plan does not say (plans tests write)
Scalar = str | int | float | bool

_REQUIRED: Any = object()


def config_key(config: Mapping[str, Any]) -> str:
    """A configuration's identity: its resolved keys as canonical JSON, without the ones
    that do not change the work (`timeout_s`). Cells with equal keys are one arm."""
    return json.dumps({k: v for k, v in sorted(config.items()) if k != "timeout_s"},
                      sort_keys=True, separators=(",", ":"))


def _problem(key: str, problem: str) -> ConfigError:
    return ConfigError(f"cell configuration `{key}`: {problem}", field=key,
                       problem=(problem,))


def _read(resolved: Mapping[str, Any], key: str, hint: Any, default: Any = _REQUIRED) -> Any:
    """`resolved[key]` as `hint` asks; `default` where it is absent (else a problem)."""
    if key not in resolved:
        if default is _REQUIRED:
            raise _problem(key, "is missing")
        return default
    try:
        return typed(resolved[key], hint, (key,))
    except BadField as e:
        raise _problem(e.where, e.problem) from None


@dataclass(frozen=True)
class _Kind:
    """What every kind holds: the mapping as plan.json has it and the engine that ran the
    cell. The typed fields are read from `resolved` (never given)."""

    resolved: dict[str, Any]  # never mutated: the identity and the bytes on disk
    engine: str = field(init=False)

    engines: ClassVar[tuple[str, ...]] = ()  # the `engine` values of this kind
    implicit: ClassVar[bool] = False  # the kind of a cell that names no `engine`

    def __post_init__(self) -> None:
        engine = _read(self.resolved, "engine", str,
                       self.engines[0] if self.implicit else _REQUIRED)
        if engine not in self.engines:
            raise _problem("engine", f"is {show(engine)}, not one of "
                           f"{', '.join(self.engines)}")
        self._set(engine=engine)

    def _set(self, **values: Any) -> None:
        """Set typed fields in `__post_init__` (the dataclass is frozen to everyone else)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def key(self) -> str:
        """The configuration's identity (`config_key`): cells with equal keys are one arm."""
        return config_key(self.resolved)

    def to_json(self) -> dict[str, Any]:
        return copy.deepcopy(self.resolved)


@dataclass(frozen=True)
class _Launched(_Kind):
    """A kind a campaign launches: it runs under a timeout, and in a memory cgroup of its
    own where the plan limits its memory (campaign/cgroup.py)."""

    timeout_s: float = field(init=False)
    memory_limit_mib: float | None = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        timeout = _read(self.resolved, "timeout_s", float, DEFAULT_TIMEOUT_S)
        if not timeout > 0:
            raise _problem("timeout_s", f"must be > 0 (got {show(timeout)})")
        limit = _read(self.resolved, "memory_limit_mib", float | None, None)
        if limit is not None and not limit > 0:
            raise _problem("memory_limit_mib", f"must be > 0 (got {show(limit)})")
        self._set(timeout_s=timeout, memory_limit_mib=limit)


@dataclass(frozen=True)
class EmbeddedConfig(_Launched):
    """The embedded engine's resolved flags, under `EngineConfig`'s field names (what
    `engine.config.to_argv` turns into the child's command line)."""

    model: str | None = field(init=False)  # None only in plans tests write
    prompt: str | None = field(init=False)
    prompt_tokens: tuple[int, ...] | None = field(init=False)
    n_tokens: int | None = field(init=False)

    engines: ClassVar[tuple[str, ...]] = ("embedded",)
    implicit: ClassVar[bool] = True  # as the runner has always read one (tests' plans)

    def __post_init__(self) -> None:
        super().__post_init__()
        r = self.resolved
        self._set(model=_read(r, "model", str | None, None),
                  prompt=_read(r, "prompt", str | None, None),
                  prompt_tokens=_read(r, "prompt_tokens", tuple[int, ...] | None, None),
                  n_tokens=_read(r, "n_tokens", int | None, None))


@dataclass(frozen=True)
class LlamaConfig(_Launched):
    """A llama.cpp cell (`campaign.llamacpp.LlamaCell` is the same, with its command line)."""

    tool: str = field(init=False)  # its `engine`
    model: str = field(init=False)
    tokens: int = field(init=False)
    prompt: str = field(init=False)
    seed: int = field(init=False)
    repetitions: int = field(init=False)
    bin_dir: str | None = field(init=False)  # `llama_cpp_bin`
    options: tuple[tuple[str, Scalar], ...] = field(init=False)  # `llama`, in file order

    engines: ClassVar[tuple[str, ...]] = LLAMA_TOOLS

    def __post_init__(self) -> None:
        super().__post_init__()
        r = self.resolved
        self._set(tool=self.engine, model=_read(r, "model", str),
                  tokens=_read(r, "tokens", int), prompt=_read(r, "prompt", str),
                  seed=_read(r, "seed", int), repetitions=_read(r, "repetitions", int),
                  bin_dir=_read(r, "llama_cpp_bin", str | None, None),
                  options=tuple(_read(r, "llama", dict[str, Scalar], {}).items()))


@dataclass(frozen=True)
class BmoeConfig(_Launched):
    """A `bmoe-cli` cell (`campaign.bmoe.BmoeCell` is the same, with its checks and its
    command line)."""

    model: str = field(init=False)
    tokens: int = field(init=False)
    prompt: str = field(init=False)
    bin_dir: str | None = field(init=False)  # `bmoe_bin`
    options: tuple[tuple[str, Scalar], ...] = field(init=False)  # `bmoe`, in file order

    engines: ClassVar[tuple[str, ...]] = ("bmoe",)

    def __post_init__(self) -> None:
        super().__post_init__()
        r = self.resolved
        self._set(model=_read(r, "model", str), tokens=_read(r, "tokens", int),
                  prompt=_read(r, "prompt", str),
                  bin_dir=_read(r, "bmoe_bin", str | None, None),
                  options=tuple(_read(r, "bmoe", dict[str, Scalar], {}).items()))


CELL_PLACEHOLDER = "{cell}"  # in an external cell's command and output: the cell's label


@dataclass(frozen=True)
class ExternalConfig(_Launched):
    """A command abbench runs as it is, and where it leaves its result. `{cell}` in either
    stands for the cell's label (`02-B`), so that each cell writes a path of its own while
    the configuration stays the same."""

    command: tuple[str, ...] = field(init=False)  # the program first
    output: str = field(init=False)  # bmoe-csv:PATH | json:PATH | stdout-summary

    engines: ClassVar[tuple[str, ...]] = ("external",)

    def __post_init__(self) -> None:
        super().__post_init__()
        command = _read(self.resolved, "command", tuple[str, ...])
        if not command or not command[0]:
            raise _problem("command", "must be a non-empty array of strings, the program "
                           "first")
        output = _read(self.resolved, "output", str)
        if not OUTPUT.match(output):
            raise _problem("output", f"{show(output)} is not an output")
        self._set(command=command, output=output)

    def command_for(self, label: str) -> list[str]:
        return [word.replace(CELL_PLACEHOLDER, label) for word in self.command]

    def output_path(self, label: str) -> str | None:
        """The file the output is read from for cell `label` (None: stdout)."""
        kind, _, where = self.output.partition(":")
        return where.replace(CELL_PLACEHOLDER, label) if kind != "stdout-summary" else None


@dataclass(frozen=True)
class ImportedConfig(_Kind):
    """A run made elsewhere: the configuration its files gave (`importers.identity`), as
    they gave it (none of it is checked but `model`); a campaign never launches it."""

    model: str | None = field(init=False)

    engines: ClassVar[tuple[str, ...]] = ("imported",)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(model=_read(self.resolved, "model", str | None, None))


LaunchedConfig = EmbeddedConfig | LlamaConfig | BmoeConfig | ExternalConfig
CellConfig = LaunchedConfig | ImportedConfig
KINDS: dict[str, type[CellConfig]] = {
    engine: kind for kind in (EmbeddedConfig, LlamaConfig, BmoeConfig, ExternalConfig,
                              ImportedConfig)
    for engine in kind.engines
}


def cell_config(resolved: Mapping[str, Any]) -> CellConfig:
    """The kind of cell `resolved` configures (by its `engine`; none: embedded), read and
    checked. Raises ConfigError."""
    engine = resolved.get("engine", "embedded")
    kind = KINDS.get(engine) if isinstance(engine, str) else None
    if kind is None:
        raise _problem("engine", f"is {show(engine)}, expected one of "
                       + ", ".join(KINDS))
    return kind(dict(resolved))
