"""Routing predictors: the stale-gate under test, the previous-token incumbent, the control.

*stale-gate*: while layer l runs, layer l's router input times layer l+1's router matrix;
its top-k is a guess at what layer l+1 will select, a full layer early.
*prev-token*: what the same layer routed for the previous token (the bet `--prefetch` makes).
*ctrl*: the stale-gate arithmetic without the staleness — layer l's own matrix on layer l's
own input, computed here (not copied from the engine's routing). It must read 100.0%;
anything less is this probe being wrong, not routing being hard.

Scored in decode only, on slot overlap (share of a routing's k slots the predictor named)
and whole routings predicted exactly, per layer and overall, with denominators. Layer 0
has no stale-gate (no previous layer); the first decode token has no previous token; a
predictor with no routings at a layer prints `-`, never `0.0`. Routings wider than 32
experts are declined and counted. Nothing here reaches the loading path: a probed run reads
exactly the bytes an unprobed one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_SCORED_K = 32


@dataclass
class Score:
    slots_named: int = 0
    slots: int = 0
    exact: int = 0
    routings: int = 0

    def add(self, predicted: set[int], actual: set[int]) -> None:
        self.slots_named += len(predicted & actual)
        self.slots += len(actual)
        self.exact += predicted == actual
        self.routings += 1

    def __iadd__(self, other: Score) -> Score:
        self.slots_named += other.slots_named
        self.slots += other.slots
        self.exact += other.exact
        self.routings += other.routings
        return self

    @property
    def slot_pct(self) -> float | None:
        return 100.0 * self.slots_named / self.slots if self.slots else None

    @property
    def exact_pct(self) -> float | None:
        return 100.0 * self.exact / self.routings if self.routings else None

    def to_dict(self) -> dict[str, Any]:
        return {"slot_pct": self.slot_pct, "exact_pct": self.exact_pct,
                "slots_named": self.slots_named, "slots": self.slots,
                "exact": self.exact, "routings": self.routings}


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """The k largest, highest first; ties go to the lower index (the engine's rule)."""
    return np.argsort(-logits, kind="stable")[:k]


@dataclass
class PredictLog:
    stale: list[Score]
    prev: list[Score]
    ctrl: list[Score]
    declined: int = 0

    @classmethod
    def empty(cls, n_layer: int) -> PredictLog:
        return cls([Score() for _ in range(n_layer)], [Score() for _ in range(n_layer)],
                   [Score() for _ in range(n_layer)])

    def overall(self, which: list[Score]) -> Score:
        total = Score()
        for s in which:
            total += s
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "stale_gate": self.overall(self.stale).to_dict(),
            "prev_token": self.overall(self.prev).to_dict(),
            "control": self.overall(self.ctrl).to_dict(),
            "declined": self.declined,
            "per_layer": [
                {"layer": i, "stale_gate": s.to_dict(), "prev_token": p.to_dict(),
                 "control": c.to_dict()}
                for i, (s, p, c) in enumerate(zip(self.stale, self.prev, self.ctrl))
            ],
        }


@dataclass
class RoutePredictor:
    """Called with every layer's router input and routing (the model's routing hook)."""

    routers: list[np.ndarray]  # per layer (n_expert, d)
    log: bool  # score all three predictors (--predict-log)
    predict: bool  # keep stale-gate predictions for the speculative path (--predict-prefetch)
    weights: bool = True  # the speculative path needs predicted weights (ordering, drop)
    scores: PredictLog = field(init=False)
    # The stale-gate prediction for layer l (made at layer l-1 of the same token), with its
    # predicted weights (softmax over the predicted top-k logits), highest first.
    pred_ids: list[np.ndarray | None] = field(init=False)
    pred_weights: list[np.ndarray | None] = field(init=False)
    _prev: list[set[int] | None] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.routers)
        self.scores = PredictLog.empty(n)
        self.pred_ids = [None] * n
        self.pred_weights = [None] * n
        self._prev = [None] * n

    def __call__(
        self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int,
        next_logits: np.ndarray | None = None,
    ) -> None:
        if phase != 1:
            return
        k = len(ids)
        stale_logits = next_logits  # (n_expert,): from the router's fused GEMV, else here
        if stale_logits is None and layer + 1 < len(self.routers):
            stale_logits = self.routers[layer + 1] @ x
        if self.log:
            actual = set(ids.tolist())
            if k > MAX_SCORED_K:
                self.scores.declined += 1
            else:
                ctrl = top_k(self.routers[layer] @ x, k)  # its own GEMV, its own ranking
                self.scores.ctrl[layer].add(set(ctrl.tolist()), actual)
                predicted = self.pred_ids[layer]
                if predicted is not None:
                    self.scores.stale[layer].add(set(predicted.tolist()), actual)
                if self._prev[layer] is not None:
                    self.scores.prev[layer].add(self._prev[layer], actual)  # type: ignore[arg-type]
            self._prev[layer] = actual
        if stale_logits is not None:
            pred = top_k(stale_logits, k)
            self.pred_ids[layer + 1] = pred
            if self.weights:
                w = np.exp(stale_logits[pred] - stale_logits[pred[0]])
                self.pred_weights[layer + 1] = w / w.sum()


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def predict_lines(log: PredictLog) -> list[str]:
    """The two `moe-predict:` lines and the per-layer table (seed format)."""
    s, p, c = log.overall(log.stale), log.overall(log.prev), log.overall(log.ctrl)
    lines = [
        f"moe-predict: stale-gate {fmt_pct(s.slot_pct)} of routed slots "
        f"({fmt_pct(s.exact_pct)} whole routings) | prev-token {fmt_pct(p.slot_pct)} "
        f"({fmt_pct(p.exact_pct)}) | fresh-gate control {fmt_pct(c.slot_pct)} "
        f"({fmt_pct(c.exact_pct)})",
        f"moe-predict: scored — stale-gate {s.routings} routings/{s.slots} slots, "
        f"prev-token {p.routings}/{p.slots}, control {c.routings}/{c.slots}; "
        f"{log.declined} routings the stale-gate could not rank",
        f"{'layer':>5} {'stale':>7} {'prev':>7} {'ctrl':>7} {'routings':>9}",
    ]
    for i, (ls, lp, lc) in enumerate(zip(log.stale, log.prev, log.ctrl)):
        routings = max(ls.routings, lp.routings, lc.routings)
        lines.append(f"{i:>5} {fmt_pct(ls.slot_pct):>7} {fmt_pct(lp.slot_pct):>7} "
                     f"{fmt_pct(lc.slot_pct):>7} {routings:>9}")
    return lines


def control_warning(log: PredictLog) -> str | None:
    c = log.overall(log.ctrl)
    if c.slots and c.slots_named != c.slots:
        return (f"the fresh-gate control reads {fmt_pct(c.slot_pct)}, not 100.0%: the probe "
                "disagrees with the engine's routing, so the stale-gate figure is suspect")
    return None


def predict_lines_from_dict(d: dict[str, Any]) -> list[str]:
    """`predict_lines` of a `PredictLog.to_dict()` (what a run's JSON carries)."""

    def score(x: dict[str, Any]) -> Score:
        return Score(x["slots_named"], x["slots"], x["exact"], x["routings"])

    layers = d["per_layer"]
    log = PredictLog([score(r["stale_gate"]) for r in layers],
                     [score(r["prev_token"]) for r in layers],
                     [score(r["control"]) for r in layers], d["declined"])
    return predict_lines(log)
