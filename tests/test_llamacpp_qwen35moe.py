"""Parity of the qwen35moe numpy model (Qwen3.5/3.6 MoE: gated delta-net layers, a gated
full-attention layer every 4th, a shared expert) with llama.cpp, as tests/test_llamacpp.py
checks the other architectures (its helpers and settings, imported):

- The same text gives the same token ids as `llama-tokenize` on the qwen35moe file (the
  `qwen35` pre-tokenizer: qwen2's with combining marks inside words).
- `abbench engine run --show-text` prints what `llama-completion` prints for 64 greedy
  tokens on `qwen35moe-tiny` and `qwen35moe-small`, llama.cpp's attention in F32, with the
  numpy model (`--kernels numpy`) and with `--kernels auto`'s graph model (the F32 presets
  run it: `arch.GRAPH_FOR_F32`; llama.cpp then with the engine's passes). One
  printing rule differs: llama.cpp's logger writes each piece as a C string, so a token
  whose text is the byte 0 prints nothing there (it does on qwen35moe-small); the engine
  prints the byte. The comparison drops NUL bytes from the engine's text.
- The numpy model's logits at every position of that continuation agree with llama.cpp's
  (in this process, through llama-cpp-python) within 1e-5 of their largest magnitude
  (measured: 8.4e-6 and 4.1e-6 of 7.5 and 7.8), and its 64 greedy token ids are
  llama.cpp's: not to the bit, as numpy's exp/sigmoid and summation orders are not ggml's.
- Quantized files (Q8_0 on both presets; Q4_K_M and Q6_K on the small one, whose widths
  are whole K-quant blocks; every matrix in the type or by the mix's rules), which
  `--kernels auto` computes with the graph model (engine/arch/qwen35moe/graph.py:
  llama.cpp's graph, ggml's ops): the text is llama-completion's and the logits at all 64
  positions are llama.cpp's to the bit, as tests/test_llamacpp.py checks qwen3moe's
  (`--no-repack` and the same passes on both sides). The graph model on the F32 presets
  (`--kernels ggml`) is bit-exact too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_llamacpp import (
    N_TOKENS,
    PROMPT,
    TEXTS,
    _abbench_text,
    _llama_completion,
    _max_logit_difference,
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
PRESETS = ("qwen35moe-tiny", "qwen35moe-small")
# marks the `qwen35` split keeps in a word where `qwen2`'s would cut it
MARKS = ["e\u0301te\u0301 cafe\u0301", "na\u0308ive \u0915\u093f\u0924\u093e\u092c"]


@pytest.fixture(scope="module")
def qwen35moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_presets(tmp_path_factory.mktemp("qwen35moe"), PRESETS)


@pytest.mark.parametrize("text", TEXTS + MARKS)
def test_the_same_text_gives_llama_cpps_token_ids(llama_bin: Path, text: str,
                                                  qwen35moe_models: dict[str, Path]) -> None:
    model = qwen35moe_models["qwen35moe-tiny"]
    assert tokenizer_for(ModelFile(model)).encode(text) == llama_token_ids(llama_bin, model,
                                                                            text)


@pytest.mark.parametrize("kernels", ["numpy", "auto"])
@pytest.mark.parametrize("preset", PRESETS)
def test_64_greedy_tokens_print_what_llama_completion_prints(
        llama_bin: Path, qwen35moe_models: dict[str, Path], preset: str, kernels: str) -> None:
    model = qwen35moe_models[preset]
    ours = _abbench_text(model, "--kernels", kernels)  # auto: the graph model
    # the graph model's bits depend on a pass's size as llama.cpp's do: its passes
    n = len(tokenizer_for(ModelFile(model)).encode(PROMPT))
    theirs = _llama_completion(llama_bin, model, *(
        ("-b", str(n - 1), "-ub", str(n - 1)) if kernels == "auto" else ()))
    assert theirs == ours.replace(b"\x00", b""), (ours, theirs)
    assert ours


@pytest.mark.parametrize("preset", PRESETS)
def test_the_logits_agree_with_llama_cpps(qwen35moe_models: dict[str, Path],
                                          preset: str) -> None:
    model = qwen35moe_models[preset]
    ours, theirs = numpy_logits(model, N_TOKENS)  # (n, vocab) each
    scale = float(np.abs(theirs).max())
    diff = float(np.abs(ours - theirs).max())
    print(f"{preset}: logits' max abs difference {diff:.3g} (of max |logit| {scale:.3g})")
    assert diff <= 1e-5 * scale
    # and the same greedy tokens, compared as ids (not through what a logger prints)
    assert ours.argmax(axis=1).tolist() == theirs.argmax(axis=1).tolist()


# (preset, type): K-quants need rows of whole 256-value blocks, which the tiny preset's
# width (64) is not
QUANTIZED = [("qwen35moe-tiny", "Q8_0"), ("qwen35moe-small", "Q8_0"),
             ("qwen35moe-small", "Q4_K_M"), ("qwen35moe-small", "Q6_K")]


@pytest.mark.parametrize("preset,qtype", QUANTIZED)
def test_a_quantized_file_decodes_as_llama_cpp_decodes_it(
        llama_bin: Path, tmp_path: Path, preset: str, qtype: str) -> None:
    model = tmp_path / f"{preset}-{qtype}.gguf"
    synth.write_model(replace(synth.named(preset), expert_type=qtype, dense_type=qtype), model)
    # `--kernels auto`: quantized experts, the graph model
    decodes_as_llama_cpp(llama_bin, model, f"{preset} {qtype}", drop_nul=True)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_graph_model_on_f32_files_is_llama_cpp_to_the_bit(
        qwen35moe_models: dict[str, Path], preset: str) -> None:
    diff = _max_logit_difference(qwen35moe_models[preset], N_TOKENS)  # `--kernels ggml`
    print(f"{preset} F32, graph model: logits' max abs difference {diff}")
    assert diff == 0.0
