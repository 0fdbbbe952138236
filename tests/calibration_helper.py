"""Simulated campaigns with known truth, decided by the product's own analysis.

Each cell's log tokens/s is `mu + effect * [candidate] + sigma * z` (a lognormal cell
effect), and its per-token wall times carry AR(1) noise; the cells are handed to
`analysis.campaign.decisions_at` (repeat groups, noise, two-level intervals, verdicts) as
matched adjacent pairs, and sequential designs take their looks and rounds from the same
functions the runner uses (`campaign.sequential`, `analysis.sequential`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.signal import lfilter

from abbench.analysis.campaign import decisions_at
from abbench.analysis.cells import CellStats, DeviceDuring
from abbench.analysis.matching import Criterion, PairMatch
from abbench.analysis.sequential import ALPHA, look_alpha
from abbench.analysis.stats import Interval, log_rate, log_rate_token_variance
from abbench.campaign.sequential import next_round
from abbench.records import DecisionSpec, NoiseFloor, Plan

TOKENS = 112  # steady tokens per cell
PHI = 0.5  # AR(1) coefficient of per-token times
TOKEN_CV = 0.10  # marginal spread of one token's time
BASE_MS = 80.0
_DURING = DeviceDuring((), {}, (), None, None, None, 0)
_OK = Criterion("adjacent", "ok", 0, 1, 1, "adjacent")
_FAR = Criterion("adjacent", "fail", 0, 2, 1, "not adjacent")


@dataclass(frozen=True)
class Design:
    name: str
    order: tuple[str, ...]  # candidate "C", baseline "B"
    max_cells: int | None = None  # sequential when set
    same_config: bool = False  # C is B under another name (an A/A of one configuration)


def _cell(i: int, name: str, wall: np.ndarray, key: str) -> CellStats:
    return CellStats(index=i, name=name, label=f"{i + 1:02d}-{name}", status="ok",
                     fingerprint=f"fp-{key}", source="per_token", tokens=len(wall),
                     steady_tokens=len(wall), tokens_per_s=Interval(math.nan, math.nan, math.nan),
                     during=_DURING, config_key=key, log_rate=log_rate(wall),
                     token_variance=log_rate_token_variance(wall))


@functools.lru_cache(maxsize=64)
def _matches(n: int) -> dict[tuple[int, int], PairMatch]:
    out = {}
    for i in range(n):
        for j in range(i + 1, n):
            adj = j == i + 1
            out[(i, j)] = PairMatch(i, j, "matched" if adj else "unmatched",
                                    (_OK if adj else _FAR,), () if adj else ("far",))
    return out


class Campaigns:
    """Draws cells for one (sigma, effect) setting; `run(design)` gives a verdict."""

    def __init__(self, sigma: float, effect: float, seed: int,
                 decision: dict | None = None, floor: NoiseFloor | None = None) -> None:
        self.floor = floor
        self.sigma, self.effect = sigma, effect
        self.rng = np.random.default_rng(seed)
        self.decision = DecisionSpec(**(decision or {"candidate": "C", "baseline": "B",
                                                     "min_effect": 0.03}))
        innov = TOKEN_CV * math.sqrt(1 - PHI * PHI)
        self._innov = innov

    def _wall(self, name: str) -> np.ndarray:
        level = self.sigma * self.rng.standard_normal()
        if name == "C":
            level += math.log1p(self.effect)
        e = lfilter([1.0], [1.0, -PHI], self.rng.normal(0, self._innov, TOKENS + 50))[50:]
        return BASE_MS * np.exp(-level) * np.maximum(1.0 + e, 0.05)

    def run(self, design: Design) -> tuple[str, int]:
        """(verdict, cells run) of one simulated campaign."""
        key = {"B": "cfg-B", "C": "cfg-B" if design.same_config else "cfg-C"}
        names = list(design.order)
        cells = [_cell(i, nm, self._wall(nm), key[nm]) for i, nm in enumerate(names)]
        prev = 0.0
        while True:
            n = len(names)
            plan = Plan("sim", (), 0.0, 0, "sim", decisions=(self.decision,))
            if design.max_cells is None:
                alpha, final = ALPHA, True
            else:
                fraction = n / design.max_cells
                final = n + len(next_round(names[-1], [("C", "B")])) > design.max_cells
                alpha = look_alpha(prev, fraction, final)
                prev = fraction
            (d,), _ = decisions_at(plan, cells, _matches(n), self.floor, n, alpha)
            if d.decided or final:
                return d.verdict, n
            for nm in next_round(names[-1], [("C", "B")]):
                cells.append(_cell(len(names), nm, self._wall(nm), key[nm]))
                names.append(nm)


def rates(design: Design, sigma: float, effect: float, campaigns: int, seed: int,
          decision: dict | None = None, floor: NoiseFloor | None = None) -> dict[str, float]:
    sim = Campaigns(sigma, effect, seed, decision, floor)
    counts: dict[str, int] = {}
    cells = 0
    for _ in range(campaigns):
        v, n = sim.run(design)
        counts[v] = counts.get(v, 0) + 1
        cells += n
    out = {k: v / campaigns for k, v in counts.items()}
    out["cells"] = cells / campaigns
    return out


DESIGNS: Sequence[Design] = (
    Design("B,C,B", ("B", "C", "B")),
    Design("ABBA", ("B", "C", "C", "B")),
    Design("ABABAB", ("C", "B", "C", "B", "C", "B")),
    Design("until decided", ("B", "C", "C", "B"), max_cells=16),
)
