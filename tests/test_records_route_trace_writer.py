"""`--route-trace FILE` (docs/formats.md#route-trace-route_trace-v1): the preamble, one row
per routed expert, and rows that agree with what the engine did — the router's choice, hits
and misses, speculative hits, drops — and nothing at FILE when the run fails.

Sizes in the preamble are checked against the model file as the `gguf` package reads it,
not through the engine's own parser.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.run.session import Engine, RunResult
from abbench.engine.units import MIB
from abbench.records.route_trace import HEADER, RouteTraceWriter

pytestmark = pytest.mark.filterwarnings("ignore:--drop-cold-experts with top-:RuntimeWarning")

N_TOKENS = 16
PROMPT = "Trace me"


@dataclass(frozen=True)
class Trace:
    comments: list[str]
    header: str
    rows: list[dict[str, Any]]

    def passes(self) -> dict[tuple[int, int], list[dict[str, Any]]]:
        out: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
        for r in self.rows:
            out[r["phase"], r["step"]].append(r)
        return out


def read_trace(path: Path) -> Trace:
    lines = path.read_text().splitlines()
    comments = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if not ln.startswith("#")]
    assert lines[: len(comments)] == comments, "comments only before the header"
    names = body[0].split(",")
    rows = []
    for ln in body[1:]:
        values = ln.split(",")
        assert len(values) == len(names), ln
        row: dict[str, Any] = {n: int(v) for n, v in zip(names, values) if n != "weight"}
        row["weight"] = float(values[names.index("weight")])
        rows.append(row)
    return Trace(comments, body[0], rows)


@dataclass(frozen=True)
class Traced:
    result: RunResult
    trace: Trace
    routing: dict[tuple[int, int, int], tuple[list[int], list[float]]]  # (phase, pass, layer)

    @property
    def k(self) -> int:
        return int(self.trace.comments[1].rsplit("=", 1)[1])

    def decode_sum(self, key: str) -> int:
        return sum(getattr(r, key) for r in self.result.decode)


def traced_run(path: Path, out: Path, **overrides: Any) -> Traced:
    """Run with `--route-trace`, also recording the router's choices through the hook."""
    cfg = EngineConfig(ignore_eos=True, model=str(path), prompt=PROMPT, n_tokens=N_TOKENS, seed=5,
                       route_trace=str(out), **overrides)
    routing: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}
    passes = defaultdict(int)
    with Engine(cfg, path) as engine:
        probe = engine.model.routing_hook
        n_layer = engine.info["n_layer"]

        def hook(layer: int, x: np.ndarray, ids: np.ndarray, w: np.ndarray, phase: int,
                 *fused: np.ndarray) -> None:
            if probe is not None:
                probe(layer, x, ids, w, phase, *fused)
            routing[phase, passes[phase], layer] = (ids.tolist(), w.tolist())
            if layer == n_layer - 1:
                passes[phase] += 1

        engine.model.routing_hook = hook
        result = engine.run()
    return Traced(result, read_trace(out), routing)


def experts_mib(path: Path, n_experts: float) -> float:
    """MiB of cache that holds `n_experts` experts (F32 buffers, whatever the file type)."""
    r = gguf.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    d, ff = int(t.shape[0]), int(t.shape[1])  # gguf lists dims innermost first
    return n_experts * 3 * ff * d * 4 / MIB


@pytest.fixture(scope="module")
def runs(small_model: Path, tiny_model: Path,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Traced]:
    folder = tmp_path_factory.mktemp("traces")
    n_layer, n_expert, k, _ = gguf_sizes(small_model)
    speculating = experts_mib(small_model, 2 * k + 0.5)  # two layers' routing
    return {
        "plain": traced_run(small_model, folder / "plain.csv",
                            cache_mib=experts_mib(small_model, 0.4 * n_layer * n_expert)),
        "spec": traced_run(small_model, folder / "spec.csv", cache_mib=speculating,
                           predict_prefetch=True, prefetch_sync=True),
        "drop": traced_run(small_model, folder / "drop.csv", cache_mib=speculating,
                           drop_cold_experts=0.75),
        "tiny": traced_run(tiny_model, folder / "tiny.csv", cache_mib=0),
    }


def gguf_sizes(path: Path) -> tuple[int, int, int, list[tuple[int, int]]]:
    """n_layer, n_expert, k and per layer (bytes of one expert, dense bytes) via `gguf`."""
    r = gguf.GGUFReader(path)

    def field(key: str) -> int:
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])

    n_layer, n_expert = field("qwen3moe.block_count"), field("qwen3moe.expert_count")
    k = field("qwen3moe.expert_used_count")
    sizes = []
    for i in range(n_layer):
        mine = [t for t in r.tensors if t.name.startswith(f"blk.{i}.")]
        experts = sum(int(t.n_bytes) for t in mine if "_exps." in t.name)
        dense = sum(int(t.n_bytes) for t in mine if "_exps." not in t.name)
        assert experts % n_expert == 0
        sizes.append((experts // n_expert, dense))
    return n_layer, n_expert, k, sizes


def check_preamble(trace: Trace, path: Path, k: int | None = None) -> None:
    n_layer, n_expert, model_k, sizes = gguf_sizes(path)
    c = trace.comments
    assert c[0] == "# route_trace v1"
    assert re.fullmatch(rf"# model=\S+ arch=qwen3moe n_layer={n_layer} n_expert={n_expert} "
                        rf"n_expert_used={k or model_k}", c[1]), c[1]
    assert c[2:] == [f"# layer={i} expert_bytes={e} dense_bytes={d}"
                     for i, (e, d) in enumerate(sizes)]
    assert trace.header == HEADER == (
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped")
    # A row says what it read: the layer's expert size on a miss, 0 on a hit or a drop
    # (as the seed engine's traces do, and as replay reads them).
    for r in trace.rows:
        missed = r["residency"] == 0 and not r.get("dropped", 0)
        assert r["expert_bytes"] == (sizes[r["layer"]][0] if missed else 0), r


@pytest.mark.parametrize("name", ["plain", "tiny"])
def test_preamble(runs: dict[str, Traced], small_model: Path, tiny_model: Path,
                  name: str) -> None:
    check_preamble(runs[name].trace, tiny_model if name == "tiny" else small_model)


def test_preamble_counts_file_bytes_not_f32_bytes(tmp_path: Path) -> None:
    """Q8_0 experts: the trace's expert_bytes are what a read moves, not the F32 buffer."""
    path = tmp_path / "tiny-q8.gguf"
    synth.write_model(replace(synth.preset("tiny"), expert_type="Q8_0"), path)
    out = tmp_path / "trace.csv"
    t = traced_run(path, out, cache_mib=0, o_direct=False, n_expert_used=1)
    check_preamble(t.trace, path, k=1)
    f32_bytes = experts_mib(path, 1) * MIB
    (size,) = {r["expert_bytes"] for r in t.trace.rows if r["expert_bytes"]}
    assert size < f32_bytes
    assert sum(r.read_bytes for r in t.result.records) == sum(
        r["expert_bytes"] for r in t.trace.rows)


@pytest.mark.parametrize("name", ["plain", "spec", "drop", "tiny"])
def test_one_row_per_routed_expert(runs: dict[str, Traced], name: str) -> None:
    t = runs[name]
    r = t.result
    n_layer = r.model["n_layer"]
    passes = t.trace.passes()
    # Prefill rows are per prompt token (all but the last, which is decode step 1), from
    # one batch; decode rows per step.
    assert len(r.prefill) == 1 and r.prefill[0].tokens == len(r.prompt_ids) - 1 > 1
    assert sorted(passes) == ([(0, i) for i in range(len(r.prompt_ids) - 1)]
                              + [(1, i) for i in range(len(r.decode))])
    assert len(r.decode) == N_TOKENS
    for (phase, step), rows in passes.items():
        assert len(rows) == n_layer * t.k, (phase, step)
        for layer in range(n_layer):
            mine = [row for row in rows if row["layer"] == layer]
            assert [row["slot"] for row in mine] == list(range(t.k))
            if phase == 0:  # the hook saw the batch: (n, k) ids and weights
                batch_ids, batch_weights = t.routing[0, 0, layer]
                ids, weights = batch_ids[step], batch_weights[step]
            else:
                ids, weights = t.routing[phase, step, layer]
            assert [row["expert"] for row in mine] == ids, "the router's choice, in order"
            np.testing.assert_allclose([row["weight"] for row in mine], weights, atol=1e-6)
            assert sum(row["weight"] for row in mine) == pytest.approx(1.0, abs=1e-5)
    assert {row["turn"] for row in t.trace.rows} == {0}


@pytest.mark.parametrize("name", ["plain", "spec", "drop", "tiny"])
def test_rows_agree_with_the_counters(runs: dict[str, Traced], name: str) -> None:
    """Misses and hits per pass; the bytes read are the misses that were not dropped."""
    t = runs[name]
    passes = t.trace.passes()
    for rec in t.result.records:
        if rec.phase == 0:  # one batch: every prefill row, one lookup per expert per layer
            rows = [r for (phase, _), mine in sorted(passes.items()) if phase == 0 for r in mine]
        else:
            rows = passes[rec.phase, rec.step - 1]
        looked: dict[tuple[int, int], dict[str, Any]] = {}
        for r in sorted(rows, key=lambda r: r["layer"]):  # stable: token order within one
            if not r["dropped"]:
                looked.setdefault((r["layer"], r["expert"]), r)  # an expert's first row
        lookups = list(looked.values())
        read = [r for r in lookups if r["residency"] == 0]
        assert len(read) == rec.misses, rec
        assert sum(r["residency"] > 0 for r in lookups) == rec.hits, rec
        assert sum(r["dropped"] for r in rows) == rec.experts_dropped, rec
        assert sum(r["expert_bytes"] for r in read) == rec.read_bytes, rec
        assert not any(r["expert_bytes"] for r in rows if not any(r is x for x in read)), rec
    decode_misses = sum(1 for r in t.trace.rows
                        if r["phase"] == 1 and r["residency"] == 0 and not r["dropped"])
    assert decode_misses == t.decode_sum("misses") > 0


def test_residency_2_only_with_speculation(runs: dict[str, Traced]) -> None:
    for name in ("plain", "drop", "tiny"):
        assert {r["residency"] for r in runs[name].trace.rows} <= {0, 1}, name
    spec = runs["spec"]
    twos = [r for r in spec.trace.rows if r["residency"] == 2]
    assert twos and all(r["phase"] == 1 for r in twos)
    assert len(twos) == spec.decode_sum("spec_useful") > 0
    assert {r["residency"] for r in runs["plain"].trace.rows} == {0, 1}


def test_dropped_rows_only_with_the_drop_policy(runs: dict[str, Traced]) -> None:
    for name in ("plain", "spec", "tiny"):
        assert not any(r["dropped"] for r in runs[name].trace.rows), name
    t = runs["drop"]
    dropped = [r for r in t.trace.rows if r["dropped"]]
    assert dropped and len(dropped) == t.decode_sum("experts_dropped")
    threshold = 0.75 / t.k
    for r in dropped:
        assert r["phase"] == 1, "dropping is for decode unless --drop-in-prefill"
        assert r["residency"] == 0
        assert r["weight"] < threshold + 1e-6
    for rows in t.trace.passes().values():
        for layer in {r["layer"] for r in rows}:
            mine = [r for r in rows if r["layer"] == layer]
            assert not max(mine, key=lambda r: r["weight"])["dropped"], "top expert dropped"


# -- a failed run leaves nothing ------------------------------------------------------------


def failing_run(path: Path, out: Path, monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    cfg = EngineConfig(ignore_eos=True, model=str(path), prompt=PROMPT, n_tokens=8, cache_mib=0,
                       route_trace=str(out))
    with Engine(cfg, path) as engine:
        forward = engine.model.forward
        calls = [0]

        def flaky(token: int, pos: int, phase: int) -> np.ndarray:
            calls[0] += 1
            if calls[0] > after:
                raise RuntimeError("disk on fire")
            return forward(token, pos, phase)

        monkeypatch.setattr(engine.model, "forward", flaky)
        with pytest.raises(RuntimeError, match="disk on fire"):
            engine.run()
        assert calls[0] == after + 1


@pytest.mark.parametrize("after", [0, 4])  # prefill rows only; mid-decode
def test_failed_run_leaves_nothing(tiny_model: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    failing_run(tiny_model, folder / "trace.csv", monkeypatch, after)
    assert list(folder.iterdir()) == []


def test_failed_run_keeps_the_previous_trace(tiny_model: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "trace.csv"
    out.write_text("the previous run's trace\n")
    failing_run(tiny_model, out, monkeypatch, 4)
    assert list(tmp_path.iterdir()) == [out]
    assert out.read_text() == "the previous run's trace\n"


def test_writer_appears_only_on_close(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    w = RouteTraceWriter(out, "m o", "qwen3moe", 1, 4, 2, [(10, 20)])
    w.layer(1, 0, 0, [3, 1], [0.75, 0.25], [0, 1], [0, 0], 10)
    assert not out.exists()
    temps = list(tmp_path.iterdir())
    assert len(temps) == 1 and temps[0].name.startswith(".t.csv.")
    w.close()
    assert list(tmp_path.iterdir()) == [out]
    assert out.read_text().splitlines() == [
        "# route_trace v1",
        "# model=m_o arch=qwen3moe n_layer=1 n_expert=4 n_expert_used=2",
        "# layer=0 expert_bytes=10 dense_bytes=20",
        HEADER,
        "0,1,0,0,0,3,0.750000,0,10,0",
        "0,1,0,0,1,1,0.250000,1,0,0",  # a hit reads nothing
    ]
    w2 = RouteTraceWriter(tmp_path / "u.csv", "m", "a", 1, 1, 1, [(1, 1)])
    w2.abandon()
    assert list(tmp_path.iterdir()) == [out]
