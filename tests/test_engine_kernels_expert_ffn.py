"""The seam an architecture plugs into the shared expert side: its expert FFN
(`expert_ffn.ExpertFFN`) and its router's bias (`Model.router_bias`, which the predictor
adds).

gpt-oss's FFN (`arch/gpt_oss.OaiExperts`: a per-expert bias after each product, indexed
by the expert's id and not its cache slot, and the clamped SwiGLU), with random biases, is
plugged into the expert runner, the thread team, the partner process and the ggml graph:
each computes what the formula written here says, and the same bits wherever numpy
computes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_engine_kernels_qcompute import FF as QFF
from test_engine_kernels_qcompute import TOL, fill, layout_of
from test_engine_kernels_qcompute import D as QD

from abbench.engine.arch.gpt_oss.model import OaiExperts
from abbench.engine.experts.predictor import RoutePredictor, top_k
from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import ggml, partner
from abbench.engine.kernels.compute import SWIGLU, Job
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.streaming.slots import SlotPool
from abbench.engine.streaming.streamer import expert_layout
from abbench.errors import EngineError

ALPHA, LIMIT = 1.702, 7.0  # gpt-oss's SWIGLU_OAI constants
LAYERS, EXPERTS, FF, D = 4, 8, 32, 64  # the `tiny` preset's experts


def clamped_swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """x = min(gate, limit), y = clip(up, -limit, limit): x / (1 + e^(-alpha x)) * (y + 1)."""
    g = np.minimum(gate, LIMIT)
    u = np.clip(up, -LIMIT, LIMIT)
    return g / (1 + np.exp(-ALPHA * g)) * (u + 1)


class Biased(OaiExperts):
    """gpt-oss's FFN (`arch/gpt_oss.OaiExperts`) with random bias stacks (per layer, per
    expert) on gate, up and down, and its formula written here independently."""

    def __init__(self, seed: int, layers: int, experts: int, ff: int, d: int,
                 scale: float = 1.0) -> None:
        rng = np.random.default_rng(seed)
        self.stacks = [(rng.standard_normal((layers, experts, n)) * scale).astype(np.float32)
                       for n in (ff, ff, d)]  # gate, up, down biases: (layers, experts, n)
        super().__init__(*(list(s) for s in self.stacks))

    def expert(self, layer: int, e: int, gate: np.ndarray, up: np.ndarray,
               down: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The formula for expert `e` on x (d,), from its weights."""
        gb, ub, db = (s[layer][e] for s in self.stacks)
        return down @ clamped_swiglu(gate @ x + gb, up @ x + ub) + db


def weights(mf: ModelFile, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(experts, ff, d) gate and up, (experts, d, ff) down of one layer, F32."""
    return tuple(mf.read_dense(f"blk.{layer}.ffn_{p}_exps.weight", True)  # type: ignore[return-value]
                 for p in ("gate", "up", "down"))


def runner(path: Path, ffn: Any, threads: int = 1, resident: bool = False,
           overlap: bool = False) -> ExpertRunner:
    mf = ModelFile(path)
    return ExpertRunner(mf, expert_layout(mf, LAYERS, EXPERTS), cache_mib=64,
                        resident=resident, io_lanes=2, o_direct=False, overlap=overlap,
                        threads=threads, max_k=4, ffn=ffn)


def near(got: np.ndarray, want: np.ndarray, tol: float = 1e-5) -> bool:
    """Equal to float summation order (numpy's GEMV against this file's `@`)."""
    return bool(np.abs(got - want).max() <= tol * np.abs(want).max())


@pytest.fixture
def ffn() -> Biased:
    return Biased(11, LAYERS, EXPERTS, FF, D)


@pytest.mark.parametrize("threads,overlap", [(1, False), (2, False), (2, True)])
def test_a_decode_layers_experts_are_the_ffns_formula(tiny_model: Path, ffn: Biased,
                                                      threads: int, overlap: bool) -> None:
    mf = ModelFile(tiny_model)
    layer, ids = 2, [6, 1, 3]
    gate, up, down = weights(mf, layer)
    x = np.random.default_rng(1).standard_normal(D).astype(np.float32)
    w = np.array([0.5, 0.3, 0.2], np.float32)
    r, plain = runner(tiny_model, ffn, threads, overlap=overlap), runner(tiny_model, SWIGLU)
    try:
        y = r(layer, x, r.select(layer, np.array(ids), w, 1), 1).copy()  # (k, d)
        assert r.tok.misses == 3  # read, not resident: the streaming path
        for j, e in enumerate(ids):
            assert near(y[j], ffn.expert(layer, e, gate[e], up[e], down[e], x)), (j, e)
        # and the plug took: the plain runner computes SwiGLU without biases
        y_plain = plain(layer, x, plain.select(layer, np.array(ids), w, 1), 1)
        assert not near(y_plain, y, 0.1)
        # the bits do not depend on residency (now all hits) or on who computed
        np.testing.assert_array_equal(r(layer, x, r.select(layer, np.array(ids), w, 1), 1), y)
    finally:
        r.close()
        plain.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_prefill_batchs_experts_are_the_ffns_formula(tiny_model: Path, ffn: Biased,
                                                       threads: int) -> None:
    mf = ModelFile(tiny_model)
    layer = 3
    gate, up, down = weights(mf, layer)
    rng = np.random.default_rng(2)
    n, k = 5, 2
    x = rng.standard_normal((n, D)).astype(np.float32)
    ids = np.array([rng.choice(EXPERTS, k, replace=False) for _ in range(n)])  # (n, k)
    w = rng.random((n, k)).astype(np.float32)
    r = runner(tiny_model, ffn, threads)
    try:
        out = r.prefill(layer, x, ids, w)  # (n, d)
    finally:
        r.close()
    for t in range(n):
        want = sum(w[t, j] * ffn.expert(layer, e, gate[e], up[e], down[e], x[t])
                   for j, e in enumerate(ids[t].tolist()))
        assert near(out[t], want), t


@pytest.mark.skipif(not partner.supported(), reason="x86-64 with 2 CPUs only")
def test_the_partner_runs_the_ffn_with_the_teams_bits(tiny_model: Path, ffn: Biased) -> None:
    """Decode (its direct path: expert ids by the routing) and prefill (`run_rows`) on the
    partner process, against the single thread's results, bit for bit."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(D).astype(np.float32)
    ids, w = np.array([7, 0, 4, 2]), np.array([0.4, 0.3, 0.2, 0.1], np.float32)
    xs = rng.standard_normal((6, D)).astype(np.float32)
    batch = np.array([rng.choice(EXPERTS, 4, replace=False) for _ in range(6)])  # (6, 4)
    bw = rng.random((6, 4)).astype(np.float32)
    results = []
    for threads in (1, 2):
        r = runner(tiny_model, ffn, threads, resident=True)
        try:
            assert r.start_partner([], max_rows=6) == (threads == 2)
            _, y = r.run_routed(1, x, ids, w, 1)
            results.append((y.copy(), r.prefill(2, xs, batch, bw)))
        finally:
            r.close()
    (y1, p1), (y2, p2) = results
    np.testing.assert_array_equal(y2, y1)
    np.testing.assert_array_equal(p2, p1)
    gate, up, down = weights(ModelFile(tiny_model), 1)
    for j, e in enumerate(ids.tolist()):
        assert near(y2[j], ffn.expert(1, e, gate[e], up[e], down[e], x))


def test_a_ggml_team_of_another_ffn_is_refused(tiny_model: Path, ffn: Biased) -> None:
    mf = ModelFile(tiny_model)
    with pytest.raises(EngineError, match="another expert FFN"):
        ExpertRunner(mf, expert_layout(mf, LAYERS, EXPERTS), cache_mib=64, resident=False,
                     io_lanes=1, o_direct=False, overlap=False, threads=1, max_k=4,
                     ffn=ffn, team=_Team())


class _Team:
    ffn = SWIGLU


def _has_oai_ops() -> bool:
    try:
        ggml.lib()
    except ggml.GgmlUnavailable:
        return False
    return hasattr(ggml.Context, "add_id") and hasattr(ggml.Context, "swiglu_oai")


@pytest.fixture
def oai_team() -> Iterator[tuple[QuantTeam, Biased]]:
    if not _has_oai_ops():
        pytest.skip("ggml's add_id and swiglu_oai are not bound")
    ffn = Biased(12, 2, 6, QFF, QD, scale=0.1)
    team = QuantTeam(1, ffn=ffn)
    yield team, ffn
    team.close()


def test_the_ggml_graph_runs_the_ffns_steps_by_expert_id(oai_team: tuple[QuantTeam, Biased]
                                                          ) -> None:
    """Decode (`run`) and prefill (`rows`) graphs with the stand-in's steps: within ggml's
    input quantization of the formula on the dequantized weights; each row's biases are
    those of its expert id, which here is not its slot."""
    team, ffn = oai_team
    rng = np.random.default_rng(13)
    pool = SlotPool(layout_of(ggml.Q8_0), 8)
    experts = fill(pool, rng, 6)  # slot j holds the weights of expert eid[j]
    eid = [3, 5, 0, 4, 1, 2]
    x = rng.standard_normal(pool.layout.gate.cols).astype(np.float32)

    def want(layer: int, j: int, v: np.ndarray) -> np.ndarray:
        f32 = experts[j][1]
        return ffn.expert(layer, eid[j], f32.gate_up[:QFF], f32.gate_up[QFF:], f32.down, v)

    chosen = [4, 1, 5]
    out = np.zeros((3, x.size), np.float32)
    for layer in (0, 1):  # one graph, its biases pointed at each layer's
        team.run([Job(i, experts[j][0], None, eid[j]) for i, j in enumerate(chosen)], x, out,
                 layer)
        for i, j in enumerate(chosen):
            np.testing.assert_array_less(np.abs(out[i] - want(layer, j, x)),
                                         TOL * np.abs(want(layer, j, x)).max())
    xs = rng.standard_normal((3, x.size)).astype(np.float32)
    rows = np.array([[0, 2], [5, 3], [1, 0]])  # (n, k) slots
    y = team.rows(pool, xs, np.array([[experts[j][0].index for j in r] for r in rows],
                                     np.int32), np.array([[eid[j] for j in r] for r in rows]), 1)
    for t in range(3):
        for i, j in enumerate(rows[t].tolist()):
            w = want(1, j, xs[t])
            assert np.abs(y[t, i] - w).max() <= TOL * np.abs(w).max(), (t, i)


# -- the router's bias, in the predictor ------------------------------------------------------


def test_the_predictor_adds_the_routers_bias_and_its_control_reads_100() -> None:
    rng = np.random.default_rng(21)
    n_layer, n_expert, d, k = 3, 8, 6, 2
    routers = [rng.standard_normal((n_expert, d)).astype(np.float32) for _ in range(n_layer)]
    biases = [(rng.standard_normal(n_expert) * 4).astype(np.float32) for _ in range(n_layer)]
    with_bias = RoutePredictor(routers, log=True, predict=True, biases=list(biases))
    without = RoutePredictor(routers, log=True, predict=True)
    differs = False
    for _token in range(8):
        for layer in range(n_layer):
            x = rng.standard_normal(d).astype(np.float32)
            logits = routers[layer] @ x + biases[layer]  # what a biased router ranks
            ids = top_k(logits, k)
            top = logits[ids]
            w = np.exp(top - top[0]) / np.exp(top - top[0]).sum()
            for p in (with_bias, without):
                p(layer, x, ids, w.astype(np.float32), 1)
            if layer + 1 < n_layer:
                nxt = routers[layer + 1] @ x + biases[layer + 1]
                assert with_bias.pred_ids[layer + 1].tolist() == top_k(nxt, k).tolist()
                differs |= top_k(nxt - biases[layer + 1], k).tolist() != top_k(nxt, k).tolist()
    assert differs, "pick a seed where the bias changes a ranking"
    control = with_bias.scores.overall(with_bias.scores.ctrl)
    assert control.slot_pct == 100.0
    assert without.scores.overall(without.scores.ctrl).slot_pct < 100.0  # the bias matters
    with pytest.raises(ValueError, match="2 router biases for 3 routers"):
        RoutePredictor(routers, log=True, predict=False, biases=biases[:2])
