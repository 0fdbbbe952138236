"""Matched pairs (docs/method.md#what-a-matched-pair-is): two cells the campaign may compare.

A pair is matched when every criterion below holds; a criterion whose sensor recorded
nothing for either cell is "not measured" and neither holds nor fails. A sensor gap fails
its criterion: a reading present for one cell's entry and absent for the other's, or one
that a cell had and then lost in some of its samples (a sensor that vanished or read
garbage mid-cell: `DeviceDuring.gaps`) — nothing says the cells ran alike. Where no
device state was recorded anywhere in the run (imported runs), a pair that passes the rest
is *unverified*, never matched.

| criterion | holds when | tolerance key ([match]) |
|---|---|---|
| status | both cells finished ok with a throughput | |
| adjacent | consecutive in execution order | |
| gap | end of first to start of second <= max_gap_s, or they took turns | max_gap_s (900) |
| gate | the thermal gate gave up before neither cell | |
| caps | one cap set for the whole of both cells, the same one | |
| cpu_temp | entry CPU temperatures differ by <= tol | cpu_temp_tol_c (3.0) |
| battery_temp | entry battery temperatures differ by <= tol | battery_temp_tol_c (0.5) |
| mem_available | entry MemAvailable differs by <= tol x the larger | mem_available_tol_frac |
| probe | entry speed-probe indices differ by <= tol | probe_tol (0.03) |
| thermal_status | the same Android thermal status at entry | |
| stability | both cells' stability ratios >= min_stability (only when it is set) | min_stability |
| foreign_load | other processes' busy cores, cell means, differ by <= tol | foreign_load_tol |

The foreign load (`DeviceDuring.foreign_cores`, docs/method.md#foreign-load) is measured
over the whole cell, not at entry, and is a criterion where the plan sets its tolerance
(every campaign file's plan does, 0.25 cores unless told; plans written before it do not).
It is "not measured" when either cell lacks it (a remote device, a kernel without
/proc/stat): not a sensor gap that fails the pair, since a cell too short for a sampler
tick says nothing of its neighbour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from abbench.analysis.cells import CapsState, CellStats
from abbench.records import CellRecord, MatchSpec, keys

DEVICE_CRITERIA = ("caps", "cpu_temp", "battery_temp", "mem_available", "probe",
                   "thermal_status", "foreign_load")


@dataclass(frozen=True)
class Criterion:
    name: str
    status: str  # "ok" | "fail" | "not measured"
    first: Any  # the measured value for the earlier cell (JSON-able)
    second: Any
    tolerance: Any
    detail: str  # one line with the numbers


@dataclass(frozen=True)
class PairMatch:
    first: int  # cell index, earlier in execution order
    second: int
    state: str  # "matched" | "unverified" | "unmatched"
    criteria: tuple[Criterion, ...]
    reasons: tuple[str, ...]  # the failed criteria's details
    note: str | None = None  # e.g. matched on the speed probe only

    @property
    def comparable(self) -> bool:
        return self.state in ("matched", "unverified")


Pair = tuple[int, int]  # (earlier cell index, later cell index)


class PairMatches(Mapping[Pair, PairMatch]):
    """Every pair of a campaign's cells, each matched when it is first read (and kept): a
    report reads the adjacent pairs and a decision its arms' pairs, so a campaign (or an
    import) of n cells never builds all n(n-1)/2 of them. `(a, b)` and `(b, a)` are one
    pair; iterating gives every pair, earlier cell first, in index order."""

    def __init__(self, indexes: list[int], compute: Callable[[int, int], PairMatch]) -> None:
        self._indexes = sorted(indexes)
        self._known = set(self._indexes)
        self._compute = compute
        self._done: dict[Pair, PairMatch] = {}

    def _key(self, key: object) -> Pair | None:
        if not (isinstance(key, tuple) and len(key) == 2):
            return None
        a, b = key
        if a == b or a not in self._known or b not in self._known:
            return None
        return (a, b) if a < b else (b, a)

    def __getitem__(self, key: Pair) -> PairMatch:
        pair = self._key(key)
        if pair is None:
            raise KeyError(key)
        if pair not in self._done:
            self._done[pair] = self._compute(*pair)
        return self._done[pair]

    def __contains__(self, key: object) -> bool:
        return self._key(key) is not None

    def __iter__(self) -> Iterator[Pair]:
        for i, a in enumerate(self._indexes):
            for b in self._indexes[i + 1:]:
                yield (a, b)

    def __len__(self) -> int:
        n = len(self._indexes)
        return n * (n - 1) // 2

    def derived(self, change: Callable[[Pair, PairMatch], PairMatch]) -> PairMatches:
        """The same pairs, each as `change` makes it of this mapping's match when read."""
        return PairMatches(self._indexes, lambda a, b: change((a, b), self[(a, b)]))


Matches = Mapping[Pair, PairMatch]


def tolerances(match: MatchSpec) -> dict[str, float]:
    return match.to_json()


def _fmt_caps(st: CapsState) -> str:
    return ", ".join(f"{p} {cap / 1e6:.2f} GHz" for p, cap in st) or "none"


def _gap(what: str, keys: Callable[[str], bool], a: CellStats, b: CellStats) -> str | None:
    """The detail of the worst sensor gap among `keys` during either cell; None if none."""
    for c in (a, b):
        lost = {k: n for k, n in c.during.gaps.items() if keys(k)}
        if lost:
            key, n = max(lost.items(), key=lambda kn: kn[1])
            return (f"{what} sensor gap during cell {c.index + 1} ({c.label}): `{key}` "
                    f"missing from {n} of {c.during.samples} samples")
    return None


def _one_sided(name: str, what: str, x: Any, y: Any, tol: Any, a: CellStats,
               b: CellStats) -> Criterion:
    only = a if y is None else b
    other = b if y is None else a
    return Criterion(name, "fail", x, y, tol,
                     f"{what} measured for cell {only.index + 1} only: a sensor gap at "
                     f"cell {other.index + 1}'s entry")


def _caps(a: CellStats, b: CellStats) -> Criterion:
    sa, sb = a.during.caps_states, b.during.caps_states
    va = [_fmt_caps(s) for s in sa]
    vb = [_fmt_caps(s) for s in sb]
    gap = _gap("caps", lambda k: k.endswith(".cap_khz"), a, b)
    if gap:
        return Criterion("caps", "fail", va, vb, "equal", gap)
    if not sa and not sb:
        return Criterion("caps", "not measured", None, None, "equal",
                         "no cpufreq caps recorded")
    if not sa or not sb:
        return Criterion("caps", "fail", va, vb, "equal",
                         "caps recorded for one cell only")
    if len(sa) > 1 or len(sb) > 1:
        moving = a if len(sa) > 1 else b
        return Criterion("caps", "fail", va, vb, "equal",
                         f"caps changed during cell {moving.index + 1} ({moving.label}): "
                         + " → ".join(_fmt_caps(s) for s in moving.during.caps_states))
    if sa[0] != sb[0]:
        return Criterion("caps", "fail", va, vb, "equal",
                         f"caps differ: {va[0]} vs {vb[0]}")
    return Criterion("caps", "ok", va, vb, "equal", f"same caps: {va[0]}")


def _abs(name: str, unit: str, x: float | None, y: float | None, tol: float,
         a: CellStats, b: CellStats, key: str | None = None) -> Criterion:
    what = name.replace("_", " ")
    gap = _gap(what, lambda k: k == key, a, b) if key else None
    if gap:
        return Criterion(name, "fail", x, y, tol, gap)
    if x is None and y is None:
        return Criterion(name, "not measured", x, y, tol, f"{what} not measured")
    if x is None or y is None:
        return _one_sided(name, what, x, y, tol, a, b)
    d = abs(x - y)
    return Criterion(name, "ok" if d <= tol else "fail", x, y, tol,
                     f"{name.replace('_', ' ')} {x:.2f} vs {y:.2f}{unit}: "
                     f"differ by {d:.2f}{unit} ({'<=' if d <= tol else '>'} {tol:g}{unit})")


def _mem(x: float | None, y: float | None, frac: float, a: CellStats,
         b: CellStats) -> Criterion:
    gap = _gap("MemAvailable", lambda k: k == keys.MEM_AVAILABLE_MIB, a, b)
    if gap:
        return Criterion("mem_available", "fail", x, y, frac, gap)
    if x is None and y is None:
        return Criterion("mem_available", "not measured", x, y, frac,
                         "MemAvailable not measured")
    if x is None or y is None:
        return _one_sided("mem_available", "MemAvailable", x, y, frac, a, b)
    d = abs(x - y) / max(x, y, 1e-9)
    return Criterion("mem_available", "ok" if d <= frac else "fail", x, y, frac,
                     f"MemAvailable {x:.0f} vs {y:.0f} MiB: differ by {d:.1%} "
                     f"({'<=' if d <= frac else '>'} {frac:.0%})")


def match_pair(a: CellStats, b: CellStats, ra: CellRecord | None, rb: CellRecord | None,
               match: MatchSpec, device_state_recorded: bool,
               order_known: bool = True) -> PairMatch:
    """Every criterion of a matched pair for cells `a` and `b` (in any order). With the
    execution order unknown (an import that recorded none) no two cells are adjacent; with
    their times unknown the gap is not measured, and the pair is unverified at best."""
    if a.index > b.index:
        a, b, ra, rb = b, a, rb, ra
    ok = a.ok and b.ok
    crit = [Criterion("status", "ok" if ok else "fail", a.status, b.status, "ok",
                      "both cells ok" if ok else
                      f"cell {a.index + 1} {a.status}, cell {b.index + 1} {b.status}"),
            _adjacent(a, b, order_known)]
    if match.min_stability is not None:
        crit.append(_stability(a, b, match.min_stability))
    if ra is not None and rb is not None:
        crit += [_gap_between(a, b, ra, rb, match.max_gap_s), _gate(ra, rb),
                 *_entry_criteria(a, b, ra, rb, match)]
    state, note = _state(crit, device_state_recorded)
    disagree = _sensors_disagree(a, b, ra, rb)
    if disagree:
        note = f"{note}; {disagree}" if note else disagree
    reasons = tuple(c.detail for c in crit if c.status == "fail")
    return PairMatch(a.index, b.index, state, tuple(crit), reasons, note)


def _stability(a: CellStats, b: CellStats, least: float) -> Criterion:
    """Both cells held their speed: a required ratio that cannot be measured fails (too few
    steady tokens for two windows), since nothing shows the cell sustained it."""
    low = [c for c in (a, b) if c.stability is None or c.stability < least]
    detail = (f"stability {_ratio(a.stability)} and {_ratio(b.stability)} "
              f"({'>=' if not low else 'below'} the {least:g} required"
              + (f" at cell {', '.join(str(c.index + 1) for c in low)}" if low else "") + ")")
    return Criterion("stability", "fail" if low else "ok", a.stability, b.stability, least,
                     detail)


def _ratio(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.2f}"


def _adjacent(a: CellStats, b: CellStats, order_known: bool) -> Criterion:
    if not order_known:
        return Criterion("adjacent", "fail", None, None, 1,
                         "the execution order is unknown (nothing recorded it): no two "
                         "cells are known to be adjacent")
    adj = b.index - a.index == 1
    return Criterion("adjacent", "ok" if adj else "fail", a.index + 1, b.index + 1, 1,
                     f"cells {a.index + 1} and {b.index + 1}"
                     + (" are adjacent" if adj else " are not adjacent in execution order"))


def _gap_between(a: CellStats, b: CellStats, ra: CellRecord, rb: CellRecord,
                 max_gap_s: float) -> Criterion:
    gap = rb.t_start_wall - ra.t_end_wall
    if a.partner == b.index:
        return Criterion("gap", "ok", ra.t_end_wall, rb.t_start_wall, max_gap_s,
                         "the cells ran side by side, taking turns (interleaved slices)")
    if ra.t_end_wall <= 0 or rb.t_start_wall <= 0:  # 0: nothing recorded when it ran
        return Criterion("gap", "not measured", None, None, max_gap_s,
                         "the gap between the cells is unknown (nothing recorded when they "
                         "ran)")
    if gap < 0:
        return Criterion("gap", "fail", ra.t_end_wall, rb.t_start_wall, max_gap_s,
                         f"cell {b.index + 1} started {-gap:.0f} s before cell "
                         f"{a.index + 1} ended: the order or the times are wrong")
    return Criterion("gap", "ok" if gap <= max_gap_s else "fail", ra.t_end_wall,
                     rb.t_start_wall, max_gap_s,
                     f"{gap:.0f} s between the cells "
                     f"({'<=' if gap <= max_gap_s else '>'} {max_gap_s:g} s)")


def _gate(ra: CellRecord, rb: CellRecord) -> Criterion:
    gave = [r.index + 1 for r in (ra, rb) if r.gate.gave_up]
    return Criterion("gate", "fail" if gave else "ok", ra.gate.gave_up, rb.gate.gave_up,
                     False, f"the gate gave up before cell {gave[0]}" if gave
                     else "no gate give-up")


def _entry_criteria(a: CellStats, b: CellStats, ra: CellRecord, rb: CellRecord,
                    match: MatchSpec) -> list[Criterion]:
    """The device-state criteria: caps, temperatures, memory, probe, thermal status, and
    the foreign load where the plan asks for it."""
    ea, eb = ra.entry, rb.entry
    foreign = ([] if match.foreign_load_tol is None
               else [_foreign_load(a, b, match.foreign_load_tol)])
    return [
        _caps(a, b),
        _abs("cpu_temp", " °C", ea.cpu_temp_c, eb.cpu_temp_c, match.cpu_temp_tol_c, a, b,
             keys.CPU_TEMP_C),
        _abs("battery_temp", " °C", ea.battery_temp_c, eb.battery_temp_c,
             match.battery_temp_tol_c, a, b, keys.BATTERY_TEMP_C),
        _mem(ea.mem_available_mib, eb.mem_available_mib, match.mem_available_tol_frac, a, b),
        _abs("probe", "", ea.probe_index, eb.probe_index, match.probe_tol, a, b),
        _thermal_status(ea.thermal_status, eb.thermal_status, a, b),
        *foreign,
    ]


def _foreign_load(a: CellStats, b: CellStats, tol: float) -> Criterion:
    """Other processes took about as much CPU during both cells: a burst of background load
    on one side is a difference the ratio would otherwise credit to the configuration."""
    x, y = a.during.foreign_cores, b.during.foreign_cores
    if x is None or y is None:
        lacking = [c.index + 1 for c, v in ((a, x), (b, y)) if v is None]
        return Criterion("foreign_load", "not measured", x, y, tol,
                         "foreign load not measured at cell "
                         + " and ".join(str(i) for i in lacking))
    d = abs(x - y)
    held = d <= tol
    return Criterion("foreign_load", "ok" if held else "fail", x, y, tol,
                     f"foreign load {x:.2f} vs {y:.2f} cores: differ by {d:.2f} cores "
                     f"({'<=' if held else '>'} {tol:g} cores)")


def _thermal_status(x: Any, y: Any, a: CellStats, b: CellStats) -> Criterion:
    if x is None and y is None:
        return Criterion("thermal_status", "not measured", x, y, "equal",
                         "thermal status not measured")
    if x is None or y is None:
        return _one_sided("thermal_status", "thermal status", x, y, "equal", a, b)
    return Criterion("thermal_status", "ok" if x == y else "fail", x, y, "equal",
                     f"thermal status {x} vs {y}")


def _state(crit: list[Criterion], device_state_recorded: bool) -> tuple[str, str | None]:
    """matched, unverified (nothing failed, but the gap or the device state is unknown) or
    unmatched (a criterion failed); with what was not measured as the note."""
    if any(c.status == "fail" for c in crit):
        return "unmatched", None
    if any(c.name == "gap" and c.status == "not measured" for c in crit):
        return "unverified", ("the gap between the cells is unknown: the pair cannot be "
                              "verified as matched")
    measured = [c.name for c in crit if c.name in DEVICE_CRITERIA and c.status != "not measured"]
    if not device_state_recorded or not measured:
        return "unverified", "no device state recorded: the pair cannot be verified as matched"
    if measured == ["probe"]:
        return "matched", ("matched on the speed probe only: caps, temperatures and memory "
                           "not measured")
    absent = [c.name.replace("_", " ") for c in crit
              if c.name in DEVICE_CRITERIA and c.status == "not measured"]
    return "matched", ("not measured: " + ", ".join(absent)) if absent else None


def _sensors_disagree(a: CellStats, b: CellStats, ra: CellRecord | None,
                      rb: CellRecord | None) -> str | None:
    """When the CPU and battery sensors rank the two cells' entries the other way round:
    the CPU sensor decides (it governs throttling; the battery lags the SoC by minutes)."""
    if ra is None or rb is None:
        return None
    ea, eb = ra.entry, rb.entry
    if None in (ea.cpu_temp_c, eb.cpu_temp_c, ea.battery_temp_c, eb.battery_temp_c):
        return None
    dc = eb.cpu_temp_c - ea.cpu_temp_c  # type: ignore[operator]
    db = eb.battery_temp_c - ea.battery_temp_c  # type: ignore[operator]
    if dc * db >= 0 or abs(dc) < 0.5 or abs(db) < 0.5:
        return None
    hotter = b if dc > 0 else a
    return (f"the sensors disagree on which cell entered hotter: the battery says cell "
            f"{(b if db > 0 else a).index + 1} (by {abs(db):.1f} °C), the CPU says cell "
            f"{hotter.index + 1} (by {abs(dc):.1f} °C); the CPU sensor decides — it governs "
            "throttling, and the battery lags the SoC by minutes")


def device_state_recorded(records: list[CellRecord]) -> bool:
    """False when every entry state is empty (an imported run without device logs)."""
    for r in records:
        e = r.entry
        if (e.caps_khz or e.cpu_temp_c is not None or e.battery_temp_c is not None
                or e.mem_available_mib is not None or e.probe_index is not None
                or e.thermal_status is not None):
            return True
    return False
