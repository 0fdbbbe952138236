"""Drift (every sentinel against its twin) and contamination tells (cells whose numbers
the device, not the configuration, may have moved).

A sentinel repeats an earlier cell's configuration. Equal fingerprints mean equal work, so
a speed ratio whose 95% interval lies wholly outside `1 ± probe_tol` is *device drift*,
attributed to what the timeline shows between the twins. Unequal fingerprints mean the
workload is not deterministic in that configuration, and its speed says nothing about the
device.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import tolerances
from abbench.analysis.stats import Interval, ratio_interval, seed_for
from abbench.records import CellRecord, MatchSpec

COMPUTE_RISE = 1.10  # compute/token up by more than 10% ...
OCCUPANCY_FALL = 0.85  # CPU occupancy below 85% of the comparable cell's
# "majflt/token jumps an order of magnitude between cells that should do comparable work":
# the authors' own canonical case is 149 -> 1189 (8x), so the tell fires from 5x (half an
# order of magnitude and more), where a 10x threshold missed it.
MAJFLT_FACTOR = 5.0
MAJFLT_FLOOR = 1.0  # ... and at least one major fault per token, so 0.01 vs 0.001 is quiet


@dataclass(frozen=True)
class Drift:
    sentinel: int
    twin: int
    fingerprints: str  # "equal" | "different" | "not recorded"
    ratio: Interval | None  # sentinel tok/s / twin tok/s
    verdict: str  # "drift" | "stable" | "not deterministic" | "unreadable"
    attribution: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class Tell:
    cell: int | None  # None: the campaign as a whole
    kind: str  # compute_up_work_down | majflt | occupancy_fall | entry_degrading | drops
    detail: str


def _capped_from(cells: list[CellStats], upto: int) -> list[str]:
    """For each policy capped by cell `upto`: "policyN capped from cell k (X → Y GHz)"; for
    a cap recorded without its hardware maximum, the cell it was first seen at and that
    the maximum is unknown (never "at max")."""
    out: list[str] = []
    first: dict[str, int] = {}
    lowest: dict[str, int] = {}
    hw: dict[str, int] = {}
    blind: dict[str, tuple[int, int]] = {}  # policy -> (first cell, lowest cap)
    for c in cells:
        if c.index > upto:
            break
        hw.update(c.during.hw_max_khz)
        for st in c.during.caps_states:
            for p, cap in st:
                if p in hw and cap < hw[p]:
                    first.setdefault(p, c.index)
                    lowest[p] = min(lowest.get(p, cap), cap)
                elif p not in hw:
                    at, low = blind.get(p, (c.index, cap))
                    blind[p] = (at, min(low, cap))
    for p in sorted(first):
        out.append(f"{p} capped from cell {first[p] + 1} "
                   f"({hw[p] / 1e6:.2f} → {lowest[p] / 1e6:.2f} GHz)")
    for p, (at, low) in sorted(blind.items()):
        if p not in hw:
            out.append(f"{p} cap {low / 1e6:.2f} GHz first seen at cell {at + 1}, hardware "
                       "max unknown (capped or not cannot be told)")
    return out


def attribute(cells: list[CellStats], rec: dict[int, CellRecord], twin: int, sentinel: int,
              match: MatchSpec) -> list[str]:
    """What the timeline shows changed between `twin` and `sentinel`."""
    tol = tolerances(match)
    out = _capped_from(cells, sentinel)
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
    fa = next(c for c in cells if c.index == twin).during.mem_available_floor_mib
    fb = next(c for c in cells if c.index == sentinel).during.mem_available_floor_mib
    if fa is not None and fb is not None and fb < fa * (1 - tol["mem_available_tol_frac"]):
        out.append(f"MemAvailable floor fell {fa:.0f} → {fb:.0f} MiB")
    if ea.probe_index is not None and eb.probe_index is not None \
            and ea.probe_index - eb.probe_index > tol["probe_tol"]:
        out.append(f"speed probe index fell {ea.probe_index:.2f} → {eb.probe_index:.2f}")
    return out


def sentinel_drift(cells: list[CellStats], rec: dict[int, CellRecord],
                   match: MatchSpec) -> list[Drift]:
    """Every sentinel against its twin: fingerprints, speed ratio, and the verdict."""
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
        if s.steady_tokens >= 2 and t.steady_tokens >= 2:
            ratio = ratio_interval(s.window(), t.window(), seed_for("ratio", s.label, t.label))
        else:
            ratio = Interval(s.tokens_per_s.estimate / t.tokens_per_s.estimate,  # type: ignore[union-attr]
                             math.nan, math.nan)
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


def model_of(c: CellStats) -> str | None:
    """The model a cell ran (its configuration's `model`), None when it does not say."""
    if not c.config_key:
        return None
    try:
        model = json.loads(c.config_key).get("model")
    except (ValueError, AttributeError):
        return None
    return str(model) if model is not None else None


def _comparables(c: CellStats, cells: list[CellStats],
                 order_known: bool = True) -> list[CellStats]:
    """The cells `c` is held against: the one before it (when the order is known), and
    earlier runs of its configuration — only cells of the same model: a tell across models
    would read a treatment effect as a slower CPU."""
    prev = [x for x in cells if order_known and x.index == c.index - 1 and x.ok]
    same = [x for x in cells if x.index < c.index and x.name == c.name and x.ok]
    return [x for x in prev + [x for x in same if x not in prev] if model_of(x) == model_of(c)]


def contamination_tells(cells: list[CellStats], rec: dict[int, CellRecord],
                        match: MatchSpec | None = None,
                        order_known: bool = True) -> list[Tell]:
    """Flags, each with the numbers behind it (thresholds are the module constants)."""
    out: list[Tell] = []
    for c in cells:
        if not c.ok:
            continue
        for r in _comparables(c, cells, order_known):
            ref = f"cell {r.index + 1} ({r.name})"
            if (c.compute_ms_per_token and r.compute_ms_per_token
                    and c.read_mib_per_token is not None and r.read_mib_per_token is not None
                    and c.compute_ms_per_token > COMPUTE_RISE * r.compute_ms_per_token
                    and c.read_mib_per_token <= r.read_mib_per_token):
                out.append(Tell(c.index, "compute_up_work_down",
                                f"compute {c.compute_ms_per_token:.1f} ms/token vs "
                                f"{r.compute_ms_per_token:.1f} in {ref} while flash reads fell "
                                f"{r.read_mib_per_token:.2f} → {c.read_mib_per_token:.2f} "
                                "MiB/token: slower at the same or less work — a slower CPU"))
            if (c.majflt_per_token is not None and r.majflt_per_token is not None
                    and c.majflt_per_token >= MAJFLT_FLOOR
                    and c.majflt_per_token > MAJFLT_FACTOR * r.majflt_per_token):
                out.append(Tell(c.index, "majflt",
                                f"{c.majflt_per_token:.1f} major faults/token vs "
                                f"{r.majflt_per_token:.2f} in {ref}: memory pressure"))
            if (c.cpu_occupancy is not None and r.cpu_occupancy
                    and c.cpu_occupancy < OCCUPANCY_FALL * r.cpu_occupancy):
                out.append(Tell(c.index, "occupancy_fall",
                                f"CPU occupancy {c.cpu_occupancy:.0%} vs "
                                f"{r.cpu_occupancy:.0%} in {ref}: threads waiting or "
                                "descheduled"))
        if c.drop_rate:
            out.append(Tell(c.index, "drops",
                            f"drops {c.drop_rate:.1%} of routed experts: quote its drop rate "
                            "next to its speed (it does less work per token)"))
    if order_known:
        out.extend(_degrading(cells, rec, match))
    return out


def _degrading(cells: list[CellStats], rec: dict[int, CellRecord],
               match: MatchSpec | None = None) -> list[Tell]:
    """Entry state getting worse at every cell, over three or more cells in run order, by
    more than the matching tolerance in all (a 13 MiB slide of 128 GiB is not a tell)."""
    ran = [c for c in cells if c.index in rec]
    ents = [rec[c.index].entry for c in ran]
    if len(ents) < 3:
        return []
    tol = tolerances(match or MatchSpec())
    mem0 = next((e.mem_available_mib for e in ents if e.mem_available_mib is not None), None)
    out: list[Tell] = []
    series = {  # values, direction of worse, unit, decimals, the change that counts
        "CPU temperature": ([e.cpu_temp_c for e in ents], 1, " °C", 1, tol["cpu_temp_tol_c"]),
        "battery temperature": ([e.battery_temp_c for e in ents], 1, " °C", 1,
                                tol["battery_temp_tol_c"]),
        "MemAvailable": ([e.mem_available_mib for e in ents], -1, " MiB", 0,
                         (mem0 or 0.0) * tol["mem_available_tol_frac"]),
        "speed probe index": ([e.probe_index for e in ents], -1, "", 2, tol["probe_tol"]),
        "capped policies": ([float(len([p for p, cap in e.caps_khz.items()
                                       if p in e.hw_max_khz and cap < e.hw_max_khz[p]]))
                             if e.caps_khz else None for e in ents], 1, "", 0, 0.0),
        # What the cells left behind, in run order (the seed's 2026-07-17 matrix: the free
        # RAM floor and the major faults degraded with position, not with configuration).
        "free-RAM floor during the cell": ([c.during.mem_available_floor_mib for c in ran],
                                           -1, " MiB", 0,
                                           (mem0 or 0.0) * tol["mem_available_tol_frac"]),
        "major faults per token": ([c.majflt_per_token for c in ran], 1, "", 0,
                                   MAJFLT_FLOOR),
    }
    for what, (vals, sign, unit, decimals, counts) in series.items():
        if any(v is None for v in vals):
            continue
        steps = [sign * (b - a) for a, b in zip(vals, vals[1:], strict=False)]  # type: ignore[operator]
        if all(s > 0 for s in steps) and sum(steps) > counts:
            shown = " → ".join(f"{v:.{decimals}f}" for v in vals)  # type: ignore[str-format]
            at = "" if what.endswith(("cell", "token")) else " at entry"
            out.append(Tell(None, "entry_degrading",
                            f"{what}{at} worsened at every cell in run order "
                            f"({shown}{unit}): later cells ran on a worse device — "
                            "compare only matched pairs, or add a [gate]"))
    return out
