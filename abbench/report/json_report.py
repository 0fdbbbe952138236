"""report.json: everything the analysis decided, machine-readable, with stable keys
(documented in docs/report.md). Undefined numbers are `null`; times are in ms, rates in
tokens/s, memory in MiB; cells are 0-based `index` with a 1-based `number`."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

from abbench.analysis.campaign import CampaignAnalysis, LookResult
from abbench.analysis.cells import STABILITY_WINDOW_TOKENS, CellStats
from abbench.analysis.decide import POWER, Comparison, Decision
from abbench.analysis.sequential import ALPHA, RHO
from abbench.analysis.stats import REPS, Interval, Noise
from abbench.records import document_text

REPORT_FORMAT = "abbench-report v1"


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def plain(x: Any) -> Any:
    """Dataclasses, tuples, Paths and NaN into JSON values (NaN/inf → null)."""
    if x is None or type(x) in (str, int, bool):
        return x
    if isinstance(x, Interval):
        return {"estimate": plain(x.estimate), "low": plain(x.low), "high": plain(x.high),
                "level": x.level}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {name: plain(getattr(x, name)) for name in _field_names(type(x))}
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    return x


def _cell(c: CellStats, a: CampaignAnalysis) -> dict[str, Any]:
    rec = a.record_of(c.index)
    d = c.during
    return {
        "index": c.index, "number": c.index + 1, "name": c.name, "label": c.label,
        "status": c.status, "error": c.error, "sentinel_of": c.sentinel_of,
        "fingerprint": c.fingerprint, "source": c.source, "tokens": c.tokens,
        "steady_tokens": c.steady_tokens, "tokens_per_s": plain(c.tokens_per_s),
        "median_ms": plain(c.median_ms), "p5_ms": plain(c.p5_ms), "p95_ms": plain(c.p95_ms),
        **{f.name: plain(getattr(c.work, f.name)) for f in dataclasses.fields(c.work)},
        "threads": c.threads,
        "peak_rss_mib": plain(c.peak_rss_mib),
        "memory": None if c.memory is None else plain(c.memory.to_json()),
        "prefill_tok_s": plain(c.prefill_tok_s), "ttft_s": plain(c.ttft_s),
        "stability": plain(c.stability),
        "power_w": plain(c.energy.power_w), "energy_per_token_j": plain(c.energy.j_per_token),
        "energy_source": c.energy.source, "energy_note": c.energy.note,
        "entry": plain(rec.entry.to_json()) if rec else None,
        "gate": plain(rec.gate.to_json()) if rec else None,
        "t_start_wall": rec.t_start_wall if rec else None,
        "t_end_wall": rec.t_end_wall if rec else None,
        "during": {
            "caps_states": [dict(s) for s in d.caps_states], "hw_max_khz": d.hw_max_khz,
            "capped": list(d.capped), "caps_constant": d.caps_constant,
            "cpu_temp_c": plain(d.cpu_temp_c), "battery_temp_c": plain(d.battery_temp_c),
            "mem_available_floor_mib": plain(d.mem_available_floor_mib), "samples": d.samples,
            "foreign_cores": plain(d.foreign_cores), "max_runnable_tasks": d.max_runnable_tasks,
            "during_caps": [dict(s) for s in d.during_caps],
        },
        "around": [plain(r.to_json()) for r in d.around],
        "notes": list(c.notes), "wall_ms": plain(c.wall_ms),
    }


def _comparison(c: Comparison, with_ratio: bool) -> dict[str, Any]:
    out = {"candidate": c.candidate, "baseline": c.baseline, "state": c.match.state,
           "reasons": list(c.match.reasons)}
    if with_ratio:
        out["ratio"] = plain(c.ratio)
    return out


def noise_json(n: Noise | None) -> dict[str, Any] | None:
    """The cell-to-cell noise: variances of log tokens/s (`variance` = what a repeat shows,
    `token_variance` its token-level part, `between` the cell level alone)."""
    if n is None:
        return None
    return {"variance": plain(n.variance), "sd": plain(n.sd), "df": n.df,
            "token_variance": plain(n.token_variance) if n.known else None,
            "between": plain(n.between), "repeats": n.repeats, "source": n.source,
            "known": n.known, "note": n.note}


def _decision(d: Decision) -> dict[str, Any]:
    order = d.order
    cell_se = (math.sqrt(max(0.0, d.se ** 2 - d.token_se ** 2))
               if math.isfinite(d.se) and math.isfinite(d.token_se) else None)
    # interleaved campaigns only: the reports of other runs keep their keys
    extra = {} if d.slices is None else {"slices": d.slices}
    if d.confound is not None:  # reports before it stay as they were
        extra["confound"] = d.confound
    return extra | {
        "candidate": d.candidate, "baseline": d.baseline, "min_effect": d.min_effect,
        "expect": d.expect, "max_regression": d.max_regression, "metric": d.metric,
        "threshold": d.threshold,
        "verdict": d.verdict, "unverified_verdict": d.unverified_verdict,
        "ratio": plain(d.ratio), "level": 1.0 - d.alpha, "look": d.look,
        "se": plain(d.se), "token_se": plain(d.token_se), "cell_se": plain(cell_se),
        "df": d.noise.df if d.noise is not None else 0, "noise": noise_json(d.noise),
        "resolvable_effect": plain(d.resolvable), "identical_config": d.identical,
        "order": None if order is None else {
            "candidate_first": order.candidate_first, "baseline_first": order.baseline_first,
            "position": plain(order.position), "flagged": order.flagged},
        "consistency": d.consistency,
        "reason": d.reason, "settle": d.settle, "order_warning": d.order_warning,
        "pairs": [_comparison(c, True) for c in d.pairs],
        "unmatched": [_comparison(c, False) for c in d.unmatched],
    }


def _look(lk: LookResult) -> dict[str, Any]:
    return {"number": lk.number, "cells": lk.cells, "alpha": lk.alpha,
            "fraction": lk.fraction, "final": lk.final, "noise": noise_json(lk.noise),
            "decisions": [{"candidate": d.candidate, "baseline": d.baseline,
                           "verdict": d.verdict, "ratio": plain(d.ratio)}
                          for d in lk.decisions]}


def build(a: CampaignAnalysis) -> dict[str, Any]:
    """The report.json document."""
    p = a.plan
    return {
        "format": REPORT_FORMAT,
        "run": str(a.run), "campaign": p.campaign, "device": p.device,
        "simulated": a.simulated, "state": a.state, "complete": a.complete,
        "cells_planned": len(p.cells), "cells_recorded": len(a.records),
        "device_state_recorded": a.device_state_recorded,
        "warmup_tokens": p.warmup_tokens, "spacing_s": p.spacing_s,
        "tolerances": a.tolerances,
        "method": {
            "interval": "moving-block bootstrap over steady-window per-token wall times, "
                        "95% percentile interval",
            "block_length": "ceil(n ** (1/3))", "reps": REPS,
            "seed": "crc32 of the cell labels involved",
            "drift_rule": "sentinel/twin ratio interval wholly outside 1 ± probe_tol",
            "stability": f"slowest over fastest throughput of consecutive "
                         f"{STABILITY_WINDOW_TOKENS}-token windows of the steady series",
            "decision_interval": "two levels: each cell's token-level variance of log "
                                 "tokens/s (moving-block bootstrap, closed form) plus the "
                                 "between-cell variance of repeats; Student t on the "
                                 "noise's degrees of freedom",
            "alpha": ALPHA, "power": POWER,
            "spending": f"alpha * fraction ** {RHO:g} (Lan-DeMets): exact group-sequential "
                        "boundaries, the looks a Brownian motion at their budget fractions; "
                        "each look tests at its boundary's two-sided level",
        },
        "exit_status": a.exit_status,
        "cells": [_cell(c, a) for c in a.cells],
        "pairs": [plain(m) for m in a.pairs],
        "unverified_ratios": [
            {"first": f, "second": s, "estimate": r.estimate, "low": r.low, "high": r.high}
            for f, s, r in a.unverified_ratios
        ],
        "drift": [plain(d) for d in a.drift],
        "tells": [plain(t) for t in a.tells],
        "caps_timeline": list(a.caps_timeline),
        "decisions": [_decision(d) for d in a.decisions],
        "noise": noise_json(a.noise), "own_noise": noise_json(a.own_noise),
        # Records read from the run folder as written: `plain` turns a number no JSON
        # holds (a damaged file's 1e400) into null, as everywhere else in the report.
        "noise_floor": plain(a.floor.to_json()) if a.floor is not None else None,
        "repeat_groups": [list(g) for g in a.groups],
        "sequential": plain(a.plan.sequential.to_json()) if a.plan.sequential else None,
        "looks": [_look(lk) for lk in a.looks], "pending": list(a.pending),
        "order_known": a.plan.order_known,
        "import": plain(a.imported.to_json()) if a.imported is not None else None,
    }


def dumps(a: CampaignAnalysis) -> str:
    return document_text(build(a))
