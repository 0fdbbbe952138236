"""The routing predictors (`--predict-log`, seed/expert-prediction.md): the stale-gate
arithmetic by hand, the control at 100.0%, what is left unscored and how it prints.

Unit tests drive `RoutePredictor` with small random routers; the engine tests read
`result.extra["predict"]` of real runs of `tiny` and `small`, and a slow test runs the real
CLI on `default`, where the stale-gate must clearly beat the previous-token predictor and
the first layers must be less predictable than the last (the shape the seed measured).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from abbench.engine.arch.shared.plain_graph import PlainGraphModel
from abbench.engine.config import EngineConfig
from abbench.engine.experts.predictor import (
    MAX_SCORED_K,
    PredictLog,
    RoutePredictor,
    RouteTally,
    Score,
    control_warning,
    predict_lines,
    predict_lines_from_dict,
    top_k,
)
from abbench.engine.run.session import Engine, RunResult

N_TOKENS = 12


def by_hand_top_k(logits: np.ndarray, k: int) -> list[int]:
    """Highest first, ties to the lower index — written without argsort."""
    return sorted(range(len(logits)), key=lambda e: (-float(logits[e]), e))[:k]


def routers(n_layer: int, n_expert: int, d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n_expert, d)).astype(np.float32) for _ in range(n_layer)]


def route(router: np.ndarray, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What the engine's router would select: ids (highest first) and renormalised weights."""
    logits = router @ x
    ids = np.array(by_hand_top_k(logits, k))
    w = np.exp(logits[ids] - logits[ids].max())
    return ids, (w / w.sum()).astype(np.float32)


# -- top_k ----------------------------------------------------------------------------------


def test_top_k_ties_go_to_the_lower_index() -> None:
    logits = np.array([1.0, 3.0, 3.0, 0.0, 3.0, 2.0], np.float32)
    assert top_k(logits, 2).tolist() == [1, 2]
    assert top_k(logits, 4).tolist() == [1, 2, 4, 5]
    assert top_k(np.zeros(5, np.float32), 3).tolist() == [0, 1, 2]
    rng = np.random.default_rng(3)
    for _ in range(50):
        x = rng.integers(0, 4, 12).astype(np.float32)  # many ties
        assert top_k(x, 5).tolist() == by_hand_top_k(x, 5)


# -- RoutePredictor by hand -------------------------------------------------------------------


def test_stale_gate_is_the_next_layers_router_on_this_layers_input() -> None:
    rs = routers(3, 6, 5)
    p = RoutePredictor(rs, log=True, predict=True)
    x0 = np.random.default_rng(1).standard_normal(5).astype(np.float32)
    p(0, x0, *route(rs[0], x0, 2), phase=1)
    expected = by_hand_top_k(rs[1] @ x0, 2)
    assert p.pred_ids[1] is not None and p.pred_ids[1].tolist() == expected
    assert expected != by_hand_top_k(rs[0] @ x0, 2), "pick a seed where the layers disagree"
    logits = (rs[1] @ x0)[expected]
    w = np.exp(logits - logits.max())
    assert p.pred_weights[1] is not None
    np.testing.assert_allclose(p.pred_weights[1], w / w.sum(), rtol=1e-6)
    assert p.pred_ids[0] is None, "layer 0 has no previous layer to predict it from"
    assert p.pred_ids[2] is None, "layer 2's prediction comes from layer 1's input"


def test_prefill_is_not_predicted_or_scored() -> None:
    rs = routers(2, 6, 5)
    p = RoutePredictor(rs, log=True, predict=True)
    x = np.ones(5, np.float32)
    p(0, x, *route(rs[0], x, 2), phase=0)
    assert p.pred_ids == [None, None]
    assert p.scores.overall(p.scores.ctrl).routings == 0


def test_scores_by_hand() -> None:
    """Two tokens through three layers: each predictor scored on exactly what it named."""
    rs = routers(3, 8, 6, seed=5)
    p = RoutePredictor(rs, log=True, predict=False)
    rng = np.random.default_rng(7)
    k = 3
    stale = [Score() for _ in range(3)]
    prev_score = [Score() for _ in range(3)]
    prev: list[set[int] | None] = [None, None, None]
    for _token in range(2):
        predicted: set[int] | None = None
        for layer in range(3):
            x = rng.standard_normal(6).astype(np.float32)
            ids, w = route(rs[layer], x, k)
            actual = set(ids.tolist())
            p(layer, x, ids, w, phase=1)
            if predicted is not None:
                stale[layer].add(predicted, actual)
            if prev[layer] is not None:
                prev_score[layer].add(prev[layer], actual)  # type: ignore[arg-type]
            prev[layer] = actual
            predicted = set(by_hand_top_k(rs[layer + 1] @ x, k)) if layer < 2 else None
    log = p.scores
    assert [s.to_dict() for s in log.stale] == [s.to_dict() for s in stale]
    assert [s.to_dict() for s in log.prev] == [s.to_dict() for s in prev_score]
    assert all(c.slots_named == c.slots == 2 * k and c.exact == 2 for c in log.ctrl)
    assert log.stale[0].routings == 0 and log.prev[0].routings == 1
    assert 0 < log.overall(log.stale).slots_named < log.overall(log.stale).slots, (
        "pick a seed where the stale-gate is partly right, or this checks little"
    )
    assert control_warning(log) is None


@pytest.mark.parametrize("rows", [5, 7, 1024])
def test_scores_in_batches_equal_scores_routing_by_routing(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tally compares its rows in batches (every `ROWS`, and when read): whatever the
    batch, including one that ends mid-token, the scores are those of `Score.add` called
    routing by routing, and reading them midway changes nothing."""
    monkeypatch.setattr(RouteTally, "ROWS", rows)
    n_layer, k = 3, 3
    rs = routers(n_layer, 8, 6, seed=11)
    p = RoutePredictor(rs, log=True, predict=False)
    rng = np.random.default_rng(12)
    want = PredictLog.empty(n_layer)
    prev: list[set[int] | None] = [None] * n_layer
    for token in range(9):
        predicted: set[int] | None = None
        for layer in range(n_layer):
            x = rng.standard_normal(6).astype(np.float32)
            ids, w = route(rs[layer], x, k)
            if token == 4 and layer == 1:  # a routing the control disagrees with
                ids = np.array([*ids[:2], next(e for e in range(8) if e not in ids)])
            actual = set(ids.tolist())
            p(layer, x, ids, w, phase=1)
            want.ctrl[layer].add(set(by_hand_top_k(rs[layer] @ x, k)), actual)
            if predicted is not None:
                want.stale[layer].add(predicted, actual)
            if prev[layer] is not None:
                want.prev[layer].add(prev[layer], actual)  # type: ignore[arg-type]
            prev[layer] = actual
            predicted = set(by_hand_top_k(rs[layer + 1] @ x, k)) if layer + 1 < n_layer else None
            if token == 2 and layer == 0:
                assert p.scores.ctrl[0].routings == 3  # read mid-token
    assert p.scores == want
    assert want.overall(want.ctrl).slots_named < want.overall(want.ctrl).slots


def test_control_is_computed_not_copied() -> None:
    """A routing that is not the top-k of the layer's own router makes the control miss."""
    rs = routers(2, 8, 4, seed=2)
    p = RoutePredictor(rs, log=True, predict=False)
    x = np.ones(4, np.float32)
    ids, w = route(rs[0], x, 2)
    wrong = np.array([int(ids[0]), next(e for e in range(8) if e not in ids)])
    p(0, x, wrong, w, phase=1)
    c = p.scores.ctrl[0]
    assert (c.slots_named, c.slots, c.exact) == (1, 2, 0)
    message = control_warning(p.scores)
    assert message is not None and "50.0%" in message and "not 100.0%" in message


def test_routings_wider_than_32_are_declined_and_counted() -> None:
    rs = routers(2, 40, 4)
    p = RoutePredictor(rs, log=True, predict=False)
    x = np.ones(4, np.float32)
    p(0, x, *route(rs[0], x, MAX_SCORED_K + 1), phase=1)
    p(1, x, *route(rs[1], x, MAX_SCORED_K + 1), phase=1)
    log = p.scores
    assert MAX_SCORED_K == 32
    assert log.declined == 2
    for which in (log.stale, log.prev, log.ctrl):
        assert log.overall(which).routings == 0
    assert "2 routings the stale-gate could not rank" in predict_lines(log)[1]
    p(0, x, *route(rs[0], x, MAX_SCORED_K), phase=1)  # 32 itself is scored
    log = p.scores  # a snapshot, read afresh
    assert log.declined == 2 and log.ctrl[0].routings == 1 and log.ctrl[0].slots == 32


# -- formatting and the warning ----------------------------------------------------------------


def test_predict_lines_print_dash_never_zero_for_nothing_scored() -> None:
    lines = predict_lines(PredictLog.empty(3))
    assert lines[0] == ("moe-predict: stale-gate - of routed slots (- whole routings) | "
                        "prev-token - (-) | fresh-gate control - (-)")
    assert "0.0" not in "\n".join(lines)
    assert lines[3].split() == ["0", "-", "-", "-", "0"]


def test_predict_lines_print_a_real_zero() -> None:
    log = PredictLog.empty(2)
    log.stale[1] = Score(slots_named=0, slots=4, exact=0, routings=2)
    log.ctrl[0] = Score(slots_named=4, slots=4, exact=2, routings=2)
    lines = predict_lines(log)
    assert "stale-gate 0.0% of routed slots (0.0% whole routings)" in lines[0]
    assert lines[3].split() == ["0", "-", "-", "100.0%", "2"]
    assert lines[4].split() == ["1", "0.0%", "-", "-", "2"]
    assert predict_lines_from_dict(log.to_dict()) == lines


def test_control_warning() -> None:
    perfect = PredictLog.empty(2)
    perfect.ctrl[0] = Score(8, 8, 4, 4)
    assert control_warning(perfect) is None
    assert control_warning(PredictLog.empty(2)) is None  # nothing scored: nothing to say
    missed = PredictLog.empty(2)
    missed.ctrl[0] = Score(8, 8, 4, 4)
    missed.ctrl[1] = Score(7, 8, 3, 4)
    message = control_warning(missed)
    assert message is not None and "93.8%" in message


# -- real runs ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["tiny", "small"])
def probed(request: pytest.FixtureRequest) -> RunResult:
    path: Path = request.getfixturevalue(f"{request.param}_model")
    cfg = EngineConfig(model=str(path), prompt="Predict me", n_tokens=N_TOKENS, seed=3,
                       cache_mib=1.0, predict_log=True)
    with Engine(cfg, path) as engine:
        return engine.run()


def test_control_reads_100_on_every_layer(probed: RunResult) -> None:
    layers = probed.extra["predict"]["per_layer"]
    assert len(layers) == probed.model["n_layer"]
    for row in layers:
        ctrl = row["control"]
        assert ctrl["slot_pct"] == 100.0 and ctrl["exact_pct"] == 100.0, row
    assert control_warning_of(probed) is None


def control_warning_of(r: RunResult) -> str | None:
    d = r.extra["predict"]
    layers = d["per_layer"]

    def score(x: dict[str, Any]) -> Score:
        return Score(x["slots_named"], x["slots"], x["exact"], x["routings"])

    log = PredictLog([score(x["stale_gate"]) for x in layers],
                     [score(x["prev_token"]) for x in layers],
                     [score(x["control"]) for x in layers], d["declined"])
    return control_warning(log)


def test_what_is_left_unscored(probed: RunResult) -> None:
    n = len(probed.decode)
    k = probed.model["n_expert_used"]
    assert n == N_TOKENS
    layers = probed.extra["predict"]["per_layer"]
    assert layers[0]["stale_gate"] == {"slot_pct": None, "exact_pct": None, "slots_named": 0,
                                       "slots": 0, "exact": 0, "routings": 0}
    for row in layers:
        assert row["control"]["routings"] == n and row["control"]["slots"] == n * k
        assert row["prev_token"]["routings"] == n - 1, "the first decode token has no previous"
        assert row["prev_token"]["slots"] == (n - 1) * k
    for row in layers[1:]:
        assert row["stale_gate"]["routings"] == n and row["stale_gate"]["slots"] == n * k
    assert probed.extra["predict"]["declined"] == 0


def test_lines_carry_the_per_layer_sums(probed: RunResult) -> None:
    d = probed.extra["predict"]
    lines = predict_lines_from_dict(d)
    m = re.fullmatch(
        r"moe-predict: scored — stale-gate (\d+) routings/(\d+) slots, prev-token (\d+)/(\d+), "
        r"control (\d+)/(\d+); (\d+) routings the stale-gate could not rank", lines[1])
    assert m, lines[1]
    sums = []
    for key in ("stale_gate", "prev_token", "control"):
        sums += [sum(r[key]["routings"] for r in d["per_layer"]),
                 sum(r[key]["slots"] for r in d["per_layer"])]
    assert [int(g) for g in m.groups()] == [*sums, d["declined"]]
    for key in ("stale_gate", "prev_token", "control"):
        assert d[key]["slots"] == sum(r[key]["slots"] for r in d["per_layer"])
        assert d[key]["slots_named"] == sum(r[key]["slots_named"] for r in d["per_layer"])
    table = lines[3:]
    assert len(table) == probed.model["n_layer"]
    assert table[0].split()[1] == "-", "layer 0 has no stale-gate: `-`, never 0.0"
    assert all(row.split()[3] == "100.0%" for row in table)


@pytest.mark.slow
def test_default_preset_shape() -> None:
    """On `default`, stale-gate clearly above prev-token, control at 100.0%, and the first
    layers less predictable than the last (docs/engine.md#the-predictor-report---predict-log)."""
    p = subprocess.run(
        [sys.executable, "-m", "abbench", "engine", "run", "-m", "synthetic:default",
         "-n", "128", "--cache-mib", "384", "--predict-log"],
        capture_output=True, text=True, timeout=1800,
    )
    assert p.returncode == 0, p.stderr
    assert "WARNING" not in p.stderr, p.stderr
    head = re.search(r"^moe-predict: stale-gate ([\d.]+)% of routed slots .* \| prev-token "
                     r"([\d.]+)% .* \| fresh-gate control ([\d.]+)% ", p.stdout, re.M)
    assert head, p.stdout
    stale, prev, ctrl = map(float, head.groups())
    assert ctrl == 100.0
    assert stale >= prev + 20, p.stdout
    rows = re.findall(r"^\s+(\d+)\s+(-|[\d.]+%)\s+(-|[\d.]+%)\s+(-|[\d.]+%)\s+(\d+)$",
                      p.stdout, re.M)
    assert len(rows) == 16, p.stdout
    assert all(r[3] == "100.0%" for r in rows), p.stdout
    assert rows[0][1] == "-"
    per_layer = [float(r[1].rstrip("%")) for r in rows[1:]]
    early, late = per_layer[:3], per_layer[-4:]
    assert sum(early) / 3 < sum(late) / 4, p.stdout


def _predicted_run(path: Path, fused: bool, resident: bool = False) -> tuple[Any, ...]:
    """Tokens, per-layer routing with the stale-gate prediction made there, and the scores
    of a predicting run, with the router GEMV fused with the next layer's or not (resident:
    the fused GEMV split with the partner process, where the machine has one)."""
    cfg = EngineConfig(model=str(path), prompt="Predict me", n_tokens=N_TOKENS, seed=3,
                       cache_mib=1.0, resident=resident, threads=2,
                       predict_log=True, predict_prefetch=True)
    with Engine(cfg, path) as engine:
        predictor = engine.predictor
        assert predictor is not None
        n_layer = len(engine.model.layers)
        stacked = [layer.moe.router_and_next for layer in engine.model.layers]
        assert all(m is not None for m in stacked[:-1]) and stacked[-1] is None
        if not fused:
            for layer in engine.model.layers:
                layer.moe.router_and_next = None
        seen: list[list[int]] = []

        def hook(layer: int, x: np.ndarray, ids: np.ndarray, w: np.ndarray, phase: int,
                 *given: np.ndarray) -> None:
            assert bool(given) == (fused and phase == 1 and layer + 1 < n_layer)
            predictor(layer, x, ids, w, phase, *given)
            nxt = predictor.pred_ids[layer + 1] if layer + 1 < n_layer else None
            seen.append([*ids.tolist(), *(nxt.tolist() if nxt is not None else [])])

        engine.model.routing_hook = hook
        result = engine.run()
    return result.output_ids, seen, result.extra["predict"]


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_fused_router_gemv_predicts_and_routes_as_two_gemvs(
        preset: str, request: pytest.FixtureRequest) -> None:
    # One GEMV over this layer's router stacked on the next one's (the P4 saving) must give
    # the same routing and the same stale-gate predictions, bit for bit, as two GEMVs.
    path: Path = request.getfixturevalue(f"{preset}_model")
    assert _predicted_run(path, fused=True) == _predicted_run(path, fused=False)
    assert _predicted_run(path, True, resident=True) == _predicted_run(path, False,
                                                                      resident=True)


def _graph_predicted_run(path: Path, fused: bool) -> tuple[Any, ...]:
    """`_predicted_run` on llama.cpp's graph (`--kernels ggml`): the next layer's router in
    each decode layer's graph, or (not fused) the predictor's own GEMV after it."""
    cfg = EngineConfig(model=str(path), prompt="Predict me", n_tokens=N_TOKENS, seed=3,
                       cache_mib=1.0, threads=2, kernels="ggml",
                       predict_log=True, predict_prefetch=True)
    with Engine(cfg, path) as engine:
        predictor, model = engine.predictor, engine.model
        assert predictor is not None and isinstance(model, PlainGraphModel) and model._fused
        if not fused:
            model._fused = False
        n_layer = len(model.weights)
        seen: list[list[int]] = []
        calls = {True: 0, False: 0}

        def hook(layer: int, x: np.ndarray, ids: np.ndarray, w: np.ndarray, phase: int,
                 *given: np.ndarray) -> None:
            if phase == 1 and layer + 1 < n_layer:
                calls[bool(given)] += 1
            predictor(layer, x, ids, w, phase, *given)
            nxt = predictor.pred_ids[layer + 1] if layer + 1 < n_layer else None
            seen.append([*ids.tolist(), *(nxt.tolist() if nxt is not None else [])])

        model.routing_hook = hook
        result = engine.run()
    assert calls[not fused] == 0 and calls[fused] > 0  # who made each prediction
    return result.output_ids, seen, result.extra["predict"]["per_layer"][0]


def test_the_graphs_next_router_predicts_as_the_predictors_own_gemv(small_model: Path) -> None:
    # The stale gate's GEMV among the layer graph's nodes (ggml's F32 product) ranks the
    # next layer's experts as the predictor's numpy GEMV ranks them, on this file; the
    # routing and the tokens are the layer graph's either way.
    assert _graph_predicted_run(small_model, True) == _graph_predicted_run(small_model, False)
