"""Looking again without raising the false-verdict rate: alpha spending with exact
group-sequential boundaries.

A sequential campaign (`[campaign] until = "decided"`) reads its decisions after the planned
order and after every appended round. `spent(f)` is a power-family spending function (Kim &
DeMets 1987) of the budget fraction f used so far: the chance, in an A/A campaign, that any
look up to f says GO or NO-GO. Look k gets the boundary c_k on the standardised contrast
such that an A/A campaign first crosses a boundary at look k with probability
`spent(f_k) - spent(f_{k-1})` (Lan & DeMets 1983); the look after which no round fits the
budget spends what is left, so the looks spend `ALPHA` in all. The looks' statistics are
taken as a Brownian motion observed at the fractions (correlation sqrt(f_i / f_j)), the
budget fraction standing for the share of information, and the crossing probabilities are
integrated numerically, look by look (Armitage, McPherson & Rowe 1969; Jennison & Turnbull
2000, ch. 19). A look tests at the two-sided level `2 * (1 - Phi(c_k))`, which the
decision's t interval (few degrees of freedom) then uses.

The union bound (each look at its spent increment) needs no model of the looks'
correlation, but spends far less than it may: the looks of one campaign share their cells.
docs/method.md gives the choice of `RHO` and the false-verdict rates measured by
simulation with known truth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05  # two-sided: a 95% interval for a campaign with one look
RHO = 2.0  # spending exponent: 2 keeps most of the alpha for the later, better-informed looks
MIN_ALPHA = 1e-6  # a look always tests at some level
_GRID = 401  # the fewest points across a continuation region (odd: Simpson's rule)
_MAX_GRID = 2001  # the most: a (G, G) kernel of float64 is 32 MB
_SAME = 1e-6  # looks closer than this in budget fraction are one test


def spent(fraction: float, alpha: float = ALPHA, rho: float = RHO) -> float:
    """The alpha spent once `fraction` of the budget is used (0 at 0, `alpha` at 1)."""
    return alpha * min(1.0, max(0.0, fraction)) ** rho


def look_alpha(fractions: Sequence[float], final: bool, alpha: float = ALPHA,
               rho: float = RHO) -> float:
    """The two-sided level of the last of the looks taken at budget `fractions` (in order;
    the earlier ones as they were taken), the last spending the rest where `final`."""
    key = tuple(round(min(1.0, max(0.0, f)), 9) for f in fractions)
    if not key:
        raise ValueError("a look needs its budget fraction")
    c = _boundaries(key, final, alpha, rho)[-1]
    return max(2.0 * _normal_cdf(-c), MIN_ALPHA)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _simpson(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w / 3.0


def _excess(c: float, scale: float, grid: np.ndarray, mass: np.ndarray, sd: float,
            target: float) -> float:
    """How far the chance that the unstopped paths — at `grid` (G,) with `mass` (G,) at the
    last look — cross |Z| >= c at this look (|x| >= c * `scale` after a step of `sd`)
    exceeds `target`."""
    from scipy.special import ndtr  # scipy: imported where a boundary is first computed

    b = c * scale
    return float(np.sum(mass * (ndtr((-b - grid) / sd) + ndtr((grid - b) / sd)))) - target


@functools.lru_cache(maxsize=1024)
def _boundaries(fractions: tuple[float, ...], final: bool, alpha: float,
                rho: float) -> tuple[float, ...]:
    """c_1..c_k on |Z| for looks at `fractions`: the sub-density of the unstopped path,
    carried from look to look on a grid, gives each look's first-crossing chance."""
    # scipy.optimize costs ~0.3 s to import: every command line (and every engine cell, run
    # through the CLI) would pay it, where only a sequential campaign's looks need it.
    from scipy.optimize import brentq
    from scipy.special import ndtri

    cs: list[float] = []
    grid = weights = density = None  # the path's position at the last look, and its density
    t_prev = 0.0
    for k, t in enumerate(fractions):
        if cs and t - t_prev < _SAME:  # nothing learnt since: the same test, nothing spent
            cs.append(cs[-1])
            continue
        last = final and k == len(fractions) - 1
        upto = alpha if last else spent(t, alpha, rho)
        target = max(upto - spent(t_prev, alpha, rho), MIN_ALPHA / 2)  # spent(0) is 0
        sd = math.sqrt(t - t_prev)
        if grid is None:
            c = float(-ndtri(target / 2.0))
        else:
            mass = weights * density  # (G,)
            c = brentq(_excess, 0.0, 40.0, args=(math.sqrt(t), grid, mass, sd, target),
                       xtol=1e-7)
        cs.append(c)
        b = c * math.sqrt(t)
        # a grid fine enough for the next step's kernel (4 points to its sd), odd
        step = math.sqrt(max(fractions[k + 1] - t, 1e-4)) if k + 1 < len(fractions) else 1.0
        points = min(_MAX_GRID, max(_GRID, 2 * math.ceil(2 * b / (step / 4) / 2) + 1))
        new_grid = np.linspace(-b, b, points)  # (G,)
        if grid is None:
            density = np.exp(-new_grid**2 / (2 * t)) / math.sqrt(2 * math.pi * t)
        else:
            kernel = np.exp(-np.subtract.outer(new_grid, grid) ** 2 / (2 * sd * sd)) / (
                sd * math.sqrt(2 * math.pi))  # (G', G): from y (columns) to x (rows)
            density = kernel @ (weights * density)
        grid, weights = new_grid, _simpson(points) * (new_grid[1] - new_grid[0])
        t_prev = t
    return tuple(cs)
