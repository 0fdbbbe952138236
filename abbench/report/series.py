"""The series report.html plots, computed once for the report model from the analysis and
the sampler's ticks: the device timeline, tokens/s per cell, per-token times. Sample keys
are named through `records.keys` only."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import abbench.report.text as t
from abbench.analysis.campaign import CampaignAnalysis
from abbench.errors import RecordError
from abbench.records import EntryState, Sample, keys, read_samples


@dataclass(frozen=True)
class Series:
    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]


@dataclass(frozen=True)
class Cap:
    series: Series  # MHz
    hw_max_mhz: float | None


@dataclass(frozen=True)
class Span:
    label: str  # "1 B"
    start: float  # seconds since the timeline's t0
    end: float
    gate_wait_s: float


@dataclass(frozen=True)
class Timeline:
    """The device over wall time, in seconds since t0 (the first tick or gate wait)."""

    t0: float
    caps: tuple[Cap, ...]  # per policy
    temperatures: tuple[Series, ...]  # CPU, battery: those sampled
    entry_cpu: Series | None  # each cell's entry reading
    entry_battery: Series | None
    mem: Series | None
    spans: tuple[Span, ...]
    empty: bool  # no cell recorded and no tick

    @property
    def missing(self) -> tuple[str, ...]:
        """The series not measured on this device."""
        temps = self.temperatures or self.entry_cpu or self.entry_battery
        return tuple(what for what, there in (("CPU caps", self.caps), ("temperatures", temps),
                                             ("MemAvailable", self.mem)) if not there)


@dataclass(frozen=True)
class RatePoint:
    number: int
    name: str
    estimate: float | None  # None: no data
    interval: tuple[float, float] | None  # the token-level 95% interval
    sentinel_of: int | None
    band: tuple[float, float] | None  # (bottom, height): where 95% of identical cells land


@dataclass(frozen=True)
class Rates:
    points: tuple[RatePoint, ...]
    band_label: str | None  # None: the cell-to-cell noise is unknown


def samples_of(run: Path) -> list[Sample]:
    """The run folder's sampler ticks; none where samples.jsonl is missing or unreadable
    (the timeline then says what was not measured)."""
    try:
        return read_samples(run)
    except RecordError:
        return []


def _series(label: str, samples: Sequence[Sample], key: str, t0: float,
            scale: float = 1.0) -> Series:
    """One sampled key's finite readings (divided by `scale`) at seconds since t0."""
    xs, ys = [], []
    for s in samples:
        v = s.values.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(s.t_wall - t0)
            ys.append(float(v) / scale)
    return Series(label, tuple(xs), tuple(ys))


def timeline(a: CampaignAnalysis, samples: Sequence[Sample]) -> Timeline:
    """Caps per policy, temperatures (sampled and at each cell's entry), MemAvailable and
    each cell's span and gate wait, from the sampler's ticks and the journal."""
    starts = [r.t_start_wall - r.gate.waited_s for r in a.records]
    t0 = min([s.t_wall for s in samples] + starts, default=0.0)
    caps = []
    for p in sorted({p for s in samples for p in keys.policies(s.values, "cap_khz")}):
        hw = _series("", samples, keys.hw_max_khz(p), t0).ys
        caps.append(Cap(_series(f"{p} cap", samples, keys.cap_khz(p), t0, 1000),
                        max(hw) / 1000 if hw else None))
    temps = tuple(x for x in (_series("CPU", samples, keys.CPU_TEMP_C, t0),
                              _series("battery", samples, keys.BATTERY_TEMP_C, t0)) if x.xs)

    def at_entry(label: str, reading: Callable[[EntryState], float | None]) -> Series | None:
        pts = [(r.t_start_wall - t0, v) for r in a.records if (v := reading(r.entry)) is not None]
        return Series(label, tuple(x for x, _ in pts), tuple(y for _, y in pts)) if pts else None

    mem = _series("MemAvailable", samples, keys.MEM_AVAILABLE_MIB, t0)
    spans = tuple(Span(f"{r.index + 1} {r.name}", r.t_start_wall - t0, r.t_end_wall - t0,
                       r.gate.waited_s) for r in a.records)
    return Timeline(t0, tuple(caps), temps, at_entry("entry CPU", lambda e: e.cpu_temp_c),
                    at_entry("entry battery", lambda e: e.battery_temp_c),
                    mem if mem.xs else None, spans, not a.records and not samples)


def rates(a: CampaignAnalysis) -> Rates:
    """tokens/s per cell with its token-level 95% interval and the cell-level band: where
    95% of identical cells would land at the campaign's cell-to-cell noise."""
    noise = a.noise
    points = []
    for c in a.cells:
        iv = c.tokens_per_s
        if iv is None or not t.finite(iv.estimate):
            points.append(RatePoint(c.index + 1, c.name, None, None, c.sentinel_of, None))
            continue
        band = None
        if noise.known:
            v = c.token_variance if math.isfinite(c.token_variance) else noise.token_variance
            half = 1.96 * math.sqrt(noise.between + v)
            band = (iv.estimate * math.exp(-half),
                    iv.estimate * (math.exp(half) - math.exp(-half)))
        interval = (iv.low, iv.high) if t.finite(iv.low) and t.finite(iv.high) else None
        points.append(RatePoint(c.index + 1, c.name, iv.estimate, interval, c.sentinel_of,
                                band))
    label = (f"where 95% of identical cells land (±{noise.sd:.1%} per cell)" if noise.known
             else None)
    return Rates(tuple(points), label)


def per_token(a: CampaignAnalysis) -> tuple[Series, ...]:
    """Each cell's steady-window wall time per token, at its decode token index."""
    out = []
    for c in a.cells:
        if c.wall_ms:
            off = c.tokens - c.steady_tokens
            out.append(Series(f"{c.index + 1} {c.name}",
                              tuple(range(off, off + len(c.wall_ms))), tuple(c.wall_ms)))
    return tuple(out)
