"""A bmoe_metrics run as its user waited through it: the seed engine's speculative groups
and the time between decodes, accounted as its writer defines them.

The v2 writer (`core/src/metrics/csv_metrics_sink.cpp`, `TokenMetrics` in
`core/include/bmoe/metrics.h`) writes one row per confirmed token, but under speculation one
*decode* confirms a whole group: `mtp_batch` (on every row of the group) is its size, and
the group's whole cost — `wall_ms`, faults, CPU, flash bytes, `loop_overhead_ms`,
`mtp_draft_ms` — is charged to its first row, the rest carrying zeros. `wall_ms` is the
decode alone; `loop_overhead_ms` is the time between the previous decode and this one
(sampling, detokenizing, drafting: `mtp_draft_ms` is a slice of it), which the engine's own
`tok/s` leaves out. A self-speculative run that drafts expensively reads faster from
`wall_ms` while its user waits longer.

So, here:

- a **group** is one decode: its first row and the `mtp_batch - 1` rows after it (fewer
  where the turn or the run ends);
- a token's **waited-through time** is its group's decode plus the time before it,
  `(wall_ms + loop_overhead_ms) / size` on each of its rows, and the run's headline rate is
  tokens over their sum; the **decode-only** rate (the engine's `tok/s`) stands beside it;
- every cost column is spread over its group the same way (`token_view`), so per-token
  statistics (medians, windows, bootstrap blocks) see one decode of `mtp_batch` tokens
  rather than one costly token and several free ones.

A file without `loop_overhead_ms` (v1, abbench's own engine) has no time between decodes on
record: its rate is the decode's, and says so. Without `mtp_batch` every row is a group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from abbench.records.bmoe_csv import BmoeRun, token_columns, work_fingerprint
from abbench.records.tokens import DECODE_MS

BATCH = "mtp_batch"
BETWEEN = "loop_overhead_ms"  # the time between the previous decode and this one
DRAFT = "mtp_draft_ms"
TURN = "turn"
WALL = "wall_ms"
DECODE = DECODE_MS  # the view's decode-only time per token (`wall_ms` spread)
# A group's costs, charged to its first row by the writer (`TokenMetrics`): spread here.
COSTS = ("wall_ms", "io_ms", "compute_ms", "read_bytes", "stall_ms", "mgmt_ms", "majflt",
         "cpu_ms", "majflt_mib", BETWEEN, DRAFT, "drain_ms", "adopt_ms", "ra_issue_ms",
         "ra_wd_ms")
# The `# summary` keys of the same accounting.
BETWEEN_PER_TOKEN = "loop_overhead_s/tok"
DECODE_RATE = "decode_tok/s"


@dataclass(frozen=True)
class Digest:
    """What a run's per-token table says of the run as a whole, kept where the table is
    not (an import of ten thousand runs holds these, and reads each file again to write
    it): its rows, its `wall_ms` values' count and sum, its last (cumulative)
    `cache_hit_pct`, its work fingerprint, and its summary (`run_summary`)."""

    rows: int
    walls: int  # wall_ms values (rows without a gap there)
    wall_sum_ms: float
    last_hit_pct: float | None
    fingerprint: str | None
    summary: dict[str, Any]


def digest(run: BmoeRun) -> Digest:
    walls = run.column(WALL) or []
    hits = run.column("cache_hit_pct")
    return Digest(run.n_rows, len(walls), math.fsum(walls), hits[-1] if hits else None,
                  work_fingerprint(run), run_summary(run))


def groups(run: BmoeRun) -> list[tuple[int, int]]:
    """Each decode's rows as [start, end): one row each without `mtp_batch`; a group never
    spans two turns and ends where the file does."""
    n = run.n_rows
    batch = run.columns.get(BATCH)
    turn = run.columns.get(TURN)
    out: list[tuple[int, int]] = []
    i = 0
    while i < n:
        size = batch[i] if batch is not None else None
        end = min(n, i + (int(size) if size is not None and size >= 1 else 1))
        if turn is not None:
            j = i + 1
            while j < end and turn[j] == turn[i]:
                j += 1
            end = j
        out.append((i, end))
        i = end
    return out


def records_between(run: BmoeRun) -> bool:
    """Whether the run records the time between its decodes."""
    return BETWEEN in run.columns or BETWEEN_PER_TOKEN in run.summary


def token_view(run: BmoeRun) -> dict[str, list[float]]:
    """The run's per-token columns as abbench reads them (a gap as NaN): each group's costs
    spread over its tokens, `decode_ms` the decode alone and `wall_ms` the waited-through
    time (decode + the time before it) where the run records it — the file's `wall_ms`
    otherwise."""
    cols = token_columns(run)
    if BATCH not in cols and BETWEEN not in cols:
        return cols
    spans = groups(run)
    for name in COSTS:
        if name in cols:
            cols[name] = _spread(cols[name], spans)
    if WALL in cols:
        cols[DECODE] = list(cols[WALL])
        if BETWEEN in cols:
            cols[WALL] = [w + (b if math.isfinite(b) else 0.0)
                          for w, b in zip(cols[WALL], cols[BETWEEN])]
    return cols


def _spread(values: list[float], spans: list[tuple[int, int]]) -> list[float]:
    """Each group's total (its known values summed) shared equally by its rows; a group
    with no known value stays unknown."""
    out = list(values)
    for start, end in spans:
        known = [v for v in values[start:end] if math.isfinite(v)]
        share = math.fsum(known) / (end - start) if known else math.nan
        out[start:end] = [share] * (end - start)
    return out


def run_summary(run: BmoeRun) -> dict[str, Any]:
    """The run's summary in abbench's keys: its `# summary` (the turns combined), else
    tokens, s/tok and tok/s from its rows; {} when it has neither. Where the run records the
    time between decodes, `tok/s` and `s/tok` are the waited-through figures — from the
    trailer's `loop_overhead_s/tok` (which includes the tail after the last token), else
    from the rows — and `decode_tok/s` the engine's own decode-only rate;
    `prefill_tok/s` from the trailer's `prefill_tps`."""
    summary = dict(run.summary)
    walls = run.column(WALL)
    if "tok/s" not in summary and walls and sum(walls) > 0:
        summary["tokens"] = len(walls)
        summary["s/tok"] = sum(walls) / len(walls) / 1e3
        summary["tok/s"] = len(walls) / (sum(walls) / 1e3)
    if not summary:
        return summary
    summary.setdefault("tokens", len(walls or []))
    if "prefill_tps" in summary and "prefill_tok/s" not in summary:
        summary["prefill_tok/s"] = summary["prefill_tps"]
    decode_s = summary.get("s/tok")
    between = summary.get(BETWEEN_PER_TOKEN)
    if not isinstance(between, float):
        rows = run.column(BETWEEN)
        between = math.fsum(rows) / len(rows) / 1e3 if rows else None
    if isinstance(decode_s, float) and between is not None and decode_s + between > 0:
        summary[DECODE_RATE] = summary.get("tok/s")
        summary[BETWEEN_PER_TOKEN] = between
        summary["s/tok"] = decode_s + between
        summary["tok/s"] = 1.0 / (decode_s + between)
    return summary


__all__ = ["BATCH", "BETWEEN", "BETWEEN_PER_TOKEN", "COSTS", "DECODE", "DECODE_RATE",
           "Digest", "digest", "groups", "records_between", "run_summary", "token_view"]
