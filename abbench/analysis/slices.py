"""A cell's slices in an interleaved campaign (docs/method.md#interleaved-slices): per turn
it took, its log tokens/s from the per-token times of that turn's tokens, its span from
`slices.jsonl`, and the foreign CPU load the sampler saw inside that span
(`analysis.interleave` pairs them into run pairs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from abbench.records import Sample, keys
from abbench.records.slices import SliceRecord


@dataclass(frozen=True)
class SliceStat:
    """One turn of a cell: its decode tokens' log tokens/s and when it ran."""

    index: int  # 0-based within the cell
    tokens: int  # with a per-token time
    log_rate: float  # NaN without tokens
    t_start_mono: float
    t_end_mono: float
    foreign_cores: float | None  # mean over the sampler's ticks inside it (None: none)


def slice_stats(records: Sequence[SliceRecord], wall_ms: Sequence[float],
                slice_of: Sequence[float], samples: Sequence[Sample]) -> tuple[SliceStat, ...]:
    """The cell's slices from its slice records, its per-token wall times and the per-token
    slice column (equal length; a cell that took no turns has no records: ())."""
    wall = np.asarray(wall_ms, dtype=float)
    which = np.asarray(slice_of, dtype=float)
    if len(which) != len(wall):
        which = np.full(len(wall), np.nan)
    out = []
    for r in records:
        w = wall[(which == r.slice) & np.isfinite(wall)]
        total = float(w.sum())
        rate = math.log(len(w) * 1000.0 / total) if len(w) and total > 0 else math.nan
        out.append(SliceStat(r.slice, len(w), rate, r.t_start_mono, r.t_end_mono,
                             _foreign(samples, r.t_start_mono, r.t_end_mono)))
    return tuple(out)


def _foreign(samples: Sequence[Sample], start: float, end: float) -> float | None:
    # a tick's foreign load is the mean since the tick before: the ticks that end inside
    seen = [float(s.values[keys.FOREIGN_CORES]) for s in samples
            if start < s.t_mono <= end and _finite(s.values.get(keys.FOREIGN_CORES))]
    return float(np.mean(seen)) if seen else None


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
