"""The expert-side policies as plain decisions, all off by default
(docs/engine.md#policies-all-off-by-default-each-prints-its-own-summary-line).

*Dropping* (`--drop-cold-experts F`): a routed expert that is not resident and weighs less
than F/k is skipped unread — never the routing's top expert — and the survivors carry the
routing's whole mass again unless `--drop-no-renorm`.
*Prefetch* (`--prefetch K`): after a layer's own reads, read what the previous token routed
at the next K layers.
*Stale-gate prefetch* (`--predict-prefetch`): read the predicted top experts of the next
layer that are missing, at most `--predict-spec-max` of them and none that dropping would
skip; predicted experts already resident are refreshed in the LRU instead (retention).

Each function takes what it decides on (weights, residency, predictions) and returns the
decision; the `ExpertRunner` asks the cache and applies it, so the rules are testable
without a model, a cache or a reader.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from abbench.engine.config import EngineConfig

Key = tuple[int, int]  # (layer, expert)


@dataclass(frozen=True)
class Policies:
    """The expert-side policies of a run; all off by default."""

    drop_frac: float | None = None
    drop_in_prefill: bool = False
    drop_renorm: bool = True
    prefetch: int = 0
    prefetch_sync: bool = False
    predict_prefetch: bool = False
    spec_max: int = 2

    @classmethod
    def of(cls, config: EngineConfig) -> Policies:
        """The policies an engine configuration asks for (the config is the one
        declaration; this is its expert-side view)."""
        return cls(drop_frac=config.drop_cold_experts, drop_in_prefill=config.drop_in_prefill,
                   drop_renorm=not config.drop_no_renorm, prefetch=config.prefetch,
                   prefetch_sync=config.prefetch_sync,
                   predict_prefetch=config.predict_prefetch, spec_max=config.predict_spec_max)

    def drop_frac_in(self, phase: int) -> float | None:
        """The drop fraction F in force in a pass of `phase` (0 prefill, 1 decode); None
        where nothing is dropped (decode only, unless --drop-in-prefill)."""
        return self.drop_frac if phase == 1 or self.drop_in_prefill else None

    @property
    def speculates(self) -> bool:
        """Whether a speculation policy is armed (`--prefetch` or `--predict-prefetch`)."""
        return bool(self.prefetch or self.predict_prefetch)

    @property
    def reads_nothing(self) -> bool:
        """Whether speculation only retains (`--predict-prefetch --predict-spec-max 0`):
        over a complete cache it then just counts its predictions."""
        return not self.prefetch and self.spec_max == 0


# -- dropping ------------------------------------------------------------------------------


def cold_keep(weights: np.ndarray, resident: Sequence[bool], frac: float) -> list[bool]:
    """Per routed slot, whether `--drop-cold-experts frac` keeps it: the top-weighted slot,
    any slot weighing at least frac/k, and any slot whose expert is resident (a hit costs
    nothing to keep). weights: (k,) routing order; resident: (k,) flags."""
    threshold = frac / len(weights)
    top = int(np.argmax(weights))
    return [bool(j == top or weights[j] >= threshold or resident[j])
            for j in range(len(weights))]


def kept_weights(weights: np.ndarray, keep: Sequence[bool], renorm: bool) -> np.ndarray:
    """The surviving slots' weights (k,) → (k',), scaled back to the routing's total mass
    when `renorm` (what the router gave the dropped experts goes to the survivors)."""
    kept = weights[np.array(keep)]  # (k',)
    if renorm:
        kept = kept * (weights.sum() / kept.sum())
    return kept.astype(np.float32)


# -- speculation ---------------------------------------------------------------------------


class Speculation(NamedTuple):
    """What a speculation policy asks for after one layer's own reads. (A tuple, not a
    frozen dataclass: one is made per layer per token, on the path P4 measures.)"""

    read: list[Key]  # to read speculatively, in issue order
    retain: list[Key]  # resident: refresh in the LRU (free; never a read)


def prev_token_prefetch(layer: int, prev_routing: Sequence[Sequence[int]],
                        depth: int) -> Speculation:
    """`--prefetch depth` after `layer`: the previous token's routing at layers
    layer+1 .. layer+depth (as far as the model goes), layer by layer, in routing order."""
    first = layer + 1
    return Speculation([(first + i, e) for i, routed in
                        enumerate(prev_routing[first : first + depth]) for e in routed], [])


def stale_gate_prefetch(layer: int, pred_ids: np.ndarray, pred_weights: np.ndarray | None,
                        resident: Container[Key], spec_max: int,
                        drop_frac: float | None) -> Speculation:
    """`--predict-prefetch` for `layer` given its stale-gate prediction (made one layer
    early), highest predicted weight first. pred_ids: (k,); pred_weights: (k,) or None.

    A resident prediction is retained whatever the cap. Missing ones are read, at most
    `spec_max`, except — when dropping is armed — one below drop_frac/k that is not the top
    prediction: dropping would skip it unread, so reading it is the waste.
    """
    keys = [(layer, e) for e in pred_ids.tolist()]
    if spec_max == 0:  # retention only (the P4 setting): no read to weigh (the runner
        # applies this answer at the next layer's lookups: `Speculator.speculate`)
        return Speculation([], [key for key in keys if key in resident])
    read: list[Key] = []
    retain: list[Key] = []
    budget = spec_max
    threshold = drop_frac / len(pred_ids) if drop_frac is not None else 0.0
    for j, key in enumerate(keys):
        if key in resident:
            retain.append(key)
            continue
        if budget == 0:
            continue
        if j > 0 and pred_weights is not None and pred_weights[j] < threshold:
            continue
        read.append(key)
        budget -= 1
    return Speculation(read, retain)
