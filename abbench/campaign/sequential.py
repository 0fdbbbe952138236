"""Sequential campaigns (`[campaign] until = "decided"`): the rounds appended after the
planned order, and whether one more fits the budget.

A round is an ABBA of every open decision — baseline, candidate, candidate, baseline — so
each round is balanced over both orders and its baselines are sentinels. Where the campaign
(or the round before) ended with that decision's baseline, the round starts with the
candidate instead: the baseline that ended one block opens the next, as in `order =
"abba"`. In an interleaved campaign a round is two more pairs of each open decision, the
first started by the arm that did not start that decision's last pair, the second by the
other (`interleaved_round`): ABBA blocks of invocations. The looks' boundaries and the
alpha each tests at are the analysis's (`analysis.sequential`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from abbench.records import Look, Plan


def next_round(last: str | None, open_decisions: Sequence[tuple[str, str]]) -> list[str]:
    """Cell names of one round for the open (candidate, baseline) decisions, after a
    campaign whose last cell was `last`."""
    names: list[str] = []
    for candidate, baseline in open_decisions:
        block = [baseline, candidate, candidate, baseline]
        before = names[-1] if names else last
        names += block[1:] if before == baseline else block
    return names


def interleaved_round(pairs: Sequence[tuple[str, str]],
                      open_decisions: Sequence[tuple[str, str]]) -> list[str]:
    """Cell names of one round for the open (candidate, baseline) decisions, as pairs (the
    one taking the first turn first), after the interleaved `pairs` (first, second) run or
    planned so far."""
    done = list(pairs)
    names: list[str] = []
    for candidate, baseline in open_decisions:
        last = next((p for p in reversed(done) if set(p) == {candidate, baseline}), None)
        first, second = (candidate, baseline) if last == (baseline, candidate) else \
            (baseline, candidate)
        done += [(first, second), (second, first)]
        names += [first, second, second, first]
    return names


def fits(cells: int, more: int, max_cells: int | None, elapsed_s: float,
         max_minutes: float | None) -> bool:
    """Whether `more` cells fit a budget of `max_cells` cells and `max_minutes` wall
    minutes, after `cells` cells in `elapsed_s` (a round is estimated at the mean time per
    cell so far, spacing and gate waits included)."""
    if max_cells is not None and cells + more > max_cells:
        return False
    if max_minutes is not None and cells > 0:
        per_cell = elapsed_s / cells
        if elapsed_s + more * per_cell > max_minutes * 60.0:
            return False
    return True


def fraction(cells: int, max_cells: int | None, elapsed_s: float,
             max_minutes: float | None) -> float:
    """The share of the budget used: cells or minutes, whichever is further along."""
    parts = []
    if max_cells is not None:
        parts.append(cells / max_cells)
    if max_minutes is not None:
        parts.append(elapsed_s / (max_minutes * 60.0))
    return min(1.0, max(parts, default=1.0))


@dataclass(frozen=True)
class LookOutcome:
    """What a look found: the look as the plan records it, the decisions still open, and
    lines for the live view (each decision's interval at this look)."""

    look: Look
    open: tuple[tuple[str, str], ...]  # (candidate, baseline)
    lines: tuple[str, ...] = ()


# (run folder, plan so far, budget fraction used, final?) -> what the look found
LookFn = Callable[[Path, Plan, float, bool], LookOutcome]
