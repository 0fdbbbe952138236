"""gemma4 (engine/arch/gemma4/args.py, gemma4.py): the header as llama.cpp reads it — the
sliding layers and their own head size, V shared with K where a layer has no `attn_v`, a
required key named when missing, what the engine does not compute refused by name — and
the numpy model's parts: GELU bit for bit as ggml's, the window, the router's folded
matrix (the predictor's), batched prefill against token by token, a predicted run.
Decoded text and logits against llama.cpp's are in tests/test_llamacpp_gemma4.py (slow)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arch_helper import check_batched_prefill, check_the_window, numpy_engine

from abbench.engine import synth
from abbench.engine.arch.gemma4 import args as g
from abbench.engine.arch.gemma4 import model as gemma4
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import ggml
from abbench.engine.run.session import Engine
from abbench.errors import ModelFileError


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemma4") / "gemma4-tiny.gguf"
    synth.write_model(synth.named("gemma4-tiny"), path, name="gemma4-tiny")
    return path


def test_a_synthetic_file_reads_as_llama_cpp_reads_it(tiny_file: Path) -> None:
    a = g.ModelArgs.from_file(ModelFile(tiny_file))
    assert (a.block_count, a.expert_count, a.expert_used_count, a.sliding_window) == \
        (4, 8, 2, 16)
    assert a.swa_layers == (True, True, False, True)
    assert [a.head_dim(i) for i in range(4)] == [16, 16, 32, 16]
    assert a.v_layers == (True, True, False, True)  # the full layer's V is its K
    assert (a.rope_freq_base, a.rope_freq_base_swa, a.final_logit_softcapping) == \
        (1e6, 1e4, 30.0)
    assert a.own_output and a.output_scales and a.expert_scales


class Edited:
    """A model file whose header lacks `key` (value None), or holds `value` there."""

    def __init__(self, mf: ModelFile, key: str, value: Any = None) -> None:
        self.mf, self.key, self.value = mf, key, value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mf, name)

    def get(self, key: str, default: Any = None) -> Any:
        if key == self.key:
            return default if self.value is None else self.value
        return self.mf.get(key, default)

    def array(self, key: str) -> Any:
        return None if key == self.key else self.mf.array(key)

    def require(self, key: str) -> Any:
        if key != self.key:
            return self.mf.require(key)
        if self.value is None:
            raise ModelFileError(f"{self.mf.path}: missing metadata key `{key}`")
        return self.value


@pytest.mark.parametrize("key", ["attention.sliding_window", "attention.sliding_window_pattern",
                                 "attention.layer_norm_rms_epsilon",
                                 "embedding_length_per_layer_input", "feed_forward_length"])
def test_a_key_llama_cpp_requires_is_required_and_named(tiny_file: Path, key: str) -> None:
    with pytest.raises(ModelFileError, match=f"missing metadata key `gemma4.{key}`"):
        g.ModelArgs.from_file(Edited(ModelFile(tiny_file), f"gemma4.{key}"))  # type: ignore[arg-type]


@pytest.mark.parametrize("key,value", [("attention.shared_kv_layers", 2),
                                       ("embedding_length_per_layer_input", 256),
                                       ("rope.scaling.type", "yarn"),
                                       ("attention.sliding_window_pattern", 6)])
def test_what_the_engine_does_not_compute_is_refused_by_name(tiny_file: Path, key: str,
                                                             value: Any) -> None:
    with pytest.raises(ModelFileError, match=f"`gemma4.{key}`"):
        g.ModelArgs.from_file(Edited(ModelFile(tiny_file), f"gemma4.{key}", value))  # type: ignore[arg-type]


def test_gelu_is_ggmls_to_the_bit() -> None:
    """ggml's geglu (F32 rows: its F16 GELU table) against `gemma4.gelu` times up, on every
    finite F16 value (the whole table), F32 values between them, the ±10 edges and beyond."""
    lib = ggml.lib()
    fn = lib.base.ggml_geglu_split
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p] * 3
    rng = np.random.default_rng(0)
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = np.concatenate([every[np.isfinite(every)], rng.standard_normal(4000) * 3,
                        np.linspace(-12, 12, 4001), [-10, 10, -10.0001, 9.9999]]
                       ).astype(np.float32)
    up = rng.standard_normal(x.size).astype(np.float32)
    ctx = ggml.Context(lib, 8, 8, 1 << 21)
    out = ctx.op("geglu_split", ctx.tensor(ggml.F32, x.shape, x.ctypes.data),
                 ctx.tensor(ggml.F32, up.shape, up.ctypes.data))
    ctx.graph([out], ggml.Threads(lib, 1)).compute()
    assert np.array_equal(ctx.array(out, x.shape, np.float32), gemma4.gelu(x) * up)


@pytest.fixture(scope="module")
def tiny_engine(tiny_file: Path) -> Iterator[Engine]:
    with numpy_engine(tiny_file) as engine:
        yield engine


def test_a_sliding_layer_sees_only_its_window(tiny_engine: Engine) -> None:
    """Layer 0 slides (window 16): what is in its cache further back than the window does
    not change its output; layer 2 attends in full, and it does."""
    check_the_window(tiny_engine.model, 2)


def test_the_folded_router_is_the_router_on_its_normed_input(tiny_engine: Engine) -> None:
    """What the predictor multiplies (`router_matrix`) gives the logits the router computes
    from the same normed input, its 1/sqrt(d) and per-channel scale folded in."""
    model = tiny_engine.model
    unit = np.random.default_rng(2).standard_normal(model.args.embedding_length)
    unit = (unit / np.sqrt(np.mean(unit ** 2))).astype(np.float32)
    for i, layer in enumerate(model.layers):
        logits = layer.moe.logits(unit)
        assert np.abs(model.router_matrix(i) @ unit - logits).max() <= \
            1e-5 * np.abs(logits).max()
        assert model.router_bias(i) is None


def test_batched_prefill_equals_token_by_token(tiny_file: Path) -> None:
    check_batched_prefill(tiny_file)


def test_a_streamed_run_with_the_predictor_reports_every_layer(tiny_file: Path) -> None:
    """Streaming (a cache smaller than the experts) and the stale-gate predictor run on
    gemma4 as on qwen3moe: its control (the router on its own input) reads 100%."""
    cfg = EngineConfig(model=str(tiny_file), prompt="Predict me", n_tokens=24, seed=3,
                       cache_mib=0.25, predict_log=True)
    with Engine(cfg, tiny_file) as engine:
        result = engine.run()
    layers = result.extra["predict"]["per_layer"]
    assert len(layers) == 4
    for row in layers:
        assert row["control"]["exact_pct"] == 100.0, row


def _continuation_logits(path: Path, kernels: str, n_prompt: int = 10) -> np.ndarray:
    """The logits of tokens 2..41 fed one at a time after a batch of the first
    `n_prompt` (past the tiny preset's window of 16) → (40 - n_prompt, vocab)."""
    seq = list(range(2, 42))
    cfg = EngineConfig(model=str(path), prompt_tokens=tuple(seq), n_tokens=1,
                       n_ctx=len(seq) + 1, ignore_eos=True, threads=1, kernels=kernels,
                       repack=False)
    with Engine(cfg, path) as engine:
        engine.model.prefill(seq[:n_prompt], 0)
        return np.array([engine.model.forward(t, pos, 1)
                         for pos, t in enumerate(seq) if pos >= n_prompt])


def test_the_graph_model_computes_what_the_numpy_model_computes(tiny_file: Path) -> None:
    """`--kernels ggml` (gemma4_graph: llama.cpp's graph on ggml's ops, the experts on
    the expert graph with GeluExperts' steps) agrees with the numpy model within float
    rounding (measured 9.5e-5 of |logit| 7.5): the same arithmetic in other orders, and
    GELU's F16 rounding of inputs that differ in their last bit. That the graph is
    llama.cpp's to the bit is tests/test_llamacpp_gemma4.py's (quantized files)."""
    from abbench.engine.arch.gemma4.graph import GraphModel

    with Engine(EngineConfig(model=str(tiny_file), prompt="x", n_tokens=1, kernels="ggml"),
                tiny_file) as engine:
        assert isinstance(engine.model, GraphModel)
    ours = _continuation_logits(tiny_file, "ggml")
    reference = _continuation_logits(tiny_file, "numpy")
    assert np.abs(ours - reference).max() <= 1e-4 * np.abs(reference).max()
    assert (ours.argmax(axis=1) == reference.argmax(axis=1)).all()


def test_a_quantized_file_takes_the_graph_and_scales_each_expert(tmp_path: Path) -> None:
    """Quantized experts: `--kernels auto` computes them in their type (the graph model),
    and the expert graph's steps (geglu, then each row times its expert's scale) are
    GeluExperts' numpy ones on the same products."""
    from dataclasses import replace

    from abbench.engine.arch.gemma4.graph import GraphModel
    from abbench.engine.kernels.qcompute import QuantTeam

    path = tmp_path / "gemma4-tiny-q8.gguf"
    synth.write_model(replace(synth.named("gemma4-tiny"), expert_type="Q8_0"), path)
    cfg = EngineConfig(model=str(path), prompt="The quick brown fox", n_tokens=8, temp=0.0,
                       ignore_eos=True, threads=1, resident=True, repack=False)
    with Engine(cfg, path) as engine:
        assert isinstance(engine.model, GraphModel) and engine.kernels == "ggml"
        runner, team = engine.runner, engine.runner.team
        layer, experts = 1, np.array([[5, 0], [2, 7]])  # (n, k) expert ids
        slots = np.array([[runner.cache.entries[(layer, int(e))].index for e in row]
                          for row in experts])
        x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
        y = team.rows(runner.kinds[layer], x, slots, experts, layer)  # (n, k, d)
        # the same experts' graph without scales: the plain products, from the same slots
        other = QuantTeam(1, False, gemma4.GeluExperts(None))
        try:
            plain = other.rows(runner.kinds[layer], x, slots)  # (n, k, d)
        finally:
            other.close()
        scales = team.ffn.scales
        assert scales is not None
        assert np.array_equal(y, plain * scales[layer][experts][..., None])
        assert len(engine.run().output_ids) == 8


def test_the_graph_models_ring_wraps_as_the_window_slides(tmp_path: Path) -> None:
    """Past the sliding layers' ring (768 cells at a context of 2048: the window and
    llama.cpp's micro-batch of 512, in blocks of 256) positions reuse its cells, a prompt
    batch that crosses its end is written in two pieces, and what the window still sees
    is the numpy model's (a cache as long as the context) within float rounding."""
    from dataclasses import replace

    path = tmp_path / "gemma4-tiny-2k.gguf"
    synth.write_model(replace(synth.named("gemma4-tiny"), context_length=2048), path)
    seq = [3 + (7 * i) % 250 for i in range(830)]

    def logits(kernels: str) -> np.ndarray:
        cfg = EngineConfig(model=str(path), prompt_tokens=tuple(seq), n_tokens=1,
                           n_ctx=900, ignore_eos=True, threads=1, kernels=kernels)
        with Engine(cfg, path) as engine:
            model = engine.model
            if kernels == "ggml":
                assert model.sliding.swa_size == 768 and model.kv_size == 1024
            model.prefill(seq[:700], 0)
            model.prefill(seq[700:800], 700)  # cells 700..767, then 0..31
            return np.array([model.forward(t, pos, 1)
                             for pos, t in enumerate(seq) if pos >= 800])

    ours, reference = logits("ggml"), logits("numpy")
    assert np.abs(ours - reference).max() <= 1e-4 * np.abs(reference).max()
