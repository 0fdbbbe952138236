"""Every architecture in the table (engine/architectures.py) decodes as llama.cpp decodes
it, with the settings and helpers of tests/test_llamacpp.py: a row added to the table is
held to llama.cpp here with no test written for it.

For each row's `tiny` and `small` presets:
- `abbench engine run --show-text` prints what `llama-completion` prints for 64 greedy
  tokens, llama.cpp's attention in F32, with `--kernels auto` (the architecture's choice:
  the numpy model for F32 experts, or its graph; llama.cpp then with the engine's passes,
  which set the graph's bits). llama.cpp's logger prints each piece as a C string, so the
  engine's NUL bytes are set aside (tests/test_llamacpp_qwen35moe.py).
- The graph model (`--kernels ggml`: llama.cpp's graph, ggml's ops) gives llama.cpp's
  logits to the bit at all 64 positions, on the F32 file and with every matrix in Q8_0
  (whose 32-value blocks fit the tiny widths), and the Q8_0 file's text is
  llama-completion's.
- Where `--kernels auto` runs the numpy model on the F32 file, its logits agree with
  llama.cpp's within 1e-5 of their largest magnitude and its 64 greedy token ids are
  llama.cpp's (numpy's exp and summation orders are not ggml's, so not to the bit). The
  other rows' numpy models are held by their own tests (gpt-oss's MXFP4 experts;
  gemma4's and qwen35moe's graphs, `graph_for_f32`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_llamacpp import (
    N_TOKENS,
    PROMPT,
    _abbench_text,
    _llama_completion,
    _max_logit_difference,
    decodes_as_llama_cpp,
    llama_bin,
    numpy_logits,
)

from abbench.engine import synth
from abbench.engine.architectures import TABLE, preset_name
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.tokenizer import tokenizer_for

pytestmark = pytest.mark.slow

__all__ = ["llama_bin"]  # the fixture, shared with tests/test_llamacpp.py
PRESETS = [preset_name(a.name, size) for a in TABLE for size in ("tiny", "small")]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _model(models: dict[str, Path], folder: Path, preset: str, qtype: str = "") -> Path:
    key = f"{preset}-{qtype}" if qtype else preset
    if key not in models:
        spec = synth.named(preset)
        if qtype:
            spec = replace(spec, expert_type=qtype, dense_type=qtype)
        models[key] = folder / f"{key}.gguf"
        synth.write_model(spec, models[key])
    return models[key]


@pytest.fixture
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.getbasetemp() / "architectures"
    path.mkdir(exist_ok=True)
    return path


@pytest.mark.parametrize("preset", PRESETS)
def test_64_greedy_tokens_print_what_llama_completion_prints(
        llama_bin: Path, models: dict[str, Path], folder: Path, preset: str) -> None:
    model = _model(models, folder, preset)
    ours = _abbench_text(model)  # --kernels auto
    n = len(tokenizer_for(ModelFile(model)).encode(PROMPT))
    theirs = _llama_completion(llama_bin, model, "--no-repack", "-b", str(n - 1), "-ub",
                               str(n - 1))
    assert theirs == ours.replace(b"\x00", b""), (ours, theirs)
    assert ours


@pytest.mark.parametrize("preset", PRESETS)
def test_the_graph_model_is_llama_cpp_to_the_bit(models: dict[str, Path], folder: Path,
                                                 preset: str) -> None:
    diff = _max_logit_difference(_model(models, folder, preset), N_TOKENS)
    print(f"{preset}, graph model: logits' max abs difference {diff}")
    assert diff == 0.0


@pytest.mark.parametrize("preset", PRESETS)
def test_a_q8_0_file_decodes_as_llama_cpp_decodes_it(
        llama_bin: Path, models: dict[str, Path], folder: Path, preset: str) -> None:
    model = _model(models, folder, preset, "Q8_0")
    decodes_as_llama_cpp(llama_bin, model, f"{preset} Q8_0", "--kernels", "ggml",
                         drop_nul=True)


# the rows whose `--kernels auto` runs the numpy model on their F32 files (the others run
# their graph there, and their own tests hold the numpy model: gemma4's GELU within 2e-4)
NUMPY_PRESETS = [preset_name(a.name, size) for a in TABLE for size in ("tiny", "small")
                 if not a.graph_for_f32 and synth.named(preset_name(a.name, size)).expert_type
                 == "F32"]


@pytest.mark.parametrize("preset", NUMPY_PRESETS)
def test_the_numpy_model_agrees_with_llama_cpp(models: dict[str, Path], folder: Path,
                                               preset: str) -> None:
    ours, theirs = numpy_logits(_model(models, folder, preset), N_TOKENS)  # (n, vocab)
    scale = float(np.abs(theirs).max())
    diff = float(np.abs(ours - theirs).max())
    print(f"{preset}: logits' max abs difference {diff:.3g} (of max |logit| {scale:.3g})")
    assert diff <= 1e-5 * scale
    assert ours.argmax(axis=1).tolist() == theirs.argmax(axis=1).tolist()
