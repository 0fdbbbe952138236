"""journal.jsonl (one CellRecord per finished cell, with its entry state and gate wait)
and samples.jsonl (one Sample per sampler tick)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from abbench.errors import BadField, RecordError
from abbench.fsutil import LineAppender
from abbench.records.jsonl import jsonl_line, numbered_jsonl, read_jsonl_records
from abbench.records.keys import POSITIONS
from abbench.records.schema import build, from_dict, show, typed
from abbench.records.summary import RunSummary

FORMAT = "abbench-run v1"
SAMPLES_FILE = "samples.jsonl"


def _shallow(record: Any) -> dict[str, Any]:
    """A record's fields by name, as `asdict` gives them but without its deep copy (the
    callers replace every field that holds a record or a container)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


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
        d = _shallow(self)
        d["caps_khz"], d["hw_max_khz"] = dict(self.caps_khz), dict(self.hw_max_khz)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EntryState:
        return from_dict(cls, d)


@dataclass(frozen=True)
class GateWait:
    """What the thermal gate did before a cell."""

    waited_s: float = 0.0
    polls: int = 0
    reasons: tuple[str, ...] = ()  # why it waited (first poll), e.g. "cpu 47.1 C > 45.0 C"
    gave_up: bool = False  # the timeout fired: the cell ran anyway

    def to_json(self) -> dict[str, Any]:
        return {**_shallow(self), "reasons": list(self.reasons)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GateWait:
        return from_dict(cls, d)


@dataclass(frozen=True)
class MemoryUse:
    """A cell run under a memory limit (`memory_limit_mib`, its own memory cgroup): the
    limit, the most the cell's group held (its page cache included), and how many of its
    processes the kernel's OOM killer ended. None: the kernel keeps no such count."""

    limit_mib: float
    peak_mib: float | None = None
    oom_kills: int | None = None

    def __post_init__(self) -> None:
        if not self.limit_mib > 0:
            raise BadField(("limit_mib",), f"must be > 0 (got {show(self.limit_mib)})")

    @property
    def oom_killed(self) -> bool:
        return bool(self.oom_kills)

    def to_json(self) -> dict[str, Any]:
        return _shallow(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MemoryUse:
        return from_dict(cls, d)


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
    summary: RunSummary = field(default_factory=RunSummary)  # what the cell reported
    fingerprint: str | None = None
    tokens_per_s: float | None = None
    exit_code: int | None = None
    error: str | None = None  # one line: why the cell failed
    stderr_tail: str = ""
    memory: MemoryUse | None = None  # None: run without a memory limit

    def to_json(self) -> dict[str, Any]:
        d = _shallow(self)
        d["entry"] = self.entry.to_json()
        d["gate"] = self.gate.to_json()
        d["summary"] = self.summary.to_json()
        if self.memory is None:  # journals before memory limits have no key
            del d["memory"]
        else:
            d["memory"] = self.memory.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CellRecord:
        if not isinstance(d, dict):
            return from_dict(cls, d)  # the problem: not an object
        # Older journals: no entry state or gate recorded.
        d = {**d, "entry": d.get("entry") or {"t_wall": 0.0}, "gate": d.get("gate") or {}}
        summary = RunSummary.from_json(d.pop("summary", {}), ("summary",))
        return build(cls, d, strict=False, summary=summary)


@dataclass(frozen=True)
class Sample:
    """One sampler tick, or one reading an import took from a snapshot or a driver line:
    timestamps and whatever readers answered (flat keys)."""

    t_mono: float
    t_wall: float
    values: dict[str, Any]
    cell: int | None = None  # the cell running at this tick, None between cells
    # An import's reading: where it stands in `cell` (`keys.POSITIONS`: an after- or exit
    # reading belongs to the cell it follows). None: a sampler tick, written without it.
    position: str | None = None

    def __post_init__(self) -> None:
        if self.position is not None and self.position not in POSITIONS:
            raise BadField(("position",), f"{show(self.position)} is not one of "
                           f"{', '.join(POSITIONS)}")

    def to_json(self) -> dict[str, Any]:
        # by hand, not asdict: a sampler writes ten a second, and asdict deep-copies
        d = {"t_mono": self.t_mono, "t_wall": self.t_wall, "values": dict(self.values),
             "cell": self.cell}
        if self.position is not None:  # an import's reading; a sampler tick has none
            d["position"] = self.position
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return from_dict(cls, d)


# the run folder.
_LABEL = re.compile(r"[^/\\\x00]*")


def check_label(label: str, key: str) -> None:
    if not _LABEL.fullmatch(label) or label in (".", ".."):
        raise BadField(key, f"is {show(label)}, not a folder name (cells/NN-NAME)")


def read_journal(run: Path) -> list[CellRecord]:
    def read(d: dict[str, Any]) -> CellRecord:
        record = CellRecord.from_json(d)
        check_label(record.label, "label")
        return record

    return read_jsonl_records(run / "journal.jsonl", read, "cell record")


class SampleLog:
    """A run's samples.jsonl being written, one Sample a line, by one process (the
    campaign's sampler, ten lines a second: the file is held open, `fsutil.LineAppender`)."""

    def __init__(self, run: Path) -> None:
        self._out = LineAppender(run / SAMPLES_FILE)

    def append(self, sample: Sample) -> None:
        """One line; an OSError (a full disk) leaves the file whole lines and names it."""
        self._out.append(jsonl_line(sample.to_json()))

    def close(self) -> None:
        self._out.close()


def read_samples(run: Path) -> list[Sample]:
    path = run / SAMPLES_FILE
    out = []
    for n, d in numbered_jsonl(path):
        try:
            sample = Sample.from_json(d)
            for k, v in sample.values.items():
                # Readings are numbers (frequencies always), strings, booleans or null.
                if (k.endswith("_khz") and v is not None) or (
                        isinstance(v, (int, float)) and not isinstance(v, bool)):
                    typed(v, float, ("values", k))
        except BadField as e:
            raise RecordError(f"{path}:{n}: malformed sample: {e}") from None
        out.append(sample)
    return out
