"""Parity of gemma4's two models (Gemma 4 MoE: sliding and full layers, a dense FFN beside
the experts, softcapped logits) with llama.cpp, as tests/test_llamacpp.py checks the other
architectures (its helpers and settings, imported):

- The same text gives the same token ids as `llama-tokenize` on the gemma4 file (its BPE
  on raw text with "▁" for spaces, cut only at newlines, byte tokens for the rest, BOS
  always added).
- `abbench engine run --show-text` prints what `llama-completion` prints for 64 greedy
  tokens on `gemma4-tiny` and `gemma4-small`, llama.cpp's attention in F32, with the graph
  model (`--kernels auto`) and with the numpy model (`--kernels numpy`).
- The graph model (`gemma4_graph.py`: llama.cpp's graph on ggml's ops) on those presets
  and on quantized files (Q8_0, the Q4_K_M mix): the same text, and logits at all 64
  positions equal to llama.cpp's to the bit (max abs difference 0.0).
- The numpy model's logits at every position of that continuation agree with llama.cpp's
  (in this process, through llama-cpp-python) within 2e-4 of their largest magnitude
  (measured here: 3.0e-5 on tiny, 7.2e-5 on small). Not to the bit: numpy's exp/tanh and
  summation orders are not ggml's, and GELU rounds its input to F16 (ggml's table, which
  the model reproduces to the bit), so where the two engines' F32 inputs differ in the
  last bit across an F16 rounding boundary, that activation differs by an F16 step (2^-11).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_llamacpp import (
    N_TOKENS,
    TEXTS,
    _abbench_text,
    _llama_completion,
    decodes_as_llama_cpp,
    llama_bin,
    llama_token_ids,
    numpy_logits,
    write_presets,
)

from abbench.engine import synth
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.tokenizer import tokenizer_for

pytestmark = pytest.mark.slow

__all__ = ["llama_bin"]  # the fixture, shared with tests/test_llamacpp.py
PRESETS = ("gemma4-tiny", "gemma4-small")
# Gemma's own tokens, runs of newlines (a run that is a token is taken whole), "▁" typed
GEMMA = ["<bos>hi<|turn>user\nHello<turn|>\n", "\n\n\nx\n", "\u2581lit\u2581",
         "ab  \n  cd", "\t\t\n\n \n"]


@pytest.fixture(scope="module")
def gemma4_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_presets(tmp_path_factory.mktemp("gemma4"), PRESETS)


@pytest.mark.parametrize("text", TEXTS + GEMMA)
def test_the_same_text_gives_llama_cpps_token_ids(llama_bin: Path, text: str,
                                                  gemma4_models: dict[str, Path]) -> None:
    model = gemma4_models["gemma4-tiny"]
    assert tokenizer_for(ModelFile(model)).encode(text) == llama_token_ids(llama_bin, model,
                                                                            text)


@pytest.mark.parametrize("kernels", ["auto", "numpy"])
@pytest.mark.parametrize("preset", PRESETS)
def test_64_greedy_tokens_print_what_llama_completion_prints(
        llama_bin: Path, gemma4_models: dict[str, Path], preset: str, kernels: str) -> None:
    model = gemma4_models[preset]
    # `--kernels auto`: the graph model (gemma4's choice for F32 experts too); numpy: the
    # numpy model
    ours = _abbench_text(model, "--kernels", kernels)
    theirs = _llama_completion(llama_bin, model)
    assert theirs == ours, (ours, theirs)
    assert ours


@pytest.mark.parametrize("preset", PRESETS)
def test_the_logits_agree_with_llama_cpps(gemma4_models: dict[str, Path],
                                          preset: str) -> None:
    model = gemma4_models[preset]
    ours, theirs = numpy_logits(model, N_TOKENS)  # (n, vocab) each
    scale = float(np.abs(theirs).max())
    diff = float(np.abs(ours - theirs).max())
    print(f"{preset}: logits' max abs difference {diff:.3g} (of max |logit| {scale:.3g})")
    assert diff <= 2e-4 * scale


# gemma4 files for the graph model: quantized (dense and experts: Q8_0, or the Q4_K_M
# mix's types where a row allows them, else its fallbacks; `--kernels auto` takes the graph
# for them) and the F32 presets (`--kernels ggml`)
GRAPH_FILES = [("gemma4-tiny", "Q8_0"), ("gemma4-small", "Q8_0"), ("gemma4-small", "Q4_K_M"),
               ("gemma4-tiny", "F32"), ("gemma4-small", "F32")]


@pytest.mark.parametrize("preset,qtype", GRAPH_FILES)
def test_the_graph_model_decodes_as_llama_cpp_decodes_it(
        llama_bin: Path, tmp_path_factory: pytest.TempPathFactory, preset: str,
        qtype: str) -> None:
    """gemma4's graph model (llama.cpp's graph on ggml's ops): the text is
    llama-completion's and the logits at all 64 positions are llama.cpp's to the bit —
    GELU, RoPE, the softmaxes and the softcap's tanh are ggml's own ops here (the numpy
    model's 2e-4 is its own arithmetic). Both with `--no-repack`, and llama.cpp with the
    engine's passes (as tests/test_llamacpp.py's quantized test says why)."""
    model = tmp_path_factory.mktemp("gemma4-graph") / f"{preset}-{qtype}.gguf"
    synth.write_model(replace(synth.named(preset), expert_type=qtype, dense_type=qtype),
                      model)
    decodes_as_llama_cpp(llama_bin, model, f"{preset} {qtype}", "--kernels", "ggml")
