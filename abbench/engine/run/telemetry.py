"""What a run reports: the summary, the console lines, the bmoe_metrics CSV, the JSON.

Decode statistics cover the decode phase (phase 1) only; prefill is reported separately.
Time accounting per token: `wall = compute + mgmt + stall`, where `stall` is the time every
compute thread waited on a read (all of the read wait without `--overlap`); `io` is the
time reads were in flight, so `read bytes / io` is the bandwidth the lanes achieved.

The fingerprint hashes what the run *did* — token ids in and out, and per forward pass the
bytes read, hits, misses, evictions, experts routed and dropped, speculative reads — never
a timing, so two runs doing the same work have the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from abbench.engine.experts.predictor import predict_lines_from_dict
from abbench.engine.run.result import RunResult, TokenRecord
from abbench.engine.units import MIB
from abbench.fsutil import atomic_write_text
from abbench.records.bmoe_csv import CACHE_BUDGET, format_bmoe_csv, trailer
from abbench.records.cell_doc import PREAMBLE, Resolved, engine_doc
from abbench.records.summary import RunSummary, generation_line
from abbench.records.tokens import (
    CSV_COLUMNS,
    PER_TOKEN_COLUMNS,
    PREFILL_COLUMNS,
    STEPS,
    TURN_COLUMNS,
    csv_row,
)


def fingerprint(result: RunResult) -> str:
    work = {
        "prompt": list(result.prompt_ids),
        "output": list(result.output_ids),
        "passes": [
            [r.phase, r.token, r.read_bytes, r.hits, r.misses, r.evictions, r.experts_routed,
             r.experts_dropped, r.spec_read_bytes, r.spec_experts, r.spec_useful]
            for r in result.records
        ],
    }
    blob = json.dumps(work, separators=(",", ":"), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def summarize(result: RunResult) -> RunSummary:
    dec = result.decode
    pre = result.prefill
    n = len(dec)
    wall = sum(r.wall_ms for r in dec) / 1e3
    read = sum(r.read_bytes for r in dec)
    io_s = sum(r.io_ms for r in dec) / 1e3
    hits = sum(r.hits for r in dec)
    misses = sum(r.misses for r in dec)
    routed = sum(r.experts_routed for r in dec)
    dropped = sum(r.experts_dropped for r in dec)
    spec_experts = sum(r.spec_experts for r in dec)
    cpu_s = sum(r.cpu_ms for r in dec) / 1e3

    def per_tok(x: float) -> float:
        return x / n if n else 0.0

    # The prompt's last token runs as decode step 1, whose logits give the first token.
    prefill_s = sum(r.wall_ms for r in pre) / 1e3
    ttft_s = prefill_s + (dec[0].wall_ms / 1e3 if dec else 0.0)

    return RunSummary(
        tokens=n,
        s_per_tok=per_tok(wall),
        tok_per_s=n / wall if wall > 0 else 0.0,
        read_mib=read / MIB,
        read_mib_per_tok=per_tok(read / MIB),
        io_s=io_s,
        io_s_per_tok=per_tok(io_s),
        bandwidth_mib_per_s=read / MIB / io_s if io_s > 0 else 0.0,
        compute_s_per_tok=per_tok(sum(r.compute_ms for r in dec) / 1e3),
        mgmt_s_per_tok=per_tok(sum(r.mgmt_ms for r in dec) / 1e3),
        stall_s_per_tok=per_tok(sum(r.stall_ms for r in dec) / 1e3),
        cache_hit_pct=100.0 * hits / (hits + misses) if hits + misses else 0.0,
        hits=hits,
        misses=misses,
        evictions=sum(r.evictions for r in dec),
        cache_resident_mib=result.resident_mib,
        cache_budget_mib=result.cache_budget_mib,
        majflt_per_tok=per_tok(sum(r.majflt for r in dec)),
        cpu_s_per_tok=per_tok(cpu_s),
        cpu_occupancy=cpu_s / (wall * result.threads) if wall > 0 else 0.0,
        peak_rss_mib=result.peak_rss_mib,
        dense_mib=result.dense_bytes / MIB,
        n_prompt=len(result.prompt_ids),
        prefill_s=prefill_s,
        ttft_s=ttft_s,
        prefill_tok_per_s=len(result.prompt_ids) / ttft_s if ttft_s > 0 else 0.0,
        load_s=result.load_s,
        experts_routed=routed,
        experts_dropped=dropped,
        spec_read_mib=sum(r.spec_read_bytes for r in dec) / MIB,
        spec_experts=spec_experts,
        spec_useful=sum(r.spec_useful for r in dec),
        spec_cancelled=sum(r.spec_cancelled for r in dec),
        retained=sum(r.retained for r in dec),
        o_direct=int(result.o_direct),
        threads=result.threads,
    )


def summary_lines(result: RunResult, s: RunSummary | None = None) -> list[str]:
    s = s or summarize(result)
    lines = [
        generation_line(s.tokens, s.s_per_tok, s.tok_per_s),
        f"compute: {s.threads} threads, {kernels_text(result.extra.get('kernels'))}"
        f"cpu {s.cpu_s_per_tok:.3f} s/token "
        f"({100 * s.cpu_occupancy:.0f}% occupancy), majflt {s.majflt_per_tok:.2f}/token, "
        f"peak RSS {s.peak_rss_mib:.0f} MiB, load {s.load_s:.2f} s, "
        f"prefill {s.n_prompt} tokens {s.prefill_tok_per_s:.1f} tok/s, TTFT "
        f"{s.ttft_s:.3f} s",
        f"moe-stream: read {s.read_mib:.1f} MiB ({s.read_mib_per_tok:.2f} MiB/token), "
        f"decode {s.s_per_tok:.3f} s/token (compute {s.compute_s_per_tok:.3f} + cache mgmt "
        f"{s.mgmt_s_per_tok:.3f} + flash I/O {s.stall_s_per_tok:.3f} s/token, "
        f"{s.bandwidth_mib_per_s:.0f} MiB/s) o_direct={s.o_direct}",
        f"moe-cache: {s.cache_hit_pct:.1f}% hit, resident {s.cache_resident_mib:.1f} MiB "
        f"(budget {s.cache_budget_mib:g} MiB, {s.evictions} evictions)",
    ]
    c = result.config
    if c.prefetch or c.predict_prefetch:
        n, useful = s.spec_experts, s.spec_useful
        pct = f"{100 * useful / n:.0f}%" if n else "-"
        line = (f"moe-prefetch: {s.spec_read_mib:.1f} MiB speculative, {useful}/{n} experts "
                f"useful ({pct}), {s.spec_cancelled} cancelled")
        if c.predict_prefetch:
            line += (f", {s.retained} predicted residents retained, spec-max "
                     f"{c.predict_spec_max}   [stale-gate]")
        else:
            line += f", horizon {c.prefetch} layers   [prev-token]"
        lines.append(line)
    if c.drop_cold_experts is not None:
        routed, dropped = s.experts_routed, s.experts_dropped
        pct = 100 * dropped / routed if routed else 0.0
        lines.append(f"moe-drop: {dropped}/{routed} routed experts dropped ({pct:.1f}%), "
                     f"threshold {c.drop_cold_experts:g} x uniform"
                     + ("" if not c.drop_no_renorm else ", survivors not renormalised"))
    if "predict" in result.extra:
        lines += predict_lines_from_dict(result.extra["predict"])
    return lines


def kernels_text(k: dict[str, Any] | None) -> str:
    """What computed the experts, for the `compute:` line (nothing for numpy's F32)."""
    if not k or k.get("backend") != "ggml":
        return ""
    types = sorted({t for ts in k.get("experts", {}).values() for t in ts})
    repacked = k.get("repacked", {}).get("experts") or []
    return (f"ggml kernels on {'/'.join(types)}"
            + (f" ({'/'.join(repacked)} repacked)" if repacked else "") + ", ")


def _num(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _preamble(result: RunResult) -> dict[str, Any]:
    c = result.config
    m = result.model
    pairs = {
        "model": m.get("name") or m["path"],
        "arch": m["architecture"],
        "n_layer": m["n_layer"],
        "n_expert": m["n_expert"],
        "n_expert_used": c.n_expert_used or m["n_expert_used"],
        "threads": result.threads,
        CACHE_BUDGET: f"{c.cache_mib:g}",
        "io_threads": c.io_lanes,
        "o_direct": int(result.o_direct),
        "overlap": int(c.overlap),
        "prefetch": c.prefetch,
        "predict_prefetch": int(c.predict_prefetch),
        "predict_spec_max": c.predict_spec_max if c.predict_prefetch else 0,
        "predict_log": int(c.predict_log),
        "dense_weights": "resident" if c.resident else ("anon" if c.dense == "pinned" else "mmap"),
        "drop_cold_frac": f"{c.drop_cold_experts:g}" if c.drop_cold_experts else 0,
        "temp": f"{result.temp:g}",
        "seed": c.seed,
        "repeat_penalty": f"{result.repeat_penalty:g}",
        "repeat_last_n": result.repeat_last_n,
    }
    pairs.update(result.extra.get(PREAMBLE, {}))
    return pairs


def _turn_columns(result: RunResult) -> tuple[str, ...]:
    """The columns a run that took turns adds (none for any other run: its files are as
    they always were)."""
    return TURN_COLUMNS if result.config.turn_tokens else ()


def csv_text(result: RunResult) -> str:
    dec = result.decode
    figures = trailer(summarize(result))
    columns = (*CSV_COLUMNS, *_turn_columns(result))
    return format_bmoe_csv(_preamble(result), columns,
                           (_row(r, len(dec), columns) for r in dec),
                           {k: _fmt(v) for k, v in figures.items()})


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def _row(r: TokenRecord, steps: int, columns: tuple[str, ...]) -> dict[str, Any]:
    # A column is named as the record's attribute; `steps` is the run's, on every row.
    return csv_row({c: steps if c == STEPS else getattr(r, c) for c in columns}, columns)


def _columns(records: tuple[TokenRecord, ...], names: tuple[str, ...]) -> dict[str, list[Any]]:
    """Per-token columns of the records (NaN as None: JSON has none)."""
    return {k: [_num(getattr(r, k)) for r in records] for k in names}


def json_doc(result: RunResult) -> dict[str, Any]:
    s = summarize(result)
    return engine_doc(
        config=result.config.to_dict(),
        resolved=Resolved(temp=result.temp, repeat_penalty=result.repeat_penalty,
                          repeat_last_n=result.repeat_last_n, threads=result.threads,
                          o_direct=result.o_direct),
        model=result.model, fingerprint=fingerprint(result), summary=s,
        lines=summary_lines(result, s), prompt_ids=result.prompt_ids,
        output_ids=result.output_ids, text=result.text,
        per_token=_columns(result.decode, (*PER_TOKEN_COLUMNS, *_turn_columns(result))),
        prefill=_columns(result.prefill, PREFILL_COLUMNS),  # one entry per batch
        sections={k: v for k, v in result.extra.items() if k != PREAMBLE},
    )


def write_csv(path: str, result: RunResult) -> None:
    atomic_write_text(path, csv_text(result))


def write_json(path: str, result: RunResult) -> None:
    atomic_write_text(path, json.dumps(json_doc(result), indent=1, allow_nan=False) + "\n")
