"""`analyze(RUN)`: everything section 7 decides, from a run folder's records alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from abbench.analysis.cells import CellStats, cell_stats
from abbench.analysis.decide import Decision, decide, exit_status
from abbench.analysis.drift import Drift, Tell, _capped_from, contamination_tells, sentinel_drift
from abbench.analysis.matching import PairMatch, device_state_recorded, match_pair, tolerances
from abbench.analysis.stats import Interval, ratio_interval, seed_for
from abbench.records import CellRecord, Plan, RecordError, read_journal, read_plan, read_samples


@dataclass(frozen=True)
class CampaignAnalysis:
    run: Path
    plan: Plan
    records: tuple[CellRecord, ...]
    state: str  # status.json's state ("complete", "interrupted", "running") or "unknown"
    complete: bool  # every planned cell is in the journal
    simulated: bool
    device_state_recorded: bool
    tolerances: dict[str, float]
    cells: tuple[CellStats, ...]
    pairs: tuple[PairMatch, ...]  # adjacent cells in execution order
    drift: tuple[Drift, ...]
    tells: tuple[Tell, ...]
    caps_timeline: tuple[str, ...]  # "policyN capped from cell k (X → Y GHz)"
    decisions: tuple[Decision, ...]
    exit_status: int
    # Adjacent pairs with no device state at all (imported runs): second / first tok/s,
    # shown in their own table, never as a verdict.
    unverified_ratios: tuple[tuple[int, int, Interval], ...] = ()


def _state(run: Path) -> str:
    try:
        return str(json.loads((run / "status.json").read_text(encoding="utf-8"))["state"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def analyze(run_folder: Path) -> CampaignAnalysis:
    """Read plan, journal, samples and per-cell output; compute cells, pairs, drift,
    tells and decisions. Raises RecordError for a folder that is not a run."""
    run = Path(run_folder)
    if not run.is_dir():
        raise RecordError(f"{run}: no such run folder")
    plan = read_plan(run)
    records = read_journal(run)
    samples = read_samples(run)
    by_index = {r.index: r for r in records}
    cells = [cell_stats(run, pc, by_index.get(pc.index), samples, plan.warmup_tokens)
             for pc in plan.cells]
    recorded = device_state_recorded(records)
    matches: dict[tuple[int, int], PairMatch] = {}
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            matches[(a.index, b.index)] = match_pair(a, b, by_index.get(a.index),
                                                     by_index.get(b.index), plan.match, recorded)
    adjacent = tuple(matches[(a.index, b.index)] for a, b in zip(cells, cells[1:], strict=False))
    decisions = tuple(decide(d, cells, matches) for d in plan.decisions)
    by_cell = {c.index: c for c in cells}
    unverified = []
    for m in adjacent:
        first, second = by_cell[m.first], by_cell[m.second]
        if m.state == "unverified" and len(first.window()) and len(second.window()):
            ratio = ratio_interval(second.window(), first.window(),
                                   seed_for("ratio", second.label, first.label))
            unverified.append((m.first, m.second, ratio))
    last = max((c.index for c in cells), default=0)
    return CampaignAnalysis(
        run=run, plan=plan, records=tuple(records), state=_state(run),
        complete=all(c.index in by_index for c in plan.cells),
        simulated=any(r.entry.simulated for r in records) or plan.device.startswith("sim:"),
        device_state_recorded=recorded, tolerances=tolerances(plan.match),
        cells=tuple(cells), pairs=adjacent,
        drift=tuple(sentinel_drift(cells, by_index, plan.match)),
        tells=tuple(contamination_tells(cells, by_index, plan.match)),
        caps_timeline=tuple(_capped_from(cells, last)),
        decisions=decisions, exit_status=exit_status(list(decisions)),
        unverified_ratios=tuple(unverified),
    )
