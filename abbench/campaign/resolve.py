"""A campaign file's cells, resolved: each `[cells.NAME]` table with its `base` chain,
`[workload]` defaults and the `[[sweep]]` value that made it, as the `CellSpec` of its kind.

A cell's keys are read as layers (`cell_layers`: TOML key -> value and where it is
written), merged nearest-last along the `base` chain (`llama` options one by one), and the
merged layer becomes the cell: an embedded cell's `EngineConfig` is built here, so the
engine's own checks and what it would reject once it read the model (`model_check`) run
before any cell does; a llama.cpp cell's model and binary are checked on this machine; an
external cell needs its `command`. Every problem names the key that set the value, with
`(resolving cell `NAME`)` where that key is not the cell's own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import abbench.campaign.bmoe as bmoe
import abbench.campaign.cgroup as cgroup
from abbench.campaign._check import as_table, check_keys, coerce, error_at, fail, under
from abbench.campaign.cell_spec import CellSpec
from abbench.campaign.llamacpp import TOOLS as LLAMA_TOOLS
from abbench.campaign.llamacpp import LlamaCell, find_binary
from abbench.campaign.model_check import ModelHeaders, cell_problems
from abbench.campaign.tables import (
    BMOE,
    BMOE_KEYS,
    CELL_DEFAULTS,
    CELL_HINTS,
    ENGINE_KEYS,
    ENGINES,
    ENGINES_TEXT,
    LLAMA_KEYS,
    TOML_KEY,
    WorkloadTable,
    check_name,
)
from abbench.engine.architectures import PRESET_NAMES
from abbench.engine.config import EngineConfig
from abbench.errors import AbbenchError, CampaignFileError, ConfigError, Key, render
from abbench.records.schema import describe, did_you_mean, show
from abbench.records.text import clip

_SYNTHETIC = re.compile(r"synthetic:[A-Za-z0-9_-]+(@[0-9]+)?\Z")
Layer = dict[str, tuple[Any, Key]]  # a cell's keys: TOML key -> (value, where it is written)
T = TypeVar("T")


def spelling(key: str) -> str | None:
    """A tip for an engine field written under its flag's name (`n_tokens`)."""
    return f"the campaign file spells it `{TOML_KEY[key]}`" if key in TOML_KEY else None


def cell_layers(raw: Any) -> dict[str, Layer]:
    if raw is None or raw == {}:
        fail(("cells",), "no cells", tip="a campaign needs at least one `[cells.NAME]` table")
    layers: dict[str, Layer] = {}
    for name, body in as_table(("cells",), raw).items():
        key: Key = ("cells", name)
        check_name(key, name)
        if not isinstance(body, dict):
            fail(key, f"expected a table, got {describe(body)}",
                 tip=f"a cell is a table: `[cells.{name}]`")
        check_keys(key, body, list(CELL_HINTS), spelling)
        layers[name] = {k: (coerce((*key, k), v, CELL_HINTS[k]), (*key, k))
                        for k, v in body.items()}
    return layers


def _chain(name: str, layers: dict[str, Layer]) -> list[str]:
    """The cell and its bases, nearest first."""
    chain = [name]
    while "base" in layers[chain[-1]]:
        base, at = layers[chain[-1]]["base"]
        if base not in layers:
            fail(at, f"no cell `{clip(base, 60)}`", tip=did_you_mean(base, layers, "cells"))
        if base in chain:
            cycle = " → ".join([*chain[chain.index(base):], base])
            fail(at, f"`base` cycle: {cycle}", tip="a cell cannot inherit from itself, "
                 "directly or through other cells")
        chain.append(base)
    return chain


def resolve_cell(name: str, layers: dict[str, Layer], workload: WorkloadTable, folder: Path,
             sweep: int | None, headers: ModelHeaders, transport: str = "local") -> CellSpec:
    home: Key = ("cells", name)
    at_home = ("sweep", sweep) if sweep is not None else home
    merged: Layer = {}
    for n in reversed(_chain(name, layers)):
        own = {k: v for k, v in layers[n].items() if k != "base"}
        for table in ("llama", "bmoe"):  # options inherit one by one
            if table in own and table in merged:
                own[table] = ({**merged[table][0], **own[table][0]}, own[table][1])
        merged.update(own)
    base = layers[name]["base"][0] if "base" in layers[name] else None
    timeout = merged["timeout_s"][0] if "timeout_s" in merged else workload.timeout_s
    memory = _memory_limit(merged, workload, transport)
    if "engine" in merged:
        engine, at = merged["engine"]
        if engine not in ENGINES:
            fail(at, f"must be one of {ENGINES_TEXT} (got {show(engine)})",
                 tip=did_you_mean(engine, ENGINES, "engines"))
    else:
        engine = "external" if "command" in merged or "output" in merged else workload.engine

    def cell(**kw: Any) -> CellSpec:
        try:
            return CellSpec(name=name, engine=engine, timeout_s=timeout,
                            memory_limit_mib=memory, base=base, sweep=sweep, **kw)
        except CampaignFileError as e:
            where = merged[e.key[0]][1] if e.key and e.key[0] in merged else None
            raise error_at(where, e.problem, e.tip) if where else under(e, home) from None

    if engine in LLAMA_TOOLS:
        return cell(llama=_llama_cell(name, engine, merged, workload, folder, transport, home))
    if engine == BMOE:
        return cell(bmoe=_bmoe_cell(name, merged, workload, folder, transport, home))
    for k in ("llama_cpp_bin", "repetitions", "llama"):
        if k in merged:
            fail(merged[k][1], f"applies to llama.cpp cells only (cell `{name}` is {engine})",
                 tip='engine = "llama-bench" or "llama-completion" runs llama.cpp')
    for k in ("bmoe_bin", "bmoe"):
        if k in merged:
            fail(merged[k][1], f"applies to bmoe cells only (cell `{name}` is {engine})",
                 tip='engine = "bmoe" runs the phone-streaming engine\'s bmoe-cli')
    if engine == "external":
        keys = [k for k in merged if k in ENGINE_KEYS]
        if keys:
            fail(merged[keys[0]][1], f"cell `{name}` runs an external command; engine keys "
                 "do not apply to it", tip="an external cell sets only `command`, `output` "
                 "and `timeout_s`; a cell is either external or embedded")
        if "command" not in merged:
            fail(home, "an external cell needs `command = [...]`", at=at_home,
                 tip='command = ["sh", "run.sh"] and output = "stdout-summary"')
        return cell(command=merged["command"][0],
                    output=merged["output"][0] if "output" in merged else "stdout-summary")
    for k in ("command", "output"):
        if k in merged:
            fail(merged[k][1], f"cell `{name}` is both embedded (`engine = \"embedded\"`) "
                 f"and external (`{k}`)", tip="drop `engine = \"embedded\"` to run the "
                 "command, or drop `command`/`output` to run the engine")
    return cell(config=_engine_config(name, merged, workload, folder, home, at_home,
                                      headers, remote=not _on_host(transport)))


def _memory_limit(merged: Layer, workload: WorkloadTable, transport: str) -> float | None:
    """The cell's `memory_limit_mib`, refused where this host cannot set it: on an adb/ssh
    device (the cell runs there), or without a memory cgroup this process may make."""
    if "memory_limit_mib" in merged:
        limit, at = merged["memory_limit_mib"]
    elif workload.memory_limit_mib is not None:
        limit, at = workload.memory_limit_mib, ("workload", "memory_limit_mib")
    else:
        return None
    if not _on_host(transport):
        fail(at, f"limits a cell's memory on this machine, but `{transport}` runs its cells "
             "there", tip="limit memory on the device itself, or run the cell locally")
    why = cgroup.unavailable()
    if why is not None:
        fail(at, f"cannot be set here: {why}",
             tip="docs/cells.md, Memory limits: a memory cgroup (v1, or v2 with the memory "
             "controller), as root or in a delegated cgroup")
    return float(limit)


def _refuse_keys(merged: Layer, foreign: set[str], problem: str, tip: str) -> None:
    """Fail on the first key of a tool cell (in file order) that is not its own: `problem`
    with the key's name for `{}`."""
    for k, (_, at) in merged.items():
        if k in foreign:
            fail(at, problem.format(k), tip=tip)


def _tool_values(merged: Layer, workload: WorkloadTable, folder: Path, transport: str,
                 home: Key, keys: tuple[str, ...]) -> Layer:
    """A tool cell's (llama.cpp, bmoe) `keys`: its own over what `[workload]` gives one
    (model, tokens, prompt, seed), the model checked here on this machine (local or
    simulated) and refused as synthetic on a device."""
    defaults = EngineConfig(model=workload.model)
    values: Layer = {"model": (workload.model, ("workload", "model")),
                     "tokens": (defaults.n_tokens, (*home, "tokens")),
                     "prompt": (defaults.prompt, (*home, "prompt")),
                     "seed": (defaults.seed, (*home, "seed"))}
    values.update({k: (v, ("workload", k)) for k, v in workload.settings.items() if k in keys})
    values.update({k: v for k, v in merged.items() if k in keys})
    model, at = values["model"]
    if _on_host(transport):
        values["model"] = (_model(model, at, folder), at)
    elif model.startswith("synthetic:"):
        fail(at, f"{show(model)} is built on this machine, but the cell runs on `{transport}`",
             tip="give the model's path on the device (`abbench model synth` writes a "
             "synthetic model to copy there)")
    return values


def _tool_error(e: CampaignFileError, values: Layer, table: str, home: Key) -> NoReturn:
    """A tool cell's problem, re-rooted at the key (or its table's option) that set it."""
    k = e.key[0] if e.key else None
    if k == table:
        where = values.get(table, (None, (*home, table)))[1]
        raise error_at((*where, *e.key[1:]), e.problem, e.tip) from None
    raise error_at(values[k][1] if k in values else home, e.problem, e.tip) from None


def _tool_cell(merged: Layer, workload: WorkloadTable, folder: Path, transport: str,
               home: Key, keys: tuple[str, ...], table: str, bin_key: str,
               make: Callable[[Layer, str | None], T]) -> tuple[T, str | None, Key]:
    """A tool cell made by `make` from its `keys` (`_tool_values`) and its binaries' folder,
    a problem re-rooted at the key that set it; (the cell, that folder, where it was set)."""
    values = _tool_values(merged, workload, folder, transport, home, keys)
    bin_dir, bin_at = values.get(bin_key, (None, (*home, bin_key)))
    try:
        return make(values, bin_dir), bin_dir, bin_at
    except CampaignFileError as e:
        _tool_error(e, values, table, home)


def _llama_cell(name: str, tool: str, merged: Layer, workload: WorkloadTable, folder: Path,
                transport: str, home: Key) -> LlamaCell:
    """A llama.cpp cell: its own keys over what `[workload]` gives one (model, tokens,
    prompt, seed); any other engine key in the cell is the embedded engine's, and an error.
    On this machine (local or simulated) the model file and the binary are checked now."""
    _refuse_keys(merged, {k for k in ENGINE_KEYS if k not in LLAMA_KEYS},
                 f"cell `{name}` runs {tool}: `{{}}` is an embedded-engine key",
                 f"llama.cpp's own options go in `[cells.{name}.llama]`, under llama.cpp's "
                 "names (docs/cells.md, llama.cpp cells)")
    cell, bin_dir, bin_at = _tool_cell(
        merged, workload, folder, transport, home, LLAMA_KEYS, "llama", "llama_cpp_bin",
        lambda values, bin_dir: LlamaCell(
            tool=tool, model=values["model"][0], tokens=values["tokens"][0],
            prompt=values["prompt"][0], seed=values["seed"][0],
            repetitions=values.get("repetitions", (5, None))[0], bin_dir=bin_dir,
            options=tuple(values.get("llama", ({},))[0].items())))
    if _on_host(transport) and find_binary(tool, bin_dir, on_host=True) is None:
        where = f"in {bin_dir}" if bin_dir else "on PATH"
        fail(bin_at if bin_dir else home, f"no `{tool}` {where}"
             + (" (nor an older build's `llama-cli`)" if tool == "llama-completion" else ""),
             tip="`llama_cpp_bin` names the folder of llama.cpp's binaries (its build/bin); "
             "`python tests/llamacpp.py` builds the pinned llama.cpp into the cache")
    return cell


def _bmoe_cell(name: str, merged: Layer, workload: WorkloadTable, folder: Path,
               transport: str, home: Key) -> bmoe.BmoeCell:
    """A bmoe-cli cell: its own keys over what `[workload]` gives one (model, tokens,
    prompt), its `bmoe` table checked as bmoe-cli's own `validate()` checks it. On this
    machine the model file and the binary are checked now."""
    _refuse_keys(merged, {k for k in ENGINE_KEYS if k not in BMOE_KEYS}
                 | {"llama", "llama_cpp_bin", "repetitions"},
                 f"cell `{name}` runs bmoe-cli: `{{}}` is not one of its keys",
                 f"bmoe-cli's own options go in `[cells.{name}.bmoe]`, under its long "
                 "flags' names (docs/cells.md, bmoe cells)")
    cell, bin_dir, bin_at = _tool_cell(
        merged, workload, folder, transport, home, BMOE_KEYS, "bmoe", "bmoe_bin",
        lambda values, bin_dir: bmoe.BmoeCell(
            model=values["model"][0], tokens=values["tokens"][0], prompt=values["prompt"][0],
            bin_dir=bin_dir, options=tuple(values.get("bmoe", ({},))[0].items())))
    if _on_host(transport) and bmoe.find_binary(bin_dir, on_host=True) is None:
        fail(bin_at if bin_dir else home, f"no `{bmoe.BINARY}` "
             + (f"in {bin_dir}" if bin_dir else "on PATH"),
             tip="`bmoe_bin` names the folder of bmoe-cli (the project's build folder)")
    return cell


def _on_host(transport: str) -> bool:
    return not transport.startswith(("adb:", "ssh:"))


def _engine_config(name: str, merged: Layer, workload: WorkloadTable, folder: Path,
                   home: Key, at_home: Key, headers: ModelHeaders,
                   remote: bool = False) -> EngineConfig:
    """An embedded cell's configuration: `[workload]` under the cell's own keys, checked by
    the engine's own rules and against what it would reject only in the cell, once it read
    the model (`model_check`: a model it cannot read, a prompt id outside the vocabulary, a
    context or top-k the model does not have); every problem names the key that set the
    value. On a `remote` device a model file is a path there, read only there (a
    synthetic model is checked from its definition, not against this machine's memory)."""
    values: Layer = {"model": (workload.model, ("workload", "model"))}
    values.update({k: (v, ("workload", k)) for k, v in CELL_DEFAULTS.items()})
    values.update({k: (v, ("workload", k)) for k, v in workload.settings.items()})
    values.update({k: v for k, v in merged.items() if k in ENGINE_KEYS})
    model, at = values["model"]
    values["model"] = (_remote_model(model, at) if remote else _model(model, at, folder), at)
    kwargs = {ENGINE_KEYS[k]: v for k, (v, _) in values.items()}
    try:
        config = EngineConfig(**kwargs)
    except ConfigError as e:
        _engine_problem(e, name, values, home, at_home)
    for k, ok, must in (("seed", config.seed >= 0, ">= 0"),
                        ("prompt_tokens", min(config.prompt_tokens or (0,)) >= 0,
                         "token ids >= 0")):
        if not ok:
            where = values[k][1] if k in values else (*home, k)
            fail(where, f"must be {must} (got {show(values[k][0])})")
    # What the engine would reject in the cell, found now.
    if remote and not config.model.startswith("synthetic:"):
        return config
    try:
        facts = headers.facts(config.model)
    except AbbenchError as e:  # an unknown synthetic preset, a file the engine cannot read
        fail(values["model"][1], e.message, e.tip)
    if remote:
        facts = replace(facts, memory=None)
    for key, problem, tip in cell_problems(config, facts):
        where = values[key][1] if key in values else (*home, key)
        fail(where, problem + (f" (resolving cell `{name}`)" if where[:2] != home else ""),
             tip)
    return config


def _engine_problem(e: ConfigError, name: str, values: Layer, home: Key,
                    at_home: Key) -> NoReturn:
    """The engine's complaint about a setting, as a complaint about the key that set it,
    worded with the campaign file's names for the settings it mentions."""
    if e.field is None or e.field not in TOML_KEY:  # a problem of no one key: the cell's
        fail(home, e.message, e.tip, at=at_home)
    key = TOML_KEY[e.field]
    problem = render(e.problem, lambda field: f"`{TOML_KEY.get(field, field)}`")
    if key in values:
        where = values[key][1]
        if where[:2] != home:
            problem += f" (resolving cell `{name}`)"
        fail(where, problem, e.tip)
    fail((*home, key), problem, e.tip, at=at_home)


def _remote_model(value: str, at: Key) -> str:
    """A model of a cell on an adb/ssh device: a synthetic one (built there), or the
    absolute path of a file there (not looked for here)."""
    if value.startswith("synthetic:"):
        return _model(value, at, Path("/"))
    if not value.startswith("/"):
        fail(at, f"{show(value)} is not an absolute path: the model of a cell on an adb/ssh "
             "device is a file on the device", tip="the .gguf file's absolute path on the "
             "device, or `synthetic:PRESET` (built there)")
    return os.path.normpath(value)


def _model(value: str, at: Key, folder: Path) -> str:
    """A synthetic model as written; a file's path made absolute (relative paths start at
    the campaign file's folder) after checking that the file is there."""
    if value.startswith("synthetic:"):
        if not _SYNTHETIC.match(value):
            fail(at, f"{show(value)} is not a synthetic model",
                 tip=f"`synthetic:PRESET` or `synthetic:PRESET@SEED` (presets: {PRESET_NAMES}; "
                 "or a real shape, e.g. qwen3-30b-a3b-4L-Q4_K_M)")
        return value
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # `~user` without a home
        path = Path(value)
    path = path if path.is_absolute() else folder / path
    try:
        found = bool(value) and path.is_file()
    except (OSError, ValueError):
        found = False
    if not found:
        fail(at, f"no model file at {show(str(path))}",
             tip="a .gguf file (relative to the campaign file's folder), or "
             f"`synthetic:PRESET[@SEED]` ({PRESET_NAMES})")
    return os.path.normpath(path)
