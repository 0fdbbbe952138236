"""What the phone-streaming engine (BigMoeOnEdge) and its drivers print, as their public
source spells it: each format string below is copied from the file and line cited beside
it (commit 2d4f2b1 of github.com/Helldez/BigMoeOnEdge unless another is named), and
`printf` fills it as C's printf would. The import fixtures (tests/fixtures/imports/build.py)
and the import tests write the files they read through these, so that no line of a
fixture is a format abbench's own parser invented (STYLE 12).

Lines whose writer is not published (two drivers whose output is only in the authors'
archive) are copied from that archive's files, cited the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

REPO = "github.com/Helldez/BigMoeOnEdge"
HEAD = "2d4f2b11db128cbe32da738ce114c0479542f458"
V1_COMMIT = "523413e9746d91a953021280effbbcc5d94c2b3b"  # the last commit before v2 (c9c5d37)
V0_COMMIT = "fcc80ad0a56620efc42afda253b1cb631be1fe06"  # the 8-column table
SIDECAR_COMMIT = "de99a4c6d0aafd301b7656247a5ce3a7a489b356"  # the sidecar's A/B build

_LENGTH = re.compile(r"(%[-+ 0#]*\d*(?:\.\d+)?)(?:hh|h|ll|l|z|j|t)?([diouxXeEfgGcs%])")


def printf(fmt: str, *args: Any) -> str:
    """`fmt` filled as C's printf fills it (length modifiers dropped, `%u` as `%d`)."""
    py = _LENGTH.sub(lambda m: m[1] + ("d" if m[2] == "u" else m[2]), fmt)
    return py % args if args else py.replace("%%", "%")


# -- the per-token CSV: core/src/metrics/csv_metrics_sink.cpp ---------------------------

# v2 (HEAD): lines 26, 31, 32-35, 37-45, 46-50 (preamble), 113-116 (header), 56-63 (row),
# 70-91 (the trailer, one per turn).
V2_PREAMBLE = (
    "# bmoe_metrics v2\n",
    "# engine=%s\n",
    "# model=%s arch=%s n_layer=%d n_expert=%d n_expert_used=%d threads=%d "
    "n_ctx=%d n_ubatch=%d chatml=%d\n",
    "# moe_stream=%d cache_mb=%d cache_auto=%d cache_floor_mb=%d cache_ceil_mb=%d "
    "force_cache=%d load_all=%d io_threads=%d o_direct=%d overlap=%d io_two_wave=%d prefetch=%d "
    "route_ahead=%d predict_prefetch=%d predict_log=%d predict_spec_max=%d prefetch_sync=%d "
    "dense_weights=%s drop_cold_frac=%.4g drop_renorm=%d drop_prefill=%d\n",
    "# temp=%.4g top_k=%d top_p=%.4g seed=%u compute_trace_layers=%d spec=%s "
    "spec_draft_max=%d mtp_p_min=%.4g ngram_min_match=%d\n",
)
V2_HEADER = ("step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,mgmt_ms,"
             "majflt,cpu_ms,dense_resident_frac,turn,majflt_mib,cache_budget_mib,rss_mib,"
             "rss_anon_mib,rss_file_mib,swap_mib,mem_available_mib,mem_free_mib,swap_free_mib,"
             "loop_overhead_ms,mtp_batch,mtp_draft_ms,drain_ms,adopt_ms,ra_issue_ms,"
             "ra_wd_ms\n")
V2_ROW = ("%d,%d,%.3f,%.3f,%.3f,%llu,%.2f,%.3f,%.3f,%llu,%.3f,%.3f,%d,%.2f,%.1f,%.1f,%.1f,"
          "%.1f,%.1f,%.1f,%.1f,%.1f,%.3f,%d,%.3f,%.3f,%.3f,%.3f,%.3f\n")
SUMMARY_HEAD = (
    "# summary tokens=%d s/tok=%.3f tok/s=%.3f read_MiB=%.1f "
    "io_s=%.2f compute_s/tok=%.3f io_s/tok=%.3f cache_hit_pct=%.1f "
    "n_prompt=%d load_s=%.3f prefill_s=%.3f prefill_tps=%.2f stall_s/tok=%.3f mgmt_s/tok=%.3f "
    "cache_resident_MiB=%.1f cache_budget_MiB=%.1f cache_resizes=%lld "
    "spec_read_MiB=%.1f spec_experts=%lld spec_useful=%lld "
    "majflt/tok=%.2f cpu_s/tok=%.4f token_demand_MiB=%.1f layer_demand_MiB=%.1f "
    "experts_routed=%lld experts_dropped=%lld")  # the trailer's keys both versions print
V2_SUMMARY = SUMMARY_HEAD + (
    " loop_overhead_s/tok=%.4f "
    "mtp_drafted=%lld mtp_accepted=%lld mtp_decodes=%lld mtp_draft_s/tok=%.4f "
    "drafted_steps=%lld "
    "ra_committed=%lld ra_passthrough=%lld ra_agree_pct=%.1f ra_gemv_ms/tok=%.2f "
    "ra_issue_ms/tok=%.2f ra_wd_ms/tok=%.2f drain_s/tok=%.3f adopt_s/tok=%.3f "
    "evictions=%lld rereads=%lld\n")

# v1 (at V1_COMMIT): lines 21, 22, 24-30 (preamble), 75-77 (header), 36-42 (row), 48-61.
V1_PREAMBLE = (
    "# bmoe_metrics v1\n",
    "# model=%s arch=%s n_layer=%d n_expert=%d n_expert_used=%d threads=%d n_ctx=%d\n",
    "# moe_stream=%d cache_mb=%d cache_auto=%d cache_ceil_mb=%d force_cache=%d "
    "io_threads=%d o_direct=%d overlap=%d prefetch=%d predict_prefetch=%d dense_weights=%s "
    "drop_cold_frac=%.4g\n",
)
V1_HEADER = ("step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,mgmt_ms,"
             "majflt,cpu_ms,dense_resident_frac,turn,majflt_mib,cache_budget_mib,rss_mib,"
             "rss_anon_mib,rss_file_mib,swap_mib,mem_available_mib,mem_free_mib,"
             "swap_free_mib\n")
V1_ROW = ("%d,%d,%.3f,%.3f,%.3f,%llu,%.2f,%.3f,%.3f,%llu,%.3f,%.3f,%d,%.2f,%.1f,%.1f,%.1f,"
          "%.1f,%.1f,%.1f,%.1f,%.1f\n")
V1_SUMMARY = SUMMARY_HEAD + "\n"

# The 8-column table (at V0_COMMIT): lines 13 (header), 20 (row); a run that ended before
# its trailer has none (the authors' 2026-07-12 archive).
V0_HEADER = "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms\n"
V0_ROW = "%d,%d,%.3f,%.3f,%.3f,%llu,%.2f,%.3f\n"

# -- the CLI's stdout: cli/main.cpp -----------------------------------------------------

GENERATION = "generation: %d tokens, %.3f s/token (%.3f tok/s)\n"  # 787
COMPUTE = ("compute: %.1f%% CPU occupancy (%.4f cpu-s/token over %d threads), %.2f major "
           "faults/token\n")  # 795
DRAFTS = ("%s: %lld/%lld drafts accepted (%.1f%%), %.2f tokens per verify decode "
          "(%lld decodes for %d tokens)\n")  # 802-803
DRAFT_COST = ("%s: drafting costs %.4f s/token on top of decode → %.2f tok/s effective "
              "(vs %.2f reported)\n")  # 811-812
PREFILL = "prefill: %d tokens, %.3f s (%.1f tok/s) | model load %.3f s | TTFT %.3f s\n"  # 834
MOE_STREAM = ("moe-stream: read %.1f MiB (%.2f MiB/token), decode %.3f s/token "
              "(compute %.3f + cache mgmt %.3f + flash I/O %.3f s/token, %.0f MiB/s)\n")  # 838
MOE_CACHE_AUTO = "moe-cache: %.1f%% hit, resident %.1f MiB, budget %.0f MiB (auto)\n"  # 847
MOE_CACHE = "moe-cache: %.1f%% hit, resident %.1f MiB\n"  # 850
MOE_OVERLAP = "moe-overlap: stall %.3f s/token (flash reads overlapped with FFN compute)\n"  # 861
MOE_PREFETCH = "moe-prefetch: %.1f MiB speculative, %lld/%lld experts useful (%.0f%%)%s\n"  # 870
MOE_DROP = ("moe-drop: %lld/%lld routed experts dropped (%.1f%%), threshold %.2f x "
            "uniform\n")  # 880

# -- the engine's stderr ---------------------------------------------------------------

# core/src/moe/expert_stream_source.cpp:268
STREAMING_ON = ("bmoe: expert streaming ON  n_expert=%d o_direct=%d io_threads=%d cache=%zu "
                "MiB shards=%zu\n")
# core/src/moe/expert_stream_source.cpp:278 at SIDECAR_COMMIT
SIDECAR_ON = "bmoe: expert sidecar ON  (%s, o_direct=%d)\n"
# core/src/moe/dense_weights.cpp:125
DENSE = "bmoe: dense-weights=%s — %llu MiB in %zu %s buffers\n"

# -- the drivers ---------------------------------------------------------------------------

# scripts/bench-run.sh:40-48 (the device-pressure `.metrics`, one `key=value` a line)
METRICS_KEYS = ("peak_rss_kb", "mem_avail_before_kb", "mem_avail_floor_kb",
                "mem_avail_after_kb", "batt_temp_before_dC", "batt_temp_max_dC",
                "batt_temp_after_dC", "cpu_temp_before_mC", "cpu_temp_max_mC")
# docs/bench-data/2026-07-17/driver-matrix.sh:19, :26; driver-lanes.sh:41-42, :51
COOLDOWN = "--- cooldown 45s ---\n"
BANNER = "=============== %s ===============\n"
ENTRY_STATE = "ENTRY STATE: batt=%s dC, memavail=%s kB, freq=%s, waited=%ss\n"
DONE = "=============== DONE ===============\n"
# docs/bench-data/2026-07-17/driver-matrix.sh:22-36: the function, and one line a run
RUN_FUNCTION = ('run() {\n  TAG="$1"; MODEL="$2"; shift 2\n  cool\n'
                '  echo "=============== $TAG ==============="\n'
                '  sh /data/local/tmp/bench-run-doc.sh "$N" "$MODEL" "$OUT/$TAG.csv" '
                '"$OUT/$TAG.metrics" "$@"\n}\n')
# docs/bench-data/2026-07-15-route-trace/route-trace-bench.sh:19-27 (state()): a `.state`
STATE_SECTION = "--- %s ---\n"
STATE_DATE = "date: %s\n"
STATE_POLICY = "%s: scaling_max=%d hw_max=%d cur=%d\n"
STATE_MEMINFO = ("meminfo: MemFree:         %d kB MemAvailable:    %d kB Cached:          "
                 "%d kB \n")
STATE_BATTERY = "battery_temp_dC: %s\n"
# ... then `dumpsys thermalservice | grep -E 'mName=CPU[0-3]|Thermal Status' | head -5`, as
# docs/bench-data/2026-07-15-route-trace/qwen.state:8-12 holds it; `date`'s own format there
STATE_THERMAL = "Thermal Status: %d\n"
STATE_TEMPERATURE = "\tTemperature{mValue=%.1f, mType=0, mName=CPU%d, mStatus=0}\n"
STATE_DATE_FORMAT = "%a %b %d %H:%M:%S CEST %Y"  # `date`, as qwen.state:2 holds it

# The sidecar A/B's driver (not published): docs/bench-data/2026-07-20-sidecar/ab-sidecar.log
# lines 1-2, 619-621 — the CPU cap before each cell, a banner, the engine's output, an end.
SIDECAR_CAP = "freq_cap=%d/%d thermal=%d\n"
SIDECAR_BANNER = "=== cell %s ===\n"
SIDECAR_END = "--- end %s ---\n"
# The cache-replay A/B's driver (not published):
# docs/bench-data/2026-07-20-cache-replay/qwen-ab-run1.log lines 1-5 — its battery-level
# reading printed a line break inside the entry line.
REPLAY_ENTRY = "ENTRY: batt=%d dC lvl=%d\n%d%% cpu=%d mC mem=%d kB freq=%d\n"
REPLAY_EXIT = "EXIT:  batt=%d dC lvl=%d\n%d%% cpu=%d mC freq=%d\n"

# scripts/route-replay.py:312, :314 (a cache-size curve, not a run)
CURVE_HEADER = "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib\n"
CURVE_ROW = "%.0f,%s,%.3f,%.3f,%.1f\n"


def lines(formats: Sequence[str], values: Sequence[Sequence[Any]]) -> str:
    """Each format filled with its values, in order."""
    return "".join(printf(f, *v) for f, v in zip(formats, values, strict=True))


# -- whole files, from per-token values -------------------------------------------------

# The v1 preamble's keys in its lines' order (V1_PREAMBLE[1], [2]) and the defaults a test
# leaves alone; a v1 row's columns (V1_HEADER).
V1_KEYS = (("model", "x.gguf"), ("arch", "qwen3moe"), ("n_layer", 48), ("n_expert", 128),
           ("n_expert_used", 8), ("threads", 4), ("n_ctx", 2048))
V1_KEYS_2 = (("moe_stream", 1), ("cache_mb", 4000), ("cache_auto", 0), ("cache_ceil_mb", 0),
             ("force_cache", 0), ("io_threads", 4), ("o_direct", 1), ("overlap", 1),
             ("prefetch", 0), ("predict_prefetch", 0), ("dense_weights", "anon"),
             ("drop_cold_frac", 0.0))
V1_COLUMNS = tuple(V1_HEADER.strip().split(","))


def v1_row(step: int, steps: int, wall_ms: float, **given: Any) -> dict[str, Any]:
    """A v1 row's values: `wall_ms` and what is given, the rest in proportion to it."""
    row: dict[str, Any] = {
        "step": step, "steps": steps, "wall_ms": wall_ms, "io_ms": 0.8 * wall_ms,
        "compute_ms": 0.4 * wall_ms, "read_bytes": 150 * 2**20, "cache_hit_pct": 80.0,
        "stall_ms": 0.1 * wall_ms, "mgmt_ms": 0.02 * wall_ms, "majflt": 5, "cpu_ms": 3.1 * wall_ms,
        "dense_resident_frac": 1.0, "turn": 0, "majflt_mib": 0.0, "cache_budget_mib": 4000.0,
        "rss_mib": 4100.0, "rss_anon_mib": 3500.0, "rss_file_mib": 600.0, "swap_mib": 12.0,
        "mem_available_mib": 5200.0, "mem_free_mib": 300.0, "swap_free_mib": 9000.0}
    row.update(given)
    row["majflt_mib"] = row["majflt"] * 4096 / 2**20
    return row


def v1_file(rows: Sequence[dict[str, Any]], *, summary: bool = True, preamble: bool = True,
            **config: Any) -> str:
    """A v1 file (csv_metrics_sink.cpp at V1_COMMIT): preamble (its keys from `config`, the
    rest `V1_KEYS` defaults), header, rows, and a trailer computed from the rows."""
    known = {k for k, _ in (*V1_KEYS, *V1_KEYS_2)}
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"not a v1 preamble key: {sorted(unknown)}")
    first = [config.get(k, d) for k, d in V1_KEYS]
    second = [config.get(k, d) for k, d in V1_KEYS_2]
    text = lines(V1_PREAMBLE, ((), first, second)) if preamble else ""
    text += printf(V1_HEADER)
    text += "".join(printf(V1_ROW, *(r[c] for c in V1_COLUMNS)) for r in rows)
    if summary and rows:
        n = len(rows)
        gen = sum(r["wall_ms"] for r in rows) / 1e3
        per = {c: sum(r[c] for r in rows) / n for c in ("compute_ms", "io_ms", "stall_ms",
                                                          "mgmt_ms", "majflt", "cpu_ms")}
        read = sum(r["read_bytes"] for r in rows) / 2**20
        text += printf(V1_SUMMARY, n, gen / n, n / gen, read, per["io_ms"] * n / 1e3,
                       per["compute_ms"] / 1e3, per["io_ms"] / 1e3, rows[-1]["cache_hit_pct"],
                       34, 11.9, 5.1, 34 / 5.1, per["stall_ms"] / 1e3, per["mgmt_ms"] / 1e3,
                       float(config.get("cache_mb", 4000)) - 2.0,
                       float(config.get("cache_mb", 4000)), 0, 0.0, 0, 0, per["majflt"],
                       per["cpu_ms"] / 1e3, 190.0, 4.1, 0, 0)
    return text


def v0_file(walls: Sequence[float], read_bytes: int = 300 * 2**20) -> str:
    """The 8-column table (V0_COMMIT), no trailer, as the 2026-07-12 archive's files."""
    n = len(walls)
    return printf(V0_HEADER) + "".join(
        printf(V0_ROW, k + 1, n, w, 0.6 * w, 0.4 * w, read_bytes, 60.0 + 20.0 * (k + 1) / n, 0.0)
        for k, w in enumerate(walls))


def metrics_file(values: Sequence[int]) -> str:
    """A `.metrics` as scripts/bench-run.sh:40-48 writes it (METRICS_KEYS' values)."""
    return "".join(f"{k}={v}\n" for k, v in zip(METRICS_KEYS, values, strict=True))


__all__ = ["lines", "metrics_file", "printf", "v0_file", "v1_file", "v1_row"]
