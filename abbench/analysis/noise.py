"""Cell-to-cell noise: how far the next identical cell lands
(docs/method.md#the-cell-is-the-unit-of-evidence).

A *repeat group* is a set of cells of one configuration (`records.config_key`) that did
equal work (equal fingerprints) and are *comparable* to each other: every device criterion
of a matched pair held between them (caps, temperatures, memory, speed probe, thermal
status, other processes' CPU load, no gate give-up), adjacency and gap aside. Groups are
built greedily in execution order: a cell joins the first group all of whose members it is
comparable with. Their pooled variance of log tokens/s is the campaign's estimate of
cell-to-cell noise (`stats.pooled_noise`); a difference between repeats that a sensor
explains (a cap, a hotter entry, a burst of foreign load) is not noise and is kept out,
while one that no sensor explains (load the device cannot attribute, placement, heat the
sensors do not see) is exactly what the estimate is for.

The device history (`sentinels/DEVICE.jsonl`) keeps every campaign's repeats
(`records.RepeatRecord`); `history_noise` pools the newest of them into the device's noise
floor, and `combine_noise` decides how it joins this campaign's own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import Matches, PairMatch
from abbench.analysis.stats import UNKNOWN_NOISE, Noise, combine_noise, pooled_noise
from abbench.records import NoiseFloor, RepeatRecord

# Criteria that say nothing about the device: two repeats far apart in the run are still
# evidence of how far identical cells land.
NOT_DEVICE = ("adjacent", "gap")
HISTORY_MAX_DF = 30  # the floor pools the newest campaigns' repeats up to this many df


def comparable(m: PairMatch) -> bool:
    """Every device criterion of the pair held or was not measured (adjacency and gap
    aside), and both cells finished with a throughput."""
    return all(c.status != "fail" for c in m.criteria if c.name not in NOT_DEVICE)


def cell_log_rate(c: CellStats) -> float:
    """log tokens/s of a cell's steady window (its summary's tok/s when it has no window)."""
    if c.log_rate is not None:
        return c.log_rate
    est = c.tokens_per_s.estimate if c.tokens_per_s is not None else math.nan
    return math.log(est) if math.isfinite(est) and est > 0 else math.nan


def repeat_groups(cells: Sequence[CellStats], matches: Matches) -> list[list[CellStats]]:
    """Groups of comparable cells with equal configuration and equal work, each in
    execution order (see the module docstring); only groups of two or more cells. A cell
    joins every group it is comparable with some member of (the first such member ends
    the search: pairs are matched as they are read, `matching.PairMatches`)."""
    groups: dict[tuple[str, str], list[list[CellStats]]] = defaultdict(list)
    for c in cells:
        if not c.ok or c.fingerprint is None or c.config_key is None \
                or not math.isfinite(cell_log_rate(c)):
            continue
        options = groups[(c.config_key, c.fingerprint)]
        linked = [g for g in options
                  if any(comparable(matches[(m.index, c.index)]) for m in g)]
        if len(linked) == 1 and linked[0][-1].index < c.index:  # the usual case: in order
            linked[0].append(c)
            continue
        merged = sorted([m for g in linked for m in g] + [c], key=lambda x: x.index)
        ids = {id(g) for g in linked}
        options[:] = [g for g in options if id(g) not in ids] + [merged]
    out = [g for gs in groups.values() for g in gs if len(g) >= 2]
    return sorted(out, key=lambda g: g[0].index)


def with_cells(groups: Sequence[Sequence[CellStats]], compared: Sequence[CellStats]
               ) -> list[list[CellStats]]:
    """The repeat groups with every cell a decision compares in one of them, so that the
    noise its verdict uses sees every cell the verdict uses: a compared cell that no group
    holds (it was not comparable with its repeats: a burst of load that slowed it, which
    the sensors did not tell apart from its partner) joins the group of its configuration
    and work nearest to it in execution order, or forms one with the other such cells of
    its configuration and work. Without this, a burst spanning two consecutive cells of one
    arm is in the ratio and not in the noise: the interval is narrow around a false effect.
    """
    out = [list(g) for g in groups]
    held = {c.index for g in out for c in g}
    loose: dict[tuple[str, str], list[CellStats]] = defaultdict(list)
    for c in compared:
        if c.index in held or c.fingerprint is None or c.config_key is None \
                or not math.isfinite(cell_log_rate(c)):
            continue
        key = (c.config_key, c.fingerprint)
        mates = [g for g in out if (g[0].config_key, g[0].fingerprint) == key]
        if mates:
            nearest = min(mates, key=lambda g: min(abs(m.index - c.index) for m in g))
            nearest.append(c)
            nearest.sort(key=lambda x: x.index)
        else:
            loose[key].append(c)
        held.add(c.index)
    out += [sorted(g, key=lambda x: x.index) for g in loose.values() if len(g) >= 2]
    return sorted(out, key=lambda g: g[0].index)


def campaign_noise(groups: list[list[CellStats]]) -> Noise:
    """The pooled cell-to-cell noise of this campaign's repeat groups."""
    return pooled_noise([[(cell_log_rate(c), c.token_variance) for c in g] for g in groups],
                        "this campaign")


def floor_noise(floor: NoiseFloor | None) -> Noise:
    """A run's snapshot of its device's noise floor as a `Noise` (unknown: no history)."""
    if floor is None or floor.df < 1:
        return UNKNOWN_NOISE
    return Noise(floor.variance, floor.df, floor.token_variance, floor.repeats,
                 "device history")


def noise_for(groups: list[list[CellStats]], floor: NoiseFloor | None) -> Noise:
    """The noise a decision uses: this campaign's repeats and the device's floor, combined
    (`stats.combine_noise`)."""
    return combine_noise(campaign_noise(groups), floor_noise(floor))


def repeat_records(cells: Sequence[CellStats], matches: Matches,
                   groups: list[list[CellStats]], *, device: str, run: str, campaign: str,
                   simulated: bool, t_start: dict[int, float]) -> list[RepeatRecord]:
    """Every repeat of the campaign, for the device history: consecutive members of each
    repeat group (counted), and every other pair of consecutive runs of one configuration
    (kept for the record, not counted), each with its log ratio and flags."""
    group_of = {c.index: g for g, members in enumerate(groups) for c in members}
    out: list[RepeatRecord] = []
    by_config: dict[str, list[CellStats]] = defaultdict(list)
    for c in cells:
        if c.ok and c.config_key is not None and math.isfinite(cell_log_rate(c)):
            by_config[c.config_key].append(c)

    def record(a: CellStats, b: CellStats, group: int | None) -> RepeatRecord:
        m = matches[(a.index, b.index)]
        return RepeatRecord(
            device=device, run=run, campaign=campaign, t_wall=t_start.get(b.index, 0.0),
            config_key=b.config_key or "", name=b.name, first=a.label, second=b.label,
            log_ratio=cell_log_rate(b) - cell_log_rate(a),
            token_variance_first=_finite_or_zero(a.token_variance),
            token_variance_second=_finite_or_zero(b.token_variance),
            fingerprints_equal=a.fingerprint is not None and a.fingerprint == b.fingerprint,
            matched=m.state == "matched", comparable=comparable(m), group=group,
            simulated=simulated)

    counted: set[tuple[int, int]] = set()
    for g, members in enumerate(groups):
        for a, b in zip(members, members[1:]):
            out.append(record(a, b, g))
            counted.add((a.index, b.index))
    for runs in by_config.values():
        for a, b in zip(runs, runs[1:]):
            if (a.index, b.index) not in counted and not (
                    group_of.get(a.index) is not None
                    and group_of.get(a.index) == group_of.get(b.index)):
                out.append(record(a, b, None))
    out.sort(key=lambda r: (r.t_wall, r.first, r.second))
    return out


def _finite_or_zero(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def history_floor(records: Sequence[RepeatRecord], history: str, t_wall: float,
                  max_df: int = HISTORY_MAX_DF) -> NoiseFloor:
    """The device's noise floor from its history: the repeat groups of the newest runs,
    pooled until `max_df` degrees of freedom (an older device state ages out)."""
    chains: dict[tuple[str, int], list[RepeatRecord]] = defaultdict(list)
    newest: dict[str, float] = {}
    for r in records:
        # A grouped record is counted as the campaign counted it: its two cells are in one
        # repeat group, linked through a member each is comparable with, though maybe not
        # comparable with each other (requiring that here dropped df the campaign's own
        # noise had, and left a calibration's floor empty when the probe was noisy).
        if r.group is None or not r.fingerprints_equal or not math.isfinite(r.log_ratio):
            continue
        chains[(r.run, r.group)].append(r)
        newest[r.run] = max(newest.get(r.run, 0.0), r.t_wall)
    groups: list[list[tuple[float, float]]] = []
    used: list[str] = []
    df = 0
    for run in sorted(newest, key=lambda k: -newest[k]):
        if df >= max_df:
            break
        for (r_run, _), chain in sorted(chains.items()):
            if r_run != run:
                continue
            rebuilt = _rebuild(chain)
            if len(rebuilt) >= 2:
                groups.append(rebuilt)
                df += len(rebuilt) - 1
        used.append(run)
    noise = pooled_noise(groups, "device history")
    if not noise.known:
        return NoiseFloor(history=history, t_wall=t_wall)
    return NoiseFloor(variance=noise.variance, df=noise.df, token_variance=noise.token_variance,
                      repeats=noise.repeats, campaigns=tuple(used), history=history,
                      t_wall=t_wall)


def _rebuild(chain: list[RepeatRecord]) -> list[tuple[float, float]]:
    """A group's cells (log rate relative to its first, token variance) from its records,
    which link consecutive members; a chain with a missing link is cut there."""
    by_first = {r.first: r for r in chain}
    seconds = {r.second for r in chain}
    starts = [r for r in chain if r.first not in seconds]
    if len(starts) != 1:
        return []
    r = starts[0]
    out = [(0.0, r.token_variance_first)]
    y = 0.0
    seen = set()
    while r is not None and r.first not in seen:
        seen.add(r.first)
        y += r.log_ratio
        out.append((y, r.token_variance_second))
        r = by_first.get(r.second)
    return out
