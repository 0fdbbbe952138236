"""Decisions: the campaign's release questions answered from matched pairs only, with the
cell as the unit of evidence (docs/method.md#the-cell-is-the-unit-of-evidence).

For `candidate` vs `baseline`, every (candidate cell, baseline cell) combination is a
comparison. Only comparable pairs (matched, or — when the run holds no device state at
all — unverified) carry a ratio. The decision's ratio is the geometric mean of its pairs'
candidate/baseline tokens/s: a contrast `sum(w_i * log rate_i)` over the cells behind it,
with `w_i` = (pairs the cell is the candidate in − pairs it is the baseline in) / pairs.
Its interval has two levels: each cell's token-level variance (moving blocks) plus the
between-cell variance of the campaign's cell-to-cell noise (`stats.Noise`, from repeats
here or in the device history), read as a Student t with the noise's degrees of freedom.
With no estimate of the noise there is no GO or NO-GO.

| expect | GO | NO-GO |
|---|---|---|
| faster (default) | the interval lies above `1 + min_effect` | it lies below 1 |
| not-slower | it lies above `1 - max_regression` | it lies below `1 - max_regression` |

Otherwise INCONCLUSIVE (it straddles, or the noise is unknown); OWED when no matched pair
exists; UNVERIFIED when only unverified pairs exist (`unverified_verdict` says what they
would give), or when the arms differ in more than the decision asks about (an import's
`DecisionSpec.confounds`: the ratio measures those changes too, so a GO or NO-GO is
UNVERIFIED; `confounded`).

`metric = "energy_per_token"` asks the same of energy: the cells, pairs and noise it is
decided on are its metric's (`analysis/metrics.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from abbench.analysis.cells import CellStats
from abbench.analysis.confound import describe
from abbench.analysis.matching import Matches, PairMatch
from abbench.analysis.metrics import metric
from abbench.analysis.noise import cell_log_rate
from abbench.analysis.sequential import ALPHA
from abbench.analysis.stats import (
    Interval,
    Noise,
    contrast_interval,
    contrast_se,
    resolvable_effect,
    t_quantile,
)
from abbench.records import DecisionSpec

GO, NO_GO, INCONCLUSIVE, OWED, UNVERIFIED = "GO", "NO-GO", "INCONCLUSIVE", "OWED", "UNVERIFIED"
EXIT_FOR = {GO: 0, NO_GO: 1, INCONCLUSIVE: 3, OWED: 3, UNVERIFIED: 3}
POWER = 0.8  # for the smallest effect a campaign could resolve
FEW_DF = 5  # a noise estimate with fewer degrees of freedom makes a wide t: say so


@dataclass(frozen=True)
class Comparison:
    candidate: int  # cell index
    baseline: int
    match: PairMatch
    ratio: Interval | None  # candidate / baseline; only for comparable pairs

    @property
    def candidate_first(self) -> bool:
        return self.candidate < self.baseline


@dataclass(frozen=True)
class OrderEffect:
    """How the pairs behind a decision were ordered, and what that order did."""

    candidate_first: int  # pairs in which the candidate ran first
    baseline_first: int
    # With pairs in both orders: the second cell of a pair over the first, as a ratio
    # (1: no position effect), with its interval at the decision's level.
    position: Interval | None = None
    flagged: bool = False  # the position interval excludes 1


@dataclass(frozen=True)
class Decision:
    candidate: str
    baseline: str
    min_effect: float
    verdict: str
    unverified_verdict: str | None  # set when verdict is UNVERIFIED
    ratio: Interval | None  # pooled over `pairs`
    pairs: tuple[Comparison, ...]  # the comparable pairs the verdict rests on
    unmatched: tuple[Comparison, ...]  # listed with the reason, never a number
    reason: str
    settle: str | None  # what would settle it (OWED / INCONCLUSIVE)
    order_warning: str | None
    expect: str = "faster"
    max_regression: float | None = None
    noise: Noise | None = None  # the cell-to-cell noise the interval used
    alpha: float = ALPHA  # two-sided: the interval's level is 1 - alpha
    se: float = math.nan  # standard error of the log ratio (both levels)
    token_se: float = math.nan  # its token level alone
    resolvable: float = math.nan  # smallest ratio change resolvable at 80% power
    order: OrderEffect | None = None
    identical: bool = False  # candidate and baseline have one configuration (A/A)
    consistency: str | None = None  # how the verdict squares with drift in the same cells
    look: int | None = None  # sequential: the look (1-based) the verdict was reached at
    metric: str = "tok_per_s"  # or "energy_per_token" (the ratio: tokens per joule)
    # interleaved campaigns: the run pairs and slice pairs the verdict rests on, in words
    slices: str | None = None
    # imports: what else sets the arms apart than what the decision asks about, in words
    # (`DecisionSpec.confounds`); a GO or NO-GO on it is UNVERIFIED
    confound: str | None = None

    @property
    def decided(self) -> bool:
        return self.verdict in (GO, NO_GO)

    @property
    def matched(self) -> bool:
        """Every pair behind the verdict is matched: its ratio was measured at one device
        state, even where a confound leaves the verdict UNVERIFIED."""
        return bool(self.pairs) and all(p.match.state == "matched" for p in self.pairs)

    @property
    def threshold(self) -> float:
        """The ratio a GO must clear."""
        if self.expect == "not-slower":
            return 1.0 - (self.max_regression or 0.0)
        return 1.0 + self.min_effect


def verdict_of(ratio: Interval, expect: str, min_effect: float, max_regression: float | None,
             noise: Noise, worse: str = "slower") -> tuple[str, str]:
    if not noise.known:
        return INCONCLUSIVE, (f"ratio {ratio.estimate:.3f}, but the cell-to-cell noise is "
                              "unknown (no repeat of a configuration with equal work in this "
                              "campaign, no device history): no interval to decide on")
    if not (math.isfinite(ratio.low) and math.isfinite(ratio.high)):
        return INCONCLUSIVE, "no throughput in a pair: no interval to decide on"
    ci = f"{ratio.level:.0%} CI {ratio.low:.3f} .. {ratio.high:.3f}"
    if expect == "not-slower":
        bar = 1.0 - (max_regression or 0.0)
        if ratio.low > bar:
            return GO, (f"ratio {ratio.estimate:.3f} ({ci}) lies above 1 - "
                        f"{max_regression:g}: not {worse} by {max_regression:g} or more")
        if ratio.high < bar:
            return NO_GO, (f"ratio {ratio.estimate:.3f} ({ci}) lies below 1 - "
                           f"{max_regression:g}: {worse} by more than {max_regression:g}")
        return INCONCLUSIVE, (f"ratio {ratio.estimate:.3f} ({ci}) straddles 1 - "
                              f"{max_regression:g}")
    if ratio.low > 1 + min_effect:
        return GO, f"ratio {ratio.estimate:.3f} ({ci}) lies above 1 + {min_effect:g}"
    if ratio.high < 1:
        return NO_GO, f"ratio {ratio.estimate:.3f} ({ci}) lies below 1"
    return INCONCLUSIVE, (f"ratio {ratio.estimate:.3f} ({ci}) straddles "
                          f"{'1' if ratio.low <= 1 else f'1 + {min_effect:g}'}")


def _weights(pairs: Sequence[tuple[int, int]]) -> dict[int, float]:
    """Cell index -> weight in the mean of the pairs' log ratios (candidate minus baseline)."""
    w: dict[int, float] = {}
    for c, b in pairs:
        w[c] = w.get(c, 0.0) + 1.0 / len(pairs)
        w[b] = w.get(b, 0.0) - 1.0 / len(pairs)
    return w


def contrast(by: dict[int, CellStats], weights: dict[int, float], noise: Noise,
             alpha: float) -> tuple[Interval, float, float]:
    """The ratio exp(sum w_i log rate_i) with its two-level interval, its standard error,
    and the standard error of its token level alone."""
    idx = sorted(weights)
    w = [weights[i] for i in idx]
    est = sum(wi * cell_log_rate(by[i]) for wi, i in zip(w, idx))
    tok = [by[i].token_variance for i in idx]
    se = contrast_se(w, tok, noise)
    token_se = math.sqrt(sum(wi * wi * v for wi, v in zip(w, tok))) \
        if all(math.isfinite(v) for v in tok) else math.nan
    return contrast_interval(est, se, noise.df, alpha), se, token_se


# What to change where a pair's criterion failed (one that needs no more than its name).
_CRITERION_HINTS = {
    "mem_available": "free memory before the campaign ([gate] mem_available_min_mib)",
    "foreign_load": "a quieter device: other processes took CPU during one cell of a pair "
                    "(the cells' foreign load); stop background work, or a larger [match] "
                    "foreign_load_tol if that load is part of what you measure",
    "gap": "a shorter spacing so the cells run within max_gap_s",
    "status": "a re-run of the failed cell",
}


def _settle_owed(cand: str, base: str, comps: list[Comparison]) -> str:
    if any("execution order is unknown" in cr.detail for c in comps for cr in c.match.criteria
           if cr.name == "adjacent"):
        return ("the order the runs ran in: `abbench import --order a,b,...` if you know it, "
                "or the driver log that ran them (its ENTRY STATE lines), so that adjacent "
                "runs can be compared")
    adjacent = [c for c in comps if abs(c.candidate - c.baseline) == 1]
    if not adjacent:
        return (f"run {cand} and {base} next to each other in `order` "
                f"(e.g. order = [\"{base}\", \"{cand}\", \"{cand}\", \"{base}\"])")
    failed = {cr.name for c in adjacent for cr in c.match.criteria if cr.status == "fail"}
    measured = {cr.name for c in adjacent for cr in c.match.criteria
                if cr.status != "not measured"}
    gaps = {cr.name for c in adjacent for cr in c.match.criteria
            if cr.status == "fail" and "sensor gap" in (cr.detail or "")}
    hints: list[str] = []
    if gaps:
        hints.append(f"a re-run with the {', '.join(sorted(gaps))} sensor readable throughout "
                     "(it vanished during a cell: check `abbench sensors` on the device)")
        failed -= gaps
    if failed == {"probe"} and not measured & {"caps", "cpu_temp", "battery_temp"}:
        # No thermal sensor: the probe is the only signal, and it moved. On a shared
        # machine that is a noisy neighbour as often as heat.
        hints.append("this device exposes no caps or temperatures, and the speed probe moved "
                     "more than probe_tol between the cells: a quieter machine (or a gate "
                     "with probe_min), or a larger [match] probe_tol if that noise is "
                     "acceptable")
    elif failed & {"caps", "cpu_temp", "battery_temp", "probe", "thermal_status", "gate"}:
        hints.append("a gated re-run ([gate] with caps_at_max = true and temperature limits, "
                     "a timeout long enough that it does not give up) so both cells start "
                     "at the same caps and temperatures")
    hints += [hint for criterion, hint in _CRITERION_HINTS.items() if criterion in failed]
    return "; ".join(hints) or f"a re-run with {cand} and {base} adjacent"


def _order(cand: str, base: str, pairs: list[Comparison], by: dict[int, CellStats],
           noise: Noise, alpha: float) -> tuple[str | None, OrderEffect | None]:
    """The order warning (one order only) and the order effect: with pairs in both orders,
    the position effect — the second cell of a pair over the first — estimated as half the
    difference of the baseline-first and candidate-first pairs' mean log ratios, with its
    two-level interval."""
    if not pairs:
        return None, None
    cf = [(p.candidate, p.baseline) for p in pairs if p.candidate_first]
    bf = [(p.candidate, p.baseline) for p in pairs if not p.candidate_first]
    n = len(pairs)
    if not bf or not cf:
        first, second = (cand, base) if not bf else (base, cand)
        return (f"order effect not excluded: {first} ran first in all {n} pair"
                f"{'s' if n > 1 else ''} behind this decision; a reversed pair ({second} "
                f"then {first}) would settle it"), OrderEffect(len(cf), len(bf))
    wc, wb = _weights(cf), _weights(bf)
    # A position effect p (the second cell runs p faster in log) shifts candidate-first
    # pairs by -p and baseline-first ones by +p.
    w = {i: (wb.get(i, 0.0) - wc.get(i, 0.0)) / 2.0 for i in set(wc) | set(wb)}
    position, _, _ = contrast(by, w, noise, alpha)
    flagged = position.excludes(1.0, 1.0)
    warning = None
    if flagged:
        warning = (f"order effect: the second cell of a pair ran {position.estimate:.3f}x the "
                   f"first ({position.level:.0%} CI {position.low:.3f} .. {position.high:.3f}) "
                   "— the position in the pair moved the speed; the decision's pairs are "
                   "balanced over both orders, so its ratio is not biased by it, but the "
                   "device is not settled between cells")
    return warning, OrderEffect(len(cf), len(bf), position, flagged)


def settle_inconclusive(d_expect: str, ratio: Interval, noise: Noise, se: float,
                         threshold: float, pairs: int, min_effect: float,
                         unit: str = "matched pair",
                         round_adds: str = "an ABBA round adds two or three") -> str:
    """What would settle an INCONCLUSIVE verdict, and whether more cells can (`unit`: what
    the evidence counts, `round_adds`: what a round of the design adds of it)."""
    if not noise.known:
        return ("an estimate of the cell-to-cell noise: `abbench calibrate` on this device "
                "(an A/A campaign whose repeats go into the device history), or an order that "
                "repeats each configuration (order = \"abba\", or `repeat`) so that the "
                "campaign measures its own")
    if not (math.isfinite(ratio.low) and math.isfinite(ratio.high)):
        return "per-token times or a throughput for every cell behind the decision"
    if d_expect == "faster" and ratio.high <= threshold:
        return (f"more cells can at most show it is slower (NO-GO): the interval already "
                f"rules out a speed-up of {min_effect:g} (upper end {ratio.high:.3f})")
    # Pairs needed for the interval's half width to clear the threshold's distance, with
    # the standard error shrinking as 1 / sqrt(pairs).
    distance = abs(math.log(threshold)) if d_expect == "not-slower" else math.log(threshold)
    z = t_quantile(1 - ALPHA / 2, math.inf) + t_quantile(POWER, math.inf)
    if distance <= 0 or not math.isfinite(se) or se <= 0:
        return f"more {unit}s ({round_adds}) narrow the interval"
    needed = math.ceil(pairs * (z * se / distance) ** 2)
    few = ""
    if noise.df < FEW_DF:
        few = (f"; the noise has only {noise.df} degree{'s' if noise.df > 1 else ''} of "
               f"freedom (t = {t_quantile(1 - ALPHA / 2, noise.df):.1f} where it would be "
               "2.0 with 30): `abbench calibrate` on this device, or more repeats of a "
               "configuration that does equal work, narrow the interval as much as pairs do")
    if needed <= pairs:
        return (f"more {unit}s narrow the interval (`[campaign] until = \"decided\"` "
                "appends rounds until it decides)" + few)
    return (f"about {needed - pairs} more {unit}{'s' if needed - pairs > 1 else ''} "
            f"({round_adds}) to resolve the threshold {threshold:g} at "
            f"{POWER:.0%} power, at this noise (±{noise.sd:.1%} per cell)" + few)


SETTLE_SPAN = ("another round, so that each arm runs in two separate spans of cells "
               "(`until = \"decided\"` adds them), or `interleave = \"slices\"`")


def one_span(spec: DecisionSpec, pairs: Sequence[Comparison]) -> str | None:
    """Why a verdict may not rest on these pairs, or None: the cells of one arm, two or
    more, all ran in one span of consecutive cells, so one burst of load across that span
    — which no sensor need show — would read as the effect, and the span's repeats, slowed
    alike, as quiet (docs/method.md#bursts). A single cell of an arm is one draw of the
    cell-to-cell noise, which the noise estimate covers."""
    for name, cells in ((spec.candidate, {p.candidate for p in pairs}),
                        (spec.baseline, {p.baseline for p in pairs})):
        ordered = sorted(cells)
        if len(ordered) >= 2 and all(b == a + 1 for a, b in zip(ordered, ordered[1:])):
            return (f"every {name} cell it compares ran in one span (cells {ordered[0] + 1}-"
                    f"{ordered[-1] + 1}): a burst of load across that span would read as "
                    "this effect, and their agreement as quiet")
    return None


def _comparisons(cc: Sequence[CellStats], bc: Sequence[CellStats],
                 matches: Matches
                 ) -> tuple[list[Comparison], list[Comparison], list[Comparison]]:
    """Every (candidate, baseline) comparison, the matched ones, and those a verdict rests
    on (the matched, or the unverified where none is matched)."""
    comps = [Comparison(c.index, b.index, matches[(min(c.index, b.index),
                                                   max(c.index, b.index))], None)
             for c in cc for b in bc]
    matched = [c for c in comps if c.match.state == "matched"]
    unverified = [c for c in comps if c.match.state == "unverified"]
    return comps, matched, matched or unverified


def compared_cells(spec: DecisionSpec, cells: Sequence[CellStats],
                   matches: Matches) -> list[CellStats]:
    """The cells a decision's verdict rests on: each in a pair it compares."""
    by = {c.index: c for c in cells}
    _, _, behind = _comparisons([c for c in cells if c.name == spec.candidate],
                                [c for c in cells if c.name == spec.baseline], matches)
    used = sorted({i for p in behind for i in (p.candidate, p.baseline)})
    return [by[i] for i in used]


def decide(spec: DecisionSpec, cells: list[CellStats],
           matches: Matches, noise: Noise,
           alpha: float = ALPHA) -> Decision:
    """One decision from the campaign file (`candidate`, `baseline`, `min_effect`,
    `expect`, `max_regression`) at a two-sided `alpha`, with `noise` as the cell level;
    at most UNVERIFIED where its arms differ in more than it asks about (`confounded`)."""
    return confounded(spec, _decide(spec, cells, matches, noise, alpha), cells)


def confounded(spec: DecisionSpec, d: Decision, cells: Sequence[CellStats]) -> Decision:
    """`d` where the arms also differ in `spec.confounds`: the ratio measures those
    changes with the one asked about, so a GO or NO-GO is UNVERIFIED (what it would be is
    kept), and every verdict says what else differs and what would settle it."""
    if not spec.confounds:
        return d
    confound, settle = describe(spec, cells, d.ratio is not None)
    if d.verdict in (GO, NO_GO):
        return replace(d, verdict=UNVERIFIED, unverified_verdict=d.verdict,
                       reason=f"{d.reason} — but {confound}", settle=settle,
                       confound=confound)
    return replace(d, reason=f"{d.reason} — and {confound}", confound=confound,
                   settle=f"{settle}; {d.settle}" if d.settle else settle)


def _decide(spec: DecisionSpec, cells: list[CellStats],
            matches: Matches, noise: Noise,
            alpha: float = ALPHA) -> Decision:
    cand, base, min_effect = spec.candidate, spec.baseline, spec.min_effect
    expect, max_regression = spec.expect, spec.max_regression
    kinds = {"expect": expect, "max_regression": max_regression, "noise": noise,
             "alpha": alpha, "metric": spec.metric}
    cc = [c for c in cells if c.name == cand]
    bc = [c for c in cells if c.name == base]
    by = {c.index: c for c in cells}
    comps, matched, behind = _comparisons(cc, bc, matches)
    unmatched = tuple(c for c in comps if c not in behind)
    keys = {c.config_key for c in cc + bc}
    identical = bool(cc and bc) and len(keys) == 1 and None not in keys
    if not cc or not bc:
        missing = " and ".join(f"`{n}`" for n, x in ((cand, cc), (base, bc)) if not x)
        return Decision(cand, base, min_effect, OWED, None, None, (), unmatched,
                        f"no cell named {missing} ran", f"add {missing} to the campaign", None,
                        **kinds)
    if not behind:
        return Decision(cand, base, min_effect, OWED, None, None, (), unmatched,
                        "no matched pair of " f"{cand} and {base}",
                        _settle_owed(cand, base, comps), None, identical=identical, **kinds)
    with_ratio = [Comparison(p.candidate, p.baseline, p.match,
                             contrast(by, {p.candidate: 1.0, p.baseline: -1.0}, noise,
                                      alpha)[0])
                  for p in behind]
    weights = _weights([(p.candidate, p.baseline) for p in with_ratio])
    pooled, se, token_se = contrast(by, weights, noise, alpha)
    verdict, reason = verdict_of(pooled, expect, min_effect, max_regression, noise,
                               metric(spec.metric).worse)
    threshold = 1.0 - (max_regression or 0.0) if expect == "not-slower" else 1.0 + min_effect
    settle = None
    if noise.known and (span := one_span(spec, with_ratio)) is not None:
        # nor an interval: what it would cover leaves out the burst it cannot see
        verdict, settle = INCONCLUSIVE, SETTLE_SPAN
        reason = f"ratio {pooled.estimate:.3f}, no interval: {span}"
        pooled = Interval(pooled.estimate, math.nan, math.nan, pooled.level)
    elif verdict == INCONCLUSIVE:
        settle = settle_inconclusive(expect, pooled, noise, se, threshold, len(with_ratio),
                                      min_effect)
    warning, order = _order(cand, base, with_ratio, by, noise, alpha)
    resolvable = resolvable_effect(se, noise.df, alpha, POWER)
    extra = {"se": se, "token_se": token_se, "resolvable": resolvable, "order": order,
             "identical": identical, **kinds}
    if not matched:
        why = "; ".join(dict.fromkeys(p.match.note for p in with_ratio if p.match.note)) \
            or "not verified as matched"
        return Decision(cand, base, min_effect, UNVERIFIED, verdict, pooled,
                        tuple(with_ratio), unmatched,
                        f"{reason} — but the pair{'s are' if len(with_ratio) > 1 else ' is'} "
                        f"unverified ({why})",
                        "a campaign run by abbench on the device (entry states and times "
                        "recorded)", warning, **extra)
    return Decision(cand, base, min_effect, verdict, None, pooled, tuple(with_ratio),
                    unmatched, reason, settle, warning, **extra)


def exit_status(decisions: list[Decision]) -> int:
    """0 all GO (or none asked), 1 some NO-GO, 3 some INCONCLUSIVE / OWED / UNVERIFIED.
    A NO-GO wins over an open question: it is a definite answer that blocks a release."""
    codes = {EXIT_FOR[d.verdict] for d in decisions}
    if 1 in codes:
        return 1
    return 3 if 3 in codes else 0
