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
from statistics import median

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import tolerances
from abbench.analysis.readings import cap_readings, place
from abbench.analysis.stats import Interval, ratio_interval, seed_for
from abbench.records import CellRecord, MatchSpec, keys

COMPUTE_RISE = 1.10  # compute/token up by more than 10% ...
OCCUPANCY_FALL = 0.85  # CPU occupancy below 85% of the comparable cell's
# "majflt/token jumps an order of magnitude between cells that should do comparable work":
# the authors' own canonical case is 149 -> 1189 (8x), so the tell fires from 5x (half an
# order of magnitude and more), where a 10x threshold missed it.
MAJFLT_FACTOR = 5.0
MAJFLT_FLOOR = 1.0  # ... and at least one major fault per token, so 0.01 vs 0.001 is quiet
# The configuration key that moves major faults by orders of magnitude on its own (dense
# weights in the page cache vs anonymous memory: hundreds per token vs single digits), so a
# run without repeats is held only against its model's runs that agree on it.
FAULT_KEYS = ("dense_weights",)
# Keys of a configuration that name a session, not what ran. (An import's partial
# configuration carries its run's name as `run`, which keeps it from equalling any other.)
NOT_WORK = frozenset({"session"})
# The knobs that take work away and leave the kernels as they were — the authors' tell is
# "compute per token rises as top-k falls" — and the direction in which each does more work.
LESS_WORK = {"n_expert_used": 1, "drop_cold_frac": -1}


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
    # compute_up_work_down | majflt | occupancy_fall | entry_degrading | drops | capped_after
    kind: str
    detail: str


def _capped_from(cells: list[CellStats], upto: int) -> list[str]:
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


def capped_after(cells: list[CellStats]) -> list[Tell]:
    """A cap read after a cell or at its exit below the hardware maximum (the maximum
    unknown: below the cap the cell entered with): the device was throttling by the end of
    that cell, whatever its entry said. It needs no order and no other cell."""
    out: list[Tell] = []
    for c in cells:
        entry = next((r.caps_khz for r in c.during.around if r.position == keys.BEFORE), {})
        seen: dict[str, str] = {}
        for r in (r for r in c.during.around if r.position in (keys.AFTER, keys.EXIT)):
            for p, cap in sorted(r.caps_khz.items()):
                top = r.hw_max_khz.get(p, c.during.hw_max_khz.get(p))
                limit = top if top is not None else entry.get(p)
                if p in seen or limit is None or cap >= limit or not c.ok:
                    continue
                against = (f"hardware max {top / 1e6:.2f} GHz" if top is not None
                           else "hardware max unknown")
                if p in entry:
                    against += f", {entry[p] / 1e6:.2f} GHz at entry"
                seen[p] = f"{p} {cap / 1e6:.2f} GHz at {place(c.index, r.position)} ({against})"
        if seen:
            out.append(Tell(c.index, "capped_after", "; ".join(seen.values()) + ": throttled "
                            "by the end of the cell — its speed may be the device's, not its "
                            "configuration's"))
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


def _twin_ratio(s: CellStats, t: CellStats) -> Interval:
    """The sentinel's speed over its twin's, with its interval where both have per-token
    times (NaN bounds where not)."""
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


def model_of(c: CellStats) -> str | None:
    """The model a cell ran (its configuration's `model`), None when it does not say."""
    if not c.config_key:
        return None
    try:
        model = json.loads(c.config_key).get("model")
    except (ValueError, AttributeError):
        return None
    return str(model) if model is not None else None


def config_of(c: CellStats) -> dict[str, object]:
    """A cell's configuration as the tells compare it: its keys without the session (a
    folder of several sessions carries it; the same configuration in another session is
    still comparable work)."""
    if not c.config_key:
        return {}
    try:
        cfg = json.loads(c.config_key)
    except ValueError:
        return {}
    return {k: v for k, v in cfg.items() if k not in NOT_WORK} if isinstance(cfg, dict) else {}


def _reference(c: CellStats, cells: list[CellStats]) -> tuple[list[CellStats], str]:
    """The runs `c` is held against, and how they are named: the other runs of its model and
    configuration; a configuration with no other run, the model's runs that agree with it
    on the keys known to move major faults by orders of magnitude (`FAULT_KEYS`). A set,
    never a neighbour: which runs a tell flags does not depend on the order they ran in."""
    mine = config_of(c)
    model = [x for x in cells if x.ok and x.index != c.index and model_of(x) == model_of(c)]
    same = [x for x in model if config_of(x) == mine]
    if same:
        return same, "its configuration's other runs"
    like = [x for x in model if all(config_of(x).get(k) == mine.get(k) for k in FAULT_KEYS)]
    return like, "its model's other runs"


def _names(cells: list[CellStats]) -> str:
    shown = ", ".join(f"{x.index + 1}" for x in cells[:6])
    more = f" and {len(cells) - 6} more" if len(cells) > 6 else ""
    return f"cell{'s' if len(cells) > 1 else ''} {shown}{more}"


def _more_of_the_same(x: CellStats, c: CellStats) -> bool:
    """Whether `x` ran the same kernels as `c` with at least as much work: its model and
    configuration, but for the knobs that only take work away (`LESS_WORK`), where `x` takes
    away no more than `c`. Anything else that differs (a predictor's GEMV, overlap, a
    partial configuration's unknowns) can move compute on its own."""
    mine, theirs = config_of(c), config_of(x)
    if model_of(x) != model_of(c) or {k: v for k, v in theirs.items() if k not in LESS_WORK} \
            != {k: v for k, v in mine.items() if k not in LESS_WORK}:
        return False
    for key, sign in LESS_WORK.items():
        a, b = _number(theirs.get(key)), _number(mine.get(key))
        if (a is None) != (b is None) or (a is not None and sign * (a - b) < 0):  # type: ignore[operator]
            return False
    return True


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _cell_tells(c: CellStats, cells: list[CellStats]) -> list[Tell]:
    """The authors' two tells and the occupancy fall for one cell, each against the median
    of its reference runs (one contaminated reference run does not move a median of three)."""
    out: list[Tell] = []
    ref, what = _reference(c, cells)
    faults = [x for x in ref if x.majflt_per_token is not None]
    if c.majflt_per_token is not None and faults:
        m = median([x.majflt_per_token for x in faults])  # type: ignore[misc]
        if c.majflt_per_token >= MAJFLT_FLOOR and c.majflt_per_token > MAJFLT_FACTOR * m:
            out.append(Tell(c.index, "majflt",
                            f"{c.majflt_per_token:.1f} major faults/token vs {m:.2f} "
                            f"(the median of {what}: {_names(faults)}): memory pressure"))
    busy = [x for x in ref if x.cpu_occupancy]
    if c.cpu_occupancy is not None and busy:
        m = median([x.cpu_occupancy for x in busy])  # type: ignore[misc]
        if c.cpu_occupancy < OCCUPANCY_FALL * m:
            out.append(Tell(c.index, "occupancy_fall",
                            f"CPU occupancy {c.cpu_occupancy:.0%} vs {m:.0%} (the median of "
                            f"{what}: {_names(busy)}): threads waiting or descheduled"))
    if c.compute_ms_per_token and c.read_mib_per_token is not None:
        more = [x for x in cells if x.ok and x.index != c.index and _more_of_the_same(x, c)
                and x.compute_ms_per_token and x.read_mib_per_token is not None
                and x.read_mib_per_token >= c.read_mib_per_token]
        if more:
            m = median([x.compute_ms_per_token for x in more])  # type: ignore[misc]
            r = median([x.read_mib_per_token for x in more])  # type: ignore[misc]
            if c.compute_ms_per_token > COMPUTE_RISE * m:
                out.append(Tell(c.index, "compute_up_work_down",
                                f"compute {c.compute_ms_per_token:.1f} ms/token vs {m:.1f} (the "
                                "median of the runs of the same kernels with as much work or "
                                f"more: {_names(more)}) while flash reads were "
                                f"{c.read_mib_per_token:.2f} MiB/token against {r:.2f}: slower "
                                "at the same or less work — a slower CPU"))
    return out


def contamination_tells(cells: list[CellStats], rec: dict[int, CellRecord],
                        match: MatchSpec | None = None,
                        order_known: bool = True) -> list[Tell]:
    """Flags, each with the numbers behind it (thresholds are the module constants). The
    per-cell tells compare a cell with a set of runs of its model, so they are the same
    whatever order — known or not — the cells ran in; only the campaign-wide degradation
    needs the order."""
    out: list[Tell] = []
    for c in cells:
        if not c.ok:
            continue
        out.extend(_cell_tells(c, cells))
        if c.drop_rate:
            out.append(Tell(c.index, "drops",
                            f"drops {c.drop_rate:.1%} of routed experts: quote its drop rate "
                            "next to its speed (it does less work per token)"))
    out.extend(capped_after(cells))
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
