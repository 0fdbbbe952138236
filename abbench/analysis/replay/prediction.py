"""Decode predictor accuracies: the share of a routing's top-k slots that a predictor named,
the predictor naming k experts per layer.

Every predictor is scored on the same routings (decode tokens after each turn's first, which
has no previous token to go on) except prev-token at lag d, which needs d earlier decode
tokens of the same turn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from abbench.analysis.replay.units import percent
from abbench.records.route_trace import RouteTrace

LAGS = (1, 2, 4, 8)

Routing = dict[int, frozenset[int]]     # layer → the experts one token routed there


@dataclass(frozen=True)
class PredictorScore:
    """Slots named over slots routed, on the routings the predictor could be scored on."""

    name: str                    # prev_token | run_hottest | prompt_hottest | random
    lag: int | None              # prev_token only
    named: int | None            # routed slots the predictor had named
    slots: int | None            # routed slots scored (the denominator)
    routings: int | None         # (token, layer) routings scored
    tie_layers: int | None = None  # static predictors: layers whose k-th place is tied
    tie_span: tuple[float, float] | None = None  # pct under the worst and best tie order
    analytic_pct: float | None = None  # random: k / n_expert

    @property
    def pct(self) -> float | None:
        if self.analytic_pct is not None:
            return self.analytic_pct
        if self.named is None or self.slots is None:
            return None
        return percent(self.named, self.slots)


def _routings(trace: RouteTrace, phase: int) -> dict[int, list[Routing]]:
    """Per turn, one routing per token of `phase`, in run order."""
    rows = np.flatnonzero(trace.phase == phase)
    tokens: dict[tuple[int, int], dict[int, set[int]]] = {}
    for t, s, la, e in zip(*(a[rows].tolist() for a in
                             (trace.turn, trace.step, trace.layer, trace.expert))):
        tokens.setdefault((t, s), {}).setdefault(la, set()).add(e)
    out: dict[int, list[Routing]] = {}
    for (t, _), layers in tokens.items():
        out.setdefault(t, []).append({la: frozenset(es) for la, es in layers.items()})
    return out


def _counts(routings: Iterable[Routing]) -> dict[int, Counter[int]]:
    """Per layer, how many of `routings` routed each expert."""
    counts: dict[int, Counter[int]] = {}
    for routing in routings:
        for la, es in routing.items():
            counts.setdefault(la, Counter()).update(es)
    return counts


def _top_k(counts: dict[int, Counter[int]], k: int,
           tie: Callable[[int, int], float]) -> dict[int, frozenset[int]]:
    """Per layer, the k most counted experts, ties ordered by `tie(layer, expert)`."""
    return {la: frozenset(sorted(c, key=lambda e: (-c[e], tie(la, e)))[:k])
            for la, c in counts.items()}


def _tied_layers(counts: dict[int, Counter[int]], k: int) -> int:
    """Layers whose k-th and (k+1)-th most counted experts tie: their top-k set depends on
    the tie rule."""
    ties = 0
    for c in counts.values():
        ranked = sorted(c.values(), reverse=True)
        ties += len(ranked) > k and ranked[k - 1] == ranked[k]
    return ties


def _prev_token(decode: dict[int, list[Routing]], lag: int) -> PredictorScore:
    """The same layer's routing `lag` decode tokens earlier in the turn."""
    named = slots = count = 0
    for tokens in decode.values():
        for i in range(lag, len(tokens)):
            before = tokens[i - lag]
            for la, actual in tokens[i].items():
                named += len(actual & before.get(la, frozenset()))
                slots += len(actual)
                count += 1
    return PredictorScore("prev_token", lag, named, slots, count)


@dataclass(frozen=True, eq=False)
class _Scored:
    """The routings the static predictors are scored on, their totals, and what they
    routed per layer (to bound the tie rule)."""

    routings: list[Routing]
    slots: int
    count: int
    truth: dict[int, Counter[int]]

    @classmethod
    def of(cls, routings: list[Routing]) -> _Scored:
        return cls(routings, slots=sum(len(es) for r in routings for es in r.values()),
                   count=sum(len(r) for r in routings), truth=_counts(routings))

    def named(self, hot: dict[int, frozenset[int]]) -> int:
        return sum(len(es & hot.get(la, frozenset()))
                   for r in self.routings for la, es in r.items())


def _static(name: str, counts: dict[int, Counter[int]], on: _Scored, k: int) -> PredictorScore:
    """The k hottest per layer, ties to the lowest expert id; where ties decide, the span
    of scores over every tie order (worst and best) goes with it."""
    named = on.named(_top_k(counts, k, lambda la, e: e))
    ties = _tied_layers(counts, k)
    span = None
    if ties and on.slots:
        worst = on.named(_top_k(counts, k, lambda la, e: on.truth.get(la, Counter())[e]))
        best = on.named(_top_k(counts, k, lambda la, e: -on.truth.get(la, Counter())[e]))
        span = (100.0 * worst / on.slots, 100.0 * best / on.slots)
    return PredictorScore(name, None, named, on.slots, on.count, tie_layers=ties, tie_span=span)


def predictors(trace: RouteTrace, lags: Sequence[int] = LAGS) -> list[PredictorScore]:
    """Decode-phase predictor accuracy: prev-token at each lag, the run's and the prompt's
    hottest-k, and random (k / n_expert, analytic)."""
    k = trace.n_expert_used
    decode = _routings(trace, 1)
    on = _Scored.of([r for tokens in decode.values() for r in tokens[1:]])
    prompt = [r for tokens in _routings(trace, 0).values() for r in tokens]
    scores = [_prev_token(decode, lag) for lag in lags]
    scores.append(_static("run_hottest", _counts(r for tokens in decode.values()
                                                 for r in tokens), on, k))
    scores.append(_static("prompt_hottest", _counts(prompt), on, k) if prompt else
                  PredictorScore("prompt_hottest", None, None, on.slots, on.count))
    scores.append(PredictorScore("random", None, None, None, None,
                                 analytic_pct=100.0 * k / trace.n_expert))
    return scores
