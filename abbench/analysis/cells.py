"""Per-cell statistics from a run folder's records: the steady window, throughput with
its interval, per-token percentiles, the engine's counters per token, and what the device
did while the cell ran (caps, temperatures, memory).

Per-token times come from `cells/NN-NAME/summary.json` (`per_token`), else from
`tokens.csv`; a cell with neither has only the summary's tok/s and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from abbench.analysis.during import (
    CapsState,
    DeviceDuring,
    device_during,
    sensor_gaps,
    with_metrics,
)
from abbench.analysis.energy import NO_ENERGY, CellEnergy, cell_energy
from abbench.analysis.readings import is_during
from abbench.analysis.slices import SliceStat, slice_stats
from abbench.analysis.stats import (
    Interval,
    cell_draws,
    log_rate,
    log_rate_token_variance,
    percentile,
    seed_for,
    tokens_per_s,
)
from abbench.records import (
    CellFiles,
    CellRecord,
    MemoryUse,
    PlannedCell,
    RunSummary,
    Sample,
    read_cell_files,
    tokens,
)
from abbench.records.slices import read_slices

# Where a cell's speed came from: its per-token columns (`records.cell_files`
# `ColumnSource`), or its summary's tok/s where they fall short.
SpeedSource = Literal["per_token", "tokens.csv", "summary", "none"]


@dataclass(frozen=True, kw_only=True)
class CellWork:
    """What one cell's engine did per token over its steady window: the per-token means
    where it recorded per-token columns, else its summary's figures, else None (unknown,
    never 0)."""

    read_mib_per_token: float | None = None
    hit_pct: float | None = None
    stall_ms_per_token: float | None = None
    compute_ms_per_token: float | None = None
    majflt_per_token: float | None = None
    cpu_occupancy: float | None = None
    drop_rate: float | None = None  # experts dropped / routed
    spec_read_mib_per_token: float | None = None
    spec_useful_pct: float | None = None
    # where the time between decodes is recorded, the cell's tokens/s is what a user waits
    # through, and this the decode alone over the same window (no interval: shown beside)
    decode_tok_s: float | None = None
    accepted_pct: float | None = None  # self-speculation: drafts the target confirmed
    tokens_per_decode: float | None = None  # ... and tokens each verify decode gave
    route_agree_pct: float | None = None  # route-ahead: committed routing = the router's


NO_WORK = CellWork()


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
    source: SpeedSource = "none"
    tokens: int = 0  # decode tokens recorded
    steady_tokens: int = 0  # after the warm-up
    tokens_per_s: Interval | None = None  # steady window; NaN-free only with per-token data
    median_ms: float | None = None
    p5_ms: float | None = None
    p95_ms: float | None = None
    work: CellWork = NO_WORK  # reads, cache, stalls, ... (frozen: one shared default)
    threads: int | None = None
    notes: tuple[str, ...] = ()
    wall_ms: tuple[float, ...] = field(default=(), repr=False)  # the steady window
    config_key: str | None = None  # the configuration's identity (`records.config_key`)
    log_rate: float | None = None  # log tokens/s of the steady window (None: no window)
    token_variance: float = math.nan  # its moving-block variance (NaN: no window)
    peak_rss_mib: float | None = None  # the process's peak RSS, where recorded
    memory: MemoryUse | None = None  # its memory cgroup's limit, peak, OOM kills (if limited)
    prefill_tok_s: float | None = None  # prompt tokens / time to first token, where recorded
    ttft_s: float | None = None  # time to first token (prefill, load excluded)
    stability: float | None = None  # worst over best window throughput (`stability_ratio`)
    energy: CellEnergy = NO_ENERGY  # mean power and J/token (`analysis.energy`)
    slices: tuple[SliceStat, ...] = ()  # the turns it took (interleaved campaigns)
    partner: int | None = None  # the cell it took turns with
    # its steady window's bootstrap draws of tokens/s (`stats.cell_draws`), (REPS,): every
    # ratio the cell is in reads them (None: no window)
    draws: np.ndarray | None = field(default=None, repr=False, compare=False)

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
    rate, source, draws = _rate(record, steady, len(wall), warmup, summary, files.source,
                                notes)
    fp = record.fingerprint or files.fingerprint
    if record.status != "ok":
        notes.append(f"cell {record.status}" + (f": {record.error}" if record.error else ""))
    peak_kb = files.metrics.peak_rss_kb
    threads = summary.threads if summary.threads is not None else files.threads
    return CellStats(
        index=record.index, name=record.name, label=record.label, status=record.status,
        sentinel_of=planned.sentinel_of, error=record.error, fingerprint=fp, source=source,
        tokens=len(wall), steady_tokens=len(steady), tokens_per_s=rate,
        median_ms=percentile(steady, 50) if len(steady) else None,
        p5_ms=percentile(steady, 5) if len(steady) else None,
        p95_ms=percentile(steady, 95) if len(steady) else None,
        work=_work_per_token(files, start, steady, summary, threads), threads=threads,
        during=with_metrics(device_during(record, samples), files.metrics),
        peak_rss_mib=peak_kb / 1024 if peak_kb is not None else _float(summary.peak_rss_mib),
        memory=record.memory,
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
        partner=planned.interleaved_with, draws=draws,
    )


def _rate(record: CellRecord, steady: np.ndarray, recorded: int, warmup: int,
          summary: RunSummary, source: SpeedSource, notes: list[str]
          ) -> tuple[Interval | None, SpeedSource, np.ndarray | None]:
    """The steady window's tokens/s with its interval (and its bootstrap draws); without
    per-token times the summary's figure (warm-up included, no interval). Says why in
    `notes` when either falls short; gives the source the rate came from."""
    if len(steady) >= 2:
        rate, draws = cell_draws(steady, seed_for("cell", record.label))
        return rate, source, draws
    if recorded:
        notes.append(f"warm-up ({warmup} tokens) leaves {len(steady)} of {recorded} "
                     f"tokens: no steady window")
    if record.status != "ok":
        return None, source, None
    tps = record.tokens_per_s if record.tokens_per_s is not None else _float(
        summary.tok_per_s)
    if tps is None:
        notes.append("no throughput recorded")
        return None, source, None
    if source == "none":
        if summary.engine == "llama-completion":
            notes.append("llama-completion gives no per-token times: tok/s from its `eval "
                         "time` line (the decode after the first token), no interval within "
                         "the cell; only the cell-level statistics carry a verdict on it")
        else:
            notes.append("no per-token times (neither per_token in summary.json nor "
                         "tokens.csv): tok/s from the summary, warm-up included, no interval")
        source = "summary"
    return Interval(tps, math.nan, math.nan), source, None


def _work_per_token(files: CellFiles, start: int, steady: np.ndarray,
                    summary: RunSummary, threads: int | None) -> CellWork:
    """The cell's `CellWork`: reads, cache, stalls, compute, faults, occupancy, drops,
    speculation."""
    cols = files.columns

    def mean(key: str) -> float | None:
        return _per_token_mean(cols, key, start)

    def per_token_or(key: str, figure: float | None, scale: float = 1.0) -> float | None:
        value = mean(key)
        if value is None and figure is not None:
            value = scale * float(figure)
        return value

    decode_rate, decode = _decode(cols, start)
    if decode is not None:
        steady = decode  # occupancy: CPU time over the decode's own time
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
    return CellWork(
        read_mib_per_token=read / 2**20 if read is not None
        else _float(summary.read_mib_per_tok),
        hit_pct=_hit_pct(mean(tokens.HITS), mean(tokens.MISSES), cols, summary),
        stall_ms_per_token=per_token_or(tokens.STALL_MS, summary.stall_s_per_tok, 1000.0),
        compute_ms_per_token=per_token_or(tokens.COMPUTE_MS, summary.compute_s_per_tok,
                                          1000.0),
        majflt_per_token=per_token_or(tokens.MAJFLT, summary.majflt_per_tok),
        cpu_occupancy=occ,
        drop_rate=dropped / routed if routed and dropped is not None else None,
        spec_read_mib_per_token=spec / 2**20 if spec is not None else None,
        spec_useful_pct=100.0 * su / se if se and su is not None else None,
        decode_tok_s=decode_rate, **_speculation(summary),
    )


def _decode(cols: dict[str, list[float]], start: int) -> tuple[float | None,
                                                                np.ndarray | None]:
    """The decode-only rate of the steady window, and its times, where the cell's tokens
    record the decode apart from the time between decodes (`tokens.DECODE_MS`)."""
    decode = cols.get(tokens.DECODE_MS)
    if decode is None or len(decode) <= start:
        return None, None
    window = np.asarray(decode[start:], dtype=float)  # (steady,)
    if not (np.all(np.isfinite(window)) and window.sum() > 0):
        return None, None
    return len(window) * 1000.0 / float(window.sum()), window


def _speculation(summary: RunSummary) -> dict[str, float | None]:
    """What a speculating run's trailer says its speed was bought with: the drafts its
    target accepted, the tokens per verify decode, route-ahead's agreement."""
    drafted, accepted = _float(summary.mtp_drafted), _float(summary.mtp_accepted)
    decodes, made = _float(summary.mtp_decodes), _float(summary.tokens)
    return {"accepted_pct": 100.0 * accepted / drafted if drafted and accepted is not None
            else None,
            "tokens_per_decode": made / decodes if decodes and made and drafted else None,
            "route_agree_pct": _float(summary.ra_agree_pct) if summary.ra_agree_pct else None}


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


def steady_rate(c: CellStats) -> float | None:
    """Point tokens/s of a cell, None when it has none."""
    if c.tokens_per_s is None:
        return None
    return c.tokens_per_s.estimate if math.isfinite(c.tokens_per_s.estimate) else None


__all__ = ["CapsState", "CellStats", "CellWork", "DeviceDuring", "cell_stats", "device_during",
           "sensor_gaps", "steady_rate", "tokens_per_s"]
