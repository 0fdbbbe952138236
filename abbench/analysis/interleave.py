"""Interleaved decisions (docs/method.md#interleaved-slices): the two arms of a decision
run as two warm engine processes that take turns every few tokens, so a burst of load, a
heat step or a cap lands on both arms within seconds of each other.

A *run pair* is one interleaved invocation of both arms (two processes, one cell each in
the journal). Inside it, slice pair s is the candidate's slice s and the baseline's slice
s, adjacent in time: its log ratio is d = log rate_C − log rate_B. A slice pair is matched
unless a host criterion failed between its two slices (one ran with markedly more foreign
load); the first `warmup` slice pairs of a run pair are left out, as a cell's warm-up
tokens are.

Run pair k's log ratio D_k is the mean d of its matched slice pairs, with a slice-level
variance v_k (the variance of d over its slices, over their count). Bursts common to both
arms cancel in every d; what differs between invocations (process placement, the page
cache, memory layout: the invocation level of Kalibera & Jones) does not, and stays in the
spread of the D_k. So the run pairs are the units of evidence: the decision's ratio is
exp(mean D_k), its interval a Student t on the variance of the D_k across run pairs (K − 1
degrees of freedom, split into its slice and invocation levels as cells' noise is).
The device's floor is not pooled in: it is measured on cells, bursts and heat steps
included, which is what interleaving cancels, so it overstates a run pair's spread and,
pooled with two to eight run pairs, sets their interval (`own_noise`). It stands in only
for a single run pair, which has no spread of its own. Alternating which arm starts each
run pair (ABBA blocks of invocations) keeps the position effect inside a slice pair
balanced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from abbench.analysis.decide import (
    INCONCLUSIVE,
    OWED,
    POWER,
    Comparison,
    Decision,
    OrderEffect,
    settle_inconclusive,
    verdict_of,
)
from abbench.analysis.matching import PairMatch
from abbench.analysis.metrics import metric
from abbench.analysis.sequential import ALPHA
from abbench.analysis.slices import SliceStat
from abbench.analysis.stats import (
    Interval,
    Noise,
    contrast_interval,
    contrast_se,
    pooled_noise,
    resolvable_effect,
)
from abbench.records import DecisionSpec, Plan

WARMUP_SLICES = 1  # the first slice pair of each run pair: both processes just started


@dataclass(frozen=True)
class SlicePair:
    """One turn of each arm, adjacent in time: their log tokens/s, and whether they are
    comparable (with the reason when not)."""

    candidate: float  # log tokens/s of the candidate's slice
    baseline: float
    matched: bool = True
    reason: str = ""

    def __post_init__(self) -> None:
        if self.matched and not (math.isfinite(self.candidate)
                                 and math.isfinite(self.baseline)):
            raise ValueError("a matched slice pair needs both slices' log rates")

    @property
    def log_ratio(self) -> float:
        return self.candidate - self.baseline


@dataclass(frozen=True)
class RunPair:
    """One interleaved invocation of both arms: the journal's cells of each, which one took
    the first turn, and its slice pairs in time order."""

    candidate_cell: int  # cell index
    baseline_cell: int
    candidate_first: bool
    slices: tuple[SlicePair, ...]


@dataclass(frozen=True)
class RunPairRatio:
    pair: RunPair
    log_ratio: float  # D_k: the mean log ratio of its matched slice pairs (NaN: none)
    variance: float  # v_k: its slice-level variance (NaN: under two slice pairs)
    used: int  # matched slice pairs after the warm-up
    dropped: tuple[str, ...]  # why each left-out slice pair was left out


def run_pair_ratio(pair: RunPair, warmup: int = WARMUP_SLICES) -> RunPairRatio:
    """D_k and v_k of one run pair from its matched slice pairs after `warmup`."""
    kept = pair.slices[warmup:]
    dropped = tuple(f"slice {warmup + i + 1}: {s.reason or 'not matched'}"
                    for i, s in enumerate(kept) if not s.matched)
    d = np.array([s.log_ratio for s in kept if s.matched], dtype=float)
    if len(d) == 0:
        return RunPairRatio(pair, math.nan, math.nan, 0, dropped)
    # Consecutive slice pairs share a process and the device's state: the Bartlett sum of
    # their autocovariances (as a cell's tokens, stats.log_rate_token_variance) would be
    # the careful v_k; it only splits the interval's variance between its two levels, and
    # the D_k's spread already holds both, so the plain variance of the mean does.
    v = float(np.var(d, ddof=1)) / len(d) if len(d) >= 2 else math.nan
    return RunPairRatio(pair, float(d.mean()), v, len(d), dropped)


@dataclass(frozen=True)
class InterleavedRatio:
    ratio: Interval | None  # candidate / baseline over the run pairs (None: no run pair)
    noise: Noise  # the run pairs' spread (a difference of two cells), or the floor's
    se: float  # of the log ratio, both levels
    pairs: tuple[RunPairRatio, ...]  # every run pair, used or not


def difference_floor(floor: Noise) -> Noise:
    """The device's noise floor (one cell's log rate) as the noise of a difference of two
    independent cells: twice it. Interleaving cancels what the two arms share, so the
    floor can only overstate a run pair's spread."""
    if not floor.known:
        return floor
    return Noise(2 * floor.variance, floor.df, 2 * floor.token_variance, floor.repeats,
                 floor.source, "one run pair has no spread of its own: the device's floor "
                 "for a difference of two cells stands in, an upper bound")


def own_noise(own: Noise, floor: Noise) -> Noise:
    """The run pairs' own spread where they have one (two or more run pairs), else the
    floor for a difference of two cells.

    Not pooled (as cells' noise is with the device history, `stats.combine_noise`): the
    floor is an upper bound on a run pair's spread, not an estimate of it, and pooling an
    upper bound only widens the interval. On a device with bursts the floor holds them and
    the run pairs do not: a floor of ±28% measured through one burst gave intervals of
    0.88-1.43 around a true 1.12 after six run pairs (docs/method.md#interleaved-slices).
    The t interval on the run pairs alone is what tests/test_calibration_bursts.py
    validates, bursts and heavy tails included."""
    return own if own.known else difference_floor(floor)


def interleaved_ratio(pairs: Sequence[RunPair], floor: Noise, alpha: float,
                      warmup: int = WARMUP_SLICES) -> InterleavedRatio:
    """The decision's ratio over its run pairs, with its two-level interval at `alpha`."""
    ratios = tuple(run_pair_ratio(p, warmup) for p in pairs)
    used = [r for r in ratios if math.isfinite(r.log_ratio)]
    if not used:
        return InterleavedRatio(None, floor, math.nan, ratios)
    own = pooled_noise([[(r.log_ratio, r.variance) for r in used]], "interleaved run pairs")
    noise = own_noise(own, floor)
    w = [1.0 / len(used)] * len(used)
    estimate = float(np.mean([r.log_ratio for r in used]))
    se = contrast_se(w, [r.variance for r in used], noise)
    return InterleavedRatio(contrast_interval(estimate, se, noise.df, alpha), noise, se,
                            ratios)


def interleaved_decision(spec: DecisionSpec, pairs: Sequence[RunPair], floor: Noise,
                         alpha: float = ALPHA) -> Decision:
    """A decision on run pairs (docs/method.md#interleaved-slices): the same verdicts,
    thresholds and words as a decision on cells, with the run pairs as its evidence."""
    kinds: dict[str, Any] = {"expect": spec.expect, "max_regression": spec.max_regression,
                             "alpha": alpha, "metric": spec.metric}
    got = interleaved_ratio(pairs, floor, alpha)
    used = [r for r in got.pairs if math.isfinite(r.log_ratio)]
    unused = tuple(_comparison(r, None) for r in got.pairs if not math.isfinite(r.log_ratio))
    if got.ratio is None:
        return Decision(spec.candidate, spec.baseline, spec.min_effect, OWED, None, None, (),
                        unused, f"no matched slice pair of {spec.candidate} and "
                        f"{spec.baseline}", "an interleaved run pair on a quieter device",
                        None, noise=got.noise, **kinds)
    verdict, reason = verdict_of(got.ratio, spec.expect, spec.min_effect,
                                 spec.max_regression, got.noise, metric(spec.metric).worse)
    threshold = 1.0 - (spec.max_regression or 0.0) if spec.expect == "not-slower" \
        else 1.0 + spec.min_effect
    settle = None
    if verdict == INCONCLUSIVE:
        settle = settle_inconclusive(spec.expect, got.ratio, got.noise, got.se, threshold,
                                     len(used), spec.min_effect, "run pair",
                                     "a round adds two")
    order = OrderEffect(sum(r.pair.candidate_first for r in used),
                        sum(not r.pair.candidate_first for r in used))
    kinds["slices"] = _evidence(spec, got.pairs)
    return Decision(spec.candidate, spec.baseline, spec.min_effect, verdict, None, got.ratio,
                    tuple(_comparison(r, got.ratio.level) for r in used), unused, reason,
                    settle, None, noise=got.noise, se=got.se,
                    resolvable=resolvable_effect(got.se, got.noise.df, alpha, POWER),
                    order=order, **kinds)


def _evidence(spec: DecisionSpec, ratios: Sequence[RunPairRatio]) -> str:
    """"4 run pairs (2 with C taking the first turn), 24 slice pairs compared, 1 left out
    (slice 5: foreign load ...)"."""
    used = [r for r in ratios if math.isfinite(r.log_ratio)]
    dropped = [d for r in ratios for d in r.dropped]
    first = sum(r.pair.candidate_first for r in used)
    out = (f"interleaved: {len(used)} run pair{'s' if len(used) != 1 else ''} ({first} with "
           f"{spec.candidate} taking the first turn), {sum(r.used for r in used)} slice "
           "pairs compared after each run pair's first")
    if dropped:
        more = " ..." if len(dropped) > 3 else ""
        out += f", {len(dropped)} left out ({'; '.join(dropped[:3])}{more})"
    return out


def _comparison(r: RunPairRatio, level: float | None) -> Comparison:
    p = r.pair
    first, second = sorted((p.candidate_cell, p.baseline_cell))
    state = "matched" if math.isfinite(r.log_ratio) else "unmatched"
    reasons = () if state == "matched" else (r.dropped or ("no slice pair after the warm-up",))
    ratio = None if level is None else Interval(math.exp(r.log_ratio), math.nan, math.nan,
                                                level)
    return Comparison(p.candidate_cell, p.baseline_cell,
                      PairMatch(first, second, state, (), tuple(reasons)), ratio)


def slice_pair(c: SliceStat, b: SliceStat, tol: float | None) -> SlicePair:
    """The candidate's and the baseline's slice of one turn as a pair: matched unless a
    slice has no throughput or their foreign loads differ by more than `tol` cores."""
    if not (math.isfinite(c.log_rate) and math.isfinite(b.log_rate)):
        return SlicePair(c.log_rate, b.log_rate, False, "a slice has no tokens")
    if tol is not None and c.foreign_cores is not None and b.foreign_cores is not None \
            and abs(c.foreign_cores - b.foreign_cores) > tol:
        return SlicePair(c.log_rate, b.log_rate, False,
                         f"foreign load {c.foreign_cores:.2f} vs {b.foreign_cores:.2f} cores "
                         f"(> {tol:g})")
    return SlicePair(c.log_rate, b.log_rate)


def run_pairs(plan: Plan, spec: DecisionSpec, slices: dict[int, tuple[SliceStat, ...]],
              ok: set[int], n: int) -> list[RunPair]:
    """The decision's run pairs among the plan's first `n` cells: each interleaved pair of
    one candidate and one baseline cell that both finished ok, slice k with slice k."""
    tol = plan.match.foreign_load_tol
    out = []
    for first, second in plan.pairs():
        if second.index >= n or not {first.index, second.index} <= ok:
            continue
        names = {first.name: first, second.name: second}
        if set(names) != {spec.candidate, spec.baseline}:
            continue
        c, b = names[spec.candidate], names[spec.baseline]
        turns = zip(slices.get(c.index, ()), slices.get(b.index, ()), strict=False)
        out.append(RunPair(c.index, b.index, first is c,
                           tuple(slice_pair(cs, bs, tol) for cs, bs in turns)))
    return out
