"""What a decision can be taken on: per metric, the cells, pairs and cell-to-cell noise it
is decided on, and the words its verdicts and reports use.

A decision reads every cell through its metric's `read`: speed reads the cells as they
are; energy reads each cell's tokens per joule (the inverse of its J/token, so that above 1
still favours the candidate) in place of its tokens/s, with the variance of its log
J/token as the token level, the cell level from this campaign's repeats of it (the device
history holds speed only), and only pairs whose cells both have an energy figure.

A new metric is its name in `records/plan.py` `METRICS` (plans and campaign files accept
it from there), one `Metric` in `BY_NAME` here, and its row in docs/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import Criterion, Matches, PairMatch, PairMatches
from abbench.analysis.noise import campaign_noise
from abbench.analysis.stats import Interval, Noise

# (cells, pairs, the repeat groups of those cells, the noise of speed) -> what the decision
# reads: the cells as the metric sees them, the pairs it may use, the noise of its figure
Read = Callable[[Sequence[CellStats], Matches, Sequence[Sequence[CellStats]], Noise],
                tuple[list[CellStats], Matches, Noise]]


@dataclass(frozen=True)
class Metric:
    name: str  # as plans and campaign files spell it
    read: Read
    worse: str  # a worse candidate, in a verdict's reason: "slower"
    verb: str  # "spec-2 ran 1.27 times faster than B"
    more: str  # the ratio above 1
    less: str  # the ratio below 1
    goal: str  # the question of `expect = "faster"`: "faster by 0.03"
    not_worse: str  # the question of `expect = "not-slower"`: "not slower by 0.1"


def _speed(cells: Sequence[CellStats], matches: Matches,
           groups: Sequence[Sequence[CellStats]], noise: Noise
           ) -> tuple[list[CellStats], Matches, Noise]:
    return list(cells), matches, noise


def _energy(cells: Sequence[CellStats], matches: Matches,
            groups: Sequence[Sequence[CellStats]], noise: Noise
            ) -> tuple[list[CellStats], Matches, Noise]:
    energy = [energy_view(c) for c in cells]
    known = {c.index: c for c in energy if c.ok}
    # The cell level from this campaign's repeats alone: the device history's floor is of
    # speed.
    energy_groups = [[known[c.index] for c in g if c.index in known] for g in groups]
    energy_noise = campaign_noise([g for g in energy_groups if len(g) >= 2])
    return energy, energy_matches(cells, matches), energy_noise


SPEED = Metric("tok_per_s", _speed, "slower", "ran", "faster", "slower", "faster",
               "not slower")
ENERGY = Metric("energy_per_token", _energy, "costlier in energy per token", "used",
                "less energy per token", "more energy per token", "J/token lower",
                "J/token not higher")
BY_NAME = {m.name: m for m in (SPEED, ENERGY)}


def metric(name: str) -> Metric:
    """The metric a decision names (speed for a name this version does not know: plans
    are checked against `records.plan.METRICS` when read)."""
    return BY_NAME.get(name, SPEED)


def energy_view(c: CellStats) -> CellStats:
    """The cell as an energy decision reads it: tokens per joule where its tokens/s was
    (higher is better, as for speed), the variance of its log J/token as its token level;
    no throughput where it has no energy figure."""
    j = c.energy.j_per_token
    if j is None or not (math.isfinite(j.estimate) and j.estimate > 0):
        return replace(c, tokens_per_s=None, log_rate=None, token_variance=math.nan)

    def inverse(x: float) -> float:
        return 1.0 / x if math.isfinite(x) and x > 0 else math.nan

    per_joule = Interval(inverse(j.estimate), inverse(j.high), inverse(j.low), j.level)
    return replace(c, tokens_per_s=per_joule, log_rate=-math.log(j.estimate),
                   token_variance=c.energy.log_variance)


def energy_matches(cells: Sequence[CellStats], matches: Matches) -> Matches:
    """The pairs an energy decision may read: a pair whose cell has no energy figure is
    unmatched for it, with the reason (the cell's note: charging, no power sensor)."""
    by = {c.index: c for c in cells}

    def for_energy(key: tuple[int, int], m: PairMatch) -> PairMatch:
        missing = [by[i] for i in key if i in by and not by[i].energy.known]
        if not missing:
            return m
        c = missing[0]
        detail = (f"no energy figure for cell {c.index + 1} ({c.name})"
                  + (f": {c.energy.note}" if c.energy.note else ": no power reading recorded"))
        crit = Criterion("energy", "fail", None, None, None, detail)
        return replace(m, state="unmatched", criteria=(*m.criteria, crit),
                       reasons=(*m.reasons, detail))

    if isinstance(matches, PairMatches):
        return matches.derived(for_energy)
    return {key: for_energy(key, m) for key, m in matches.items()}
