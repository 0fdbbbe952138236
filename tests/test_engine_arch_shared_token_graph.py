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
from abbench.engine.config import EngineConfig
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
