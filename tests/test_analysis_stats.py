"""Moving-block bootstrap: block length rule, seeded reproducibility, interval sanity."""

from __future__ import annotations

import math

import numpy as np

from abbench.analysis.stats import (
    block_length,
    moving_block_indices,
    pooled_ratio_interval,
    rate_interval,
    ratio_interval,
    seed_for,
    tokens_per_s,
)


def test_block_length_is_cube_root_rounded_up() -> None:
    assert [block_length(n) for n in (1, 8, 9, 27, 28, 128, 1000)] == [1, 2, 3, 3, 4, 6, 10]
    assert block_length(0) == 1


def test_block_indices_are_runs_of_consecutive_tokens() -> None:
    idx = moving_block_indices(10, 3, 5, np.random.default_rng(0))
    assert idx.shape == (5, 10)
    assert idx.min() >= 0 and idx.max() <= 9
    for row in idx:
        for start in range(0, 9, 3):
            block = row[start:start + 3]
            assert list(np.diff(block)) == [1] * (len(block) - 1)


def test_tokens_per_s_is_tokens_over_summed_time() -> None:
    assert tokens_per_s(np.array([10.0, 30.0])) == 50.0  # not the mean of 100 and 33.3


def test_seeded_bootstrap_reproduces_and_seed_matters() -> None:
    x = np.random.default_rng(3).normal(20, 1, 100)
    a = rate_interval(x, seed_for("cell", "01-B"))
    b = rate_interval(x, seed_for("cell", "01-B"))
    c = rate_interval(x, seed_for("cell", "02-C"))
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low < a.estimate < a.high


def test_interval_covers_the_true_rate_most_of_the_time() -> None:
    # 60 independent AR(1) windows at a true 50 tok/s: a 95% interval should cover the
    # truth in most of them (a loose bound: the bootstrap is slightly anti-conservative).
    rng = np.random.default_rng(7)
    covered = 0
    for k in range(60):
        e = np.zeros(128)
        for i in range(1, 128):
            e[i] = 0.6 * e[i - 1] + rng.normal(0, 1)
        wall = 20.0 + 0.5 * e
        iv = rate_interval(wall, k, reps=500)
        covered += iv.low <= 1000 / 20.0 <= iv.high
    assert covered >= 48


def test_ratio_interval_brackets_a_known_ratio_and_excludes_one() -> None:
    rng = np.random.default_rng(5)
    a = 1000 / 40 * (1 + 0.02 * rng.standard_normal(100))
    b = 1000 / 50 * (1 + 0.02 * rng.standard_normal(100))
    iv = ratio_interval(a, b, 11)
    assert iv.low < 0.8 < iv.high or abs(iv.estimate - 0.8) < 0.01
    assert iv.excludes(0.97, 1.03)
    assert not iv.excludes(0.5, 1.0)


def test_pooled_ratio_is_the_geometric_mean_of_pair_ratios() -> None:
    rng = np.random.default_rng(2)
    s = [r * (1 + 0.01 * rng.standard_normal(50)) for r in (10.0, 20.0, 10.0)]
    iv = pooled_ratio_interval(s, [(1, 0), (1, 2)], 3)
    expect = math.sqrt(tokens_per_s(s[1]) / tokens_per_s(s[0])
                       * tokens_per_s(s[1]) / tokens_per_s(s[2]))
    assert abs(iv.estimate - expect) < 1e-9
    assert iv.low < iv.estimate < iv.high
