"""Decisions: the campaign's release questions answered from matched pairs only.

For `candidate` vs `baseline` with `min_effect`, every (candidate cell, baseline cell)
combination is a comparison. Only comparable pairs (matched, or — when the run holds no
device state at all — unverified) carry a ratio: candidate tok/s / baseline tok/s, the
geometric mean over the pairs behind the decision, with a 95% moving-block bootstrap
interval (`stats.pooled_ratio_interval`).

| verdict | when |
|---|---|
| GO | the ratio interval lies wholly above `1 + min_effect` |
| NO-GO | the ratio interval lies wholly below 1 |
| INCONCLUSIVE | it straddles (or a matched pair has no per-token times) |
| OWED | no matched pair exists |
| UNVERIFIED | only unverified pairs exist; `unverified_verdict` says what they would give |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import PairMatch
from abbench.analysis.stats import Interval, pooled_ratio_interval, ratio_interval, seed_for

GO, NO_GO, INCONCLUSIVE, OWED, UNVERIFIED = "GO", "NO-GO", "INCONCLUSIVE", "OWED", "UNVERIFIED"
EXIT_FOR = {GO: 0, NO_GO: 1, INCONCLUSIVE: 3, OWED: 3, UNVERIFIED: 3}


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


def _verdict(ratio: Interval, min_effect: float) -> tuple[str, str]:
    if not (math.isfinite(ratio.low) and math.isfinite(ratio.high)):
        return INCONCLUSIVE, "no per-token times in the pair: no interval to decide on"
    ci = f"95% CI {ratio.low:.3f} .. {ratio.high:.3f}"
    if ratio.low > 1 + min_effect:
        return GO, f"ratio {ratio.estimate:.3f} ({ci}) lies above 1 + {min_effect:g}"
    if ratio.high < 1:
        return NO_GO, f"ratio {ratio.estimate:.3f} ({ci}) lies below 1"
    return INCONCLUSIVE, (f"ratio {ratio.estimate:.3f} ({ci}) straddles "
                          f"{'1' if ratio.low <= 1 else f'1 + {min_effect:g}'}")


def _settle_owed(cand: str, base: str, comps: list[Comparison]) -> str:
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
    if "mem_available" in failed:
        hints.append("free memory before the campaign ([gate] mem_available_min_mib)")
    if "gap" in failed:
        hints.append("a shorter spacing so the cells run within max_gap_s")
    if "status" in failed:
        hints.append("a re-run of the failed cell")
    return "; ".join(hints) or f"a re-run with {cand} and {base} adjacent"


def _order(cand: str, base: str, pairs: list[Comparison]) -> str | None:
    if not pairs:
        return None
    if all(p.candidate_first for p in pairs):
        return (f"order effect not excluded: {cand} ran first in every pair behind this "
                f"decision; a reversed pair ({base} then {cand}) would settle it")
    if not any(p.candidate_first for p in pairs):
        return (f"order effect not excluded: {base} ran first in every pair behind this "
                f"decision; a reversed pair ({cand} then {base}) would settle it")
    return None


def decide(spec: dict[str, Any], cells: list[CellStats],
           matches: dict[tuple[int, int], PairMatch]) -> Decision:
    """One decision from the campaign file (`candidate`, `baseline`, `min_effect`)."""
    cand, base = str(spec.get("candidate")), str(spec.get("baseline"))
    min_effect = float(spec.get("min_effect", 0.0))
    cc = [c for c in cells if c.name == cand]
    bc = [c for c in cells if c.name == base]
    by = {c.index: c for c in cells}
    comps: list[Comparison] = []
    for c in cc:
        for b in bc:
            m = matches[(min(c.index, b.index), max(c.index, b.index))]
            comps.append(Comparison(c.index, b.index, m, None))
    matched = [c for c in comps if c.match.state == "matched"]
    unverified = [c for c in comps if c.match.state == "unverified"]
    behind = matched or unverified
    unmatched = tuple(c for c in comps if c not in behind)
    if not cc or not bc:
        missing = " and ".join(f"`{n}`" for n, x in ((cand, cc), (base, bc)) if not x)
        return Decision(cand, base, min_effect, OWED, None, None, (), unmatched,
                        f"no cell named {missing} ran", f"add {missing} to the campaign", None)
    if not behind:
        return Decision(cand, base, min_effect, OWED, None, None, (), unmatched,
                        "no matched pair of " f"{cand} and {base}",
                        _settle_owed(cand, base, comps), None)
    with_ratio: list[Comparison] = []
    for p in behind:
        a, b = by[p.candidate], by[p.baseline]
        if a.steady_tokens >= 2 and b.steady_tokens >= 2:
            r = ratio_interval(a.window(), b.window(), seed_for("ratio", a.label, b.label))
        else:
            r = Interval(a.tokens_per_s.estimate / b.tokens_per_s.estimate,  # type: ignore[union-attr]
                         math.nan, math.nan)
        with_ratio.append(Comparison(p.candidate, p.baseline, p.match, r))
    if all(by[p.candidate].steady_tokens >= 2 and by[p.baseline].steady_tokens >= 2
           for p in with_ratio):
        keys = sorted({i for p in with_ratio for i in (p.candidate, p.baseline)})
        pos = {k: n for n, k in enumerate(keys)}
        pooled = pooled_ratio_interval(
            [by[k].window() for k in keys],
            [(pos[p.candidate], pos[p.baseline]) for p in with_ratio],
            seed_for("decision", cand, base, *(by[k].label for k in keys)))
    else:
        est = math.exp(sum(math.log(p.ratio.estimate) for p in with_ratio  # type: ignore[union-attr]
                           ) / len(with_ratio))
        pooled = Interval(est, math.nan, math.nan)
    verdict, reason = _verdict(pooled, min_effect)
    settle = None
    if verdict == INCONCLUSIVE:
        settle = ("more matched pairs (an ABBA order) or more tokens per cell would narrow "
                  "the interval")
    order = _order(cand, base, with_ratio)
    if not matched:
        return Decision(cand, base, min_effect, UNVERIFIED, verdict, pooled,
                        tuple(with_ratio), unmatched,
                        f"{reason} — but no device state was recorded, so the pair"
                        f"{'s are' if len(with_ratio) > 1 else ' is'} unverified",
                        "a campaign run by abbench on the device (entry states recorded)",
                        order)
    return Decision(cand, base, min_effect, verdict, None, pooled, tuple(with_ratio),
                    unmatched, reason, settle, order)


def exit_status(decisions: list[Decision]) -> int:
    """0 all GO (or none asked), 1 some NO-GO, 3 some INCONCLUSIVE / OWED / UNVERIFIED.
    A NO-GO wins over an open question: it is a definite answer that blocks a release."""
    codes = {EXIT_FOR[d.verdict] for d in decisions}
    if 1 in codes:
        return 1
    return 3 if 3 in codes else 0
