"""What a trace holds and how big its experts are: the report's header and the default
ladder of cache budgets."""

from __future__ import annotations

from dataclasses import dataclass

from abbench.analysis.replay.units import MIB
from abbench.records.route_trace import RouteTrace


def token_cycle_bytes(trace: RouteTrace) -> int:
    """Expert bytes one token routes through all layers: k × Σ expert_bytes."""
    return trace.n_expert_used * sum(trace.expert_bytes)


def all_experts_bytes(trace: RouteTrace) -> int:
    return trace.n_expert * sum(trace.expert_bytes)


def recorded_budget_mib(trace: RouteTrace) -> float | None:
    """The run's own cache budget, where the trace's preamble states it."""
    return trace.cache_budget_mib


def default_budgets(trace: RouteTrace) -> list[float]:
    """The trace's own budget (if stated) plus a doubling ladder of round sizes,
    125 × 2^n MiB, from below half a token's cycle to the first size that holds every
    expert (where only first-touch misses remain)."""
    half_cycle = token_cycle_bytes(trace) / 2 / MIB
    everything = all_experts_bytes(trace) / MIB
    rung = 125.0
    while rung > half_cycle:
        rung /= 2
    while rung * 2 <= half_cycle:
        rung *= 2
    ladder = [rung]
    while ladder[-1] < everything:
        ladder.append(ladder[-1] * 2)
    own = recorded_budget_mib(trace)
    return sorted(set(ladder) | ({own} if own else set()))


@dataclass(frozen=True)
class TraceShape:
    """What the trace holds, for the report's header."""

    turns: int
    prefill_tokens: int
    decode_tokens: int
    prefill_rows: int
    decode_rows: int
    dropped_rows: int
    token_cycle_bytes: int
    all_experts_bytes: int


def shape(trace: RouteTrace) -> TraceShape:
    def tokens(phase: int) -> int:
        rows = trace.phase == phase
        return len(set(zip(trace.turn[rows].tolist(), trace.step[rows].tolist())))
    return TraceShape(
        turns=len(set(trace.turn.tolist())), prefill_tokens=tokens(0), decode_tokens=tokens(1),
        prefill_rows=int((trace.phase == 0).sum()), decode_rows=int((trace.phase == 1).sum()),
        dropped_rows=int(trace.dropped.sum()), token_cycle_bytes=token_cycle_bytes(trace),
        all_experts_bytes=all_experts_bytes(trace),
    )
