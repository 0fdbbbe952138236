"""Number formatting shared by the renderers (hyperfine's "x ± y times" style)."""

from __future__ import annotations

import json
import math
from typing import Any

from abbench.analysis.cells import CellStats, DeviceDuring
from abbench.analysis.decide import UNVERIFIED, Decision
from abbench.analysis.metrics import metric as metric_of
from abbench.analysis.stats import Interval, Noise
from abbench.records import EntryState
from abbench.records.keys import AFTER, BEFORE, DURING, EXIT


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


def measure(iv: Interval | None, unit: str, fmt: str = ".3g") -> str:
    """"3.21 ± 0.12 W" (± the larger half of the 95% interval), "-" for none."""
    if iv is None or not finite(iv.estimate):
        return "-"
    if not (finite(iv.low) and finite(iv.high)):
        return f"{iv.estimate:{fmt}} {unit} (no interval)"  # one reading: none measured
    return f"{iv.estimate:{fmt}} ± {iv.half_width():.2g} {unit}"


def ci(iv: Interval | None) -> str:
    if iv is None or not (finite(iv.low) and finite(iv.high)):
        return "-"
    return f"{iv.low:.3f} .. {iv.high:.3f}"


def times(candidate: str, baseline: str, iv: Interval, metric: str = "tok_per_s") -> str:
    """"spec-2 ran 1.27 ± 0.05 times slower than B" from a candidate/baseline ratio; for an
    energy decision (a ratio of tokens per joule) "spec-2 used 1.27 ± 0.05 times less
    energy per token than B"."""
    if not finite(iv.estimate):
        return "-"
    up = iv.estimate >= 1
    est, lo, hi = (iv.estimate, iv.low, iv.high) if up else (1 / iv.estimate, 1 / iv.high,
                                                             1 / iv.low)
    m = metric_of(metric)
    verb, word = m.verb, m.more if up else m.less
    if finite(lo) and finite(hi):
        pm = max(est - lo, hi - est)
        return f"{candidate} {verb} {est:.2f} ± {pm:.2f} times {word} than {baseline}"
    return f"{candidate} {verb} {est:.2f} times {word} than {baseline} (no interval)"


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
    split = (f"of which token noise ±{token:.1%}" if n.token_variance < n.variance else
             f"no more than their own token noise, ±{token:.1%}")
    return (f"cell-to-cell noise ±{n.sd:.1%} ({n.repeats} repeats, {n.df} df; {n.source}; "
            f"{split})")


def question(d: Decision) -> str:
    """The decision's question in a table cell: "faster by 0.03", "not slower by 0.1", and
    for energy "J/token lower by 0.03", "J/token not higher by 0.1"."""
    m = metric_of(d.metric)
    if d.expect == "not-slower":
        return f"{m.not_worse} by {d.max_regression:g}"
    return f"{m.goal} by {d.min_effect:g}"


def resolvable(d: Decision) -> str | None:
    """The smallest effect the campaign could resolve for this decision (80% power)."""
    if not finite(d.resolvable):
        return None
    return (f"smallest effect this campaign could resolve: ±{d.resolvable:.1%} at 80% power "
            f"({d.ratio.level:.0%} level)" if d.ratio is not None else None)


def verdict_cells(d: Decision) -> tuple[str, str, str]:
    """(ratio, 95% CI, matched pairs) of a verdict-table row: numbers only from matched
    pairs, dashes otherwise."""
    pairs = ", ".join(f"{p.candidate + 1}/{p.baseline + 1}" for p in d.pairs)
    if d.verdict == UNVERIFIED and d.matched:  # confounded: matched, but no verdict's number
        return "-", "-", f"{pairs} (confounded)"
    if d.verdict == UNVERIFIED or d.ratio is None:
        return "-", "-", "none" if not d.pairs else "unverified only"
    return f"{d.ratio.estimate:.3f}", ci(d.ratio), pairs


def listed(*readings: tuple[str, Any], none: str = "-") -> str:
    """Each `(format, value)` whose value was measured (not None), formatted and joined
    with commas; `none` where nothing was."""
    return ", ".join(fmt.format(x) for fmt, x in readings if x is not None) or none


def entry(e: EntryState) -> str:
    """One line of entry state: caps, temperatures, memory, probe (what was measured)."""
    caps: list[str] = []
    if e.caps_khz:
        capped = e.capped()
        blind = sorted(p for p in e.caps_khz if p not in e.hw_max_khz)
        if capped:
            caps.append("capped " + ",".join(capped))
        if blind:  # a cap with no hardware maximum is not "at max": unknown
            caps.append(", ".join(f"{p} cap "
                                  f"{e.caps_khz[p] / 1e6:.2f} GHz" for p in blind)
                        + " (hardware max unknown)")
        elif not capped:
            caps.append("caps at max")
    return listed(*(("{}", x) for x in caps), ("cpu {:.1f} °C", e.cpu_temp_c),
                  ("batt {:.1f} °C", e.battery_temp_c), ("avail {:.0f} MiB", e.mem_available_mib),
                  ("probe {:.2f}", e.probe_index), ("status {}", e.thermal_status),
                  none="not recorded")


def caps_during(c: CellStats) -> str:
    """The caps read during the cell (from its entry on: "changing" when they moved); with
    none read during it, what its entry and the readings after it showed, said as such
    (`analysis.readings`: never shown as "during")."""
    d = c.during
    if not d.during_caps:
        seen = dict.fromkeys(f"{POSITION_WORDS[r.position]} {_caps_read(r.caps_khz, d)}"
                             for r in d.around if r.caps_khz)
        return f"not read during ({'; '.join(seen)})" if seen else "-"
    blind = sorted({p for st in d.caps_states for p, _ in st if p not in d.hw_max_khz})
    if blind and not d.capped:
        lows = {p: min(cap for st in d.caps_states for q, cap in st if q == p) for p in blind}
        return ", ".join(f"cap {lows[p] / 1e6:.2f} GHz" for p in blind) + \
            " (hardware max unknown)"
    if not d.capped:
        return "at max" if d.caps_constant else "changed (at max)"
    return ("capped " if d.caps_constant else "changing, capped ") + ",".join(d.capped)


POSITION_WORDS = {BEFORE: "entry", DURING: "during", AFTER: "after", EXIT: "exit"}


def _caps_read(caps: dict[str, int], d: DeviceDuring) -> str:
    """One reading's caps against the hardware maxima: the capped ones with their cap."""
    hw = d.hw_max_khz
    low = [f"{p} {cap / 1e6:.2f}" for p, cap in sorted(caps.items())
           if p in hw and cap < hw[p]]
    blind = [f"{p} cap {cap / 1e6:.2f} GHz (hardware max unknown)"
             for p, cap in sorted(caps.items()) if p not in hw]
    return ", ".join(([f"capped {', '.join(low)} GHz"] if low else []) + blind) or "at max"


DESCRIBE_MAX = 100  # characters of a configuration's description


def _config(key: str) -> dict[str, Any]:
    """A configuration key's settings, a cell's option table (`llama`, `bmoe`) as one
    setting per option (`bmoe.cache_mb`)."""
    try:
        cfg = json.loads(key)
    except json.JSONDecodeError:
        return {}
    if not isinstance(cfg, dict):
        return {}
    flat: dict[str, Any] = {}
    for name, value in cfg.items():
        if isinstance(value, dict) and value:
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    return flat


def describe_configs(keys: list[str]) -> dict[str, str]:
    """Each configuration named by the keys that set it apart from the others (all of
    them differing nowhere: its model), shortened to a line."""
    cfgs = {k: _config(k) for k in keys}
    names = sorted({n for c in cfgs.values() for n in c})
    apart = [n for n in names if len({json.dumps(c.get(n), sort_keys=True)
                                      for c in cfgs.values()}) > 1]
    out = {}
    for key, cfg in cfgs.items():
        if not cfg:
            text = key
        else:
            shown = apart or [n for n in ("model", "engine", "command") if n in cfg]
            # a key only the others record (a switch this run's command line did not give)
            text = " ".join(f"{n}={_short(cfg[n])}" for n in shown if n in cfg) or \
                " ".join(f"{n}=(not recorded)" for n in shown) or "(no keys)"
        out[key] = text if len(text) <= DESCRIBE_MAX else text[:DESCRIBE_MAX - 3] + "..."
    return out


def _short(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 40 else text[:37] + "..."


def config_apart(cells: Any) -> dict[int, str]:
    """Per cell index, its configuration by the keys that set it apart from the other
    cells' ("-" where every cell runs one configuration)."""
    keys = [c.config_key for c in cells if c.config_key]
    if len(set(keys)) <= 1:
        return {c.index: "-" for c in cells}
    names = describe_configs(sorted(set(keys)))
    return {c.index: names.get(c.config_key, "-") if c.config_key else "-" for c in cells}


def speculation(c: CellStats) -> str:
    """What a speculating cell's speed was bought with: the drafts its target confirmed
    and the tokens per verify decode; route-ahead's agreement with the router ("-")."""
    parts = []
    if c.work.accepted_pct is not None:
        per = f", {c.work.tokens_per_decode:.2f} tok/decode" if c.work.tokens_per_decode else ""
        parts.append(f"{c.work.accepted_pct:.0f}% accepted{per}")
    if c.work.route_agree_pct is not None:
        parts.append(f"route-ahead {c.work.route_agree_pct:.1f}% agree")
    return "; ".join(parts) or "-"


def pressure(c: CellStats) -> str:
    """What a cell did to the rest of the device: the free-RAM floor, the CPU and battery
    maximum temperatures during it, its peak RSS (what was recorded)."""
    d = c.during
    return listed(("floor {:.0f} MiB", d.mem_available_floor_mib),
                  ("CPU max {:.1f} °C", d.cpu_temp_c[1] if d.cpu_temp_c else None),
                  ("batt max {:.1f} °C", d.battery_temp_c[1] if d.battery_temp_c else None),
                  ("RSS {:.2f} GiB", None if c.peak_rss_mib is None else c.peak_rss_mib / 1024))


def cgroup_memory(c: CellStats) -> str:
    """A cell run under a memory limit: its cgroup's peak (page cache included) over the
    limit, "365 / 1024 MiB", and an OOM kill; "-" without a limit."""
    m = c.memory
    if m is None:
        return "-"
    peak = "?" if m.peak_mib is None else f"{m.peak_mib:.0f}"
    return f"{peak} / {m.limit_mib:g} MiB" + (", OOM-killed" if m.oom_killed else "")
