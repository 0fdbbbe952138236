"""The expert side's records of one forward pass: what the pass did (`TokenCounters`), a
layer's routing as the drop policy left it (`Selection`) and its experts after their
lookups (`Load`). `experts.py` fills them; the session reads the counters per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

import numpy as np

from abbench.engine.kernels.compute import Job
from abbench.engine.streaming.cache import ExpertCache, Key
from abbench.engine.streaming.streamer import ExpertBuffer, ReadTicket

if TYPE_CHECKING:
    from abbench.records.route_trace import RouteTraceWriter


@dataclass
class TokenCounters:
    """What one forward pass did on the expert side (reset per pass)."""

    read_bytes: int = 0
    io_s: float = 0.0  # time reads were in flight (per layer, first issue → last done)
    stall_s: float = 0.0  # time every compute thread waited on a read
    mgmt_s: float = 0.0  # cache bookkeeping and read issue on the compute thread
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    experts_routed: int = 0
    experts_dropped: int = 0
    spec_read_bytes: int = 0
    spec_experts: int = 0  # speculative reads completed and integrated into the cache
    spec_useful: int = 0  # speculatively read experts hit before eviction
    spec_cancelled: int = 0
    retained: int = 0  # predicted residents refreshed in the LRU

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())

    def counts(self) -> dict[str, int]:
        """The pass's counts, which a TokenRecord carries as they are (times it converts)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}


@dataclass(frozen=True, slots=True)
class Selection:
    """One layer's routing as the router chose it and as the drop policy left it."""

    routed: list[int]  # (k,) expert ids, routing order
    routed_weights: np.ndarray  # (k,)
    keep: list[bool] | None  # (k,) per routed slot; None when nothing was dropped
    experts: list[int]  # (k',) the kept experts, routing order
    weights: np.ndarray  # (k',) their weights (renormalised unless --drop-no-renorm)

    def trace(self, trace: RouteTraceWriter, phase: int, step: int, layer: int,
              residency: list[int], file_bytes: int) -> None:
        """The layer's route-trace rows, one per routed slot, dropped ones included
        (residency 0): `residency` is the kept experts' (routing order)."""
        k = len(self.routed)
        if self.keep is None:
            full, dropped = residency, [0] * k
        else:
            it = iter(residency)
            full = [next(it) if kept else 0 for kept in self.keep]
            dropped = [0 if kept else 1 for kept in self.keep]
        trace.layer(phase, step, layer, self.routed, self.routed_weights.tolist(), full,
                    dropped, file_bytes)


class ResidentTeam(Protocol):
    """A team that runs resident experts from their buffers alone (the partner, the ggml
    team): `bufs` in routing order, `experts` their ids → (k, d), valid until the next
    call."""

    def run_resident(self, bufs: list[ExpertBuffer], x: np.ndarray,
                     experts: Sequence[int] = (), layer: int = 0) -> np.ndarray: ...


# The team and each layer's buffers by expert id, when every expert is resident there.
Direct = tuple[ResidentTeam, list[list[ExpertBuffer]]]


def by_expert_id(cache: ExpertCache, n_layer: int, n_expert: int) -> list[list[ExpertBuffer]]:
    """Each layer's buffers by expert id, of a complete cache (which never changes)."""
    return [[cache.entries[(layer, e)] for e in range(n_expert)] for layer in range(n_layer)]
Miss = tuple[int, int, ExpertBuffer, bool]  # (slot, expert, buffer, whether it is cached)


@dataclass(slots=True)
class Load:
    """One layer's chosen experts after their lookups: what is resident, what is read."""

    resident: list[Job]
    missing: list[Miss]
    tickets: list[ReadTicket]  # one per miss, in flight
    residency: list[int]  # per chosen slot: 0 miss, 1 hit, 2 hit on speculation
    batch: set[Key] | None  # the layer's keys (never evicted by it); built at the first miss

