"""The drop policy's trade in decode: what `--drop-cold-experts F` would have skipped.

A routed expert is dropped when the run recorded it as a miss, it is not its routing's
top-weighted expert, and its weight is below F / k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from abbench.analysis.replay.units import percent
from abbench.records.route_trace import RouteTrace

DROP_FACTORS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class DropTrade:
    """What `--drop-cold-experts F` would have skipped in this run's decode."""

    factor: float            # F, in units of the uniform weight 1/k
    threshold: float         # F / k
    dropped: int             # routed experts it skips
    candidates: int          # decode misses (recorded residency 0) that are not the top expert
    miss_bytes: int          # all decode miss bytes, at the layer's expert_bytes
    avoided_bytes: int
    weight_total: float      # all decode router weight
    weight_discarded: float

    @property
    def reads_avoided_pct(self) -> float | None:
        return percent(self.avoided_bytes, self.miss_bytes)

    @property
    def weight_discarded_pct(self) -> float | None:
        return percent(self.weight_discarded, self.weight_total)


def drop_trade(trace: RouteTrace, factors: Sequence[float] = DROP_FACTORS) -> list[DropTrade]:
    """Per factor F: the decode misses (as the run recorded them) whose weight is below
    F / k, never a routing's top-weighted expert. The trade is read off the recorded
    residency: a drop does not change later residency here."""
    rows = np.flatnonzero(trace.phase == 1)                     # (d,) decode row indices
    weight = trace.weight[rows]                                  # (d,)
    # One id per (turn, step, layer) routing, then its heaviest row (the first on ties).
    _, routing = np.unique(np.stack([trace.turn[rows], trace.step[rows], trace.layer[rows]]),
                           axis=1, return_inverse=True)
    routing = routing.reshape(-1)                                # (d,)
    order = np.lexsort((np.arange(len(rows)), -weight, routing))
    first = np.ones(len(order), dtype=bool)
    first[1:] = routing[order][1:] != routing[order][:-1]
    top = np.zeros(len(rows), dtype=bool)
    top[order[first]] = True
    miss = trace.residency[rows] == 0
    cost = np.asarray(trace.expert_bytes, dtype=np.int64)[trace.layer[rows]]  # (d,)
    candidate = miss & ~top
    k = trace.n_expert_used
    out = []
    for f in factors:
        drop = candidate & (weight < f / k)
        out.append(DropTrade(
            factor=f, threshold=f / k, dropped=int(drop.sum()), candidates=int(candidate.sum()),
            miss_bytes=int(cost[miss].sum()), avoided_bytes=int(cost[drop].sum()),
            weight_total=float(weight.sum()), weight_discarded=float(weight[drop].sum()),
        ))
    return out
