"""The cache's view of a trace: its rows grouped into layer batches, one lookup per unique
expert per batch.

A batch is a run of consecutive rows with the same turn, phase and layer and, in decode,
the same step: a decode token meets each layer once, a prefill pass meets each layer once
with all its prompt tokens. Duplicates in a batch only refresh recency, so they are not
looked up again; a miss costs that layer's `expert_bytes`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from abbench.records.route_trace import RouteTrace

NEVER = sys.maxsize                     # next use of an entry the trace never asks for again


@dataclass(frozen=True, eq=False)
class Lookups:
    """One lookup per unique expert per layer batch, in run order."""

    keys: list[int]            # per lookup: layer * n_expert + expert
    cost: list[int]            # per lookup: the layer's expert_bytes, what a miss reads
    next_use: list[int]        # per lookup: the batch that asks for the key next, or NEVER
    recorded_hit: list[bool]   # per lookup: the run's own residency (its first row) was a hit
    starts: list[int]          # lookup index where each batch starts, plus the total at the end
    decode: list[bool]         # per batch: a decode batch
    key_bytes: dict[int, int]  # per key: its layer's expert_bytes

    @property
    def batches(self) -> int:
        return len(self.decode)

    def __len__(self) -> int:
        return len(self.keys)


def lookups(trace: RouteTrace) -> Lookups:
    """Group the trace's rows into layer batches and dedupe each batch. Rows the run dropped
    were never loaded, so they are not looked up."""
    turn, phase, step, layer, expert, res, dropped = (
        a.tolist() for a in (trace.turn, trace.phase, trace.step, trace.layer, trace.expert,
                             trace.residency, trace.dropped))
    n_expert, layer_bytes = trace.n_expert, trace.expert_bytes
    keys: list[int] = []
    cost: list[int] = []
    hit: list[bool] = []
    starts: list[int] = []
    decode: list[bool] = []
    current: tuple[int, int, int, int] | None = None
    seen: set[int] = set()
    for i in range(len(layer)):
        if dropped[i]:
            continue
        batch = (turn[i], phase[i], layer[i], step[i] if phase[i] else -1)
        if batch != current:
            current, seen = batch, set()
            starts.append(len(keys))
            decode.append(phase[i] == 1)
        key = layer[i] * n_expert + expert[i]
        if key in seen:
            continue
        seen.add(key)
        keys.append(key)
        cost.append(layer_bytes[layer[i]])
        hit.append(res[i] > 0)
    starts.append(len(keys))
    return Lookups(keys=keys, cost=cost, next_use=_next_use(keys, starts), recorded_hit=hit,
                   starts=starts, decode=decode,
                   key_bytes={k: layer_bytes[k // n_expert] for k in set(keys)})


def _next_use(keys: list[int], starts: list[int]) -> list[int]:
    """Per lookup, the index of the next batch that looks the same key up (Belady's oracle),
    computed once in one backward pass."""
    nxt = [NEVER] * len(keys)
    later: dict[int, int] = {}
    for b in range(len(starts) - 2, -1, -1):
        lo, hi = starts[b], starts[b + 1]
        for j in range(lo, hi):
            nxt[j] = later.get(keys[j], NEVER)
        for j in range(lo, hi):
            later[keys[j]] = b
    return nxt
