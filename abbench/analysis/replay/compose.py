"""The whole replay: every offline answer on one trace, composed into one result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from abbench.analysis.replay.batches import Lookups, lookups
from abbench.analysis.replay.cache import POLICIES, CacheResult, recorded, replay_cache
from abbench.analysis.replay.drop import DROP_FACTORS, DropTrade, drop_trade
from abbench.analysis.replay.prediction import PredictorScore, predictors
from abbench.analysis.replay.sizes import TraceShape, default_budgets, shape
from abbench.records.route_trace import RouteTrace


@dataclass(frozen=True, eq=False)
class Replay:
    """Everything `abbench replay` answers about one trace."""

    trace: RouteTrace
    shape: TraceShape
    lookups: Lookups
    recorded: CacheResult
    budgets_mib: tuple[float, ...]
    cache: tuple[CacheResult, ...]      # budgets × POLICIES, budget-major
    predictors: tuple[PredictorScore, ...]
    drops: tuple[DropTrade, ...]

    def at(self, budget_mib: float, policy: str) -> CacheResult:
        for r in self.cache:
            if r.budget_mib == budget_mib and r.policy == policy:
                return r
        raise KeyError((budget_mib, policy))

    def predictor(self, name: str, lag: int | None = None) -> PredictorScore:
        for p in self.predictors:
            if p.name == name and p.lag == lag:
                return p
        raise KeyError((name, lag))

    def drop(self, factor: float) -> DropTrade:
        for d in self.drops:
            if d.factor == factor:
                return d
        raise KeyError(factor)


def replay(trace: RouteTrace, budgets_mib: Sequence[float] | None = None,
           factors: Sequence[float] = DROP_FACTORS) -> Replay:
    """Run every offline answer on `trace`; `budgets_mib` defaults to `default_budgets`."""
    budgets = tuple(sorted(set(budgets_mib))) if budgets_mib else tuple(default_budgets(trace))
    lk = lookups(trace)
    return Replay(
        trace=trace, shape=shape(trace), lookups=lk, recorded=recorded(lk), budgets_mib=budgets,
        cache=tuple(replay_cache(lk, m, p) for m in budgets for p in POLICIES),
        predictors=tuple(predictors(trace)),
        drops=tuple(drop_trade(trace, sorted(set(factors)))),
    )
