"""The run folder's schema: what `campaign` (and importers) write and `analysis` reads.

A run folder is the single source of truth; every report is re-rendered from it.

```
RUN/
  campaign.toml          the campaign file as resolved (every cell's full configuration)
  plan.json              Plan: the cells in execution order
  journal.jsonl          one CellRecord per finished cell (appended, flushed, fsync'd)
  samples.jsonl          one Sample per sampler tick
  cells/NN-NAME/         tokens.csv, summary.json (the engine's --json), stderr.txt
  report.md|json|html    rendered by `abbench report RUN`
```

Everything here is a frozen dataclass with `to_json()` / `from_json()`; unknown keys in a
file are ignored on read (newer writers), missing optional keys take their defaults.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from abbench.errors import AbbenchError

FORMAT = "abbench-run v1"

T = TypeVar("T")


class RecordError(AbbenchError):
    """A run folder file that cannot be read."""


def _from_dict(cls: type[T], d: dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in d.items() if k in names})


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
        d = dict(d)
        d["reasons"] = tuple(d.get("reasons", ()))
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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cells"] = [c.to_json() for c in self.cells]
        d["decisions"] = list(self.decisions)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        d["cells"] = tuple(PlannedCell.from_json(c) for c in d.get("cells", ()))
        d["decisions"] = tuple(d.get("decisions", ()))
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
        d = dict(d)
        d["entry"] = EntryState.from_json(d.get("entry") or {"t_wall": 0.0})
        d["gate"] = GateWait.from_json(d.get("gate") or {})
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


# -- files ---------------------------------------------------------------------------


def append_jsonl(path: Path, obj: dict[str, Any], fsync: bool = True) -> None:
    """Append one JSON line; flushed and (by default) fsync'd before returning."""
    line = json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file; a torn last line (a crash mid-write) is
    ignored, any other bad line is an error naming the file and line."""
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: torn by a crash
                continue
            raise RecordError(f"{path}:{n}: not a JSON line ({e.msg})") from None
        if not isinstance(obj, dict):
            raise RecordError(f"{path}:{n}: expected a JSON object")
        out.append(obj)
    return out


def read_journal(run: Path) -> list[CellRecord]:
    try:
        return [CellRecord.from_json(d) for d in read_jsonl(run / "journal.jsonl")]
    except (TypeError, KeyError, ValueError) as e:
        raise RecordError(f"{run / 'journal.jsonl'}: malformed cell record ({e})") from None


def read_plan(run: Path) -> Plan:
    path = run / "plan.json"
    try:
        return Plan.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise RecordError(f"{run}: not a run folder (no plan.json)") from None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as e:
        raise RecordError(f"{path}: malformed plan ({e})") from None


def read_samples(run: Path) -> list[Sample]:
    try:
        return [Sample.from_json(d) for d in read_jsonl(run / "samples.jsonl")]
    except (TypeError, KeyError, ValueError) as e:
        raise RecordError(f"{run / 'samples.jsonl'}: malformed sample ({e})") from None
