"""The run folder's schema: what `campaign` (and importers) write and `analysis` reads.

A run folder is the single source of truth; every report is re-rendered from it.

```
RUN/
  campaign.toml          the campaign file as resolved (every cell's full configuration)
  plan.json              Plan: the cells in execution order
  journal.jsonl          one CellRecord per finished cell (appended, flushed, fsync'd)
  samples.jsonl          one Sample per sampler tick
  noise-floor.json       NoiseFloor: the device history's cell-to-cell noise when the run began
  cells/NN-NAME/         tokens.csv, summary.json (the engine's --json), stderr.txt
  report.md|json|html    rendered by `abbench report RUN`
```

Everything here is a frozen dataclass with `to_json()` / `from_json()`; unknown keys in a
file are ignored on read (newer writers), missing optional keys take their defaults, and
every other key is checked against its annotation: a value of the wrong type, a number
that is not finite or beyond `LIMIT`, or a label that is not a folder name is a
`RecordError` naming the file, the line and the key.
"""

from __future__ import annotations

import json
import math
import re
import types
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from abbench.errors import RecordError
from abbench.fsutil import append_line

FORMAT = "abbench-run v1"
EXPECT = ("faster", "not-slower")  # a decision's question (`[[decision]] expect`)

T = TypeVar("T")




# -- reading: every field checked against its annotation ---------------------------------


# No number a run folder records comes near this (Unix times ~2e9, bytes per token ~1e10);
# beyond it sums, spans and plot ranges overflow to infinity.
LIMIT = 1e18


def _number(value: Any) -> bool:
    """A finite JSON number within LIMIT (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LIMIT  # False for NaN; never converts a huge int to a float


class _BadField(ValueError):
    """A record field of the wrong type or shape; `key` names it (`entry.cpu_temp_c`)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"`{key}` {problem}" if key else problem)


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"a {len(str(abs(value)))}-digit number" if abs(value) < 10**4000 else \
            "a number of thousands of digits"
    try:
        text = json.dumps(value, allow_nan=True, default=str)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _typed(value: Any, hint: Any, key: str) -> Any:
    """`value` as the annotation `hint` asks (lists become tuples, whole numbers become
    floats where a float is asked); anything else raises `_BadField` naming `key`."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _typed(value, inner[0], key)
    if hint is bool:
        if not isinstance(value, bool):
            raise _BadField(key, f"is {_shown(value)}, expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _BadField(key, f"is {_shown(value)}, expected a whole number")
        if not _number(value):
            raise _BadField(key, f"is {_shown(value)}, out of range (at most {LIMIT:g})")
        return value
    if hint is float:
        if not _number(value):
            raise _BadField(key, f"is {_shown(value)}, expected a finite number "
                            f"(at most {LIMIT:g})")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _BadField(key, f"is {_shown(value)}, expected a string")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise _BadField(key, f"is {_shown(value)}, expected an object")
        return {k: _typed(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list):
            raise _BadField(key, f"is {_shown(value)}, expected a list")
        return tuple(_typed(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if is_dataclass(hint):
        return _from_dict(hint, value, key)  # type: ignore[arg-type]
    raise TypeError(f"records: no reader for the annotation {hint!r}")  # a bug here


def _from_dict(cls: type[T], d: Any, key: str = "") -> T:
    """A record from a JSON object: known keys checked against their annotations, unknown
    keys ignored (newer writers), missing keys with a default take it."""
    if not isinstance(d, dict):
        raise _BadField(key, f"is {_shown(d)}, expected an object")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        at = f"{key}.{f.name}" if key else f.name
        if f.name in d:
            values[f.name] = _typed(d[f.name], hints[f.name], at)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise _BadField(at, "is missing")
    return cls(**values)


@dataclass(frozen=True)
class EntryState:
    """The device's state when a cell starts. None = not measured on this device."""

    t_wall: float
    caps_khz: dict[str, int] = field(default_factory=dict)  # per cpufreq policy: the cap
    hw_max_khz: dict[str, int] = field(default_factory=dict)  # per policy: hardware max
    cpu_temp_c: float | None = None
    battery_temp_c: float | None = None
    mem_available_mib: float | None = None
    probe_index: float | None = None  # speed probe relative to the campaign's first
    thermal_status: int | None = None  # Android thermal status (0 none .. 6 shutdown)
    simulated: bool = False

    def capped(self) -> list[str]:
        """Policies whose cap is below their hardware maximum."""
        return [p for p, cap in self.caps_khz.items()
                if p in self.hw_max_khz and cap < self.hw_max_khz[p]]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EntryState:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class GateWait:
    """What the thermal gate did before a cell."""

    waited_s: float = 0.0
    polls: int = 0
    reasons: tuple[str, ...] = ()  # why it waited (first poll), e.g. "cpu 47.1 C > 45.0 C"
    gave_up: bool = False  # the timeout fired: the cell ran anyway

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reasons": list(self.reasons)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GateWait:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class PlannedCell:
    index: int  # 0-based execution order
    name: str  # the cell name in cells.toml (sentinels repeat a name)
    config: dict[str, Any]  # resolved configuration: engine flags or external command
    sentinel_of: int | None = None  # index of the earlier cell this one repeats
    label: str = ""  # NN-NAME, the cell's folder name

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlannedCell:
        return _from_dict(cls, d)


def config_key(config: dict[str, Any]) -> str:
    """A configuration's identity: its resolved keys as canonical JSON, without the ones
    that do not change the work (`timeout_s`). Cells with equal keys are one arm."""
    return json.dumps({k: v for k, v in sorted(config.items()) if k != "timeout_s"},
                      sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Sequential:
    """`[campaign] until = "decided"`: rounds appended until every decision is decided or
    the budget (cells, wall minutes; either may be absent) is spent."""

    until: str = "decided"
    max_cells: int | None = None
    max_minutes: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Look:
    """One look of a sequential campaign: the decisions are read on the first `cells`
    cells at a two-sided level of 1 - `alpha` (the alpha spent at this look)."""

    cells: int
    fraction: float  # of the budget spent at this look (cells or minutes, whichever is more)
    alpha: float
    final: bool = False  # no further round fits the budget: the rest of the alpha is spent

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    campaign: str
    cells: tuple[PlannedCell, ...]
    spacing_s: float
    warmup_tokens: int
    device: str  # transport, e.g. "local", "adb:SERIAL", "sim:phone"
    decisions: tuple[dict[str, Any], ...] = ()
    match: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] | None = None
    format: str = FORMAT
    sequential: Sequential | None = None
    looks: tuple[Look, ...] = ()  # taken so far (sequential campaigns)
    planned_cells: int | None = None  # cells before any appended round (None: all of them)
    # False for imported runs whose execution order nothing recorded: no two cells are
    # adjacent, so none is compared (DESIGN 6.3)
    order_known: bool = True

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cells"] = [c.to_json() for c in self.cells]
        d["decisions"] = list(self.decisions)
        d["looks"] = [x.to_json() for x in self.looks]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class CellRecord:
    """One finished cell, as the journal holds it."""

    index: int
    name: str
    label: str
    status: str  # "ok" | "failed" | "timeout"
    t_start_wall: float
    t_end_wall: float
    t_start_mono: float
    t_end_mono: float
    entry: EntryState
    gate: GateWait = field(default_factory=GateWait)
    summary: dict[str, Any] = field(default_factory=dict)  # the engine's JSON summary
    fingerprint: str | None = None
    tokens_per_s: float | None = None
    exit_code: int | None = None
    error: str | None = None  # one line: why the cell failed
    stderr_tail: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["entry"] = self.entry.to_json()
        d["gate"] = self.gate.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CellRecord:
        if isinstance(d, dict):  # older journals: no entry state or gate recorded
            d = {**d, "entry": d.get("entry") or {"t_wall": 0.0}, "gate": d.get("gate") or {}}
        return _from_dict(cls, d)


@dataclass(frozen=True)
class Sample:
    """One sampler tick: timestamps and whatever readers answered (flat keys)."""

    t_mono: float
    t_wall: float
    values: dict[str, Any]
    cell: int | None = None  # the cell running at this tick, None between cells

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class NoiseFloor:
    """A device's cell-to-cell noise as its history gave it when a campaign began
    (`noise-floor.json`): the pooled variance of repeats' log tokens/s with its degrees of
    freedom, the mean token-level part, and what it was pooled from. `df` 0: no history."""

    variance: float = 0.0
    df: int = 0
    token_variance: float = 0.0
    repeats: int = 0  # cells behind it
    campaigns: tuple[str, ...] = ()  # run folder names, newest first
    history: str = ""  # the history file read (and the one the run's repeats go to)
    t_wall: float = 0.0
    device: str = ""
    simulated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "campaigns": list(self.campaigns)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NoiseFloor:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class RepeatRecord:
    """One repeat a campaign made, as the device history (`sentinels/DEVICE.jsonl`, lines
    with `kind` "repeat") keeps it: two cells of one configuration, the later one's log
    tokens/s minus the earlier one's, and whether they may count as cell-to-cell noise.

    Comparable repeats with equal work form groups (`group`, per run); consecutive members
    of a group are one record each, so a group's cells can be rebuilt from its records."""

    device: str
    run: str  # the run folder's name
    campaign: str
    t_wall: float  # the later cell's start
    config_key: str
    name: str  # the later cell's name
    first: str  # cell labels
    second: str
    log_ratio: float  # log(second tok/s) - log(first tok/s)
    token_variance_first: float  # moving-block variance of each cell's log tok/s (0: none)
    token_variance_second: float
    fingerprints_equal: bool
    matched: bool  # adjacent and thermally matched
    comparable: bool  # every device criterion held (adjacency and gap aside)
    group: int | None = None  # the repeat group within the run (None: not counted)
    simulated: bool = False
    kind: str = "repeat"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RepeatRecord:
        return _from_dict(cls, d)


def history_file(folder: Path, device: str) -> Path:
    """The device history file for a device name (what a folder name cannot hold → `_`)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", device) or "device"
    return folder / f"{name}.jsonl"


def read_repeats(path: Path) -> list[RepeatRecord]:
    """The repeat records of a device history; other lines (sentinel speeds) are skipped,
    and so is a repeat line that does not parse (a history is appended to by many
    campaigns and versions: one bad line must not hide the rest)."""
    out = []
    for _, d in _jsonl(path):
        if d.get("kind") != "repeat":
            continue
        try:
            out.append(RepeatRecord.from_json(d))
        except _BadField:
            continue
    return out


def append_repeats(path: Path, records: list[RepeatRecord]) -> int:
    """Append the repeats the history lacks (keyed by run and cell pair, so a resumed or
    re-reported campaign adds none twice); returns how many were appended."""
    have = {(r.run, r.first, r.second) for r in read_repeats(path)}
    new = [r for r in records if (r.run, r.first, r.second) not in have]
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
    for r in new:
        append_jsonl(path, r.to_json())
    return len(new)


NOISE_FLOOR_FILE = "noise-floor.json"
IMPORT_FILE = "import.json"
IMPORT_FORMAT = "abbench-import-provenance v1"
FACT_KINDS = ("measured", "derived", "unknown")


@dataclass(frozen=True)
class Fact:
    """Where an imported fact came from: `measured` (`source` names the file and line),
    `derived` (`source` says how), or `unknown` (`source` says why)."""

    kind: str
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ImportedCell:
    """One imported run: its files, the configuration its files give (the keys that name
    its arm), and the provenance of each fact the journal holds for it."""

    label: str
    files: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)  # "t_start", "config.model", ...

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "files": list(self.files), "config": self.config,
                "facts": {k: f.to_json() for k, f in self.facts.items()}}


@dataclass(frozen=True)
class ImportInfo:
    """`import.json`: what an import read, from where, and what it could not."""

    source: str  # the folder imported
    order: Fact
    notes: tuple[str, ...] = ()  # files skipped or read in part, in the order found
    cells: tuple[ImportedCell, ...] = ()
    format: str = IMPORT_FORMAT

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "source": self.source, "order": self.order.to_json(),
                "notes": list(self.notes), "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImportInfo:
        return _from_dict(cls, d)


def read_import_info(run: Path) -> ImportInfo | None:
    """A run's import provenance; None for a campaign's run folder."""
    return _read_record(run / IMPORT_FILE, ImportInfo, "import provenance")


def read_noise_floor(run: Path) -> NoiseFloor | None:
    """The run's snapshot of its device's noise floor; None when there is none (runs from
    before it existed, imports). A snapshot that does not parse is an error."""
    return _read_record(run / NOISE_FLOOR_FILE, NoiseFloor, "noise floor")


def _read_record(path: Path, cls: type[T], what: str) -> T | None:
    """One JSON record file of a run folder: None when absent, a RecordError naming the
    file when it does not parse."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RecordError(f"{path}: malformed {what} ({str(e)[:200]})") from None
    try:
        return _from_dict(cls, doc)
    except _BadField as e:
        raise RecordError(f"{path}: malformed {what}: {e}") from None


# -- files ---------------------------------------------------------------------------


def append_jsonl(path: Path, obj: dict[str, Any], fsync: bool = True) -> None:
    """Append one JSON line, written whole or not at all (`fsutil.append_line`: one locked
    write, a torn tail cut first, undone on failure) and by default fsync'd."""
    append_line(path, json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n", fsync)


def _jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every complete line of a JSON-lines file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RecordError(f"{path}: cannot read ({e.strerror or e})") from None
    out = []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: torn by a crash
                continue
            raise RecordError(f"{path}:{n}: not a JSON line ({e.msg})") from None
        except ValueError:  # a number of thousands of digits
            raise RecordError(f"{path}:{n}: not a JSON line (a number too long)") from None
        except RecursionError:
            raise RecordError(f"{path}:{n}: not a JSON line (nested too deeply)") from None
        if not isinstance(obj, dict):
            raise RecordError(f"{path}:{n}: expected a JSON object")
        out.append((n, obj))
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file; a torn last line (a crash mid-write) is
    ignored, any other bad line is an error naming the file and line."""
    return [obj for _, obj in _jsonl(path)]


# A cell's folder name: at most one path component, so that `cells/LABEL` stays inside
# the run folder.
_LABEL = re.compile(r"[^/\\\x00]*")


def _label(label: str, key: str) -> None:
    if not _LABEL.fullmatch(label) or label in (".", ".."):
        raise _BadField(key, f"is {_shown(label)}, not a folder name (cells/NN-NAME)")


def read_journal(run: Path) -> list[CellRecord]:
    path = run / "journal.jsonl"
    out = []
    for n, d in _jsonl(path):
        try:
            record = CellRecord.from_json(d)
            _label(record.label, "label")
        except _BadField as e:
            raise RecordError(f"{path}:{n}: malformed cell record: {e}") from None
        out.append(record)
    return out


def read_plan(run: Path) -> Plan:
    path = run / "plan.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{run}: not a run folder (no plan.json)") from None
    except OSError as e:
        raise RecordError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:  # not JSON, not UTF-8, a huge number
        raise RecordError(f"{path}: malformed plan ({str(e)[:200]})") from None
    except RecursionError:
        raise RecordError(f"{path}: malformed plan (nested too deeply)") from None
    try:
        plan = Plan.from_json(doc)
        _check_plan(plan)
    except _BadField as e:
        raise RecordError(f"{path}: malformed plan: {e}") from None
    return plan


def _check_plan(plan: Plan) -> None:
    """What the analysis relies on beyond the types: cells in execution order, each in its
    own folder, sentinels of earlier cells, decisions and tolerances that are numbers."""
    for i, c in enumerate(plan.cells):
        if c.index != i:
            raise _BadField(f"cells[{i}].index", f"is {c.index}, expected {i} (execution "
                            "order)")
        _label(c.label, f"cells[{i}].label")
        if c.sentinel_of is not None and not 0 <= c.sentinel_of < i:
            raise _BadField(f"cells[{i}].sentinel_of", f"is {c.sentinel_of}, not an earlier "
                            "cell")
    for i, d in enumerate(plan.decisions):
        for name in ("candidate", "baseline"):
            _typed(d.get(name), str, f"decisions[{i}].{name}")
        if d["candidate"] == d["baseline"]:
            raise _BadField(f"decisions[{i}]", f"compares `{d['candidate']}` with itself")
        for key in ("min_effect", "max_regression"):
            if key in d:
                _typed(d[key], float, f"decisions[{i}].{key}")
        if d.get("expect", "faster") not in EXPECT:
            raise _BadField(f"decisions[{i}].expect", f"is {_shown(d.get('expect'))}, "
                            f"expected one of {', '.join(EXPECT)}")
    last = 0
    for i, look in enumerate(plan.looks):
        if not last < look.cells <= len(plan.cells) or not 0 < look.alpha < 1:
            raise _BadField(f"looks[{i}]", "is not a look at more cells than the one before, "
                            "within the plan, at an alpha in (0, 1)")
        last = look.cells
    for k, v in plan.match.items():
        _typed(v, float, f"match.{k}")


def read_samples(run: Path) -> list[Sample]:
    path = run / "samples.jsonl"
    out = []
    for n, d in _jsonl(path):
        try:
            sample = Sample.from_json(d)
            for k, v in sample.values.items():
                # Readings are numbers (frequencies always), strings, booleans or null.
                if (k.endswith("_khz") and v is not None) or (
                        isinstance(v, (int, float)) and not isinstance(v, bool)):
                    _typed(v, float, f"values.{k}")
        except _BadField as e:
            raise RecordError(f"{path}:{n}: malformed sample: {e}") from None
        out.append(sample)
    return out


# -- a cell's own files ----------------------------------------------------------------------


def _column(values: Any) -> list[float] | None:
    """A per-token column: a list of numbers (null: not measured), else None."""
    if not isinstance(values, list) or not all(v is None or _number(v) for v in values):
        return None
    return [math.nan if v is None else float(v) for v in values]


def read_cell_files(cell_dir: Path) -> tuple[dict[str, list[float]], str, dict[str, Any]]:
    """A cell's per-token columns, where they came from, and its `summary.json` document.

    Columns come from `summary.json` `per_token` (the engine's --json), else `tokens.csv`
    (a bmoe_metrics CSV); source is "per_token", "tokens.csv" or "none". Fail-soft like the
    cell that wrote them (an external command's output may be anything): a document that is
    not JSON counts as absent, a column that is not a list of numbers is left out, a CSV row
    that does not parse ends the table (a torn file), and `summary`, `fingerprint` and
    `resolved` of the wrong type are dropped."""
    doc: dict[str, Any] = {}
    path = cell_dir / "summary.json"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # absent, unreadable, not JSON
        loaded = None
    if isinstance(loaded, dict):
        doc = {k: v for k, v in loaded.items() if not (
            (k in ("summary", "resolved", "per_token") and not isinstance(v, dict))
            or (k == "fingerprint" and not isinstance(v, str)))}
    pt = doc.get("per_token", {})
    cols = {k: c for k, c in ((k, _column(v)) for k, v in pt.items()) if c is not None}
    if cols.get("wall_ms"):
        return cols, "per_token", doc
    cols = _tokens_csv(cell_dir / "tokens.csv")
    if cols.get("wall_ms"):
        return cols, "tokens.csv", doc
    return {}, "none", doc


def _tokens_csv(path: Path) -> dict[str, list[float]]:
    """bmoe_metrics CSV: `#` lines, a header row, one row per token; every column optional,
    a row that does not parse ends the table (a torn file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines:
        return {}
    header = [h.strip() for h in lines[0].split(",")]
    cols: dict[str, list[float]] = {h: [] for h in header}
    for line in lines[1:]:
        try:
            vals = [float(v) for v in line.split(",")]
        except ValueError:
            break
        if len(vals) != len(header) or not all(_number(v) for v in vals):
            break
        for h, v in zip(header, vals):
            cols[h].append(v)
    return cols
