"""qwen35moe (engine/arch/qwen35moe/args.py, qwen35moe.py): the header as llama.cpp reads it
— which layers are recurrent, the RoPE sections' pairs that turn, a required key named when
missing — and the numpy model's parts: the delta rule against its formula, the recurrent
state's reset at position 0 and its refusal to jump, batched prefill against token by
token, the stale-gate predictor's control; and the graph model (qwen35moe_graph.py): its
logits against the numpy model's, its state across passes, the predictor and a drop
policy through it. Decoded text and logits against llama.cpp's are in
tests/test_llamacpp_qwen35moe.py (slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from arch_helper import Without

from abbench.engine import synth
from abbench.engine.arch.qwen35moe import args as q
from abbench.engine.arch.qwen35moe import model as qwen35moe
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine
from abbench.errors import EngineError, ModelFileError

PROMPT = ("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun all "
          "afternoon long.")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen35moe") / "qwen35moe-tiny.gguf"
    synth.write_model(synth.named("qwen35moe-tiny"), path, name="qwen35moe-tiny")
    return path


def engine_of(path: Path, **kw: Any) -> Engine:
    cfg = EngineConfig(model=str(path), prompt=PROMPT, n_tokens=8, temp=0.0,
                       ignore_eos=True, threads=1, resident=True,
                       kernels=kw.pop("kernels", "numpy"), **kw)
    return Engine(cfg, path)


def test_a_synthetic_file_reads_as_llama_cpp_reads_it(tiny_file: Path) -> None:
    a = q.ModelArgs.from_file(ModelFile(tiny_file))
    assert a.recurrent_layers == (True, True, True, False)  # interval 4: layer 3 is full
    assert (a.ssm_time_step_rank, a.ssm_group_count, a.ssm_state_size, a.ssm_inner_size,
            a.ssm_conv_kernel) == (4, 2, 16, 64, 4)
    assert (a.rope_dimension_count, a.rope_dimension_sections) == (4, (1, 1, 0, 0))
    assert a.expert_shared_feed_forward_length == 32
    assert a.rotated_pairs().all()


def header(**keys: Any) -> SimpleNamespace:
    """A stand-in ModelFile whose arrays are `keys` (`qwen35moe.KEY`)."""
    values = {f"qwen35moe.{k.replace('__', '.')}": v for k, v in keys.items()}
    return SimpleNamespace(path="m.gguf", array=lambda key: values.get(key))


def test_the_recurrent_layers_come_from_the_interval_or_a_flag_per_layer() -> None:
    assert q._recurrent(header(), "qwen35moe.", 8, 4) == (True, True, True, False) * 2
    assert q._recurrent(header(), "qwen35moe.", 3, 1) == (False,) * 3
    flags = header(attention__recurrent_layers=[True, False, True])
    assert q._recurrent(flags, "qwen35moe.", 3, 4) == (True, False, True)
    with pytest.raises(ModelFileError, match="recurrent_layers` has 3 values for 4"):
        q._recurrent(flags, "qwen35moe.", 4, 4)


def test_a_pair_on_the_fourth_rope_axis_stays_still() -> None:
    """Text positions are 0 on the 4th axis (src/llama-graph.cpp L131-141): Qwen3.5's
    sections [11, 11, 10, 0] turn all 32 pairs; [2, 0, 0, 0] over 2 pairs leaves the second
    on the 4th axis (measured against llama.cpp: it agrees only with that pair still)."""
    a = q.ModelArgs.__new__(q.ModelArgs)
    object.__setattr__(a, "rope_dimension_count", 64)
    object.__setattr__(a, "rope_dimension_sections", (11, 11, 10, 0))
    assert a.rotated_pairs().all()
    object.__setattr__(a, "rope_dimension_count", 4)
    object.__setattr__(a, "rope_dimension_sections", (2, 0, 0, 0))
    assert a.rotated_pairs().tolist() == [True, False]


@pytest.mark.parametrize("key", ["attention.layer_norm_rms_epsilon", "rope.dimension_sections",
                                 "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
                                 "ssm.time_step_rank", "ssm.group_count"])
def test_a_key_llama_cpp_requires_is_required_and_named(tiny_file: Path, key: str) -> None:
    with pytest.raises(ModelFileError, match=f"missing metadata key `qwen35moe.{key}`"):
        q.ModelArgs.from_file(Without(ModelFile(tiny_file), f"qwen35moe.{key}"))  # type: ignore[arg-type]


# --- the numpy model (engine/arch/qwen35moe/model.py) -----------------------------------------

def test_the_first_token_writes_beta_v_k_and_reads_it_with_q(tiny_file: Path) -> None:
    """From a zero state one token's delta rule is S = beta v k^T, its output S q / sqrt(hd)
    = beta (k.q) v / sqrt(hd): the layer's output, projected, with the norm and gate."""
    with engine_of(tiny_file) as engine:
        net = engine.model.layers[0].mixer
        assert isinstance(net, qwen35moe.GatedDeltaNet)
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        net.reset()
        out = net(x)
        proj = x @ net.w_in.T  # (1, conv + inner + 2h)
        conv, inner, h, s = net.conv, net.inner, net.h, net.s
        mixed = proj[0, :conv] * net.conv_w[:, -1]  # only the newest tap sees a non-zero input
        mixed = mixed / (1 + np.exp(-mixed))
        qk = mixed[: 2 * net.hk * s].reshape(2, net.hk, s)
        qk = qk / np.linalg.norm(qk, axis=-1, keepdims=True)
        v = mixed[2 * net.hk * s:].reshape(h, s)
        beta = 1 / (1 + np.exp(-proj[0, conv + inner: conv + inner + h]))
        kq = (qk[1] * qk[0]).sum(-1)[np.arange(h) % net.hk]  # (h,)
        o = (beta * kq)[:, None] * v / np.sqrt(s)
        o = o / np.sqrt((o * o).mean(-1, keepdims=True) + 1e-6) * net.norm
        z = proj[0, conv: conv + inner].reshape(h, s)
        expected = (o * z / (1 + np.exp(-z))).reshape(inner) @ net.wo.T
        assert np.abs(out[0] - expected).max() <= 1e-5 * np.abs(expected).max()


def test_batched_prefill_equals_token_by_token(tiny_file: Path) -> None:
    with engine_of(tiny_file) as batched, engine_of(tiny_file) as reference:
        prompt = batched.prompt_ids
        n = len(prompt)
        batched.model.prefill(prompt[: n // 2], 0)  # two batches: the state carries over
        batched.model.prefill(prompt[n // 2: -1], n // 2)
        for pos, t in enumerate(prompt[:-1]):
            reference.model.forward(t, pos, 0)
        logits = batched.model.forward(prompt[-1], n - 1, 1)
        expected = reference.model.forward(prompt[-1], n - 1, 1)
        assert np.abs(logits - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("kernels", ["numpy", "ggml"])  # ggml: the graph model
def test_position_0_starts_a_new_sequence_and_a_jump_is_refused(tiny_file: Path,
                                                                 kernels: str) -> None:
    with engine_of(tiny_file, kernels=kernels) as engine:
        model, prompt = engine.model, engine.prompt_ids
        first = [model.forward(t, pos, 1) for pos, t in enumerate(prompt)]
        again = [model.forward(t, pos, 1) for pos, t in enumerate(prompt)]
        assert np.array_equal(np.array(first), np.array(again))
        with pytest.raises(EngineError, match="position 3, but the recurrent state stands"):
            model.forward(prompt[0], 3, 1)


def test_the_stale_gate_control_reads_100_on_every_layer(tiny_file: Path) -> None:
    """The predictor reads each layer's router through the fused GEMV (`fuse_next_routers`),
    linear layers and full alike: its control, the router's own top-k, is exact; and the
    fused routing decodes the same tokens as the plain one."""
    with engine_of(tiny_file, cache_mib=1.0, predict_log=True) as engine:
        probed = engine.run()
    with engine_of(tiny_file, cache_mib=1.0) as engine:
        plain = engine.run()
    layers = probed.extra["predict"]["per_layer"]
    assert len(layers) == 4
    for row in layers:
        assert row["control"]["slot_pct"] == 100.0 and row["control"]["exact_pct"] == 100.0
    assert [r.token for r in probed.decode] == [r.token for r in plain.decode]


def test_model_synth_arch_qwen35moe_writes_the_preset(tmp_path: Path, tiny_file: Path) -> None:
    out = tmp_path / "m.gguf"
    p = subprocess.run([sys.executable, "-m", "abbench", "model", "synth", "--arch",
                        "qwen35moe", "--preset", "tiny", "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    mf, named = ModelFile(out), ModelFile(tiny_file)
    assert mf.architecture == "qwen35moe" and mf.get("tokenizer.ggml.pre") == "qwen35"
    assert mf.array("qwen35moe.rope.dimension_sections") == [1, 1, 0, 0]
    assert {n: t.shape for n, t in mf.tensors.items()} == \
        {n: t.shape for n, t in named.tensors.items()}


# -- the graph model (engine/arch/qwen35moe/graph.py: llama.cpp's graph, `--kernels ggml`)


def test_the_graph_model_computes_what_the_numpy_model_computes(tiny_file: Path) -> None:
    """Its logits at every position of a prompt (half prefilled in one batch) and 8 more
    tokens are the numpy model's within 1e-5 of their largest magnitude (float rounding:
    ggml's exp, sigmoid and sums are not numpy's), and its state carries across passes."""
    with (engine_of(tiny_file, n_ctx=256) as ref,
          engine_of(tiny_file, n_ctx=256, kernels="ggml") as graph):
        assert type(graph.model).__module__ == "abbench.engine.arch.qwen35moe.graph"
        seq = graph.prompt_ids + [7, 300, 11, 42, 5, 450, 64, 128]
        half = len(graph.prompt_ids) // 2
        out = []
        for model in (ref.model, graph.model):
            model.prefill(seq[:half], 0)
            out.append(np.array([model.forward(t, pos, 1)
                                 for pos, t in enumerate(seq) if pos >= half]))
        ours, theirs = out[1], out[0]
        assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
        assert ours.argmax(axis=1).tolist() == theirs.argmax(axis=1).tolist()


def test_the_graph_model_serves_the_predictor_and_the_drop_policy(tiny_file: Path) -> None:
    """The stale-gate predictor reads the graph model's routers (F32, as the layer graphs
    rank them): its control is exact on every layer; a drop policy runs through it."""
    with engine_of(tiny_file, kernels="ggml", cache_mib=1.0, predict_log=True) as engine:
        probed = engine.run()
    for row in probed.extra["predict"]["per_layer"]:
        assert row["control"]["exact_pct"] == 100.0
    cfg = EngineConfig(model=str(tiny_file), prompt=PROMPT, n_tokens=8, temp=0.0,
                       ignore_eos=True, threads=1, kernels="ggml", cache_mib=0.05,
                       drop_cold_experts=0.75)  # a cache of a few experts: most are cold
    with pytest.warns(RuntimeWarning, match="top-2"), Engine(cfg, tiny_file) as engine:
        dropped = engine.run()
    assert len(dropped.decode) == 8
    assert sum(r.experts_dropped for r in dropped.decode) > 0
