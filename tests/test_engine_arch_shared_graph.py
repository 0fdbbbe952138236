"""`--flash-attn`: attention as llama.cpp's default computes it on CPU (flash attention
over an F16 KV cache), on every architecture's graph model. Its parity with llama.cpp to
the bit is tests/test_llamacpp_flash_attn.py (slow); here, what it does besides: where it
runs, what it refuses, and that it attends over what F32 attention attends over (the
sliding ring wrapped, the masks) with F16's rounding as the only difference."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main
from test_engine_arch_gpt_oss import _logits

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine


@pytest.fixture(scope="module")
def gpt_oss_small_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("flash") / "gpt-oss-small-f32.gguf"
    synth.write_model(replace(synth.named("gpt-oss-small"), expert_type="F32"), path)
    return path


def test_flash_attention_attends_over_what_f32_attention_does_past_the_ring(
        gpt_oss_small_f32: Path) -> None:
    """900 prompt tokens: past the sliding window (32) and the sliding layers' ring (768
    cells: the second prefill batch wraps, decode writes cell p mod 768). A cell written
    or masked wrongly moves a logit by its whole size; F16's rounding of K and V by about
    a percent of the largest."""
    vocab = ModelFile(gpt_oss_small_f32).tensor("token_embd.weight").shape[0]
    prompt = [int(t) for t in np.random.default_rng(3).integers(10, vocab, 900)]
    f32 = _logits(gpt_oss_small_f32, "ggml", prompt, 8)
    flash = _logits(gpt_oss_small_f32, "ggml", prompt, 8, flash_attn=True)
    scale = np.abs(f32).max()
    assert not np.array_equal(flash, f32)  # another computation
    assert np.abs(flash - f32).max() <= 0.03 * scale
    assert (flash.argmax(axis=1) == f32.argmax(axis=1)).all()


def test_kernels_auto_takes_the_graph_model_with_f16_caches(tiny_model: Path) -> None:
    """The tiny qwen3moe file has F32 experts, which `auto` computes in numpy; flash
    attention is the graph model's, so `auto` takes it, and says so in the run's kernels."""
    cfg = EngineConfig(model=str(tiny_model), n_tokens=2, flash_attn=True, ignore_eos=True)
    with Engine(cfg, tiny_model) as engine:
        assert engine.kernels == "ggml"
        assert engine.kernel_info()["attention"] == "flash, F16 cache"
        caches = engine.model.caches
        assert {c.k.dtype for c in caches} == {c.v.dtype for c in caches} == {np.dtype(np.float16)}
        assert all(c.v.shape == c.k.shape for c in caches)  # V by rows, as flash reads it
        engine.run()
    with Engine(replace(cfg, flash_attn=False), tiny_model) as engine:
        assert engine.kernels == "numpy"
        assert engine.kernel_info()["attention"] == "F32"


def test_flash_attention_with_numpy_kernels_is_refused(
        tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_main(["engine", "run", "-m", str(tiny_model), "-n", "1", "-q",
                           "--kernels", "numpy", "--flash-attn"], capsys)
    assert rc == 2
    assert "flash_attn" in err or "--flash-attn" in err
    assert "numpy" in err and "Traceback" not in err
