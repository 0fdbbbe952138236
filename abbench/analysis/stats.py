"""Statistics: pure functions over per-token times and per-cell log throughputs.

Tokens of one decode are autocorrelated (the cache warms, the device heats, a burst of
misses spans several tokens), so an ordinary bootstrap that resamples single tokens would
understate the spread. Everything here resamples **moving blocks** of consecutive tokens
(Künsch 1989) with the block length `ceil(n ** (1/3))` — the n^(1/3) rate that is optimal
for the variance of a block-bootstrap estimate (Hall, Horowitz & Jing 1995) — and reads
intervals as percentiles of the resampled statistic. Every bootstrap takes an explicit
seed, so a report rendered twice from the same run folder prints the same intervals.

A decision's interval has two levels (Kalibera & Jones 2013; docs/method.md): tokens within
a cell, and cells. The token level is the moving-block bootstrap's variance of a cell's
log throughput, in closed form (`log_rate_token_variance`); the cell level is the variance
of repeats of one configuration (`Noise`), with its degrees of freedom, and the interval on
a contrast of cells is a Student t at that level (`contrast_interval`).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
        sums = _resampled_sums(s, block_length(len(s)), reps, rng)
        with np.errstate(divide="ignore"):
            out[:, j] = np.where(sums > 0, len(s) * 1000.0 / sums, math.nan)
    return out


def _resampled_sums(s: np.ndarray, block: int, reps: int, rng: np.random.Generator
                    ) -> np.ndarray:
    """(reps,) sums of a moving-block bootstrap of `s`, the draws `moving_block_indices`
    makes: the sum of each resampled series as the sum of its blocks' sums (the last block
    cut to what is left of n), read from the series' prefix sums instead of gathering
    (reps, n) values — the same resamples at about 1/block of the work."""
    n = len(s)
    block = min(block, n)
    k = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(reps, k))  # as moving_block_indices draws
    prefix = np.concatenate(([0.0], np.cumsum(s)))  # (n + 1,)
    whole = prefix[block:] - prefix[:n - block + 1]  # (n - block + 1,): each block's sum
    tail = n - (k - 1) * block  # tokens of the last block kept
    cut = prefix[tail:tail + n - block + 1] - prefix[:n - block + 1]
    return whole[starts[:, :k - 1]].sum(axis=1) + cut[starts[:, k - 1]]


def resampled_means(values: np.ndarray, weights: np.ndarray, seed: int,
                    reps: int = REPS) -> np.ndarray:
    """Moving-block bootstrap of a weighted mean sum(v·w) / sum(w) over one series (a
    cell's power readings): (reps,) draws, block length `ceil(n ** (1/3))`."""
    rng = np.random.default_rng(seed)
    idx = moving_block_indices(len(values), block_length(len(values)), reps, rng)
    return (values[idx] * weights[idx]).sum(axis=1) / weights[idx].sum(axis=1)


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


def ratio_of_draws(a_ms: np.ndarray, b_ms: np.ndarray, a_draws: np.ndarray,
                   b_draws: np.ndarray) -> Interval:
    """tokens/s of `a` over `b` with the 95% interval of their bootstrap draws' ratio: each
    window's own moving-block draws (`cell_draws`), resampled once per cell and read by
    every ratio it is in — as `pooled_ratio_interval` resamples each series once."""
    return percentile_interval(tokens_per_s(a_ms) / tokens_per_s(b_ms), a_draws / b_draws)


def cell_draws(wall_ms: np.ndarray, seed: int, reps: int = REPS) -> tuple[Interval, np.ndarray]:
    """A window's tokens/s with its 95% interval (`rate_interval`, the same draws) and the
    draws themselves, (reps,)."""
    draws = resampled_rates([wall_ms], seed, reps)[:, 0]
    return percentile_interval(tokens_per_s(wall_ms), draws), draws


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


# -- two levels: tokens within cells, cells ---------------------------------------------


def log_rate(wall_ms: np.ndarray) -> float:
    """log(tokens/s) of a window: the scale on which cells are compared (a ratio of two
    cells is a difference of logs)."""
    r = tokens_per_s(np.asarray(wall_ms, dtype=float))
    return math.log(r) if r > 0 and math.isfinite(r) else math.nan


def log_rate_token_variance(wall_ms: np.ndarray) -> float:
    """The token-level variance of a window's log tokens/s: the moving-block bootstrap's
    variance, in closed form.

    With block length b = `block_length(n)`, the moving-block bootstrap variance of a sum of
    n autocorrelated times is n times the Bartlett-window sum of autocovariances
    `g0 + 2 * sum_{k<b} (1 - k/b) g_k` (Künsch 1989, section 3); the log of a throughput
    `n / sum(t)` moves by `d sum / sum` (the delta method). No resampling, so no seed: the
    same window always gives the same variance. NaN for fewer than 2 tokens."""
    t = np.asarray(wall_ms, dtype=float)
    n = len(t)
    if n < 2 or not np.all(np.isfinite(t)) or float(t.sum()) <= 0:
        return math.nan
    b = min(block_length(n), n)
    d = t - t.mean()
    lrv = float(d @ d) / n
    for k in range(1, b):
        lrv += 2.0 * (1.0 - k / b) * float(d[:-k] @ d[k:]) / n
    lrv = max(lrv, 0.0)
    return lrv / (n * float(t.mean()) ** 2)


@dataclass(frozen=True)
class Noise:
    """Cell-to-cell noise: how far the log throughput of the next identical cell lands.

    `variance` is the pooled variance of repeats' log tokens/s around their configuration's
    mean (token noise included: it is what a repeat shows), with `df` degrees of freedom;
    `token_variance` the mean token-level part of it (moving blocks). The between-cell part
    is their difference, at least 0."""

    variance: float
    df: int
    token_variance: float = 0.0
    repeats: int = 0  # cells in the repeat groups behind it
    source: str = "none"  # "this campaign" | "device history" | "this campaign + device history"
    note: str | None = None  # why the source was chosen, when there was a choice

    @property
    def known(self) -> bool:
        return self.df >= 1 and math.isfinite(self.variance)

    @property
    def between(self) -> float:
        """The cell level alone: the variance a repeat shows beyond its token noise."""
        return max(0.0, self.variance - self.token_variance) if self.known else math.nan

    @property
    def sd(self) -> float:
        """The standard deviation of a cell's log tokens/s (≈ a relative spread: 0.04 is
        about ±4%)."""
        return math.sqrt(self.variance) if self.known else math.nan


UNKNOWN_NOISE = Noise(math.nan, 0)


def pooled_noise(groups: Sequence[Sequence[tuple[float, float]]], source: str) -> Noise:
    """One-way pooled variance of repeat groups: each group is the (log rate, token
    variance) of cells of one configuration that did equal work; df = sum(n_k - 1).

    The token variance of a cell without per-token times is taken as 0 (its part is then in
    the between-cell share)."""
    ss, df, tok, cells = 0.0, 0, 0.0, 0
    for g in groups:
        y = np.array([p[0] for p in g], dtype=float)
        if len(y) < 2 or not np.all(np.isfinite(y)):
            continue
        v = np.array([p[1] if math.isfinite(p[1]) else 0.0 for p in g], dtype=float)
        ss += float(np.sum((y - y.mean()) ** 2))
        # E[SS] = (n - 1) * between + sum(v) * (1 - 1/n): the token part of the group.
        tok += float(v.sum()) * (1.0 - 1.0 / len(y))
        df += len(y) - 1
        cells += len(y)
    if df == 0:
        return UNKNOWN_NOISE
    return Noise(ss / df, df, tok / df, cells, source)


def combine_noise(own: Noise, history: Noise, level: float = 0.95) -> Noise:
    """This campaign's noise and the device history's, as one estimate.

    Either alone when only one is known. Both: pooled by degrees of freedom, unless this
    campaign is noisier than the history by more than chance allows (a one-sided F test at
    `level`), in which case this campaign's own estimate stands: a device that is noisier
    today than it used to be must not borrow yesterday's quiet."""
    if not own.known:
        return history
    if not history.known:
        return own
    f = own.variance / history.variance if history.variance > 0 else math.inf
    if f > float(_scipy_stats().f.ppf(level, own.df, history.df)):
        return Noise(own.variance, own.df, own.token_variance, own.repeats, own.source,
                     f"this campaign's repeats vary more than the device history's "
                     f"(±{math.sqrt(own.variance):.1%} vs ±{math.sqrt(history.variance):.1%}, "
                     f"F = {f:.2f}): the history is not used")
    df = own.df + history.df
    return Noise((own.variance * own.df + history.variance * history.df) / df, df,
                 (own.token_variance * own.df + history.token_variance * history.df) / df,
                 own.repeats + history.repeats, "this campaign + device history")


@functools.cache
def _scipy_stats() -> Any:
    """scipy.stats, imported when a quantile is first needed: importing it costs ~0.3 s and
    ~25 MiB of RSS (scipy's own OpenBLAS among its libraries), which every process that
    imports the CLI — each embedded-engine cell among them — would otherwise pay."""
    from scipy import stats

    return stats


# Cached: a campaign's analysis asks for the same few quantiles thousands of times, and
# each of scipy's costs about 0.1 ms (half of a simulated campaign's decision, measured).
@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (the normal for inf)."""
    sps = _scipy_stats()
    return float(sps.norm.ppf(p)) if math.isinf(df) else float(sps.t.ppf(p, df))


def contrast_se(weights: Sequence[float], token_vars: Sequence[float], noise: Noise) -> float:
    """The standard error of sum(w_i * log rate_i) over independent cells, each with the
    between-cell variance plus its own token-level variance (the noise's mean token
    variance where a cell has none)."""
    if not noise.known:
        return math.nan
    total = 0.0
    for w, v in zip(weights, token_vars):
        v = v if math.isfinite(v) else noise.token_variance
        total += w * w * (noise.between + v)
    return math.sqrt(total)


def contrast_interval(estimate: float, se: float, df: float, alpha: float) -> Interval:
    """exp(estimate ± t(1 - alpha/2, df) * se): a ratio's two-sided interval at level
    1 - alpha. NaN ends when the standard error is unknown."""
    if not (math.isfinite(se) and df >= 1):
        return Interval(math.exp(estimate), math.nan, math.nan, 1.0 - alpha)
    half = t_quantile(1.0 - alpha / 2.0, df) * se
    return Interval(math.exp(estimate), math.exp(estimate - half), math.exp(estimate + half),
                    1.0 - alpha)


def resolvable_effect(se: float, df: float, alpha: float, power: float = 0.8) -> float:
    """The smallest true ratio change a contrast with this standard error resolves with
    `power` at a two-sided `alpha`: exp((t(1 - alpha/2) + t(power)) * se) - 1."""
    if not (math.isfinite(se) and df >= 1):
        return math.nan
    return math.exp((t_quantile(1.0 - alpha / 2.0, df) + t_quantile(power, df)) * se) - 1.0
