"""What the device did while a cell ran — its caps, temperatures, memory and other
processes' load at entry and during the cell, and what was read before and after it
(`analysis.readings`) — from the samples and the entry state, and what an imported run's
`.metrics` recorded over it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from abbench.analysis.readings import CapsState, Reading, around, is_during, metrics_after
from abbench.records import CellRecord, Sample, keys
from abbench.records.metrics_file import Pressure


@dataclass(frozen=True)
class DeviceDuring:
    """What the samples (and the entry state) show while one cell ran, and what was read
    before and after it (`analysis.readings`)."""

    caps_states: tuple[CapsState, ...]  # distinct cap sets at entry and during, in order
    hw_max_khz: dict[str, int]
    capped: tuple[str, ...]  # policies below their hardware max at any point
    cpu_temp_c: tuple[float, float] | None  # (min, max)
    battery_temp_c: tuple[float, float] | None
    mem_available_floor_mib: float | None
    samples: int
    # Sensor gaps: reading key -> how many of the cell's samples lack it, for each key the
    # sampler records in this run that the cell had (at entry or in a sample) and then lost
    # in some sample (a sensor that vanished or read garbage mid-cell).
    gaps: dict[str, int] = field(default_factory=dict)
    # Other processes' CPU load: the mean of the cell's `load.foreign_cores` ticks (busy
    # cores; None: not measured) and the longest run queue seen (`load.runnable_tasks`).
    foreign_cores: float | None = None
    max_runnable_tasks: int | None = None
    during_caps: tuple[CapsState, ...] = ()  # distinct cap sets read during the cell only
    around: tuple[Reading, ...] = ()  # its readings before (entry first), after, at exit

    @property
    def caps_measured(self) -> bool:
        return any(self.caps_states)

    @property
    def caps_constant(self) -> bool:
        return len(self.caps_states) <= 1


def device_during(record: CellRecord, samples: list[Sample]) -> DeviceDuring:
    """Caps, temperatures, memory and other processes' load over the cell: its readings
    before it (the entry state first) plus every reading during it (`readings.is_during`:
    keys `cpu.<policy>.cap_khz`/`hw_max_khz`, `temp.cpu_c`, `battery.temp_c`,
    `mem.available_mib`, `load.foreign_cores`, `load.runnable_tasks`); the readings after
    it and at its exit are kept apart (`around`), never folded into "during"."""
    outside = around(record, samples)
    before = [r for r in outside if r.position == keys.BEFORE]
    states: list[CapsState] = []
    hw: dict[str, int] = {p: v for r in outside for p, v in r.hw_max_khz.items()}
    for r in before:
        if r.caps_khz and (st := tuple(sorted(r.caps_khz.items()))) not in states:
            states.append(st)
    cpu = [r.cpu_temp_c for r in before if r.cpu_temp_c is not None]
    bat = [r.battery_temp_c for r in before if r.battery_temp_c is not None]
    mem = [r.mem_available_mib for r in before if r.mem_available_mib is not None]
    foreign: list[float] = []
    runnable: list[int] = []
    during: list[CapsState] = []
    n = 0
    for s in samples:
        if not is_during(s, record):
            continue
        n += 1
        v = s.values
        x = v.get(keys.FOREIGN_CORES)
        if _number(x):
            foreign.append(float(x))
        x = v.get(keys.RUNNABLE_TASKS)
        if _number(x):
            runnable.append(int(x))
        caps = {p: int(x) for p, x in keys.policies(v, "cap_khz").items() if x is not None}
        for p, x in keys.policies(v, "hw_max_khz").items():
            if x is not None:
                hw[p] = int(x)
        if caps:
            st = tuple(sorted(caps.items()))
            if st not in states:
                states.append(st)
            if st not in during:
                during.append(st)
        for key, acc in ((keys.CPU_TEMP_C, cpu), (keys.BATTERY_TEMP_C, bat),
                         (keys.MEM_AVAILABLE_MIB, mem)):
            x = v.get(key)
            if isinstance(x, (int, float)):
                acc.append(float(x))
    capped = sorted({p for st in states for p, cap in st if p in hw and cap < hw[p]})
    return DeviceDuring(
        caps_states=tuple(states), hw_max_khz=hw, capped=tuple(capped),
        cpu_temp_c=(min(cpu), max(cpu)) if cpu else None,
        battery_temp_c=(min(bat), max(bat)) if bat else None,
        mem_available_floor_mib=min(mem) if mem else None, samples=n,
        gaps=sensor_gaps(record, samples),
        foreign_cores=float(np.mean(foreign)) if foreign else None,
        max_runnable_tasks=max(runnable) if runnable else None,
        during_caps=tuple(during), around=outside,
    )


def _number(x: Any) -> bool:
    """A finite number as a sample holds one (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _matched_keys(values: dict[str, Any]) -> set[str]:
    """The readings matching compares, present as numbers in one sample."""
    return {k for k, v in values.items()
            if (k in keys.ENTRY_KEYS
                or keys.policy_of(k, "cap_khz") is not None)
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def sensor_gaps(record: CellRecord, samples: list[Sample]) -> dict[str, int]:
    """Per reading key, the number of the cell's samples that lack it, for the keys that
    some sample of the run records and that this cell had (entry state or a sample).

    A device without a sensor has no gap (never recorded); neither has a cell after the
    sensor vanished for good (it never had it: its pairs read "not measured" or, against
    a cell that had it, fail on the entry state)."""
    recorded: set[str] = set()
    mine: list[set[str]] = []
    for s in samples:
        if s.position not in (None, keys.DURING):  # an import's reading around a cell
            continue
        present = _matched_keys(s.values)
        recorded |= present
        if is_during(s, record):
            mine.append(present)
    e = record.entry
    had = {keys.cap_khz(p) for p in e.caps_khz}
    had |= {k for k, name in keys.ENTRY_READINGS if getattr(e, name) is not None}
    had = (had | set().union(*mine)) & recorded
    gaps = {k: sum(k not in present for present in mine) for k in sorted(had)}
    return {k: n for k, n in gaps.items() if n}


def with_metrics(during: DeviceDuring, metrics: Pressure) -> DeviceDuring:
    """What an imported run's `.metrics` recorded over the run — the free-RAM floor, the
    CPU and battery temperatures before and at their maximum (a reading during it without a
    time) — joined to what the entry state and samples show; its `*_after_*` readings are
    a reading after it."""
    floor = metrics.mem_avail_floor_kb
    changes: dict[str, Any] = {}
    if (after := metrics_after(metrics)) is not None:
        changes["around"] = (*during.around, after)
    if floor is not None:
        seen = during.mem_available_floor_mib
        changes["mem_available_floor_mib"] = min(floor / 1024, seen) if seen is not None \
            else floor / 1024
    for field_name, before, top, div in (
            ("cpu_temp_c", metrics.cpu_temp_before_mC, metrics.cpu_temp_max_mC, 1000),
            ("battery_temp_c", metrics.batt_temp_before_dC, metrics.batt_temp_max_dC, 10)):
        values = [v / div for v in (before, top) if v is not None]
        if values:
            seen = getattr(during, field_name)
            values += list(seen) if seen is not None else []
            changes[field_name] = (min(values), max(values))
    return dataclasses.replace(during, **changes) if changes else during


__all__ = ["CapsState", "DeviceDuring", "device_during", "sensor_gaps", "with_metrics"]
