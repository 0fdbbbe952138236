"""Simulated campaigns with known truth, decided by the product's own analysis.

Each cell's log tokens/s is `mu + effect * [candidate] + sigma * z` (a lognormal cell
effect; with `Load(tails="t3")` z is Student t with 3 df, scaled to unit variance), plus
the load process's slowdown: a two-state chain over cells in execution order — from a
quiet cell a burst starts with probability `Load.rate`, lasts 1-3 cells (uniform) and slows
every cell it covers by one depth drawn from 20..40% — and its per-token wall times carry
AR(1) noise. A burst is invisible to the device criteria unless `Load.visible`: then the
foreign-load criterion fails between a cell in a burst and one outside it, as the host-load
sensor makes it fail on a device. The cells are handed to
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
from abbench.analysis.decide import Decision
from abbench.analysis.interleave import RunPair, SlicePair, interleaved_decision
from abbench.analysis.matching import Criterion, PairMatch
from abbench.analysis.noise import campaign_noise, floor_noise
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
class Load:
    """Episodic interference: bursts that span whole cells, and the cell effects' tails."""

    rate: float = 0.0  # chance a burst starts at a quiet cell
    tails: str = "normal"  # or "t3": Student t, 3 df, unit variance
    visible: bool = False  # the foreign-load sensor sees a burst
    depth: tuple[float, float] = (0.20, 0.40)  # a burst's slowdown
    length: tuple[int, int] = (1, 3)  # cells

    @property
    def name(self) -> str:
        rate = f"bursts 1 in {1 / self.rate:.0f}" if self.rate else "no bursts"
        seen = ", seen" if self.rate and self.visible else ""
        return f"{rate}{seen}, {self.tails} cells"


QUIET = Load()
_FOREIGN = Criterion("foreign_load", "fail", 0, 1, 0.25, "one cell ran in a burst")


@dataclass(frozen=True)
class Design:
    name: str
    order: tuple[str, ...]  # candidate "C", baseline "B"
    max_cells: int | None = None  # sequential when set
    same_config: bool = False  # C is B under another name (an A/A of one configuration)


def _cell(i: int, name: str, wall: np.ndarray, key: str, burst: bool = False) -> CellStats:
    # a burst's mark rides in the label's suffix: `_matches_with` reads it back
    return CellStats(index=i, name=name, label=f"{i + 1:02d}-{name}{'!' if burst else ''}",
                     status="ok",
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


def _matches_with(cells: Sequence[CellStats]) -> dict[tuple[int, int], PairMatch]:
    """The matches of `_matches`, with the foreign-load criterion failing (the pair and the
    repeat unmatched) wherever exactly one cell of a pair ran in a seen burst."""
    out = dict(_matches(len(cells)))
    burst = [c.label.endswith("!") for c in cells]
    for (i, j), m in out.items():
        if burst[i] != burst[j]:
            out[(i, j)] = PairMatch(i, j, "unmatched", (*m.criteria, _FOREIGN),
                                    (*m.reasons, "foreign load"))
    return out


class Campaigns:
    """Draws cells for one (sigma, effect, load) setting; `run(design)` gives a verdict."""

    def __init__(self, sigma: float, effect: float, seed: int,
                 decision: dict | None = None, floor: NoiseFloor | None = None,
                 load: Load = QUIET) -> None:
        self.floor = floor
        self.load = load
        self._burst_left = 0
        self._burst_depth = 0.0
        self.sigma, self.effect = sigma, effect
        self.rng = np.random.default_rng(seed)
        self.decision = DecisionSpec(**(decision or {"candidate": "C", "baseline": "B",
                                                     "min_effect": 0.03}))
        innov = TOKEN_CV * math.sqrt(1 - PHI * PHI)
        self._innov = innov

    def _z(self) -> float:
        if self.load.tails == "t3":
            return float(self.rng.standard_t(3)) / math.sqrt(3.0)
        return float(self.rng.standard_normal())

    def _burst(self) -> bool:
        """Advance the load chain by one cell: is this cell in a burst (and how deep)?"""
        if self._burst_left == 0 and self.load.rate and self.rng.random() < self.load.rate:
            lo, hi = self.load.length
            self._burst_left = int(self.rng.integers(lo, hi + 1))
            self._burst_depth = float(self.rng.uniform(*self.load.depth))
        if self._burst_left:
            self._burst_left -= 1
            return True
        return False

    def _wall(self, name: str, burst: bool = False) -> np.ndarray:
        level = self.sigma * self._z()
        if name == "C":
            level += math.log1p(self.effect)
        if burst:
            level += math.log1p(-self._burst_depth)
        e = lfilter([1.0], [1.0, -PHI], self.rng.normal(0, self._innov, TOKENS + 50))[50:]
        return BASE_MS * np.exp(-level) * np.maximum(1.0 + e, 0.05)

    def _next(self, i: int, name: str, key: str) -> CellStats:
        burst = self._burst()
        return _cell(i, name, self._wall(name, burst), key, burst and self.load.visible)

    def calibrated(self, cells: int = 6) -> NoiseFloor:
        """The floor `abbench calibrate` records: `cells` cells of B in a row, their pooled
        noise by the product's own code (one repeat group: `cells - 1` df)."""
        group = [self._next(i, "B", "cfg-B") for i in range(cells)]
        n = campaign_noise([group])
        return NoiseFloor(n.variance, n.df, n.token_variance, n.repeats)

    def run(self, design: Design) -> tuple[str, int]:
        """(verdict, cells run) of one simulated campaign."""
        return self.run_decision(design)[0]

    def run_decision(self, design: Design) -> tuple[tuple[str, int], Decision]:
        """((verdict, cells run), the decision) of one simulated campaign."""
        key = {"B": "cfg-B", "C": "cfg-B" if design.same_config else "cfg-C"}
        names = list(design.order)
        self._burst_left = 0  # each campaign starts quiet
        cells = [self._next(i, nm, key[nm]) for i, nm in enumerate(names)]
        fractions: list[float] = []
        while True:
            n = len(names)
            plan = Plan("sim", (), 0.0, 0, "sim", decisions=(self.decision,))
            if design.max_cells is None:
                alpha, final = ALPHA, True
            else:
                fractions.append(n / design.max_cells)
                final = n + len(next_round(names[-1], [("C", "B")])) > design.max_cells
                alpha = look_alpha(fractions, final)
            matches = _matches_with(cells) if self.load.visible else _matches(n)
            (d,), _ = decisions_at(plan, cells, matches, self.floor, n, alpha)
            if d.decided or final:
                return (d.verdict, n), d
            for nm in next_round(names[-1], [("C", "B")]):
                cells.append(self._next(len(names), nm, key[nm]))
                names.append(nm)


def rates(design: Design, sigma: float, effect: float, campaigns: int, seed: int,
          decision: dict | None = None, floor: NoiseFloor | None = None,
          load: Load = QUIET) -> dict[str, float]:
    """Each verdict's share of `campaigns`, the mean cells run ("cells"), and the share
    of campaigns whose interval held the true ratio ("covered", of those with one)."""
    sim = Campaigns(sigma, effect, seed, decision, floor, load)
    return _tally([sim.run_decision(design) for _ in range(campaigns)], effect)


DESIGNS: Sequence[Design] = (
    Design("B,C,B", ("B", "C", "B")),
    Design("ABBA", ("B", "C", "C", "B")),
    Design("ABABAB", ("C", "B", "C", "B", "C", "B")),
    Design("until decided", ("B", "C", "C", "B"), max_cells=16),
)


@dataclass(frozen=True)
class Interleaved:
    """An interleaved design (`interleave = "slices"`): `pairs` run pairs, the arm that
    starts alternating, each arm `TOKENS` tokens in slices of `slice_tokens`; sequential
    (two more run pairs a round) up to `max_pairs` when set."""

    name: str
    pairs: int
    slice_tokens: int = 16
    max_pairs: int | None = None

    @property
    def slices(self) -> int:
        return TOKENS // self.slice_tokens


class InterleavedCampaigns(Campaigns):
    """The same device as `Campaigns` (cell effect per process, the load chain, the token
    noise), run as interleaved slices: the load chain steps once per slice, a burst lasting
    1-3 cells' worth of slices and starting as often per unit of time as in a cell design."""

    def _slice_sd(self) -> float:
        # log rate of a slice of AR(1) token times: the long-run sd over slice_tokens
        return TOKEN_CV * math.sqrt((1 + PHI) / (1 - PHI)) / math.sqrt(self._slice_tokens)

    def _slice_burst(self, per_cell: int) -> bool:
        if self._burst_left == 0 and self.load.rate \
                and self.rng.random() < self.load.rate / per_cell:
            lo, hi = self.load.length
            self._burst_left = int(self.rng.integers(lo, hi + 1)) * per_cell
            self._burst_depth = float(self.rng.uniform(*self.load.depth))
        if self._burst_left:
            self._burst_left -= 1
            return True
        return False

    def _run_pair(self, k: int, design: Interleaved) -> RunPair:
        self._slice_tokens = design.slice_tokens
        u = {"C": self.sigma * self._z() + math.log1p(self.effect), "B": self.sigma * self._z()}
        first, second = ("C", "B") if k % 2 == 0 else ("B", "C")
        out = []
        for _ in range(design.slices):
            rate, burst = {}, {}
            for arm in (first, second):
                burst[arm] = self._slice_burst(design.slices)
                rate[arm] = u[arm] + self._slice_sd() * float(self.rng.standard_normal()) \
                    + (math.log1p(-self._burst_depth) if burst[arm] else 0.0)
            seen = self.load.visible and burst["C"] != burst["B"]
            out.append(SlicePair(rate["C"], rate["B"], not seen,
                                 "foreign load" if seen else ""))
        return RunPair(2 * k + (first == "B"), 2 * k + (first == "C"), first == "C",
                       tuple(out))

    def run_interleaved(self, design: Interleaved) -> tuple[tuple[str, int], Decision]:
        """((verdict, cells run), the decision) of one simulated interleaved campaign."""
        self._burst_left = 0
        pairs = [self._run_pair(k, design) for k in range(design.pairs)]
        fractions: list[float] = []
        while True:
            if design.max_pairs is None:
                alpha, final = ALPHA, True
            else:
                fractions.append(len(pairs) / design.max_pairs)
                final = len(pairs) + 2 > design.max_pairs
                alpha = look_alpha(fractions, final)
            d = interleaved_decision(self.decision, pairs, floor_noise(self.floor), alpha)
            if d.decided or final:
                return (d.verdict, 2 * len(pairs)), d
            pairs += [self._run_pair(len(pairs) + i, design) for i in range(2)]


def interleaved_rates(design: Interleaved, sigma: float, effect: float, campaigns: int,
                      seed: int, load: Load = QUIET, decision: dict | None = None,
                      floor: NoiseFloor | None = None) -> dict[str, float]:
    """As `rates`, for an interleaved design."""
    sim = InterleavedCampaigns(sigma, effect, seed, decision, floor, load)
    return _tally([sim.run_interleaved(design) for _ in range(campaigns)], effect)


def _tally(runs: Sequence[tuple[tuple[str, int], Decision]], effect: float
           ) -> dict[str, float]:
    counts: dict[str, int] = {}
    cells = covered = with_interval = 0
    for (v, n), d in runs:
        counts[v] = counts.get(v, 0) + 1
        cells += n
        if d.ratio is not None and d.noise is not None and d.noise.known \
                and math.isfinite(d.ratio.low):
            with_interval += 1
            covered += d.ratio.low <= 1.0 + effect <= d.ratio.high
    out = {k: v / len(runs) for k, v in counts.items()}
    out["cells"] = cells / len(runs)
    out["covered"] = covered / with_interval if with_interval else math.nan
    return out


INTERLEAVED: Sequence[Interleaved] = (
    Interleaved("interleaved x4", 4),
    Interleaved("interleaved until decided", 4, max_pairs=8),
)
