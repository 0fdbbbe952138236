"""Parity with llama.cpp's default attention (`--flash-attn`): flash attention over an F16
KV cache, as `llama-completion` computes it by default on CPU (`-fa on`), on every
architecture's graph model — the helpers and settings of tests/test_llamacpp.py, imported.

`abbench engine run --flash-attn --show-text` prints what `llama-completion -fa on` prints
for 64 greedy tokens, and the logits at all 64 positions are llama.cpp's with
`flash_attn=True` to the bit (max abs difference 0.0): the F16 cache written by a copy
from F32 (llama.cpp's set_rows rounds the same way), V by rows, the causal mask cast to
F16, ggml's `flash_attn_ext` with the layer's sinks and F32 accumulators, as
`build_attn_mha` builds them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_llamacpp import (
    PROMPT,
    _abbench_text,
    _llama_completion,
    decodes_as_llama_cpp,
    llama_bin,
)

from abbench.engine import synth
from abbench.engine.architectures import TABLE, preset_name
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.tokenizer import tokenizer_for

pytestmark = pytest.mark.slow

__all__ = ["llama_bin"]  # the fixture, shared with tests/test_llamacpp.py
# every architecture's presets (their graph models, `--kernels ggml`), and the first row's
# small one in Q8_0 as its graph computes quantized files
PRESETS = [preset_name(a.name, size) for a in TABLE for size in ("tiny", "small")]
PRESETS.append(preset_name(TABLE[0].name, "small") + "-Q8_0")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("flash-attn")
    paths = {}
    for name in PRESETS:
        spec = synth.named(name.removesuffix("-Q8_0"))
        if name.endswith("-Q8_0"):
            spec = replace(spec, expert_type="Q8_0", dense_type="Q8_0")
        paths[name] = folder / f"{name}.gguf"
        synth.write_model(spec, paths[name], name=name)
    return paths


@pytest.mark.parametrize("name", PRESETS)
def test_flash_attention_decodes_as_llama_cpps_default(llama_bin: Path, name: str,
                                                        models: dict[str, Path]) -> None:
    decodes_as_llama_cpp(llama_bin, models[name], f"{name} --flash-attn", "--kernels",
                         "ggml", drop_nul=True, flash=True)


@pytest.mark.parametrize("flash", [False, True], ids=["f32-attention", "flash-attn"])
@pytest.mark.parametrize("name", [n for n in PRESETS if n.endswith("small")])
def test_a_resident_run_one_graph_a_pass_prints_what_llama_completion_prints(
        llama_bin: Path, name: str, flash: bool, models: dict[str, Path]) -> None:
    """`--resident` on ggml: the prompt's batch and each decode token are one graph each,
    the experts `mul_mat_id` inside it (`arch/shared/token_graph.py`); the text is
    llama-completion's, run with the same passes (the prompt but its last token one
    batch). Both attentions."""
    model = models[name]
    ours = _abbench_text(model, "--kernels", "ggml", "--resident",
                         *(("--flash-attn",) if flash else ()))
    n = len(tokenizer_for(ModelFile(model)).encode(PROMPT))
    theirs = _llama_completion(llama_bin, model, "--no-repack", "-b", str(n - 1), "-ub",
                               str(n - 1), flash=flash)
    assert theirs == ours.replace(b"\x00", b"")  # NUL bytes: llama.cpp's logger drops them
    assert ours
