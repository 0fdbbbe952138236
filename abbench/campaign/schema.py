"""The `cells.toml` schema: read, validate and resolve a campaign file.

One frozen dataclass per table (`tables`), each checking its values on construction.
`load_campaign` reads the file, checks every table's keys and TOML types against those
dataclasses, resolves `base` inheritance, `[workload]` defaults and `[[sweep]]`s, and has
each cell resolved as its kind (`resolve`: an embedded cell's `EngineConfig` is built there,
so that the engine's own checks run before any cell does); `CampaignSpec` then checks what
spans tables (order, decisions). `resolved_toml` writes the campaign back. Every problem is
one `CampaignFileError` reading `FILE:LINE: `key.path`: what is wrong`, with a tip.
docs/cells.md is the reference for the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

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
from abbench.campaign.cell_spec import CellSpec
from abbench.campaign.llamacpp import TOOLS as LLAMA_TOOLS
from abbench.campaign.model_check import ModelHeaders
from abbench.campaign.resolve import cell_layers, resolve_cell, spelling
from abbench.campaign.stage import StageTable
from abbench.campaign.tables import (
    CELL_HINTS,
    MAX_CELLS,
    NAME_MAX,
    TOML_KEY,
    WORKLOAD_KEYS,
    CampaignTable,
    Decision,
    DeviceTable,
    FleetTable,
    GateTable,
    MatchTable,
    Sweep,
    WorkloadTable,
    check_name,
)
from abbench.errors import CampaignFileError, Key, format_key
from abbench.records.plan import CELLS, SLICES
from abbench.records.schema import did_you_mean, show
from abbench.records.text import clip
from abbench.records.toml import (
    KeyLines,
    TOMLDecodeError,
    dump_table,
    error_position,
    parse,
)

__all__ = [
    "TOML_KEY", "CampaignFileError", "CampaignSpec", "CampaignTable", "CellSpec", "Decision",
    "DeviceTable", "GateTable", "MatchTable", "Sweep", "WorkloadTable", "load_campaign",
    "resolved_toml",
]

TOP_KEYS = ("campaign", "device", "gate", "match", "workload", "cells", "decision", "sweep",
            "fleet", "stage")

# Why a cell of this kind cannot take turns (docs/cells.md, Interleaved slices).
_CANNOT_PAUSE = {
    "external": "an external command, which has no turn protocol",
    **{tool: f"a {tool} cell: llama.cpp's command-line tools cannot pause between tokens (a "
       "llama.cpp server could, between requests: not built)" for tool in LLAMA_TOOLS},
    "bmoe": "a bmoe cell: bmoe-cli decodes one prompt through (its `--session` mode takes "
            "whole prompts, not turns)",
}

_TABLE_KEYS = {
    "campaign": [f.name for f in fields(CampaignTable)],
    "device": [f.name for f in fields(DeviceTable)],
    "gate": [f.name for f in fields(GateTable)],
    "match": [f.name for f in fields(MatchTable)],
    "workload": list(WORKLOAD_KEYS),
    "fleet": [f.name for f in fields(FleetTable)],
    "stage": [f.name for f in fields(StageTable)],
}


def _table_of(key: str) -> str | None:
    """A tip for a key written above every table."""
    home = [table for table, keys in _TABLE_KEYS.items() if key in keys]
    return f"`{key}` belongs in the `[{home[0]}]` table" if home else None


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
    stage: StageTable | None = None  # files the device must hold (adb/ssh devices)

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
                    fail(("campaign", "order", i), f"no cell `{clip(name, 60)}`",
                         tip=did_you_mean(name, self.cells, "cells"))
        elif order == "abba" and len(self.cells) < 2:
            fail(("campaign", "order"), '"abba" needs at least two cells')
        for i, d in enumerate(self.decisions):
            for role in ("candidate", "baseline"):
                name = getattr(d, role)
                if name not in self.cells:
                    fail(("decision", i, role), f"no cell `{clip(name, 60)}`",
                         tip=did_you_mean(name, self.cells, "cells"))
                if isinstance(order, tuple) and name not in order:
                    fail(("decision", i, role),
                         f"cell `{clip(name, 60)}` is not in `campaign.order`",
                         tip="add it to `order`: a decision needs both cells in the plan")
        transport = self.device.transport
        if transport.startswith("adb:"):
            for name, cell in self.cells.items():
                if cell.engine == "embedded":
                    # abbench (Python, numpy, gguf) is not what an Android shell has.
                    fail(("cells", name), f"is an embedded cell: abbench's engine runs on "
                         f"this machine or an ssh: host, not on `{transport}`",
                         tip="on an adb: device a cell runs the engine there: `command = "
                         '[...]` with `output = "bmoe-csv:PATH"` (docs/cells.md, External '
                         "cells)")
        if transport.startswith(("adb:", "ssh:")) and self.campaign.interleave == SLICES:
            fail(("campaign", "interleave"), f'"{SLICES}" runs two engines on this machine '
                 f"taking turns: not on `{transport}`", tip='interleave = "cells" (the '
                 "default) on a remote device")
        warmup = self.campaign.warmup_tokens
        for cell in self.cells.values():
            if cell.config is not None and warmup >= cell.config.n_tokens:
                fail(("campaign", "warmup_tokens"),
                     f"{warmup} leaves no tokens to measure in cell `{cell.name}` "
                     f"(`tokens` = {cell.config.n_tokens})",
                     tip="lower `warmup_tokens`, or raise that cell's `tokens`")
        if self.campaign.interleave == SLICES:
            self._check_pairs()

    def _check_pairs(self) -> None:
        """Interleaved pairs (`interleave = "slices"`): two different embedded cells each,
        decoding as many tokens, so that their slices pair up."""
        order = self.campaign.order
        at: Key = ("campaign", "interleave")
        if isinstance(order, tuple):
            if len(order) % 2:
                fail(("campaign", "order"), f'is read as pairs with interleave = "slices", '
                     f"but names {len(order)} cells", tip='name the cells pair by pair, the '
                     'one taking the first turn first: ["B", "C", "C", "B"]')
            pairs = list(zip(order[::2], order[1::2], strict=True))
            for k, (a, b) in enumerate(pairs):
                if a == b:
                    fail(("campaign", "order", 2 * k + 1), f"pairs `{a}` with itself",
                         tip="an interleaved pair is two different cells taking turns")
        elif len(self.cells) < 2:
            fail(at, '"slices" needs at least two cells: it runs them in pairs')
        else:
            pairs = [(self.baseline, name) for name in self.cells if name != self.baseline]
        for name in dict.fromkeys(n for pair in pairs for n in pair):
            cell = self.cells[name]
            if cell.engine != "embedded":
                fail(at, f'"slices" runs a pair\'s cells as two engine processes that pause '
                     f"between turns, but cell `{name}` is {_CANNOT_PAUSE.get(cell.engine, '')}",
                     tip='interleave embedded cells only, or set interleave = "cells" '
                     "(docs/cells.md, Interleaved slices)")
            if cell.memory_limit_mib is not None:
                fail(at, f'"slices" runs a pair\'s two engines side by side, but cell `{name}` '
                     "runs in a memory cgroup of its own (`memory_limit_mib`): the pair's "
                     "memory is not one cell's", tip='limit memory with interleave = "cells"')
        for i, d in enumerate(self.decisions):
            if d.metric != "tok_per_s":
                fail(("decision", i, "metric"), f'is "{d.metric}", but interleaved cells '
                     "run side by side: a power reading is the pair's, not one cell's",
                     tip='decide energy with interleave = "cells"')
        for a, b in pairs:
            ta, tb = (self.cells[x].config.n_tokens for x in (a, b))  # type: ignore[union-attr]
            if ta != tb:
                fail(at, f"cells `{a}` and `{b}` take turns but decode different `tokens` "
                     f"({ta} and {tb}): their slices would not pair up",
                     tip="give the cells of a pair the same `tokens`")

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


def _spec(path: Path, text: str, doc: dict[str, Any]) -> CampaignSpec:
    check_keys((), doc, TOP_KEYS, _table_of)
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", path.stem).lstrip("._-") or "campaign"
    campaign_raw = as_table(("campaign",), doc.get("campaign", {}))
    given = {} if "name" in campaign_raw else {"name": stem[:NAME_MAX]}
    campaign = build(CampaignTable, campaign_raw, ("campaign",), **given)
    device = build(DeviceTable, doc.get("device", {}), ("device",))
    gate = build(GateTable, doc["gate"], ("gate",)) if "gate" in doc else None
    fleet = build(FleetTable, doc.get("fleet", {}), ("fleet",))
    stage = _stage(doc, device, Path(os.path.abspath(path)).parent)
    match = build(MatchTable, doc.get("match", {}), ("match",))
    workload = _workload(as_table(("workload",), doc.get("workload", {})))
    layers = cell_layers(doc.get("cells"))
    declared = list(layers)
    raw_sweeps = as_array_of_tables(("sweep",), doc.get("sweep", []))
    _check_size(campaign, "repeat" in campaign_raw, declared, raw_sweeps)
    sweeps = [build(Sweep, raw, ("sweep", i)) for i, raw in enumerate(raw_sweeps)]
    for i, sweep in enumerate(sweeps):
        if sweep.cell not in declared:
            fail(("sweep", i, "cell"), f"no cell `{clip(sweep.cell, 60)}`",
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
    cells = {name: resolve_cell(name, layers, workload, folder, generated.get(name),
                                headers, device.transport) for name in layers}
    return CampaignSpec(path=path, source_text=text, campaign=campaign, device=device,
                        gate=gate, match=match, workload=workload, cells=cells,
                        decisions=decisions, sweeps=tuple(sweeps), fleet=fleet, stage=stage)


def _stage(doc: dict[str, Any], device: DeviceTable, folder: Path) -> StageTable | None:
    """`[stage]`, on an adb/ssh device, each file here found now (relative to the
    campaign file's folder, made absolute)."""
    if "stage" not in doc:
        return None
    stage = build(StageTable, doc["stage"], ("stage",))
    if not device.transport.startswith(("adb:", "ssh:")):
        fail(("stage",), f"applies to adb:/ssh: devices (this one is "
             f"{show(device.transport)})", tip="on this machine a cell reads its files "
             "where they are")
    files = {}
    for there, here in stage.files.items():
        path = Path(here).expanduser()
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            fail(("stage", "files", there), f"no file here at {show(str(path))}",
                 tip="the file the device must hold, relative to the campaign file's folder")
        files[there] = os.path.normpath(path)
    return replace(stage, files=files)


def _check_size(campaign: CampaignTable, repeat_given: bool, names: list[str],
                sweeps: list[dict[str, Any]]) -> None:
    """Refuse a file whose cells, or whose sweeps, make more cells than a campaign may run
    before they are read (each cell costs its configuration's checks): with no `order`,
    every cell runs `repeat` times at least. The message names the key the file has that
    makes the number. A `values` that is no array is left to `Sweep` to name."""
    runs = 1 if isinstance(campaign.order, tuple) else campaign.repeat
    declared = len(names)
    if declared * runs > MAX_CELLS:
        if repeat_given and runs > 1:
            fail(("campaign", "repeat"), f"is {runs}: the file's {declared} cells, run {runs} "
                 f"times, are {declared * runs}, more than the {MAX_CELLS} a campaign may run",
                 tip="lower `repeat`, or split the campaign")
        past = names[MAX_CELLS // runs]  # the first cell past the limit: its line
        fail(("cells",), f"the file declares {declared} cells"
             + (f", run {runs} times (`repeat`'s default)" if runs > 1 else "")
             + f": more than the {MAX_CELLS} a campaign may run (`{past}` is past them)",
             tip="split the campaign into files of fewer cells", at=("cells", past))
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
    check_keys(key, raw, WORKLOAD_KEYS, spelling)
    values = {k: coerce((*key, k), v, CELL_HINTS[k]) for k, v in raw.items()}
    own = {k: values.pop(k) for k in ("engine", "model", "timeout_s", "memory_limit_mib")
           if k in values}
    try:
        return WorkloadTable(**own, settings=values)
    except CampaignFileError as e:
        raise under(e, key) from None


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
    if c.interleave == CELLS:  # the default: files before it stay as they were
        del campaign["interleave"]
    lines += [*dump_table(["campaign"], campaign), ""]
    lines += [*dump_table(["device"], asdict(spec.device)), ""]
    if spec.gate is not None:
        lines += [*dump_table(["gate"], asdict(spec.gate)), ""]
    if spec.stage is not None:
        lines += [*dump_table(["stage"], asdict(spec.stage)), ""]
    lines += [*dump_table(["match"], asdict(spec.match)), ""]
    for name, cell in spec.cells.items():
        lines += [*dump_table(["cells", name], cell.to_toml()), ""]
    for d in spec.decisions:
        lines += [*dump_table(["decision"], d.to_json(), array=True), ""]
    return "\n".join(lines)

