"""Routing predictors: the stale-gate under test, the previous-token incumbent, the control.

*stale-gate*: while layer l runs, layer l's router input times layer l+1's router matrix
(plus its bias, where the architecture's router has one: `Model.router_bias`); its top-k
is a guess at what layer l+1 will select, a full layer early.
*prev-token*: what the same layer routed for the previous token (the bet `--prefetch` makes).
*ctrl*: the stale-gate arithmetic without the staleness — layer l's own matrix (and bias)
on layer l's own input, computed here (not copied from the engine's routing). It must read 100.0%;
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


STALE, PREV, CTRL = range(3)  # the predictors, in `PredictLog`'s order


class RouteTally:
    """The three predictors' scores per layer, compared in batches.

    Each scored decode routing becomes a row as it happens: its layer, its ids, the
    stale-gate's prediction for it, and the control's own logits (its GEMV runs then, while
    its matrix is still in cache). Every ROWS rows, and before the scores are read, the
    rows are compared in one set of numpy calls — `Score.add`'s set logic, vectorised
    (routings are distinct experts, so a predictor's slots named are the equal pairs
    between its k ids and the routing's). A decode step then pays for recording, not for
    the comparisons: that is what P3 measures (docs/benches.md#the-bars).
    """

    ROWS = 1024  # 64 tokens of a 16-layer model

    def __init__(self, n_layer: int, n_expert: int) -> None:
        self.n_layer = n_layer
        self.declined = 0
        # [slots named, slots, exact, routings] × predictor × layer
        self.counts = np.zeros((4, 3, n_layer), np.int64)
        self.ctrl_logits = np.zeros((self.ROWS, n_expert), np.float32)  # (ROWS, n_expert)
        self._layer = np.zeros(self.ROWS, np.int64)
        self._rows = 0
        self._shape(0)

    def _shape(self, k: int) -> None:
        self._k = k
        self._actual = np.zeros((self.ROWS, k), np.int64)  # (ROWS, k)
        self._stale = np.zeros((self.ROWS, k), np.int64)
        self._stale_ok = np.zeros(self.ROWS, bool)
        self._last = np.zeros((self.n_layer, k), np.int64)  # each layer's previous routing
        self._last_ok = np.zeros(self.n_layer, bool)

    def row(self, layer: int, ids: np.ndarray, stale: np.ndarray | None) -> int:
        """Record layer `layer`'s routing ids (k,) and the stale-gate's prediction for it
        (k,) or None; the row whose `ctrl_logits` the caller fills."""
        if self._rows == self.ROWS or len(ids) != self._k:
            self.flush()
            if len(ids) != self._k:
                self._shape(len(ids))
        i = self._rows
        self._rows = i + 1
        self._layer[i] = layer
        self._actual[i] = ids
        if stale is None:
            self._stale_ok[i] = False
        else:
            self._stale[i] = stale
            self._stale_ok[i] = True
        return i

    def flush(self) -> None:
        n, k = self._rows, self._k
        if n == 0:
            return
        layer, actual = self._layer[:n], self._actual[:n]  # (n,), (n, k)
        # The previous routing at the same layer: the row before in the same layer, or
        # the last one of the previous batch.
        prev = np.empty((n, k), np.int64)
        prev_ok = np.zeros(n, bool)
        for la in np.unique(layer).tolist():
            at = np.flatnonzero(layer == la)
            prev[at[1:]], prev_ok[at[1:]] = actual[at[:-1]], True
            prev[at[0]], prev_ok[at[0]] = self._last[la], self._last_ok[la]
            self._last[la], self._last_ok[la] = actual[at[-1]], True
        ctrl = np.argsort(-self.ctrl_logits[:n], axis=1, kind="stable")[:, :k]  # (n, k)
        named = np.stack([self._stale[:n], prev, ctrl])  # (3, n, k)
        ok = np.stack([self._stale_ok[:n], prev_ok, np.ones(n, bool)])  # (3, n)
        hits = (named[:, :, :, None] == actual[None, :, None, :]).sum(axis=(2, 3))  # (3, n)
        for f, value in enumerate((hits * ok, k * ok, (hits == k) & ok, ok)):
            for p in range(3):
                self.counts[f, p] += np.bincount(layer, weights=value[p],
                                                 minlength=self.n_layer).astype(np.int64)
        self._rows = 0

    def log(self) -> PredictLog:
        self.flush()
        c = self.counts.tolist()
        which = [[Score(*(int(c[f][p][i]) for f in range(4))) for i in range(self.n_layer)]
                 for p in range(3)]
        return PredictLog(which[STALE], which[PREV], which[CTRL], self.declined)


@dataclass
class RoutePredictor:
    """Called with every layer's router input and routing (the model's routing hook)."""

    routers: list[np.ndarray]  # per layer (n_expert, d)
    log: bool  # score all three predictors (--predict-log)
    predict: bool  # keep stale-gate predictions for the speculative path (--predict-prefetch)
    weights: bool = True  # the speculative path needs predicted weights (ordering, drop)
    # per layer (n_expert,), added to the router's logits before they are ranked, or None
    # (an architecture whose router has no bias: qwen3moe); None: no layer has one
    biases: list[np.ndarray | None] | None = None
    # The stale-gate prediction for layer l (made at layer l-1 of the same token), with its
    # predicted weights (softmax over the predicted top-k logits), highest first.
    pred_ids: list[np.ndarray | None] = field(init=False)
    pred_weights: list[np.ndarray | None] = field(init=False)
    _tally: RouteTally = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.routers)
        if self.biases is None:
            self.biases = [None] * n
        if len(self.biases) != n:
            raise ValueError(f"{len(self.biases)} router biases for {n} routers")
        self.pred_ids = [None] * n
        self.pred_weights = [None] * n
        self._tally = RouteTally(n, self.routers[0].shape[0] if n else 0)

    @property
    def scores(self) -> PredictLog:
        return self._tally.log()

    def __call__(
        self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int,
        next_ids: np.ndarray | None = None, next_logits: np.ndarray | None = None,
    ) -> None:
        if phase != 1:
            return
        k = len(ids)
        nxt = layer + 1
        biases = self.biases
        assert biases is not None  # set in __post_init__
        if next_ids is None and nxt < len(self.routers):  # not fused: the GEMV here
            next_logits = self.routers[nxt] @ x  # (n_expert,)
            if (b := biases[nxt]) is not None:
                next_logits += b  # W x + b, one rounding each, as the router adds it
            next_ids = top_k(next_logits, k)  # (k,)
        if self.log:
            tally = self._tally
            if k > MAX_SCORED_K:
                tally.declined += 1
            else:  # the control: its own GEMV, its own ranking (at the tally's flush)
                i = tally.row(layer, ids, self.pred_ids[layer])
                np.matmul(self.routers[layer], x, out=tally.ctrl_logits[i])
                if (b := biases[layer]) is not None:
                    tally.ctrl_logits[i] += b
        if next_ids is not None:
            self.pred_ids[nxt] = next_ids
            if self.weights:
                assert next_logits is not None
                top = next_logits[next_ids]  # (k,) the predicted logits, highest first
                w = np.exp(top - top[0])
                self.pred_weights[nxt] = w / w.sum()


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
