"""Per-cell statistics from a run folder's records: the steady window, throughput with
its interval, per-token percentiles, the engine's counters per token, and what the device
did while the cell ran (caps, temperatures, memory).

Per-token times come from `cells/NN-NAME/summary.json` (`per_token`), else from
`tokens.csv`; a cell with neither has only the summary's tok/s and says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from abbench.analysis.energy import NO_ENERGY, CellEnergy, cell_energy
from abbench.analysis.readings import CapsState, Reading, around, is_during, metrics_after
from abbench.analysis.slices import SliceStat, slice_stats
from abbench.analysis.stats import (
    Interval,
    log_rate,
    log_rate_token_variance,
    percentile,
    rate_interval,
    seed_for,
    tokens_per_s,
)
from abbench.records import (
    CellFiles,
    CellRecord,
    PlannedCell,
    RunSummary,
    Sample,
    keys,
    read_cell_files,
    tokens,
)
from abbench.records.slices import read_slices


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


@dataclass(frozen=True, kw_only=True)
class CellStats:
    """What section 7 asks of one cell. Built by name only: a measure the cell did not
    record stays None (unknown), never 0."""

    index: int
    name: str
    label: str
    status: str
    during: DeviceDuring
    sentinel_of: int | None = None
    error: str | None = None
    fingerprint: str | None = None
    source: str = "none"  # "per_token" | "tokens.csv" | "summary" | "none"
    tokens: int = 0  # decode tokens recorded
    steady_tokens: int = 0  # after the warm-up
    tokens_per_s: Interval | None = None  # steady window; NaN-free only with per-token data
    median_ms: float | None = None
    p5_ms: float | None = None
    p95_ms: float | None = None
    read_mib_per_token: float | None = None
    hit_pct: float | None = None
    stall_ms_per_token: float | None = None
    compute_ms_per_token: float | None = None
    majflt_per_token: float | None = None
    cpu_occupancy: float | None = None
    drop_rate: float | None = None  # experts dropped / routed
    spec_read_mib_per_token: float | None = None
    spec_useful_pct: float | None = None
    threads: int | None = None
    notes: tuple[str, ...] = ()
    wall_ms: tuple[float, ...] = field(default=(), repr=False)  # the steady window
    config_key: str | None = None  # the configuration's identity (`records.config_key`)
    log_rate: float | None = None  # log tokens/s of the steady window (None: no window)
    token_variance: float = math.nan  # its moving-block variance (NaN: no window)
    peak_rss_mib: float | None = None  # the process's peak RSS, where recorded
    prefill_tok_s: float | None = None  # prompt tokens / time to first token, where recorded
    ttft_s: float | None = None  # time to first token (prefill, load excluded)
    stability: float | None = None  # worst over best window throughput (`stability_ratio`)
    energy: CellEnergy = NO_ENERGY  # mean power and J/token (`analysis.energy`)
    slices: tuple[SliceStat, ...] = ()  # the turns it took (interleaved campaigns)
    partner: int | None = None  # the cell it took turns with

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tokens_per_s is not None

    def window(self) -> np.ndarray:
        return np.asarray(self.wall_ms, dtype=float)


STABILITY_WINDOW_TOKENS = 32  # tokens per window of the stability ratio (docs/report.md#method)


def stability_ratio(wall_ms: np.ndarray, window: int = STABILITY_WINDOW_TOKENS) -> float | None:
    """Sustained against peak, as sustained-performance tests report it: the steady series
    cut into consecutive windows of `window` tokens (a partial last one left out), the
    slowest window's throughput over the fastest's. 1.0 is a cell that held its speed;
    None with fewer than two whole windows. wall_ms: (n,) per-token times."""
    n = len(wall_ms) // window
    if n < 2:
        return None
    per_window = np.asarray(wall_ms[: n * window], float).reshape(n, window).sum(axis=1)  # (n,)
    if not np.all(np.isfinite(per_window)) or per_window.min() <= 0:
        return None
    return float(per_window.min() / per_window.max())  # tok/s is window / ms: worst / best


def _per_token_mean(cols: dict[str, list[float]], key: str, start: int) -> float | None:
    v = cols.get(key)
    if not v or len(v) <= start:
        return None
    return float(np.mean(np.asarray(v[start:], dtype=float)))


def _float(v: float | None) -> float | None:
    """A summary's figure as a float (a count may be written as an integer)."""
    return None if v is None else float(v)


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


def cell_stats(run: Path, planned: PlannedCell, record: CellRecord | None,
               samples: list[Sample], warmup: int) -> CellStats:
    """Everything section 7 asks of one cell; a cell not in the journal is "not run"."""
    if record is None:
        return CellStats(index=planned.index, name=planned.name, label=planned.label,
                         status="not run", sentinel_of=planned.sentinel_of,
                         during=DeviceDuring((), {}, (), None, None, None, 0),
                         notes=("not in the journal",), config_key=planned.config.key)
    notes: list[str] = []
    files = read_cell_files(run / "cells" / record.label)
    cols = files.columns
    summary = record.summary if record.summary.keys else files.summary
    wall = np.asarray(cols.get(tokens.WALL_MS, []), dtype=float)
    repetitions = files.repetitions
    if repetitions:  # llama-bench: each repetition is one sample (and one stability window)
        warmup = 0  # (it warms up itself); ms per token of each, not per-token times
        each = summary.tokens_per_repetition
        notes.append(f"{len(wall)} repetitions of {'?' if each is None else each} "
                     "tokens (llama-bench) are the samples: no per-token times")
    notes += files.notes
    start = min(warmup, len(wall))
    steady = wall[start:]
    rate, source = _rate(record, steady, len(wall), warmup, summary, files.source, notes)
    fp = record.fingerprint or files.fingerprint
    if record.status != "ok":
        notes.append(f"cell {record.status}" + (f": {record.error}" if record.error else ""))
    peak_kb = files.metrics.get("peak_rss_kb")
    return CellStats(
        index=record.index, name=record.name, label=record.label, status=record.status,
        sentinel_of=planned.sentinel_of, error=record.error, fingerprint=fp, source=source,
        tokens=len(wall), steady_tokens=len(steady), tokens_per_s=rate,
        median_ms=percentile(steady, 50) if len(steady) else None,
        p5_ms=percentile(steady, 5) if len(steady) else None,
        p95_ms=percentile(steady, 95) if len(steady) else None,
        **_work_per_token(files, start, steady, summary),
        during=_with_metrics(device_during(record, samples), files.metrics),
        peak_rss_mib=peak_kb / 1024 if peak_kb is not None else _float(summary.peak_rss_mib),
        prefill_tok_s=_float(summary.prefill_tok_per_s), ttft_s=_float(summary.ttft_s),
        notes=tuple(notes),
        wall_ms=tuple(float(x) for x in steady), config_key=planned.config.key,
        log_rate=log_rate(steady) if len(steady) >= 2 else None,
        token_variance=log_rate_token_variance(steady),
        stability=stability_ratio(steady, 1 if repetitions else STABILITY_WINDOW_TOKENS),
        energy=cell_energy([s for s in samples if is_during(s, record)], steady,
                           seed_for("energy", record.label)),
        slices=slice_stats(read_slices(run / "cells" / record.label), wall,
                           cols.get(tokens.SLICE, []), samples),
        partner=planned.interleaved_with,
    )


def _rate(record: CellRecord, steady: np.ndarray, recorded: int, warmup: int,
          summary: RunSummary, source: str, notes: list[str]) -> tuple[Interval | None, str]:
    """The steady window's tokens/s with its interval; without per-token times the
    summary's figure (warm-up included, no interval). Says why in `notes` when either falls
    short; gives the source the rate came from."""
    if len(steady) >= 2:
        return rate_interval(steady, seed_for("cell", record.label)), source
    if recorded:
        notes.append(f"warm-up ({warmup} tokens) leaves {len(steady)} of {recorded} "
                     f"tokens: no steady window")
    if record.status != "ok":
        return None, source
    tps = record.tokens_per_s if record.tokens_per_s is not None else _float(
        summary.tok_per_s)
    if tps is None:
        notes.append("no throughput recorded")
        return None, source
    if source == "none":
        if summary.engine == "llama-completion":
            notes.append("llama-completion gives no per-token times: tok/s from its `eval "
                         "time` line (the decode after the first token), no interval within "
                         "the cell; only the cell-level statistics carry a verdict on it")
        else:
            notes.append("no per-token times (neither per_token in summary.json nor "
                         "tokens.csv): tok/s from the summary, warm-up included, no interval")
        source = "summary"
    return Interval(tps, math.nan, math.nan), source


def _work_per_token(files: CellFiles, start: int, steady: np.ndarray,
                    summary: RunSummary) -> dict[str, Any]:
    """The work measures of `CellStats` (reads, cache, stalls, compute, faults, occupancy,
    drops, speculation, threads): the steady window's per-token means where the cell
    recorded per-token columns, else its summary's figures, else None."""
    cols = files.columns

    def mean(key: str) -> float | None:
        return _per_token_mean(cols, key, start)

    def per_token_or(key: str, figure: float | None, scale: float = 1.0) -> float | None:
        value = mean(key)
        if value is None and figure is not None:
            value = scale * float(figure)
        return value

    threads = summary.threads if summary.threads is not None else files.threads
    read = mean(tokens.READ_BYTES)
    cpu_ms = mean(tokens.CPU_MS)
    if cpu_ms is not None and cpu_ms <= 0:
        cpu_ms = None  # a column of zeros: the engine did not measure CPU time there
    occ: float | None = None
    if cpu_ms is not None and len(steady) and threads:
        occ = cpu_ms / (float(np.mean(steady)) * threads)
    elif summary.cpu_occupancy is not None:
        occ = float(summary.cpu_occupancy)
    routed, dropped = mean(tokens.EXPERTS_ROUTED), mean(tokens.EXPERTS_DROPPED)
    if routed is None:
        routed, dropped = _float(summary.experts_routed), _float(summary.experts_dropped)
    spec = mean(tokens.SPEC_READ_BYTES)
    se, su = mean(tokens.SPEC_EXPERTS), mean(tokens.SPEC_USEFUL)
    if se is None:
        se, su = _float(summary.spec_experts), _float(summary.spec_useful)
    return {
        "read_mib_per_token": read / 2**20 if read is not None
        else _float(summary.read_mib_per_tok),
        "hit_pct": _hit_pct(mean(tokens.HITS), mean(tokens.MISSES), cols, summary),
        "stall_ms_per_token": per_token_or(tokens.STALL_MS, summary.stall_s_per_tok, 1000.0),
        "compute_ms_per_token": per_token_or(tokens.COMPUTE_MS, summary.compute_s_per_tok,
                                             1000.0),
        "majflt_per_token": per_token_or(tokens.MAJFLT, summary.majflt_per_tok),
        "cpu_occupancy": occ,
        "drop_rate": dropped / routed if routed and dropped is not None else None,
        "spec_read_mib_per_token": spec / 2**20 if spec is not None else None,
        "spec_useful_pct": 100.0 * su / se if se and su is not None else None,
        "threads": threads,
    }


def _hit_pct(hits: float | None, misses: float | None, cols: dict[str, list[float]],
             summary: RunSummary) -> float | None:
    if hits is not None and misses is not None and hits + misses > 0:
        return 100.0 * hits / (hits + misses)
    # The seed engine's per-token `cache_hit_pct` is cumulative: the run's figure is its
    # summary's, else the column's last value (a mean would weigh the cold start);
    # negative means the cache was off.
    hit = _float(summary.cache_hit_pct)
    last = [v for v in cols.get(tokens.CACHE_HIT_PCT, []) if math.isfinite(v)]
    if hit is None and last:
        hit = last[-1]
    return hit if hit is None or hit >= 0 else None


def _with_metrics(during: DeviceDuring, metrics: dict[str, float]) -> DeviceDuring:
    """What an imported run's `.metrics` recorded over the run — the free-RAM floor, the
    CPU and battery temperatures before and at their maximum (a reading during it without a
    time) — joined to what the entry state and samples show; its `*_after_*` keys are a
    reading after it."""
    floor = metrics.get("mem_avail_floor_kb")
    changes: dict[str, Any] = {}
    if (after := metrics_after(metrics)) is not None:
        changes["around"] = (*during.around, after)
    if floor is not None:
        seen = during.mem_available_floor_mib
        changes["mem_available_floor_mib"] = min(floor / 1024, seen) if seen is not None \
            else floor / 1024
    for field_name, before, top, div in (("cpu_temp_c", "cpu_temp_before_mC",
                                          "cpu_temp_max_mC", 1000),
                                         ("battery_temp_c", "batt_temp_before_dC",
                                          "batt_temp_max_dC", 10)):
        values = [v / div for v in (metrics.get(before), metrics.get(top)) if v is not None]
        if values:
            seen = getattr(during, field_name)
            values += list(seen) if seen is not None else []
            changes[field_name] = (min(values), max(values))
    return dataclasses.replace(during, **changes) if changes else during


def steady_rate(c: CellStats) -> float | None:
    """Point tokens/s of a cell, None when it has none."""
    if c.tokens_per_s is None:
        return None
    return c.tokens_per_s.estimate if math.isfinite(c.tokens_per_s.estimate) else None


__all__ = ["CapsState", "CellStats", "DeviceDuring", "cell_stats", "device_during",
           "sensor_gaps", "steady_rate", "tokens_per_s"]
