"""The replay report: `abbench replay`'s figures as text, each with its denominator and
the definitions it used, one line each, or as a JSON document under stable keys
(docs/replay.md); undefined figures are `null`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from abbench.analysis.replay import (
    MIB,
    POLICIES,
    CacheResult,
    Replay,
    recorded_budget_mib,
)
from abbench.textsafe import shown

FORMAT = "abbench-replay v1"
_POLICY_NAMES = {"lru": "LRU", "lfu": "LFU", "belady": "Belady"}
DEFINITIONS = {
    "lookup": "one per unique expert per layer batch (duplicates in a batch only refresh "
              "recency); a miss reads that layer's expert_bytes; eviction after the batch, "
              "never of an entry the batch touched; prefill and decode through one cache",
    "batch": "consecutive rows of one turn, phase and layer (and, in decode, one step)",
    "hit_pct": "hits / all lookups (prefill + decode)",
    "decode_hit_pct": "decode hits / decode lookups (the cache still warms over prefill)",
    "lru": "evict the least recently used entry",
    "lfu": "evict the entry with the fewest lookups so far (counts survive eviction), "
           "ties to the least recent",
    "belady": "evict the entry used again farthest ahead (never first, then the larger): "
              "the bound on every online policy",
    "predictor_pct": "slots the predictor named / slots routed, the predictor naming k "
                     "experts per layer; decode routings after each turn's first token",
    "prev_token": "the same layer's routing `lag` decode tokens earlier",
    "run_hottest": "per layer, the k experts routed most often in the run's decode",
    "prompt_hottest": "per layer, the k experts routed most often in prefill (the prompt)",
    "random": "k / n_expert, analytic",
    "ties": "static predictors break ties at the k-th place by the lowest expert id",
    "drop": "decode; a routed expert the run recorded as a miss, not its routing's top "
            "weight, with weight < factor / k",
    "reads_avoided_pct": "dropped miss bytes / all decode miss bytes",
    "weight_discarded_pct": "dropped router weight / all decode router weight",
}


# -- JSON --------------------------------------------------------------------------------


def _cache_json(r: CacheResult) -> dict[str, Any]:
    return {"hits": r.hits, "lookups": r.lookups, "hit_pct": r.hit_pct,
            "decode_hits": r.decode_hits, "decode_lookups": r.decode_lookups,
            "decode_hit_pct": r.decode_hit_pct, "read_bytes": r.read_bytes}


def to_json(rp: Replay) -> dict[str, Any]:
    """The replay as a JSON-ready dict; keys documented in docs/replay.md."""
    t, s, lk = rp.trace, rp.shape, rp.lookups
    decode_batches = sum(lk.decode)
    return {
        "format": FORMAT,
        "trace": {
            "path": t.source, "model": t.model, "arch": t.arch, "n_layer": t.n_layer,
            "n_expert": t.n_expert, "n_expert_used": t.n_expert_used, "rows": t.rows,
            "has_dropped_column": t.has_dropped, "turns": s.turns,
            "prefill_tokens": s.prefill_tokens, "decode_tokens": s.decode_tokens,
            "prefill_rows": s.prefill_rows, "decode_rows": s.decode_rows,
            "dropped_rows": s.dropped_rows, "token_cycle_bytes": s.token_cycle_bytes,
            "all_experts_bytes": s.all_experts_bytes, "expert_bytes": list(t.expert_bytes),
        },
        "lookups": {"all": len(lk), "decode": len(lk) - _prefill_lookups(rp),
                    "batches": lk.batches, "decode_batches": decode_batches},
        "recorded": _cache_json(rp.recorded),
        "cache": [
            {"budget_mib": m, "budget_bytes": int(m * MIB),
             **{p: _cache_json(rp.at(m, p)) for p in POLICIES}}
            for m in rp.budgets_mib
        ],
        "predictors": [
            {"name": p.name, "lag": p.lag, "named": p.named, "slots": p.slots,
             "routings": p.routings, "pct": p.pct, "tie_layers": p.tie_layers,
             "tie_span_pct": list(p.tie_span) if p.tie_span else None}
            for p in rp.predictors
        ],
        "drop": [
            {"factor": d.factor, "threshold": d.threshold, "dropped": d.dropped,
             "candidates": d.candidates, "miss_bytes": d.miss_bytes,
             "avoided_bytes": d.avoided_bytes, "reads_avoided_pct": d.reads_avoided_pct,
             "weight_total": d.weight_total, "weight_discarded": d.weight_discarded,
             "weight_discarded_pct": d.weight_discarded_pct}
            for d in rp.drops
        ],
        "definitions": DEFINITIONS,
    }


def _prefill_lookups(rp: Replay) -> int:
    lk = rp.lookups
    return sum(lk.starts[b + 1] - lk.starts[b] for b, d in enumerate(lk.decode) if not d)


# -- terminal report ---------------------------------------------------------------------


def _p(value: float | None, width: int = 6) -> str:
    return f"{value:{width}.1f}" if value is not None else f"{'-':>{width}}"


def _mib_text(n_bytes: float) -> str:
    return f"{n_bytes / MIB:,.1f} MiB"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _budget(mib: float) -> str:
    return f"{mib:g}"


def render(rp: Replay) -> str:
    """The plain-text report: header, cache replay, predictors, drop trade."""
    out: list[str] = []
    _header(rp, out)
    _cache_section(rp, out)
    _predictor_section(rp, out)
    _drop_section(rp, out)
    return "\n".join(map(shown, out)) + "\n"  # the trace's `# model=` is its writer's words


def _header(rp: Replay, out: list[str]) -> None:
    t, s, lk, rec = rp.trace, rp.shape, rp.lookups, rp.recorded
    model = Path(t.model).name if t.model else "unknown model"
    pre = _prefill_lookups(rp)
    out += [
        f"route trace  {t.source}",
        f"  model      {model}" + (f" ({t.arch})" if t.arch else "")
        + f", {_n(t.n_layer, 'layer')} x {_n(t.n_expert, 'expert')}, top-{t.n_expert_used}",
        f"  rows       {t.rows}: prefill {s.prefill_rows} ({_n(s.prefill_tokens, 'token')}), "
        f"decode {s.decode_rows} ({_n(s.decode_tokens, 'token')}), {_n(s.turns, 'turn')}, "
        f"{s.dropped_rows} dropped by the run"
        + ("" if t.has_dropped else " (no `dropped` column)"),
        f"  experts    one token's cycle {_mib_text(s.token_cycle_bytes)} "
        f"(k x sum of expert_bytes), all experts {_mib_text(s.all_experts_bytes)}",
        f"  lookups    {len(lk)} in {lk.batches} layer batches: prefill {pre} in "
        f"{lk.batches - sum(lk.decode)}, decode {len(lk) - pre} in {sum(lk.decode)}",
        f"  recorded   {_p(rec.hit_pct, 0)}% hit ({rec.hits}/{rec.lookups} lookups), decode "
        f"{_p(rec.decode_hit_pct, 0)}% ({rec.decode_hits}/{rec.decode_lookups}): "
        "the run's own cache, from the residency column",
        "",
    ]


def _cache_section(rp: Replay, out: list[str]) -> None:
    own = recorded_budget_mib(rp.trace)
    out.append("cache replay: hit %" + "".join(f"{_POLICY_NAMES[p]:>17}" for p in POLICIES))
    out.append("  budget MiB       " + "      all  decode" * len(POLICIES))
    for m in rp.budgets_mib:
        cells = "".join(f"   {_p(r.hit_pct)}  {_p(r.decode_hit_pct)}"
                        for r in (rp.at(m, p) for p in POLICIES))
        out.append(f"  {_budget(m):>10}       {cells}" + ("   the run's budget" if m == own
                                                          else ""))
    d = DEFINITIONS
    pre = _prefill_lookups(rp)
    out += [
        f"  all: hits / {len(rp.lookups)} lookups (prefill + decode); decode: hits / "
        f"{len(rp.lookups) - pre} decode lookups, the cache warmed by prefill",
        f"  lookup: {d['lookup']}",
        f"  LRU: {d['lru']}; LFU: {d['lfu']}; Belady: {d['belady']}",
        "",
    ]


_PREDICTOR_LABELS = {"prev_token": "prev-token, lag {lag}", "run_hottest": "run hottest-k",
                     "prompt_hottest": "prompt hottest-k", "random": "random"}


def _predictor_section(rp: Replay, out: list[str]) -> None:
    t = rp.trace
    k = t.n_expert_used
    out.append(f"predictors (decode): share of a routing's top-{k} the predictor named, "
               f"{k} per layer")
    notes = []
    for p in rp.predictors:
        label = _PREDICTOR_LABELS[p.name].format(lag=p.lag)
        if p.name == "random":
            what = f"k / n_expert = {k}/{t.n_expert}"
        elif p.named is None:
            what = "no prefill rows in the trace" if p.name == "prompt_hottest" else "-"
        else:
            what = f"{p.named:>6} / {p.slots} slots ({p.routings} routings)"
        out.append(f"  {label:<20}{_p(p.pct)}{'%' if p.pct is not None else ' '}   {what}")
        if p.tie_span and round(p.tie_span[0], 1) != round(p.tie_span[1], 1):
            notes.append(f"  {label}: {p.tie_layers} of {t.n_layer} layers tie at the k-th "
                         f"place; {p.tie_span[0]:.1f}-{p.tie_span[1]:.1f}% across tie orders "
                         "(here ties go to the lowest expert id)")
    d = DEFINITIONS
    out += [
        "  scored: decode routings after each turn's first token; lag d needs d earlier "
        "decode tokens of the turn",
        f"  prev-token: {d['prev_token']}; run hottest-k: {d['run_hottest']}; "
        f"prompt hottest-k: {d['prompt_hottest']}",
        *notes,
        "",
    ]


def _drop_section(rp: Replay, out: list[str]) -> None:
    k = rp.trace.n_expert_used
    out.append(f"drop policy (decode): skip a recorded miss whose weight < F/{k}, never a "
               "routing's top expert")
    out.append("         F   threshold   dropped   reads avoided   weight discarded")
    for d in rp.drops:
        out.append(f"  {d.factor:8.2f}   {d.threshold:9.4f}   {d.dropped:7d}   "
                   f"{_p(d.reads_avoided_pct, 12)}%   {_p(d.weight_discarded_pct, 15)}%"
                   .replace("-%", "- "))
    if rp.drops:
        d0 = rp.drops[0]
        out += [
            f"  reads avoided: skipped miss bytes / {_mib_text(d0.miss_bytes)} of decode "
            f"misses (recorded residency 0); weight discarded: skipped router weight / "
            f"{d0.weight_total:,.1f} (all decode weight)",
            f"  candidates: {d0.candidates} recorded decode misses that are not their "
            "routing's top expert; a skip does not change later residency here",
        ]
