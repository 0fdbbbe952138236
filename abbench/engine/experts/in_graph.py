"""What a graph model's one graph a decode token asks of the expert side: whether this
pass may run its experts inside that graph, where a layer's experts sit in the complete
cache (the stack `mul_mat_id` indexes by expert id), and the counts of a pass whose
experts ran there (`arch/token_graph.py`: `TokenGraph`, `ExpertNodes`).

`InGraph` is a part of `ExpertRunner` (experts.py), not an object of its own, as
`Speculation` is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from abbench.engine.experts.policies import Policies
from abbench.engine.experts.selection import Direct, TokenCounters
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.streaming.cache import ExpertCache, Key
from abbench.engine.streaming.slots import SlotPool

if TYPE_CHECKING:
    from abbench.engine.streaming.streamer import ReadTicket
    from abbench.records.route_trace import RouteTraceWriter


class InGraph:
    """The one-graph-a-token queries of `ExpertRunner`, which sets every attribute below
    in its constructor."""

    team: object
    cache: ExpertCache
    tok: TokenCounters
    policies: Policies
    trace: RouteTraceWriter | None
    _direct: Direct | None
    _routing: list[list[int]]
    _pending: list[tuple[Key, ReadTicket]]
    _retain_at: tuple[int, list[int]] | None

    def in_graph(self, phase: int) -> bool:
        """Whether this decode pass's experts may run inside the model's one graph per
        token (as llama.cpp's do): every expert resident on the ggml team and nothing
        acting between a layer's router and its experts — no drop policy, speculation,
        route trace or reads in flight. The model counts the pass with `count_in_graph`."""
        return (phase == 1 and self._direct is not None and isinstance(self.team, QuantTeam)
                and self.policies.drop_frac_in(1) is None and not self.policies.speculates
                and self.trace is None and not self._pending and self._retain_at is None)

    def layer_stack(self, layer: int) -> tuple[SlotPool, int] | None:
        """A complete cache's slot pool and first slot of `layer`'s experts, where expert e
        sits in slot first + e (as `_preload` places them): the stack a graph's
        `mul_mat_id` takes the router's expert ids into. None: not so placed."""
        if self._direct is None:
            return None
        bufs = self._direct[1][layer]
        pool, first = bufs[0].kind, bufs[0].index  # type: ignore[attr-defined]
        if not isinstance(pool, SlotPool) or any(
                b.kind is not pool or b.index != first + e  # type: ignore[attr-defined]
                for e, b in enumerate(bufs)):
            return None
        return pool, first

    def count_in_graph(self, routed: Sequence[list[int]]) -> None:
        """What `run_routed`'s short way counts for each layer, for a pass whose experts
        ran in the model's graph (`routed`: each layer's expert ids, routing order)."""
        t0 = time.perf_counter()
        n = 0
        for layer, ids in enumerate(routed):
            self._routing[layer] = ids  # the next token's previous routing
            n += len(ids)
        self.tok.experts_routed += n
        self.tok.hits += n
        self.cache.counters.hits += n
        self.tok.mgmt_s += time.perf_counter() - t0
