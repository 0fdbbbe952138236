"""The `cells.toml` schema: read, validate and resolve a campaign file.

One frozen dataclass per table (`tables`), each checking its values on construction.
`load_campaign` reads the file, checks every table's keys and TOML types against those
dataclasses, resolves `base` inheritance, `[workload]` defaults and `[[sweep]]`s, and builds
an `EngineConfig` for every embedded cell, so that the engine's own checks run before any
cell does; `CampaignSpec` then checks what spans tables (order, decisions). Every problem is
one `CampaignFileError` reading `FILE:LINE: `key.path`: what is wrong`, with a tip.
docs/cells.md is the reference for the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NoReturn

from abbench.campaign._check import (
    as_array_of_tables,
    as_table,
    build,
    check_keys,
    coerce,
    error_at,
    fail,
    under,
)
from abbench.campaign.llamacpp import TOOLS as LLAMA_TOOLS
from abbench.campaign.llamacpp import LlamaCell, find_binary
from abbench.campaign.model_check import ModelHeaders, cell_problems
from abbench.campaign.tables import (
    CELL_DEFAULTS,
    CELL_HINTS,
    ENGINE_KEYS,
    ENGINES,
    ENGINES_TEXT,
    LLAMA_KEYS,
    MAX_CELLS,
    NAME_MAX,
    TOML_KEY,
    WORKLOAD_KEYS,
    CampaignTable,
    CellSpec,
    Decision,
    DeviceTable,
    FleetTable,
    GateTable,
    MatchTable,
    Sweep,
    WorkloadTable,
    check_name,
)
from abbench.engine.config import EngineConfig
from abbench.errors import (
    AbbenchError,
    CampaignFileError,
    ConfigError,
    Key,
    format_key,
    render,
)
from abbench.records.schema import describe, did_you_mean, show
from abbench.records.toml import (
    KeyLines,
    TOMLDecodeError,
    dump_table,
    error_position,
    parse,
)

__all__ = [
    "CampaignFileError", "CampaignSpec", "CampaignTable", "CellSpec", "Decision", "DeviceTable",
    "GateTable", "MatchTable", "Sweep", "WorkloadTable", "load_campaign", "resolved_toml",
]

TOP_KEYS = ("campaign", "device", "gate", "match", "workload", "cells", "decision", "sweep",
            "fleet")
_SYNTHETIC = re.compile(r"synthetic:[A-Za-z0-9_-]+(@[0-9]+)?\Z")

_TABLE_KEYS = {
    "campaign": [f.name for f in fields(CampaignTable)],
    "device": [f.name for f in fields(DeviceTable)],
    "gate": [f.name for f in fields(GateTable)],
    "match": [f.name for f in fields(MatchTable)],
    "workload": list(WORKLOAD_KEYS),
    "fleet": [f.name for f in fields(FleetTable)],
}


def _table_of(key: str) -> str | None:
    """A tip for a key written above every table."""
    home = [table for table, keys in _TABLE_KEYS.items() if key in keys]
    return f"`{key}` belongs in the `[{home[0]}]` table" if home else None


def _spelling(key: str) -> str | None:
    """A tip for an engine field written under its flag's name (`n_tokens`)."""
    return f"the campaign file spells it `{TOML_KEY[key]}`" if key in TOML_KEY else None


@dataclass(frozen=True)
class CampaignSpec:
    """A campaign file, validated and resolved. Checks that span tables run here."""

    path: Path
    source_text: str
    campaign: CampaignTable
    device: DeviceTable = field(default_factory=DeviceTable)
    gate: GateTable | None = None
    match: MatchTable = field(default_factory=MatchTable)
    workload: WorkloadTable = field(default_factory=WorkloadTable)
    cells: dict[str, CellSpec] = field(default_factory=dict)  # file order, then sweeps
    decisions: tuple[Decision, ...] = ()
    sweeps: tuple[Sweep, ...] = ()
    fleet: FleetTable = field(default_factory=FleetTable)  # for `abbench fleet` only

    def on(self, transport: str) -> CampaignSpec:
        """The same campaign on another device (`[device] transport`): a calibration's
        `--device`, each device of a fleet."""
        return replace(self, device=replace(self.device, transport=transport))

    def __post_init__(self) -> None:
        if not self.cells:
            fail(("cells",), "no cells", tip="a campaign needs at least one `[cells.NAME]`")
        for name, cell in self.cells.items():
            if cell.name != name:
                fail(("cells", name), f"holds the cell `{cell.name}`")
        order = self.campaign.order
        if isinstance(order, tuple):
            for i, name in enumerate(order):
                if name not in self.cells:
                    fail(("campaign", "order", i), f"no cell `{name}`",
                         tip=did_you_mean(name, self.cells, "cells"))
        elif order == "abba" and len(self.cells) < 2:
            fail(("campaign", "order"), '"abba" needs at least two cells')
        for i, d in enumerate(self.decisions):
            for role in ("candidate", "baseline"):
                name = getattr(d, role)
                if name not in self.cells:
                    fail(("decision", i, role), f"no cell `{name}`",
                         tip=did_you_mean(name, self.cells, "cells"))
                if isinstance(order, tuple) and name not in order:
                    fail(("decision", i, role), f"cell `{name}` is not in `campaign.order`",
                         tip="add it to `order`: a decision needs both cells in the plan")
        transport = self.device.transport
        if transport.startswith(("adb:", "ssh:")):
            for name, cell in self.cells.items():
                if cell.engine == "embedded":
                    # The embedded engine runs on this machine: its cell would be timed
                    # here while the sampler reads the other device's caps and temperatures.
                    fail(("cells", name), f"is an embedded cell, which runs on this machine, "
                         f"not on `{transport}`", tip="on an adb:/ssh: device a cell runs "
                         'the engine there: `command = [...]` with `output = "bmoe-csv:PATH"` '
                         "(docs/cells.md, External cells)")
        warmup = self.campaign.warmup_tokens
        for cell in self.cells.values():
            if cell.config is not None and warmup >= cell.config.n_tokens:
                fail(("campaign", "warmup_tokens"),
                     f"{warmup} leaves no tokens to measure in cell `{cell.name}` "
                     f"(`tokens` = {cell.config.n_tokens})",
                     tip="lower `warmup_tokens`, or raise that cell's `tokens`")

    def error(self, key: Key, problem: str, tip: str | None = None) -> CampaignFileError:
        """A problem with this campaign's file, located as `load_campaign` locates them."""
        return _locate(error_at(key, problem, tip), self.path, self.source_text)

    @property
    def baseline(self) -> str:
        """The first decision's baseline, else the first cell: what `abba` and
        `sentinel_every` put between the others."""
        return self.decisions[0].baseline if self.decisions else next(iter(self.cells))


# -- loading -------------------------------------------------------------------------


def load_campaign(path: Path) -> CampaignSpec:
    """Read, validate and resolve a campaign file. Raises `CampaignFileError`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CampaignFileError(f"{path}: cannot read the campaign file: {e.strerror or e}",
                                located=True) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise CampaignFileError(f"{path}:{line}: not UTF-8 text (byte {e.start})",
                                tip="TOML files are UTF-8", located=True) from None
    try:
        document = parse(text)
    except TOMLDecodeError as e:
        msg, line, col = error_position(e, text)
        where = f"{path}:{line}:{col}" if line is not None else f"{path}"
        tip = "docs/cells.md has a complete example"
        if msg.startswith("Invalid value"):
            tip = 'strings need quotes (`dense = "pinned"`); ' + tip
        raise CampaignFileError(f"{where}: invalid TOML: {msg}", tip, located=True) from None
    except RecursionError:
        raise CampaignFileError(f"{path}: invalid TOML: nested too deeply",
                                located=True) from None
    try:
        return _spec(path, text, document)
    except CampaignFileError as e:
        if e.located:
            raise
        raise _locate(e, path, text) from None


def _locate(e: CampaignFileError, path: Path, text: str) -> CampaignFileError:
    """The problem with the file's name and, where the key can be found, its line."""
    line = KeyLines(text).line(e.at)
    where = f"{path}:{line}" if line is not None else f"{path}"
    problem = f"`{format_key(e.key)}`: {e.problem}" if e.key else e.problem
    return CampaignFileError(f"{where}: {problem}", e.tip, key=e.key, problem=e.problem,
                             at=e.at, located=True)


Layer = dict[str, tuple[Any, Key]]  # a cell's keys: TOML key -> (value, where it is written)


def _spec(path: Path, text: str, doc: dict[str, Any]) -> CampaignSpec:
    check_keys((), doc, TOP_KEYS, _table_of)
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", path.stem).lstrip("._-") or "campaign"
    campaign_raw = as_table(("campaign",), doc.get("campaign", {}))
    given = {} if "name" in campaign_raw else {"name": stem[:NAME_MAX]}
    campaign = build(CampaignTable, campaign_raw, ("campaign",), **given)
    device = build(DeviceTable, doc.get("device", {}), ("device",))
    gate = build(GateTable, doc["gate"], ("gate",)) if "gate" in doc else None
    fleet = build(FleetTable, doc.get("fleet", {}), ("fleet",))
    match = build(MatchTable, doc.get("match", {}), ("match",))
    workload = _workload(as_table(("workload",), doc.get("workload", {})))
    layers = _cell_layers(doc.get("cells"))
    declared = list(layers)
    raw_sweeps = as_array_of_tables(("sweep",), doc.get("sweep", []))
    _check_size(campaign, len(declared), raw_sweeps)
    sweeps = [build(Sweep, raw, ("sweep", i)) for i, raw in enumerate(raw_sweeps)]
    for i, sweep in enumerate(sweeps):
        if sweep.cell not in declared:
            fail(("sweep", i, "cell"), f"no cell `{sweep.cell}`",
                 tip=did_you_mean(sweep.cell, declared, "cells"))
        for j, value in enumerate(sweep.values):
            at: Key = ("sweep", i, "values", j)
            name = sweep.cell_name(value)
            if name in layers:
                fail(at, f"generates the cell `{name}`, which exists already")
            check_name(at, name, "generated cell name")
            layers[name] = {"base": (sweep.cell, ("sweep", i, "cell")),
                            sweep.key: (coerce(at, value, CELL_HINTS[sweep.key]), at)}
    decisions = tuple(build(Decision, raw, ("decision", i)) for i, raw in
                      enumerate(as_array_of_tables(("decision",), doc.get("decision", []))))
    folder = Path(os.path.abspath(path)).parent
    generated = {name: i for i, s in enumerate(sweeps) for name in map(s.cell_name, s.values)}
    headers = ModelHeaders()  # each model's header read once, whatever the cells using it
    cells = {name: _resolve(name, layers, workload, folder, generated.get(name),
                            headers, device.transport) for name in layers}
    return CampaignSpec(path=path, source_text=text, campaign=campaign, device=device,
                        gate=gate, match=match, workload=workload, cells=cells,
                        decisions=decisions, sweeps=tuple(sweeps), fleet=fleet)


def _check_size(campaign: CampaignTable, declared: int, sweeps: list[dict[str, Any]]) -> None:
    """Refuse sweeps that make more cells than a campaign may run before their values are
    read (each cell costs its configuration's checks): with no `order`, every cell runs
    `repeat` times at least. A `values` that is no array is left to `Sweep` to name."""
    runs = 1 if isinstance(campaign.order, tuple) else campaign.repeat
    cells = declared
    for i, raw in enumerate(sweeps):
        values = raw.get("values")
        cells += len(values) if isinstance(values, list) else 0
        if cells * runs > MAX_CELLS:
            times = f", run {runs} times (`repeat`)" if runs > 1 else ""
            fail(("sweep", i, "values"), f"{len(values or ())} values make the campaign "
                 f"{cells} cells{times}: more than the {MAX_CELLS} a campaign may run",
                 tip="sweep fewer values, or split the campaign")


def _workload(raw: dict[str, Any]) -> WorkloadTable:
    key: Key = ("workload",)
    check_keys(key, raw, WORKLOAD_KEYS, _spelling)
    values = {k: coerce((*key, k), v, CELL_HINTS[k]) for k, v in raw.items()}
    own = {k: values.pop(k) for k in ("engine", "model", "timeout_s") if k in values}
    try:
        return WorkloadTable(**own, settings=values)
    except CampaignFileError as e:
        raise under(e, key) from None


def _cell_layers(raw: Any) -> dict[str, Layer]:
    if raw is None or raw == {}:
        fail(("cells",), "no cells", tip="a campaign needs at least one `[cells.NAME]` table")
    layers: dict[str, Layer] = {}
    for name, body in as_table(("cells",), raw).items():
        key: Key = ("cells", name)
        check_name(key, name)
        if not isinstance(body, dict):
            fail(key, f"expected a table, got {describe(body)}",
                 tip=f"a cell is a table: `[cells.{name}]`")
        check_keys(key, body, list(CELL_HINTS), _spelling)
        layers[name] = {k: (coerce((*key, k), v, CELL_HINTS[k]), (*key, k))
                        for k, v in body.items()}
    return layers


def _chain(name: str, layers: dict[str, Layer]) -> list[str]:
    """The cell and its bases, nearest first."""
    chain = [name]
    while "base" in layers[chain[-1]]:
        base, at = layers[chain[-1]]["base"]
        if base not in layers:
            fail(at, f"no cell `{base}`", tip=did_you_mean(base, layers, "cells"))
        if base in chain:
            cycle = " → ".join([*chain[chain.index(base):], base])
            fail(at, f"`base` cycle: {cycle}", tip="a cell cannot inherit from itself, "
                 "directly or through other cells")
        chain.append(base)
    return chain


def _resolve(name: str, layers: dict[str, Layer], workload: WorkloadTable, folder: Path,
             sweep: int | None, headers: ModelHeaders, transport: str = "local") -> CellSpec:
    home: Key = ("cells", name)
    at_home = ("sweep", sweep) if sweep is not None else home
    merged: Layer = {}
    for n in reversed(_chain(name, layers)):
        own = {k: v for k, v in layers[n].items() if k != "base"}
        if "llama" in own and "llama" in merged:  # options inherit one by one
            own["llama"] = ({**merged["llama"][0], **own["llama"][0]}, own["llama"][1])
        merged.update(own)
    base = layers[name]["base"][0] if "base" in layers[name] else None
    timeout = merged["timeout_s"][0] if "timeout_s" in merged else workload.timeout_s
    if "engine" in merged:
        engine, at = merged["engine"]
        if engine not in ENGINES:
            fail(at, f"must be one of {ENGINES_TEXT} (got {show(engine)})",
                 tip=did_you_mean(engine, ENGINES, "engines"))
    else:
        engine = "external" if "command" in merged or "output" in merged else workload.engine

    def cell(**kw: Any) -> CellSpec:
        try:
            return CellSpec(name=name, engine=engine, timeout_s=timeout, base=base,
                            sweep=sweep, **kw)
        except CampaignFileError as e:
            where = merged[e.key[0]][1] if e.key and e.key[0] in merged else None
            raise error_at(where, e.problem, e.tip) if where else under(e, home) from None

    if engine in LLAMA_TOOLS:
        return cell(llama=_llama_cell(name, engine, merged, workload, folder, transport, home))
    for k in ("llama_cpp_bin", "repetitions", "llama"):
        if k in merged:
            fail(merged[k][1], f"applies to llama.cpp cells only (cell `{name}` is {engine})",
                 tip='engine = "llama-bench" or "llama-completion" runs llama.cpp')
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
                                      headers))


def _llama_cell(name: str, tool: str, merged: Layer, workload: WorkloadTable, folder: Path,
                transport: str, home: Key) -> LlamaCell:
    """A llama.cpp cell: its own keys over what `[workload]` gives one (model, tokens,
    prompt, seed); any other engine key in the cell is the embedded engine's, and an error.
    On this machine (local or simulated) the model file and the binary are checked now."""
    for k, (_, at) in merged.items():
        if k in ENGINE_KEYS and k not in LLAMA_KEYS:
            fail(at, f"cell `{name}` runs {tool}: `{k}` is an embedded-engine key",
                 tip=f"llama.cpp's own options go in `[cells.{name}.llama]`, under "
                 "llama.cpp's names (docs/cells.md, llama.cpp cells)")
    defaults = EngineConfig(model=workload.model)
    values: Layer = {"model": (workload.model, ("workload", "model")),
                     "tokens": (defaults.n_tokens, (*home, "tokens")),
                     "prompt": (defaults.prompt, (*home, "prompt")),
                     "seed": (defaults.seed, (*home, "seed"))}
    values.update({k: (v, ("workload", k)) for k, v in workload.settings.items()
                   if k in LLAMA_KEYS})
    values.update({k: v for k, v in merged.items() if k in LLAMA_KEYS})
    on_host = not transport.startswith(("adb:", "ssh:"))
    model, at = values["model"]
    if on_host:
        model = _model(model, at, folder)
    elif model.startswith("synthetic:"):
        fail(at, f"{show(model)} is built on this machine, but the cell runs on `{transport}`",
             tip="give the model's path on the device (`abbench model synth` writes a "
             "synthetic model to copy there)")
    table, table_at = values.get("llama", ({}, (*home, "llama")))
    bin_dir, bin_at = values.get("llama_cpp_bin", (None, (*home, "llama_cpp_bin")))
    try:
        cell = LlamaCell(tool=tool, model=model, tokens=values["tokens"][0],
                         prompt=values["prompt"][0], seed=values["seed"][0],
                         repetitions=values.get("repetitions", (5, None))[0],
                         bin_dir=bin_dir, options=tuple(table.items()))
    except CampaignFileError as e:
        k = e.key[0] if e.key else None
        where = table_at if k == "llama" else values[k][1] if k in values else home
        raise error_at((*where, *e.key[1:]) if k == "llama" else where, e.problem,
                       e.tip) from None
    if on_host and find_binary(tool, bin_dir, on_host=True) is None:
        where = f"in {bin_dir}" if bin_dir else "on PATH"
        fail(bin_at if bin_dir else home, f"no `{tool}` {where}"
             + (" (nor an older build's `llama-cli`)" if tool == "llama-completion" else ""),
             tip="`llama_cpp_bin` names the folder of llama.cpp's binaries (its build/bin); "
             "`python tests/llamacpp.py` builds the pinned llama.cpp into the cache")
    return cell


def _engine_config(name: str, merged: Layer, workload: WorkloadTable, folder: Path,
                   home: Key, at_home: Key, headers: ModelHeaders) -> EngineConfig:
    """An embedded cell's configuration: `[workload]` under the cell's own keys, checked by
    the engine's own rules and against what it would reject only in the cell, once it read
    the model (`model_check`: a model it cannot read, a prompt id outside the vocabulary, a
    context or top-k the model does not have); every problem names the key that set the
    value."""
    values: Layer = {"model": (workload.model, ("workload", "model"))}
    values.update({k: (v, ("workload", k)) for k, v in CELL_DEFAULTS.items()})
    values.update({k: (v, ("workload", k)) for k, v in workload.settings.items()})
    values.update({k: v for k, v in merged.items() if k in ENGINE_KEYS})
    model, at = values["model"]
    values["model"] = (_model(model, at, folder), at)
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
    try:
        facts = headers.facts(config.model)
    except AbbenchError as e:  # an unknown synthetic preset, a file the engine cannot read
        fail(values["model"][1], e.message, e.tip)
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


def _model(value: str, at: Key, folder: Path) -> str:
    """A synthetic model as written; a file's path made absolute (relative paths start at
    the campaign file's folder) after checking that the file is there."""
    if value.startswith("synthetic:"):
        if not _SYNTHETIC.match(value):
            fail(at, f"{show(value)} is not a synthetic model",
                 tip="`synthetic:PRESET` or `synthetic:PRESET@SEED` (presets: tiny, small, "
                 "default; or a real shape, e.g. qwen3-30b-a3b-4L-Q4_K_M)")
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
             "`synthetic:tiny|small|default[@SEED]`")
    return os.path.normpath(path)


# -- writing -------------------------------------------------------------------------


def resolved_toml(spec: CampaignSpec) -> str:
    """The campaign as resolved, every cell with its full configuration: `campaign.toml` in
    a run folder. `load_campaign` reads it back to the same cells, plan and decisions."""
    c = spec.campaign
    lines = [f"# {c.name}, as resolved from {show(str(spec.path))}: every cell's full",
             "# configuration (`base`, `[workload]` and `[[sweep]]` applied).", ""]
    campaign = asdict(c)
    if isinstance(c.order, tuple):
        campaign["order"] = list(c.order)
    lines += [*dump_table(["campaign"], campaign), ""]
    lines += [*dump_table(["device"], asdict(spec.device)), ""]
    if spec.gate is not None:
        lines += [*dump_table(["gate"], asdict(spec.gate)), ""]
    lines += [*dump_table(["match"], asdict(spec.match)), ""]
    for name, cell in spec.cells.items():
        lines += [*dump_table(["cells", name], cell.to_toml()), ""]
    for d in spec.decisions:
        lines += [*dump_table(["decision"], d.to_json(), array=True), ""]
    return "\n".join(lines)
