"""Offline answers from a route trace (docs/replay.md): cache policies, predictors, drop trade.

Pure functions: a `RouteTrace` in, immutable results out. The definitions are the ones the
engine's authors used for their published figures (reference/bmoe/README.md):

- Cache accounting (`batches`, `cache`): one lookup per *unique* expert per layer batch
  (duplicates in a batch only refresh recency); a miss costs that layer's `expert_bytes`;
  eviction happens after the batch and never evicts an entry the batch touched. A batch is a
  run of consecutive rows with the same turn, phase and layer and, in decode, the same step:
  a decode token meets each layer once, a prefill pass meets each layer once with all its
  prompt tokens. Prefill and decode are replayed together, one cache, from cold.
- Predictors (`prediction`, decode): share of a routing's top-k slots that a predictor
  named, the predictor naming k experts per layer.
- Drop trade (`drop`, decode): a routed expert is dropped when the run recorded it as a
  miss, it is not its routing's top-weighted expert, and its weight is below F / k.

`sizes` holds the trace's shape and the default budget ladder, `units` the MiB and
percentages they share, `compose` the `replay()` that runs them all.
"""

from abbench.analysis.replay.batches import NEVER, Lookups, lookups
from abbench.analysis.replay.cache import POLICIES, CacheResult, recorded, replay_cache
from abbench.analysis.replay.compose import Replay, replay
from abbench.analysis.replay.drop import DROP_FACTORS, DropTrade, drop_trade
from abbench.analysis.replay.prediction import LAGS, PredictorScore, Routing, predictors
from abbench.analysis.replay.sizes import (
    TraceShape,
    all_experts_bytes,
    default_budgets,
    recorded_budget_mib,
    shape,
    token_cycle_bytes,
)
from abbench.analysis.replay.units import MIB

__all__ = [
    "DROP_FACTORS", "LAGS", "MIB", "NEVER", "POLICIES", "CacheResult", "DropTrade", "Lookups",
    "PredictorScore", "Replay", "Routing", "TraceShape", "all_experts_bytes", "default_budgets",
    "drop_trade", "lookups", "predictors", "recorded", "recorded_budget_mib", "replay",
    "replay_cache", "shape", "token_cycle_bytes",
]
