"""Statistics: pure functions over per-token times, numpy only.

Tokens of one decode are autocorrelated (the cache warms, the device heats, a burst of
misses spans several tokens), so an ordinary bootstrap that resamples single tokens would
understate the spread. Everything here resamples **moving blocks** of consecutive tokens
(Künsch 1989) with the block length `ceil(n ** (1/3))` — the n^(1/3) rate that is optimal
for the variance of a block-bootstrap estimate (Hall, Horowitz & Jing 1995) — and reads
intervals as percentiles of the resampled statistic. Every bootstrap takes an explicit
seed, so a report rendered twice from the same run folder prints the same intervals.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
REPS = 2000


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile interval at `level`."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL

    def excludes(self, lo: float, hi: float) -> bool:
        """True when the whole interval lies outside [lo, hi]."""
        return self.high < lo or self.low > hi

    def half_width(self) -> float:
        """The larger distance from the estimate to an end: the `y` of "x ± y"."""
        return max(self.estimate - self.low, self.high - self.estimate)


def block_length(n: int) -> int:
    """Moving-block length for `n` tokens: `ceil(n ** (1/3))`, at least 1."""
    return max(1, math.ceil(n ** (1.0 / 3.0))) if n > 0 else 1


def seed_for(*keys: str) -> int:
    """A stable seed from names (crc32 of the joined keys): the same cells, the same seed,
    whatever order the report computes things in."""
    return zlib.crc32("\x1f".join(keys).encode("utf-8"))


def tokens_per_s(wall_ms: np.ndarray) -> float:
    """Throughput over a window: tokens / summed wall time (not the mean of 1/t)."""
    total = float(np.sum(wall_ms))
    return len(wall_ms) * 1000.0 / total if total > 0 else math.nan


def moving_block_indices(n: int, block: int, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, n) indices of a moving-block bootstrap: ceil(n/block) blocks of `block`
    consecutive tokens, start points uniform over the n - block + 1 possible, cut to n."""
    block = min(block, n)
    k = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(reps, k))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(reps, k * block)
    return idx[:, :n]


def resampled_rates(series: Sequence[np.ndarray], seed: int, reps: int = REPS) -> np.ndarray:
    """Moving-block bootstrap of tokens/s: (reps, len(series)) resampled throughputs, each
    series resampled independently with block length `ceil(n ** (1/3))`."""
    rng = np.random.default_rng(seed)
    out = np.empty((reps, len(series)))
    for j, s in enumerate(series):
        s = np.asarray(s, dtype=float)
        if len(s) == 0:
            out[:, j] = math.nan
            continue
        idx = moving_block_indices(len(s), block_length(len(s)), reps, rng)
        sums = s[idx].sum(axis=1)
        with np.errstate(divide="ignore"):
            out[:, j] = np.where(sums > 0, len(s) * 1000.0 / sums, math.nan)
    return out


def percentile_interval(estimate: float, draws: np.ndarray, level: float = LEVEL) -> Interval:
    """Percentile interval of bootstrap draws (NaN draws ignored) around `estimate`."""
    d = draws[np.isfinite(draws)]
    if len(d) == 0:
        return Interval(estimate, math.nan, math.nan, level)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(d, [a, 1.0 - a])
    return Interval(float(estimate), float(lo), float(hi), level)


def rate_interval(wall_ms: np.ndarray, seed: int, reps: int = REPS) -> Interval:
    """tokens/s of one window with a 95% moving-block bootstrap interval."""
    draws = resampled_rates([wall_ms], seed, reps)[:, 0]
    return percentile_interval(tokens_per_s(wall_ms), draws)


def ratio_interval(a_ms: np.ndarray, b_ms: np.ndarray, seed: int, reps: int = REPS) -> Interval:
    """tokens/s of `a` over tokens/s of `b` (>1: a faster), each window resampled by
    moving blocks independently; 95% percentile interval of the ratio."""
    draws = resampled_rates([a_ms, b_ms], seed, reps)
    return percentile_interval(tokens_per_s(a_ms) / tokens_per_s(b_ms),
                               draws[:, 0] / draws[:, 1])


def pooled_ratio_interval(series: Sequence[np.ndarray], pairs: Sequence[tuple[int, int]],
                          seed: int, reps: int = REPS) -> Interval:
    """Geometric mean of the ratios rate[a]/rate[b] over `pairs` (indices into `series`).
    Each series is resampled once per replicate (moving blocks), so a cell shared by two
    pairs moves both ratios together, as it should."""
    draws = resampled_rates(series, seed, reps)
    point = np.array([tokens_per_s(np.asarray(s, dtype=float)) for s in series])

    def gmean(r: np.ndarray) -> np.ndarray:
        logs = [np.log(r[..., a] / r[..., b]) for a, b in pairs]
        return np.exp(np.mean(logs, axis=0))

    return percentile_interval(float(gmean(point)), gmean(draws))


def percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile (linear interpolation), NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan
