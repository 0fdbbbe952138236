"""What a graph model's one graph a pass (a decode token, a prefill batch) asks of the
expert side: whether this pass may run its experts inside that graph, where a layer's
experts sit in the complete cache (the stack `mul_mat_id` indexes by expert id), and the
counts of a pass whose experts ran there (`arch/shared/token_graph.py`: `TokenGraph`,
`ExpertNodes`).

Queries of an `ExpertRunner`'s state, answered here rather than by the runner so that it
stays a decode layer's steps; they change nothing but the counters of a pass counted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.streaming.slots import SlotPool

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner


def in_graph(runner: ExpertRunner, phase: int) -> bool:
    """Whether this pass's experts may run inside the model's one graph for the pass (as
    llama.cpp's do): every expert resident on the ggml team and nothing acting between a
    layer's router and its experts — no drop policy in force in the pass's phase (0
    prefill, 1 decode), no speculation (a decode pass's), route trace or reads in
    flight. The model counts the pass with `count_in_graph` (decode) or
    `count_batch_in_graph` (prefill)."""
    pol, spec = runner.policies, runner.spec
    return (runner.direct is not None and isinstance(runner.team, QuantTeam)
            and pol.drop_frac_in(phase) is None and not (phase == 1 and pol.speculates)
            and runner.trace is None and not spec.pending and spec.retain_at is None)


def layer_stack(runner: ExpertRunner, layer: int) -> tuple[SlotPool, int] | None:
    """A complete cache's slot pool and first slot of `layer`'s experts, where expert e
    sits in slot first + e (as the runner's preload places them): the stack a graph's
    `mul_mat_id` takes the router's expert ids into. None: not so placed."""
    if runner.direct is None:
        return None
    bufs = runner.direct[1][layer]
    pool, first = bufs[0].kind, bufs[0].index  # type: ignore[attr-defined]
    if not isinstance(pool, SlotPool) or any(
            b.kind is not pool or b.index != first + e  # type: ignore[attr-defined]
            for e, b in enumerate(bufs)):
        return None
    return pool, first


def count_in_graph(runner: ExpertRunner, routed: Sequence[list[int]]) -> None:
    """What `run_routed`'s short way counts for each layer, for a pass whose experts ran
    in the model's graph (`routed`: each layer's expert ids, routing order)."""
    t0 = time.perf_counter()
    n = 0
    routing = runner.spec.routing
    for layer, ids in enumerate(routed):
        routing[layer] = ids  # the next token's previous routing
        n += len(ids)
    tok = runner.tok
    tok.experts_routed += n
    tok.hits += n
    runner.cache.counters.hits += n
    tok.mgmt_s += time.perf_counter() - t0


def count_batch_in_graph(runner: ExpertRunner, tops: Sequence[np.ndarray]) -> None:
    """What a prefill pass's lookups count (`prefill.py`: every token's experts routed,
    one lookup — a hit — per expert of a layer's union), for a pass whose experts ran in
    the model's graph (`tops`: each layer's top k ids (t, k))."""
    t0 = time.perf_counter()
    routed = looked_up = 0
    for top in tops:
        routed += top.size
        looked_up += len(np.unique(top))
    tok = runner.tok
    tok.experts_routed += routed
    tok.hits += looked_up
    runner.cache.counters.hits += looked_up
    tok.mgmt_s += time.perf_counter() - t0
