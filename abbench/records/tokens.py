"""The per-token columns, spelled once: a forward pass's measures as the bmoe_metrics CSV's
header names them (abbench's engine's `--csv`, a cell's tokens.csv) and as a cell's
summary.json keys its `per_token` (decode, one value per token) and `prefill` (one value
per batch) columns.

The names are the engine's `TokenRecord` attributes, so a writer reads a record's value by
its column's name. Outside `records/` a column is named by these constants only
(`tests/test_architecture.py` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STEP = "step"  # 1-based within its phase
STEPS = "steps"  # decode steps in the run (the CSV repeats it on every row)
TOKEN = "token"  # the token id fed to the pass
TOKENS = "tokens"  # tokens the pass ran: a prefill batch's size
WALL_MS = "wall_ms"
IO_MS = "io_ms"  # reads in flight
COMPUTE_MS = "compute_ms"
STALL_MS = "stall_ms"  # compute waiting on a read
MGMT_MS = "mgmt_ms"  # cache management
READ_BYTES = "read_bytes"
HITS = "hits"
MISSES = "misses"
EVICTIONS = "evictions"
CACHE_HIT_PCT = "cache_hit_pct"  # the seed engine's is cumulative over the run
MAJFLT = "majflt"
CPU_MS = "cpu_ms"
RSS_MIB = "rss_mib"
EXPERTS_ROUTED = "experts_routed"
EXPERTS_DROPPED = "experts_dropped"
SPEC_READ_BYTES = "spec_read_bytes"
SPEC_EXPERTS = "spec_experts"
SPEC_USEFUL = "spec_useful"
SLICE = "slice"  # the slice (0-based turn) a decode token ran in, in a run that took turns
# An imported run that records the time between decodes (the seed engine's v2 CSV): its
# `wall_ms` is what a user waits through per token, this the decode alone
# (`records.bmoe_view`).
DECODE_MS = "decode_ms"

# The measures of a pass, in the order summary.json writes them.
MEASURES = (WALL_MS, IO_MS, COMPUTE_MS, STALL_MS, MGMT_MS, READ_BYTES, HITS, MISSES,
            EVICTIONS, MAJFLT, CPU_MS, RSS_MIB, EXPERTS_ROUTED, EXPERTS_DROPPED,
            SPEC_READ_BYTES, SPEC_EXPERTS, SPEC_USEFUL)
# summary.json `per_token`: the decode steps' measures, then the derived hit rate and the
# token fed; `prefill`: the batches' measures and their sizes.
PER_TOKEN_COLUMNS = (*MEASURES, CACHE_HIT_PCT, TOKEN)
PREFILL_COLUMNS = (*MEASURES, TOKENS)

# A run that took turns (`--turn-tokens`, records.slices) adds these after the columns
# above, to its `per_token` and its CSV; other runs' files are as they always were, and a
# reader finds them absent.
TURN_COLUMNS = (SLICE,)

# The bmoe_metrics CSV (v2) header abbench's engine writes, in order.
CSV_COLUMNS = (STEP, STEPS, WALL_MS, IO_MS, COMPUTE_MS, READ_BYTES, CACHE_HIT_PCT, STALL_MS,
               MGMT_MS, MAJFLT, CPU_MS, RSS_MIB, TOKEN, HITS, MISSES, EVICTIONS,
               EXPERTS_ROUTED, EXPERTS_DROPPED, SPEC_READ_BYTES, SPEC_EXPERTS, SPEC_USEFUL)
# Decimals of the CSV's fractional columns; every other column is a whole number.
CSV_DECIMALS = {WALL_MS: 3, IO_MS: 3, COMPUTE_MS: 3, CACHE_HIT_PCT: 2, STALL_MS: 3,
                MGMT_MS: 3, CPU_MS: 3, RSS_MIB: 1}


def csv_row(values: Mapping[str, Any],
            columns: tuple[str, ...] = CSV_COLUMNS) -> dict[str, Any]:
    """One CSV row from a pass's values by column name (`columns`), each fractional one
    formatted to its decimals."""
    return {c: f"{values[c]:.{CSV_DECIMALS[c]}f}" if c in CSV_DECIMALS else values[c]
            for c in columns}


__all__ = [
    "CACHE_HIT_PCT", "COMPUTE_MS", "CPU_MS", "CSV_COLUMNS", "CSV_DECIMALS", "DECODE_MS",
    "EVICTIONS",
    "EXPERTS_DROPPED", "EXPERTS_ROUTED", "HITS", "IO_MS", "MAJFLT", "MEASURES", "MGMT_MS",
    "MISSES", "PER_TOKEN_COLUMNS", "PREFILL_COLUMNS", "READ_BYTES", "RSS_MIB", "SLICE",
    "SPEC_EXPERTS", "SPEC_READ_BYTES", "SPEC_USEFUL", "STALL_MS", "STEP", "STEPS", "TOKEN",
    "TOKENS", "TURN_COLUMNS", "WALL_MS", "csv_row",
]
