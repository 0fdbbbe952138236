"""The synthetic gemma4 files (synth_gemma4.py, the `gemma4` vocabulary of synth_vocab.py)
and the `gemma4` tokenizer's rules on them, without llama.cpp (tests/test_llamacpp_gemma4.py
checks them against llama-tokenize and llama-completion)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from abbench.engine import synth
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.synth.gemma4 import swa_layers
from abbench.engine.synth.vocab import GEMMA4_SPECIAL, vocab_of
from abbench.engine.text.tokenizer import Gemma4Tokenizer, tokenizer_for
from abbench.errors import UsageError


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemma4") / "gemma4-tiny.gguf"
    synth.write_model(synth.arch_preset("gemma4", "tiny"), path)
    return path


def test_the_presets_are_gemma4s_with_a_window() -> None:
    for name in ("tiny", "small"):
        spec = synth.arch_preset("gemma4", name)
        assert (spec.arch, spec.tokenizer) == ("gemma4", "gemma4") and spec.sliding_window
    with pytest.raises(UsageError, match="sliding_window"):
        replace(synth.named("gemma4-tiny"), sliding_window=0)


def test_every_third_layer_attends_in_full() -> None:
    assert swa_layers(8) == [True, True, False, True, True, False, True, True]


def test_the_file_has_the_keys_and_tensors_llama_cpp_requires(tiny_file: Path) -> None:
    mf = ModelFile(tiny_file)
    assert mf.architecture == "gemma4"
    for key in ("attention.sliding_window", "attention.layer_norm_rms_epsilon",
                "embedding_length_per_layer_input", "attention.key_length_swa",
                "attention.value_length_swa"):
        assert mf.get(f"gemma4.{key}") is not None, key
    assert mf.array("gemma4.attention.sliding_window_pattern") == [True, True, False, True]
    assert "rope_freqs.weight" in mf.tensors and "blk.2.attn_v.weight" not in mf.tensors
    assert mf.tensor("blk.2.attn_q.weight").shape == (4 * 32, 64)  # a full layer's heads


def test_the_vocabulary_is_gemmas_specials_bytes_then_learned_tokens() -> None:
    v = vocab_of("gemma4")
    assert v.tokens[: len(GEMMA4_SPECIAL)] == GEMMA4_SPECIAL
    assert v.tokens[len(GEMMA4_SPECIAL)] == "<0x00>" and len(v.tokens) == 512
    assert all(" " not in t for t in v.tokens)  # spaces are "▁" in gemma4's vocabulary
    assert v.merges and (v.bos, v.eos) == (2, 1)


def test_the_tokenizer_adds_bos_takes_newline_runs_whole_and_spells_the_rest_in_bytes(
        tiny_file: Path) -> None:
    tok = tokenizer_for(ModelFile(tiny_file))
    assert isinstance(tok, Gemma4Tokenizer)
    ids = tok.encode("\n\n")
    assert ids == [2, tok.vocab.tokens.index("\n\n")]
    clef = tok.encode("\U0001d11e")[1:]  # not in the corpus: four byte tokens
    assert [tok.vocab.tokens[i] for i in clef] == ["<0xF0>", "<0x9D>", "<0x84>", "<0x9E>"]
    text = "The quick brown fox, naïve 東京\n\nok \U0001d11e"
    assert tok.decode(tok.encode(text)) == text
