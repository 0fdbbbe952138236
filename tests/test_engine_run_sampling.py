"""Sampling: greedy is argmax; seeded temperature sampling is reproducible and calibrated."""

from __future__ import annotations

import numpy as np
import pytest

from abbench.engine.run.sampling import Sampler


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.mark.parametrize("temp", [0.0, -1.0])
def test_greedy_is_argmax(temp: float) -> None:
    rng = np.random.default_rng(0)
    sampler = Sampler(temp, seed=123)
    for _ in range(50):
        logits = rng.standard_normal(300).astype(np.float32)
        assert sampler(logits) == int(np.argmax(logits))


def test_greedy_takes_the_first_of_tied_maxima() -> None:
    assert Sampler(0.0, 0)(np.array([0.0, 3.0, 1.0, 3.0])) == 1


def test_same_seed_same_sequence_different_seed_different_sequence() -> None:
    logits = np.zeros(1000, np.float32)

    def draws(seed: int) -> list[int]:
        s = Sampler(1.0, seed)
        return [s(logits) for _ in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_one_draw_per_token_whatever_the_logits() -> None:
    a, b = Sampler(0.8, 5), Sampler(0.8, 5)
    a(np.array([5.0, 0.0, 0.0]))
    b(np.linspace(-3, 3, 1000))
    assert a.rng.random() == b.rng.random()


def test_returns_a_python_int_in_range() -> None:
    s = Sampler(1.0, 0)
    for _ in range(100):
        t = s(np.array([1.0, 2.0, 3.0], np.float32))
        assert type(t) is int
        assert 0 <= t < 3


def test_masked_tokens_are_never_drawn() -> None:
    logits = np.array([-np.inf, 0.0, -np.inf, 1.0, -np.inf])
    s = Sampler(1.0, 3)
    assert {s(logits) for _ in range(2000)} <= {1, 3}


@pytest.mark.parametrize("temp", [0.5, 1.0, 2.0])
def test_draws_follow_softmax_of_logits_over_temperature(temp: float) -> None:
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0])
    p = softmax(logits / temp)
    n = 20000
    s = Sampler(temp, seed=11)
    counts = np.bincount([s(logits) for _ in range(n)], minlength=len(logits))
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001
    # and temperature visibly moves the mass: the top token's share tracks its probability
    assert abs(counts[0] / n - p[0]) < 0.02


def test_large_logits_do_not_overflow() -> None:
    s = Sampler(0.01, 0)
    assert s(np.array([1e4, 1e4 - 1.0, -1e4])) == 0


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    s = Sampler(0.0, 0, repeat_penalty=2.0, last_n=8)
    s.accept(0)
    assert s(np.array([3.0, 2.0, -5.0])) == 1  # 3 / 2 = 1.5 < 2
    s = Sampler(0.0, 0, repeat_penalty=2.0, last_n=8)
    s.accept(0)
    assert s(np.array([-1.0, -1.5, -5.0])) == 1  # -1 * 2 = -2 < -1.5
    # without the penalty the same logits give the recent token
    assert Sampler(0.0, 0, repeat_penalty=1.0, last_n=8)(np.array([3.0, 2.0, -5.0])) == 0


def test_repeat_penalty_covers_only_the_last_n_tokens_and_its_own_choices() -> None:
    logits = np.array([3.0, 2.0, 1.0, 0.5])
    s = Sampler(0.0, 0, repeat_penalty=10.0, last_n=2)
    s.accept(0)
    assert s(logits) == 1  # 0 is recent: 1 wins, and is now recent too
    assert s(logits) == 2  # 0 and 1 recent
    assert s(logits) == 0  # the window holds 1 and 2: 0 is back
    # the caller's logits are untouched
    assert logits.tolist() == [3.0, 2.0, 1.0, 0.5]


def test_repeat_penalty_keeps_one_draw_per_token_and_masked_tokens_masked() -> None:
    a, b = Sampler(1.0, 5, repeat_penalty=1.3, last_n=4), Sampler(1.0, 5)
    a.accept(1)
    a(np.array([-np.inf, 2.0, 0.0]))
    b(np.array([-np.inf, 2.0, 0.0]))
    assert a.rng.random() == b.rng.random()
    s = Sampler(1.0, 3, repeat_penalty=1.5, last_n=16)
    assert {s(np.array([-np.inf, 0.0, -np.inf, 1.0])) for _ in range(500)} <= {1, 3}


def test_a_penalised_token_is_drawn_less_often() -> None:
    logits = np.array([2.0, 1.0, 1.0, 1.0])
    n = 4000
    plain, penalised = Sampler(1.0, 11), Sampler(1.0, 11, repeat_penalty=2.0, last_n=1)
    free = sum(plain(logits) == 0 for _ in range(n)) / n
    counts = 0
    for _ in range(n):
        penalised.recent.clear()
        penalised.accept(0)
        counts += penalised(logits) == 0
    expected = softmax(np.array([1.0, 1.0, 1.0, 1.0]))[0]  # 2 / 2 = 1: token 0 like the rest
    assert free == pytest.approx(softmax(logits)[0], abs=0.03)
    assert counts / n == pytest.approx(expected, abs=0.03)


def test_banned_tokens_are_never_chosen_and_the_callers_logits_stay() -> None:
    logits = np.array([0.5, 3.0, 1.0, 2.9])
    assert Sampler(0.0, 0)(logits) == 1
    greedy = Sampler(0.0, 0, banned=[1])
    assert greedy(logits) == 3  # the best token left
    assert logits[1] == 3.0
    hot = Sampler(2.0, 5, banned=[1, 3, 99])  # an id past the vocabulary is no error
    assert {hot(logits) for _ in range(300)} == {0, 2}


def test_greedy_with_banned_tokens_is_the_first_largest_unbanned_logit() -> None:
    # ties everywhere (few distinct values), a banned token often the largest: the short
    # way (no float64 copy when the argmax is not banned) must choose as the long one
    rng = np.random.default_rng(7)
    for _ in range(300):
        logits = rng.integers(0, 4, 12).astype(np.float32)
        banned = rng.choice(12, rng.integers(1, 4), replace=False).tolist()
        allowed = np.where(np.isin(np.arange(12), banned), -np.inf, logits)
        assert Sampler(0.0, 0, banned=banned)(logits) == int(np.argmax(allowed))
