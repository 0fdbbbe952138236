"""Drift: every sentinel against its twin (the contamination tells are `tells`).

A sentinel repeats an earlier cell's configuration. Equal fingerprints mean equal work, so
a speed ratio whose 95% interval lies wholly outside `1 ± probe_tol` is *device drift*,
attributed to what the timeline shows between the twins. Unequal fingerprints mean the
workload is not deterministic in that configuration, and its speed says nothing about the
device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import tolerances
from abbench.analysis.readings import cap_readings
from abbench.analysis.stats import Interval, ratio_interval, ratio_of_draws, seed_for
from abbench.records import CellRecord, MatchSpec


@dataclass(frozen=True)
class Drift:
    sentinel: int
    twin: int
    fingerprints: str  # "equal" | "different" | "not recorded"
    ratio: Interval | None  # sentinel tok/s / twin tok/s
    verdict: str  # "drift" | "stable" | "not deterministic" | "unreadable"
    attribution: tuple[str, ...]
    summary: str


def capped_from(cells: list[CellStats], upto: int) -> list[str]:
    """For each policy capped by cell `upto`: "policyN capped from cell k (X → Y GHz)", k the
    cell whose entry, span, end or exit holds the first capped reading and Y the lowest cap
    read there; the lowest of all with the cell it was read at, when that is another
    (`readings.cap_readings`). A cap recorded without its hardware maximum: where it was
    first seen, and that the maximum is unknown (never "at max")."""
    ran = [c for c in cells if c.index <= upto]
    hw = {p: v for c in ran for p, v in c.during.hw_max_khz.items()}
    first: dict[str, tuple[str, int]] = {}  # policy -> (where, its lowest cap there)
    lowest: dict[str, tuple[str, int]] = {}
    for c in ran:
        for where, st in cap_readings(c.index, c.during.around, c.during.during_caps):
            for p, cap in st:
                if p in hw and cap >= hw[p]:
                    continue
                at, low = first.setdefault(p, (where, cap))
                if at == where and cap < low:
                    first[p] = (where, cap)
                if cap < lowest.get(p, (where, cap + 1))[1]:
                    lowest[p] = (where, cap)
    out: list[str] = []
    for p in sorted(first, key=lambda p: (p not in hw, p)):
        (at, cap), (low_at, low) = first[p], lowest[p]
        more = f", lowest {low / 1e6:.2f} GHz at {low_at}" if low_at != at else ""
        if p in hw:
            out.append(f"{p} capped from {at} ({hw[p] / 1e6:.2f} → {cap / 1e6:.2f} GHz){more}")
        else:
            out.append(f"{p} cap {cap / 1e6:.2f} GHz first seen at {at}{more}, hardware max "
                       "unknown (capped or not cannot be told)")
    return out


def attribute(cells: list[CellStats], rec: dict[int, CellRecord], twin: int, sentinel: int,
              match: MatchSpec) -> list[str]:
    """What the timeline shows changed between `twin` and `sentinel`."""
    tol = tolerances(match)
    out = capped_from(cells, sentinel)
    a, b = rec.get(twin), rec.get(sentinel)
    if a is None or b is None:
        return out
    ea, eb = a.entry, b.entry
    if ea.cpu_temp_c is not None and eb.cpu_temp_c is not None \
            and eb.cpu_temp_c - ea.cpu_temp_c > tol["cpu_temp_tol_c"]:
        out.append(f"CPU temperature at entry rose {ea.cpu_temp_c:.1f} → {eb.cpu_temp_c:.1f} °C")
    if ea.battery_temp_c is not None and eb.battery_temp_c is not None \
            and eb.battery_temp_c - ea.battery_temp_c > tol["battery_temp_tol_c"]:
        out.append(f"battery temperature at entry rose {ea.battery_temp_c:.1f} → "
                   f"{eb.battery_temp_c:.1f} °C")
    by = {c.index: c for c in cells}
    fa = by[twin].during.mem_available_floor_mib
    fb = by[sentinel].during.mem_available_floor_mib
    if fa is not None and fb is not None and fb < fa * (1 - tol["mem_available_tol_frac"]):
        out.append(f"MemAvailable floor fell {fa:.0f} → {fb:.0f} MiB")
    if ea.probe_index is not None and eb.probe_index is not None \
            and ea.probe_index - eb.probe_index > tol["probe_tol"]:
        out.append(f"speed probe index fell {ea.probe_index:.2f} → {eb.probe_index:.2f}")
    return out


def _twin_ratio(s: CellStats, t: CellStats) -> Interval:
    """The sentinel's speed over its twin's, with its interval where both have per-token
    times (NaN bounds where not)."""
    if s.draws is not None and t.draws is not None:
        return ratio_of_draws(s.window(), t.window(), s.draws, t.draws)
    if s.steady_tokens >= 2 and t.steady_tokens >= 2:
        return ratio_interval(s.window(), t.window(), seed_for("ratio", s.label, t.label))
    return Interval(s.tokens_per_s.estimate / t.tokens_per_s.estimate,  # type: ignore[union-attr]
                    math.nan, math.nan)


def sentinel_drift(cells: list[CellStats], rec: dict[int, CellRecord],
                   match: MatchSpec, order_known: bool = True) -> list[Drift]:
    """Every sentinel against its twin: fingerprints, speed ratio, and the verdict. With
    the order unknown (an import that recorded none) no drift is read: which of the two ran
    first is what a drift says, and nothing says it."""
    by = {c.index: c for c in cells}
    tol = match.probe_tol
    out: list[Drift] = []
    for s in cells:
        if s.sentinel_of is None or s.sentinel_of not in by:
            continue
        t = by[s.sentinel_of]
        if not (s.ok and t.ok):
            out.append(Drift(s.index, t.index, "not recorded", None, "unreadable", (),
                             f"sentinel cell {s.index + 1} or its twin cell {t.index + 1} "
                             "did not finish with a throughput"))
            continue
        if s.fingerprint is None or t.fingerprint is None:
            fp = "not recorded"
        else:
            fp = "equal" if s.fingerprint == t.fingerprint else "different"
        ratio = _twin_ratio(s, t)
        delta = f"{ratio.estimate - 1:+.1%}"
        if math.isfinite(ratio.low):
            delta += f" (95% CI {ratio.low - 1:+.1%} .. {ratio.high - 1:+.1%})"
        beyond = math.isfinite(ratio.low) and ratio.excludes(1 - tol, 1 + tol)
        attribution: tuple[str, ...] = ()
        if fp == "different":
            verdict = "not deterministic"
            summary = (f"{s.name}: fingerprints differ between cells {t.index + 1} and "
                       f"{s.index + 1} — the workload is not deterministic in that "
                       f"configuration, so its speed ({delta}) says nothing about the device")
        elif not order_known:
            verdict = "unreadable"
            summary = (f"{s.name}: cells {t.index + 1} and {s.index + 1} differ by {delta}, "
                       "but the order they ran in is unknown: which ran first, and so "
                       "whether the device drifted, cannot be told")
        elif beyond:
            verdict = "drift"
            work = "with identical work" if fp == "equal" else "(fingerprints not recorded)"
            if ratio.estimate < 1:
                attribution = tuple(attribute(cells, rec, t.index, s.index, match))
                why = ("; ".join(attribution) if attribution else
                       "nothing in the recorded timeline explains it (background load?)")
            else:  # what slows a device cannot explain it running faster
                why = ("the device ran faster at the end: the opening cell was the slowed "
                       "one (a warm start, background load, or a machine still settling)")
            summary = (f"device drift: {s.name} ran {delta} at cell {s.index + 1} against "
                       f"cell {t.index + 1} {work}; {why}")
        elif not math.isfinite(ratio.low):
            verdict = "unreadable"
            summary = (f"{s.name}: {delta} at cell {s.index + 1} against cell {t.index + 1}; "
                       "no per-token times, so no interval")
        else:
            verdict = "stable"
            summary = (f"{s.name}: {delta} at cell {s.index + 1} against cell {t.index + 1}, "
                       f"interval reaches into 1 ± {tol:g}: no drift shown"
                       + (" (identical work)" if fp == "equal" else ""))
        out.append(Drift(s.index, t.index, fp, ratio, verdict, attribution, summary))
    return out


__all__ = ["Drift", "attribute", "capped_from", "sentinel_drift"]
