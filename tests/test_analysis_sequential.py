"""Group-sequential boundaries: what each look tests at, checked against simulated looks
with known truth (no effect: a Brownian motion seen at the looks' budget fractions)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from abbench.analysis.sequential import ALPHA, _boundaries, look_alpha, spent

LOOKS = (4 / 16, 7 / 16, 10 / 16, 13 / 16, 1.0)  # an ABBA, then ABBA rounds, <= 16 cells


def _first_crossings(fractions: tuple[float, ...], final: bool, paths: int = 400_000,
                     seed: int = 1) -> np.ndarray:
    """Each look's share of A/A paths that first cross its boundary there."""
    rng = np.random.default_rng(seed)
    steps = np.diff((0.0, *fractions))  # (K,)
    z = rng.standard_normal((paths, len(fractions))) * np.sqrt(steps)  # (P, K)
    stat = np.cumsum(z, axis=1) / np.sqrt(fractions)  # (P, K): Z_k
    cross = np.abs(stat) >= np.array(_boundaries(fractions, final, ALPHA, 2.0))  # (P, K)
    first = np.where(cross.any(axis=1), cross.argmax(axis=1), -1)  # (P,)
    return np.array([(first == k).mean() for k in range(len(fractions))])


def test_each_look_first_crosses_as_often_as_its_spending_allows() -> None:
    got = _first_crossings(LOOKS, True)
    want = np.diff([0.0, *(spent(f) for f in LOOKS[:-1]), ALPHA])
    se = np.sqrt(want * (1 - want) / 400_000)
    assert np.all(np.abs(got - want) <= 4 * se + 1e-4), (got, want)
    assert abs(got.sum() - ALPHA) <= 0.0015  # the whole campaign: ALPHA, not less


def test_a_look_not_final_spends_only_its_share() -> None:
    got = _first_crossings(LOOKS[:3], False)
    assert abs(got.sum() - spent(LOOKS[2])) <= 0.001, got


def test_one_look_is_a_plain_two_sided_test() -> None:
    assert look_alpha([1.0], True) == pytest.approx(ALPHA)
    assert look_alpha([0.5], False) == pytest.approx(spent(0.5))
    assert look_alpha([0.3], True) == pytest.approx(ALPHA)  # a budget cut short: the rest


def test_later_looks_test_at_more_than_their_increment() -> None:
    """The looks share their cells, so a later look may test at more than the alpha its
    fraction adds (the union bound's level); never at more than the whole."""
    previous = 0.0
    for k, f in enumerate(LOOKS, 1):
        level = look_alpha(LOOKS[:k], k == len(LOOKS))
        increment = (ALPHA if k == len(LOOKS) else spent(f)) - spent(previous)
        assert level >= increment - 1e-9
        assert level < ALPHA
        if k > 1:
            assert level > 1.1 * increment
        previous = f


def test_the_first_look_matches_the_normal_quantile() -> None:
    (c,) = _boundaries((0.25,), False, ALPHA, 2.0)
    assert 2 * ndtr(-c) == pytest.approx(spent(0.25), rel=1e-9)


def test_a_look_with_nothing_new_is_the_same_test_and_spends_nothing() -> None:
    assert look_alpha([0.5, 0.5, 0.5 + 1e-12], False) == look_alpha([0.5], False)
    assert look_alpha([0.5, 0.5, 0.75], False) == pytest.approx(look_alpha([0.5, 0.75], False),
                                                                rel=1e-6)


def test_many_small_looks_spend_as_their_fractions_say() -> None:
    """A budget in minutes, or of many cells, looks often and a little apart: the grid
    follows the steps."""
    looks = tuple(np.round(np.linspace(0.02, 1.0, 50), 9))
    got = _first_crossings(looks, True, paths=100_000, seed=3)
    assert abs(got.sum() - ALPHA) <= 0.003, got.sum()
    assert abs(got[:25].sum() - spent(looks[24])) <= 0.002, got[:25].sum()


def test_no_look_is_refused() -> None:
    with pytest.raises(ValueError):
        look_alpha([], True)
