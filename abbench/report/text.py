"""Number formatting shared by the renderers (hyperfine's "x ± y times" style)."""

from __future__ import annotations

import math

from abbench.analysis.cells import CellStats
from abbench.analysis.decide import UNVERIFIED, Decision
from abbench.analysis.stats import Interval, Noise
from abbench.records import EntryState


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def num(x: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return f"{x:{fmt}}{unit}" if finite(x) else "-"


def rate(iv: Interval | None) -> str:
    """"45.48 ± 3.9 tok/s" (± the larger half of the 95% interval), "-" for none."""
    if iv is None or not finite(iv.estimate):
        return "-"
    if not (finite(iv.low) and finite(iv.high)):
        return f"{iv.estimate:.2f} tok/s (no interval)"
    return f"{iv.estimate:.2f} ± {iv.half_width():.2f} tok/s"


def ci(iv: Interval | None) -> str:
    if iv is None or not (finite(iv.low) and finite(iv.high)):
        return "-"
    return f"{iv.low:.3f} .. {iv.high:.3f}"


def times(candidate: str, baseline: str, iv: Interval) -> str:
    """"spec-2 ran 1.27 ± 0.05 times slower than B" from a candidate/baseline ratio."""
    if not finite(iv.estimate):
        return "-"
    if iv.estimate >= 1:
        est, lo, hi, word = iv.estimate, iv.low, iv.high, "faster"
    else:
        est, lo, hi, word = 1 / iv.estimate, 1 / iv.high, 1 / iv.low, "slower"
    if finite(lo) and finite(hi):
        pm = max(est - lo, hi - est)
        return f"{candidate} ran {est:.2f} ± {pm:.2f} times {word} than {baseline}"
    return f"{candidate} ran {est:.2f} times {word} than {baseline} (no interval)"


def interval_text(iv: Interval | None) -> str:
    """"ratio 1.032 (95% CI 0.981 .. 1.086)", or what is missing."""
    if iv is None or not finite(iv.estimate):
        return "no ratio"
    if not (finite(iv.low) and finite(iv.high)):
        return f"ratio {iv.estimate:.3f} (no interval)"
    return f"ratio {iv.estimate:.3f} ({iv.level:.0%} CI {iv.low:.3f} .. {iv.high:.3f})"


def noise(n: Noise) -> str:
    """"cell-to-cell noise ±3.1% (6 repeats, 4 df; this campaign)": what the verdicts'
    cell level rests on."""
    if not n.known:
        return ("cell-to-cell noise unknown (no repeat of a configuration with equal work in "
                "this campaign, no device history)")
    token = math.sqrt(n.token_variance) if n.token_variance > 0 else 0.0
    return (f"cell-to-cell noise ±{n.sd:.1%} ({n.repeats} repeats, {n.df} df; {n.source}; "
            f"of it token noise ±{token:.1%})")


def question(d: Decision) -> str:
    """The decision's question in a table cell: "faster by 0.03", "not slower by 0.1"."""
    if d.expect == "not-slower":
        return f"not slower by {d.max_regression:g}"
    return f"faster by {d.min_effect:g}"


def resolvable(d: Decision) -> str | None:
    """The smallest effect the campaign could resolve for this decision (80% power)."""
    if not finite(d.resolvable):
        return None
    return (f"smallest effect this campaign could resolve: ±{d.resolvable:.1%} at 80% power "
            f"({d.ratio.level:.0%} level)" if d.ratio is not None else None)


def verdict_cells(d: Decision) -> tuple[str, str, str]:
    """(ratio, 95% CI, matched pairs) of a verdict-table row: numbers only from matched
    pairs, dashes otherwise."""
    if d.verdict == UNVERIFIED or d.ratio is None:
        return "-", "-", "none" if not d.pairs else "unverified only"
    pairs = ", ".join(f"{p.candidate + 1}/{p.baseline + 1}" for p in d.pairs)
    return f"{d.ratio.estimate:.3f}", ci(d.ratio), pairs


def entry(e: EntryState) -> str:
    """One line of entry state: caps, temperatures, memory, probe (what was measured)."""
    parts: list[str] = []
    if e.caps_khz:
        capped = e.capped()
        parts.append("capped " + ",".join(capped) if capped else "caps at max")
    if e.cpu_temp_c is not None:
        parts.append(f"cpu {e.cpu_temp_c:.1f} °C")
    if e.battery_temp_c is not None:
        parts.append(f"batt {e.battery_temp_c:.1f} °C")
    if e.mem_available_mib is not None:
        parts.append(f"avail {e.mem_available_mib:.0f} MiB")
    if e.probe_index is not None:
        parts.append(f"probe {e.probe_index:.2f}")
    if e.thermal_status is not None:
        parts.append(f"status {e.thermal_status}")
    return ", ".join(parts) or "not recorded"


def caps_during(c: CellStats) -> str:
    d = c.during
    if not d.caps_measured:
        return "-"
    if not d.capped:
        return "at max" if d.caps_constant else "changed (at max)"
    return ("capped " if d.caps_constant else "changing, capped ") + ",".join(d.capped)
