"""`analyze(RUN)`: everything section 7 decides, from a run folder's records alone."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from abbench.analysis.cells import CellStats, cell_stats
from abbench.analysis.decide import Decision, compared_cells, decide, exit_status
from abbench.analysis.drift import Drift, capped_from, sentinel_drift
from abbench.analysis.interleave import interleaved_decision, run_pairs
from abbench.analysis.matching import (
    Matches,
    PairMatch,
    PairMatches,
    device_state_recorded,
    match_pair,
    tolerances,
)
from abbench.analysis.metrics import SPEED, metric
from abbench.analysis.noise import (
    comparable,
    floor_noise,
    noise_for,
    repeat_groups,
    with_cells,
)
from abbench.analysis.sequential import ALPHA
from abbench.analysis.stats import Interval, Noise, ratio_interval, ratio_of_draws, seed_for
from abbench.analysis.tells import Tell, contamination_tells
from abbench.errors import EXIT_NO_GO, EXIT_NO_MEASUREMENT, RecordError
from abbench.records import (
    CellRecord,
    ImportInfo,
    NoiseFloor,
    Plan,
    PlannedCell,
    Sample,
    keys,
    read_import_info,
    read_journal,
    read_noise_floor,
    read_plan,
    read_samples,
)
from abbench.records.plan import SLICES
from abbench.workers import map_all


@dataclass(frozen=True)
class LookResult:
    """The decisions as one look of a sequential campaign read them."""

    number: int  # 1-based
    cells: int  # the first `cells` cells
    alpha: float
    fraction: float
    final: bool
    noise: Noise
    decisions: tuple[Decision, ...]


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
    # Adjacent unverified pairs (imported runs: no device state, or no times): second / first tok/s,
    # shown in their own table, never as a verdict.
    unverified_ratios: tuple[tuple[int, int, Interval], ...] = ()
    noise: Noise = field(default_factory=lambda: Noise(math.nan, 0))  # behind the verdicts
    own_noise: Noise = field(default_factory=lambda: Noise(math.nan, 0))  # this campaign's
    floor: NoiseFloor | None = None  # the device history's, when the run began
    groups: tuple[tuple[int, ...], ...] = ()  # repeat groups (cell indices)
    looks: tuple[LookResult, ...] = ()  # sequential campaigns: every look, in order
    pending: tuple[int, ...] = ()  # cells recorded after the last look (not yet read)
    matches: Matches = field(default_factory=dict, repr=False)
    imported: ImportInfo | None = None  # an import's provenance (import.json)

    @functools.cached_property
    def _records_by_index(self) -> dict[int, CellRecord]:
        return {r.index: r for r in self.records}

    def record_of(self, index: int) -> CellRecord | None:
        """The journal's record of cell `index`; None for a cell not run."""
        return self._records_by_index.get(index)


def _cell_stats(context: tuple[Path, dict[int, CellRecord], list[Sample], int],
                planned: PlannedCell) -> CellStats:
    run, by_index, samples, warmup = context
    return cell_stats(run, planned, by_index.get(planned.index), samples, warmup)


def mem_total(samples: Sequence[Sample]) -> float | None:
    """The device's MemTotal in MiB as its samples recorded it; None where none did."""
    seen = [float(v) for s in samples if isinstance(v := s.values.get(keys.MEM_TOTAL_MIB),
                                                    (int, float)) and not isinstance(v, bool)]
    return max(seen) if seen else None


def _state(run: Path) -> str:
    try:
        return str(json.loads((run / "status.json").read_text(encoding="utf-8"))["state"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def analyze(run_folder: Path, plan: Plan | None = None) -> CampaignAnalysis:
    """Read plan, journal, samples and per-cell output; compute cells, pairs, drift,
    tells and decisions. `plan` stands in for plan.json (a look about to be recorded).
    Raises RecordError for a folder that is not a run."""
    run = Path(run_folder)
    if not run.is_dir():
        raise RecordError(f"{run}: no such run folder")
    plan = plan if plan is not None else read_plan(run)
    records = read_journal(run)
    samples = read_samples(run)
    by_index = {r.index: r for r in records}
    cells = map_all(_cell_stats, (run, by_index, samples, plan.warmup_tokens),
                    list(plan.cells))
    recorded = device_state_recorded(records)
    by_cell = {c.index: c for c in cells}
    matches = PairMatches(list(by_cell), lambda i, j: match_pair(
        by_cell[i], by_cell[j], by_index.get(i), by_index.get(j), plan.match, recorded,
        plan.order_known))
    adjacent = tuple(matches[(a.index, b.index)] for a, b in zip(cells, cells[1:], strict=False))
    floor = read_noise_floor(run)
    groups = repeat_groups(cells, matches)
    drift = tuple(sentinel_drift(cells, by_index, plan.match, plan.order_known))
    looks, decisions, noise, pending = _read_decisions(plan, cells, matches, floor)
    decisions = tuple(reconcile(d, drift, matches, cells, noise) for d in decisions)
    unverified = []
    for m in adjacent:
        first, second = by_cell[m.first], by_cell[m.second]
        if m.state == "unverified" and len(first.window()) and len(second.window()):
            ratio = ratio_of_draws(second.window(), first.window(), second.draws,
                                   first.draws) if second.draws is not None \
                and first.draws is not None else ratio_interval(
                    second.window(), first.window(), seed_for("ratio", second.label,
                                                              first.label))
            unverified.append((m.first, m.second, ratio))
    last = max((c.index for c in cells), default=0)
    return CampaignAnalysis(
        run=run, plan=plan, records=tuple(records), state=_state(run),
        complete=all(c.index in by_index for c in plan.cells),
        simulated=any(r.entry.simulated for r in records) or plan.device.startswith("sim:"),
        device_state_recorded=recorded, tolerances=tolerances(plan.match),
        cells=tuple(cells), pairs=adjacent,
        drift=drift,
        tells=tuple(contamination_tells(cells, by_index, plan.match, plan.order_known,
                                        mem_total(samples))),
        caps_timeline=tuple(capped_from(cells, last)),
        decisions=decisions, exit_status=run_exit_status(decisions, cells),
        unverified_ratios=tuple(unverified), noise=noise,
        own_noise=noise_for(groups, None), floor=floor,
        groups=tuple(tuple(c.index for c in g) for g in groups), looks=looks,
        pending=pending, matches=matches, imported=read_import_info(run),
    )


def _possible(cells: Sequence[CellStats]) -> set[str]:
    """The cell names with a valid measurement, or with a planned cell not run yet (an
    interrupted run's rest may still give one)."""
    return {c.name for c in cells if c.ok or c.status == "not run"}


def measured_nothing(cells: Sequence[CellStats]) -> bool:
    """No cell is a valid measurement, and none is left to run."""
    return not _possible(cells)


def unmeasured_arms(decisions: Sequence[Decision], cells: Sequence[CellStats]) -> list[str]:
    """The candidates and baselines of decisions that have no valid cell (each failed)."""
    possible = _possible(cells)
    return list(dict.fromkeys(name for d in decisions for name in (d.candidate, d.baseline)
                              if name not in possible))


def run_exit_status(decisions: Sequence[Decision], cells: Sequence[CellStats]) -> int:
    """The decisions' exit status (`decide.exit_status`), except that a run which measured
    nothing, or nothing for an arm of a decision, is EXIT_NO_MEASUREMENT, asked a decision
    or not; only a NO-GO, a definite answer that blocks a release, wins over it."""
    status = exit_status(list(decisions))
    if status != EXIT_NO_GO and (measured_nothing(cells) or unmeasured_arms(decisions, cells)):
        return EXIT_NO_MEASUREMENT
    return status


def decisions_at(plan: Plan, cells: list[CellStats], matches: Matches,
                 floor: NoiseFloor | None, n: int, alpha: float
                 ) -> tuple[tuple[Decision, ...], Noise]:
    """Every decision of the plan read on the first `n` cells at a two-sided `alpha`, with
    the noise of those cells' repeats (and the device's floor)."""
    prefix = [c for c in cells if c.index < n]
    groups = repeat_groups(prefix, matches)
    noise = noise_for(groups, floor)
    decisions = []
    for d in plan.decisions:
        if plan.interleave == SLICES and d.metric == SPEED.name:
            pairs = run_pairs(plan, d, {c.index: c.slices for c in prefix},
                              {c.index for c in prefix if c.ok}, n)
            decisions.append(interleaved_decision(d, pairs, floor_noise(floor), alpha))
            continue
        # the noise of this decision sees every cell it compares (`noise.with_cells`)
        seen = with_cells(groups, compared_cells(d, prefix, matches))
        read_cells, read_matches, read_noise = metric(d.metric).read(
            prefix, matches, seen, noise_for(seen, floor))
        decisions.append(decide(d, read_cells, read_matches, read_noise, alpha))
    return tuple(decisions), noise


def _read_decisions(plan: Plan, cells: list[CellStats],
                    matches: Matches, floor: NoiseFloor | None
                    ) -> tuple[tuple[LookResult, ...], tuple[Decision, ...], Noise,
                               tuple[int, ...]]:
    """The decisions: at one look over every cell for a fixed campaign; for a sequential
    one, at every look the plan records, each decision frozen at the look that decided it
    (a later look does not reopen it) or else read at the last look."""
    if not plan.looks:
        decisions, noise = decisions_at(plan, cells, matches, floor, len(cells), ALPHA)
        return (), decisions, noise, ()
    looks: list[LookResult] = []
    frozen: dict[int, Decision] = {}
    noise = Noise(math.nan, 0)
    for k, look in enumerate(plan.looks, 1):
        at, noise = decisions_at(plan, cells, matches, floor, look.cells, look.alpha)
        at = tuple(dataclasses.replace(d, look=k) for d in at)
        looks.append(LookResult(k, look.cells, look.alpha, look.fraction, look.final, noise,
                                at))
        for i, d in enumerate(at):
            if i not in frozen and d.decided:
                frozen[i] = d
    last = looks[-1].decisions
    final = tuple(frozen.get(i, d) for i, d in enumerate(last))
    pending = tuple(c.index for c in cells if c.index >= plan.looks[-1].cells)
    return tuple(looks), final, noise, pending


def reconcile(d: Decision, drift: tuple[Drift, ...], matches: Matches,
              cells: list[CellStats], noise: Noise) -> Decision:
    """A decision beside the drift its campaign showed: a report never shows device drift and
    a verdict from the same cells without saying how they square (docs/method.md#two-levels,
    "Drift and verdicts square")."""
    moved = [x for x in drift if x.verdict == "drift"]
    if not moved or not d.pairs:
        return d
    lines = []
    for x in moved:
        delta = f"{x.ratio.estimate - 1:+.0%}" if x.ratio is not None else "moved"
        where = f"cells {x.twin + 1} → {x.sentinel + 1}"
        if comparable(matches[(x.twin, x.sentinel)]):
            lines.append(f"the sentinel moved {delta} ({where}) while every sensor held "
                         "steady: that is cell-to-cell noise the sensors could not see"
                         + (f", and the ±{noise.sd:.1%} per cell behind this interval "
                            "includes it" if noise.known and noise.source != "device history"
                            else "; the device history's noise floor does not include it, "
                            "so read this verdict against it" if noise.known else ""))
        else:
            pairs = ", ".join(f"{p.candidate + 1}/{p.baseline + 1}" for p in d.pairs)
            lines.append(f"device drift {delta} ({where}) is a change the sensors saw; this "
                         f"verdict rests only on pairs matched at one device state ({pairs}), "
                         "none of which spans it")
    return dataclasses.replace(d, consistency="; ".join(lines))
