"""A cell's readings of the device by where they stand in it (docs/import.md#readings).

- **before**: its entry state (the journal's), and an import's reading before the run at
  another time (a `.state` BEFORE snapshot when the driver's entry line gave the entry);
- **during**: a sampler tick tagged with the cell, or an import's reading (a `.state`
  section other than BEFORE/AFTER) whose time falls inside the cell's span
  [t_start, t_end] as the journal records it — whichever run's file holds it;
- **after**: a snapshot taken after the run (`.state` AFTER, a driver's `AFTER STATE:`
  line) and the `.metrics` `*_after_*` keys (no time);
- **exit**: the driver's `EXIT STATE:` line.

After- and exit readings belong to the cell they follow, whatever their time: what the
device showed at a cell's end is a tell for that cell (`drift.capped_after`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from abbench.records import CellRecord, EntryState, Sample, keys
from abbench.records.metrics_file import Pressure

CapsState = tuple[tuple[str, int], ...]  # sorted (policy, cap_khz)

LATER = (keys.AFTER, keys.EXIT)


@dataclass(frozen=True)
class Reading:
    """One reading of the device around a cell, with where it stands and when."""

    position: str  # keys.BEFORE | keys.AFTER | keys.EXIT
    t_wall: float | None  # None: not recorded
    caps_khz: dict[str, int] = field(default_factory=dict)
    hw_max_khz: dict[str, int] = field(default_factory=dict)
    cpu_temp_c: float | None = None
    battery_temp_c: float | None = None
    mem_available_mib: float | None = None
    thermal_status: int | None = None

    def __post_init__(self) -> None:
        if self.position not in keys.POSITIONS:
            raise ValueError(f"position {self.position!r} is not one of {keys.POSITIONS}")

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "t_wall": self.t_wall, "caps_khz": self.caps_khz,
                "hw_max_khz": self.hw_max_khz, "cpu_temp_c": self.cpu_temp_c,
                "battery_temp_c": self.battery_temp_c,
                "mem_available_mib": self.mem_available_mib,
                "thermal_status": self.thermal_status}


def is_during(s: Sample, record: CellRecord) -> bool:
    """Whether `s` is a reading during `record`'s cell: a sampler tick tagged with it, or an
    import's during reading whose time lies in the cell's span (with no span recorded, the
    run whose file holds it)."""
    if s.position is None:
        return s.cell == record.index
    if s.position != keys.DURING:
        return False
    if 0 < record.t_start_wall <= record.t_end_wall:
        return record.t_start_wall <= s.t_wall <= record.t_end_wall
    return s.cell == record.index


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _from_sample(s: Sample) -> Reading:
    v = s.values
    status = _number(v.get(keys.ANDROID_THERMAL_STATUS))
    return Reading(
        position=s.position or keys.DURING, t_wall=s.t_wall,
        caps_khz={p: int(x) for p, x in keys.policies(v, "cap_khz").items()
                  if _number(x) is not None},
        hw_max_khz={p: int(x) for p, x in keys.policies(v, "hw_max_khz").items()
                    if _number(x) is not None},
        cpu_temp_c=_number(v.get(keys.CPU_TEMP_C)),
        battery_temp_c=_number(v.get(keys.BATTERY_TEMP_C)),
        mem_available_mib=_number(v.get(keys.MEM_AVAILABLE_MIB)),
        thermal_status=None if status is None else int(status))


def _from_entry(e: EntryState, t_start: float) -> Reading:
    t = e.t_wall or t_start
    return Reading(keys.BEFORE, t or None, dict(e.caps_khz), dict(e.hw_max_khz),
                   e.cpu_temp_c, e.battery_temp_c, e.mem_available_mib, e.thermal_status)


def around(record: CellRecord, samples: list[Sample]) -> tuple[Reading, ...]:
    """The cell's readings before it (its entry state first), after it and at its exit,
    each group in time order. A before-reading at the entry state's own time is the entry
    state (the driver's entry line): it is not counted twice."""
    entry = _from_entry(record.entry, record.t_start_wall)
    mine = [s for s in samples if s.cell == record.index and s.position is not None
            and s.position != keys.DURING]
    before = [_from_sample(s) for s in mine
              if s.position == keys.BEFORE and s.t_wall != entry.t_wall]
    later = sorted((_from_sample(s) for s in mine if s.position in LATER),
                   key=lambda r: (LATER.index(r.position), r.t_wall or 0.0))
    return (entry, *sorted(before, key=lambda r: r.t_wall or 0.0), *later)


def metrics_after(metrics: Pressure) -> Reading | None:
    """The `.metrics` `*_after_*` readings as one after-reading (no time), None without
    any."""
    values = {name: v / div for name, v, div in (
        ("cpu_temp_c", metrics.cpu_temp_after_mC, 1000.0),
        ("battery_temp_c", metrics.batt_temp_after_dC, 10.0),
        ("mem_available_mib", metrics.mem_avail_after_kb, 1024.0)) if v is not None}
    return Reading(keys.AFTER, None, **values) if values else None


def place(index: int, position: str) -> str:
    """Where a reading of cell `index` was taken, in a report's words."""
    if position == keys.EXIT:
        return f"cell {index + 1}'s exit"
    return f"the end of cell {index + 1}" if position == keys.AFTER else f"cell {index + 1}"


def cap_readings(index: int, around_: tuple[Reading, ...],
                 during: tuple[CapsState, ...]) -> Iterator[tuple[str, CapsState]]:
    """A cell's cap sets in the order they were read, each with where: before it, during
    it, after it and at its exit."""
    for r in around_:
        if r.position == keys.BEFORE and r.caps_khz:
            yield place(index, r.position), tuple(sorted(r.caps_khz.items()))
    for st in during:
        yield place(index, keys.DURING), st
    for r in around_:
        if r.position in LATER and r.caps_khz:
            yield place(index, r.position), tuple(sorted(r.caps_khz.items()))


__all__ = ["CapsState", "Reading", "around", "cap_readings", "is_during", "metrics_after",
           "place"]
