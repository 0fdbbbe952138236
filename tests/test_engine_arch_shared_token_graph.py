"""A resident decode token as one ggml graph (`arch/token_graph.py`): every
architecture's layers, its experts (`ExpertNodes`, over the complete cache's slots) and
the output in one graph, as llama.cpp computes a token. It must compute the same bits and
count the same as a graph per layer with the experts run between them, and be taken only
where nothing acts between a layer's router and its experts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from abbench.engine import synth
from abbench.engine.arch.shared import graph, token_graph
from abbench.engine.config import EngineConfig
from abbench.engine.kernels.ggml import context
from abbench.engine.run.session import Engine

TINY = [name for name in synth.PRESETS if name.endswith("tiny")]  # one per architecture
COUNTED = ("experts_routed", "hits", "misses", "experts_dropped", "read_bytes")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("token-graph")
    out = {}
    for name in TINY:
        out[name] = folder / f"{name}.gguf"
        synth.write_model(synth.named(name), out[name], name=name)
    return out


def config(path: Path, **extra: object) -> EngineConfig:
    settings: dict[str, object] = {"resident": True, "kernels": "ggml", "threads": 2,
                                   "temp": 0.0, "ignore_eos": True, **extra}
    return EngineConfig(model=str(path), prompt_tokens=(5, 9, 30, 41, 7), n_tokens=12,
                        **settings)  # type: ignore[arg-type]


def logits(path: Path, one_graph: bool, flash: bool) -> tuple[np.ndarray, bool]:
    """Every position's logits through `forward`, and whether a token graph was built."""
    tokens = [int(t) for t in np.random.default_rng(8).integers(3, 250, 20)]
    cfg = EngineConfig(model=str(path), prompt_tokens=tuple(tokens), n_tokens=1, n_ctx=300,
                       ignore_eos=True, resident=True, kernels="ggml", threads=2,
                       flash_attn=flash)
    with Engine(cfg, path) as engine:
        engine.model.one_graph = one_graph
        out = np.stack([engine.model.forward(t, pos, 1) for pos, t in enumerate(tokens)])
        return out, engine.model._token_graphs._built is not None


@pytest.mark.parametrize("flash", [False, True], ids=["f32-attention", "flash-attn"])
@pytest.mark.parametrize("name", TINY)
def test_one_graph_a_token_gives_the_bits_of_a_graph_a_layer(
        name: str, flash: bool, files: dict[str, Path]) -> None:
    one, built = logits(files[name], True, flash)
    per_layer, built_per_layer = logits(files[name], False, flash)
    assert built and not built_per_layer
    np.testing.assert_array_equal(one, per_layer)


@pytest.mark.parametrize("name", TINY)
def test_a_run_decodes_and_counts_as_a_graph_a_layer(name: str,
                                                     files: dict[str, Path]) -> None:
    """The same tokens, and per token the same experts routed and hits counted (every
    one a hit: nothing read), whichever way the token was computed."""
    runs = []
    for one_graph in (True, False):
        with Engine(config(files[name]), files[name]) as engine:
            engine.model.one_graph = one_graph
            result = engine.run()
            assert (engine.model._token_graphs._built is not None) == one_graph
            runs.append(result)
    one, per_layer = runs
    assert one.output_ids == per_layer.output_ids
    decode = [[[getattr(t, c) for c in COUNTED] for t in r.records if t.phase == 1]
              for r in runs]
    assert decode[0] == decode[1]
    k = synth.named(name).n_expert_used * synth.named(name).n_layer
    assert all(row[0] == row[1] == k and row[2] == 0 for row in decode[0])


@pytest.mark.parametrize("extra", [
    {"drop_cold_experts": 0.5},  # a policy between the router and the experts
    {"predict_log": True},  # a routing hook: it sees each layer before its experts run
    {"resident": False, "cache_mib": 64.0},  # a cache that may miss
], ids=["drop", "predictor", "streaming"])
def test_the_token_graph_is_taken_only_where_nothing_acts_between_router_and_experts(
        extra: dict[str, object], files: dict[str, Path]) -> None:
    path = files["gpt-oss-tiny"]
    with Engine(config(path, **extra), path) as engine:
        engine.run()
        assert engine.model._token_graphs._built is None
    with Engine(config(path), path) as engine:  # the control
        engine.run()
        assert engine.model._token_graphs._built is not None


def test_a_route_trace_keeps_a_graph_a_layer(files: dict[str, Path], tmp_path: Path) -> None:
    path = files["qwen35moe-tiny"]
    with Engine(config(path, route_trace=str(tmp_path / "trace.jsonl")), path) as engine:
        engine.run()
        assert engine.model._token_graphs._built is None


# -- a prefill batch as one graph ----------------------------------------------------------


def batch_graphs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions of the prefill passes run as one graph from now on (a spy)."""
    ran: list[int] = []
    run_batch = token_graph.TokenGraph.run_batch

    def spy(self: token_graph.TokenGraph, pos: int, experts: object) -> None:
        ran.append(pos)
        run_batch(self, pos, experts)  # type: ignore[arg-type]

    monkeypatch.setattr(token_graph.TokenGraph, "run_batch", spy)
    return ran


def prefilled(path: Path, one_graph: bool, flash: bool, monkeypatch: pytest.MonkeyPatch
              ) -> tuple[np.ndarray, list[list[int]], int]:
    """A 20-token prompt's run, then its tokens but the last prefilled in one pass and
    the last one's logits (the bits the cache holds decide them); the run's prefill
    records' counters; how many passes ran as one graph."""
    ran = batch_graphs(monkeypatch)
    tokens = tuple(int(t) for t in np.random.default_rng(9).integers(3, 250, 20))
    cfg = EngineConfig(model=str(path), prompt_tokens=tokens, n_tokens=3, n_ctx=300,
                       ignore_eos=True, resident=True, kernels="ggml", threads=2,
                       flash_attn=flash, temp=0.0)
    with Engine(cfg, path) as engine:
        engine.model.one_graph = one_graph
        result = engine.run()  # the session's own prefill, counted
        # again, over the memory the run's pass left (a prefill graph's is kept)
        engine.model.prefill(list(tokens[:-1]), 0)
        out = engine.model.forward(tokens[-1], len(tokens) - 1, 1)
    counted = [[getattr(r, c) for c in COUNTED] for r in result.records if r.phase == 0]
    return out, counted, len(ran)


@pytest.mark.parametrize("flash", [False, True], ids=["f32-attention", "flash-attn"])
@pytest.mark.parametrize("name", TINY)
def test_a_prefill_batch_as_one_graph_gives_the_bits_and_counts_of_a_graph_a_layer(
        name: str, flash: bool, files: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The experts of every token of the batch as `mul_mat_id` in the pass's one graph:
    the cache the batch leaves gives the next token the same logits to the bit, and the
    pass counts what a batch's lookups count (each token's experts routed, one hit per
    expert of a layer's union)."""
    one, one_counted, graphs = prefilled(files[name], True, flash, monkeypatch)
    per_layer, counted, none = prefilled(files[name], False, flash, monkeypatch)
    assert graphs == 2 and none == 0  # the test's prefill and the run's
    np.testing.assert_array_equal(one, per_layer)
    assert one_counted == counted
    spec = synth.named(name)
    routed, hits, misses = counted[0][:3]
    assert routed == 19 * spec.n_expert_used * spec.n_layer and misses == 0
    assert spec.n_layer * spec.n_expert_used <= hits <= spec.n_layer * spec.n_expert


def test_a_prefill_batch_past_the_graph_budget_runs_a_graph_a_layer(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass whose one graph would hold more results than PREFILL_GRAPH_BYTES runs a
    graph a layer (one layer's results at a time), with the same bits; the pass's size
    is remembered, so that the next pass of that size does not build toward it again."""
    path = files["tiny"]
    within, _, graphs = prefilled(path, True, False, monkeypatch)
    monkeypatch.setattr(graph, "PREFILL_GRAPH_BYTES", 64 << 10)
    over, _, none = prefilled(path, True, False, monkeypatch)
    assert graphs == 2 and none == 0
    np.testing.assert_array_equal(within, over)


def test_a_pass_size_past_the_budget_is_not_built_toward_again(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass of a size that did not fit goes straight to a graph a layer."""
    monkeypatch.setattr(graph, "PREFILL_GRAPH_BYTES", 64 << 10)
    built: list[int] = []
    make = graph.token_graph

    def counted(*args: object, **kwargs: object) -> object:
        built.append(1)
        return make(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(graph, "token_graph", counted)
    path = files["tiny"]
    tokens = [5, 9, 30, 41, 7, 99, 12, 3]
    with Engine(config(path), path) as engine:
        for _ in range(2):
            engine.model.prefill(tokens, 0)
        assert len(built) == 1 and len(engine.model._over_budget) == 1


def test_a_prefill_batch_whose_arenas_cannot_be_mapped_runs_a_graph_a_layer(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """No address space for the arenas (`ulimit -v`): the pass runs a graph a layer."""
    path = files["gpt-oss-tiny"]
    within, _, graphs = prefilled(path, True, False, monkeypatch)

    def refused(nbytes: int) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(context, "_small_pages", refused)
    over, _, none = prefilled(path, True, False, monkeypatch)
    assert graphs == 2 and none == 0
    np.testing.assert_array_equal(within, over)


@pytest.mark.parametrize("extra", [
    {"drop_cold_experts": 0.5, "drop_in_prefill": True},  # a policy in the batch's layers
    {"predict_log": True},  # a routing hook sees each layer's batch before its experts
    {"resident": False, "cache_mib": 64.0},  # a cache that may miss
], ids=["drop-in-prefill", "predictor", "streaming"])
def test_a_prefill_batch_is_one_graph_only_where_nothing_acts_between_router_and_experts(
        extra: dict[str, object], files: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = batch_graphs(monkeypatch)
    path = files["gemma4-tiny"]
    with Engine(config(path, **extra), path) as engine:
        engine.run()
    assert ran == []
    with Engine(config(path, drop_cold_experts=0.5), path) as engine:  # decode only: taken
        engine.run()
    assert ran == [0]
