"""Interleaved decisions: run pairs of slice pairs as the unit of evidence
(abbench/analysis/interleave.py, docs/method.md#interleaved-slices)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abbench.analysis.interleave import (
    RunPair,
    SlicePair,
    interleaved_decision,
    interleaved_ratio,
    run_pair_ratio,
    slice_pair,
)
from abbench.analysis.slices import SliceStat
from abbench.analysis.stats import UNKNOWN_NOISE, Noise
from abbench.records import DecisionSpec

SPEC = DecisionSpec("C", "B", min_effect=0.03)


def _pair(k: int, effect: float, levels: list[float], process: tuple[float, float] = (0, 0),
          burst: dict[int, float] | None = None) -> RunPair:
    """Run pair k: slice s of each arm at `levels[s]` (the device's state then, shared),
    the candidate `effect` above, each process off by its own `process` level, and a
    burst slowing both slices of a turn by `burst[s]`."""
    burst = burst or {}
    slices = tuple(SlicePair(lv + math.log1p(effect) + process[0] + burst.get(s, 0.0),
                             lv + process[1] + burst.get(s, 0.0))
                   for s, lv in enumerate(levels))
    return RunPair(2 * k + (k % 2), 2 * k + 1 - (k % 2), k % 2 == 0, slices)


def test_a_run_pair_is_the_mean_of_its_matched_slice_pairs_after_the_warm_up() -> None:
    pair = RunPair(0, 1, True, (SlicePair(5.0, 1.0),  # warm-up: left out
                                SlicePair(2.1, 2.0), SlicePair(2.3, 2.0),
                                SlicePair(9.0, 2.0, False, "foreign load 1.0 vs 0.1"),
                                SlicePair(2.2, 2.0)))
    r = run_pair_ratio(pair)
    assert r.used == 3 and r.log_ratio == pytest.approx(0.2)
    assert r.variance == pytest.approx(np.var([0.1, 0.3, 0.2], ddof=1) / 3)
    assert r.dropped == ("slice 4: foreign load 1.0 vs 0.1",)


def test_a_burst_on_both_arms_cancels_in_every_slice_pair() -> None:
    # The device slows by 35% for two turns in the middle of each run pair: a cell design
    # would see it in whichever arm ran then; slice pairs see it in both.
    levels = [3.0 + 0.01 * s for s in range(8)]
    burst = {3: math.log(0.65), 4: math.log(0.65)}
    # the processes' own levels differ, and average out over the run pairs
    pairs = [_pair(k, 0.10, levels, (0.01 * (k - 1.5), -0.01 * (k - 1.5)), burst)
             for k in range(4)]
    got = interleaved_ratio(pairs, UNKNOWN_NOISE, 0.05)
    assert got.ratio is not None
    assert got.ratio.estimate == pytest.approx(1.10, rel=1e-6)
    assert got.ratio.low < 1.10 < got.ratio.high
    assert got.noise.df == 3 and got.noise.source == "interleaved run pairs"


def test_the_run_pairs_spread_is_the_interval_and_a_burst_laden_floor_does_not_widen_it(
) -> None:
    rng = np.random.default_rng(1)
    levels = [3.0] * 8
    pairs = [_pair(k, 0.10, levels, tuple(rng.normal(0, 0.02, 2))) for k in range(6)]
    alone = interleaved_ratio(pairs, UNKNOWN_NOISE, 0.05)
    # A floor measured on cells through a burst (P13, 2026-12-06: ±28.1% on 2 df): pooled,
    # it set the interval to about ×/÷ 1.25; the run pairs cancel the bursts it holds.
    floor = Noise(0.281 ** 2, 2, 0.0, 4, "device history")
    got = interleaved_ratio(pairs, floor, 0.05)
    assert alone.noise.df == 5 and got.noise == alone.noise
    assert got.ratio == alone.ratio and got.ratio is not None
    assert got.ratio.high / got.ratio.low < 1.1
    assert got.ratio.low < 1.10 < got.ratio.high


def test_one_run_pair_borrows_the_floor_for_a_difference_of_two_cells() -> None:
    floor = Noise(0.02 ** 2, 30, 0.0, 31, "device history")
    got = interleaved_ratio([_pair(0, 0.10, [3.0] * 8, (0.01, -0.01))], floor, 0.05)
    assert got.noise.df == 30 and got.noise.variance == pytest.approx(2 * 0.02 ** 2)
    assert got.noise.note is not None and "upper bound" in got.noise.note
    assert got.ratio is not None and got.ratio.low < 1.10 * math.exp(0.02) < got.ratio.high


def test_a_clear_effect_is_decided_and_a_pair_without_slices_is_owed() -> None:
    rng = np.random.default_rng(2)
    pairs = [_pair(k, 0.20, [3.0 + 0.02 * rng.standard_normal() for _ in range(8)],
                   tuple(rng.normal(0, 0.01, 2))) for k in range(4)]
    d = interleaved_decision(SPEC, pairs, UNKNOWN_NOISE)
    assert d.verdict == "GO" and d.ratio is not None and d.ratio.low > 1.03
    assert len(d.pairs) == 4 and {p.candidate for p in d.pairs} == {0, 3, 4, 7}
    assert d.order is not None and (d.order.candidate_first, d.order.baseline_first) == (2, 2)
    empty = RunPair(0, 1, True, (SlicePair(3.0, 3.0),))  # the warm-up slice only
    d = interleaved_decision(SPEC, [empty], UNKNOWN_NOISE)
    assert d.verdict == "OWED" and d.ratio is None
    assert "no slice pair after the warm-up" in d.unmatched[0].match.reasons


def test_one_run_pair_has_no_spread_and_decides_nothing_alone() -> None:
    d = interleaved_decision(SPEC, [_pair(0, 0.5, [3.0] * 8)], UNKNOWN_NOISE)
    assert d.verdict == "INCONCLUSIVE" and "unknown" in d.reason


def test_slice_pairs_with_different_foreign_load_are_not_matched() -> None:
    def s(load: float | None, rate: float = 3.0) -> SliceStat:
        return SliceStat(0, 16, rate, 0.0, 1.0, load)

    assert slice_pair(s(0.1), s(0.2), 0.25).matched
    far = slice_pair(s(1.2), s(0.1), 0.25)
    assert not far.matched and "foreign load 1.20 vs 0.10 cores (> 0.25)" in far.reason
    assert slice_pair(s(None), s(2.0), 0.25).matched  # not measured: not a criterion
    assert slice_pair(s(1.2), s(0.1), None).matched  # a plan without the criterion
    assert not slice_pair(s(0.1, math.nan), s(0.1), 0.25).matched
