"""Byte-fallback tokenization: UTF-8 round trips, BOS, and the refusal without byte tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from abbench.engine import synth
from abbench.engine.gguf_file import ModelFile
from abbench.engine.tokenizer import ByteTokenizer
from abbench.errors import UsageError

VOCAB = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
TEXTS = ["Hello, world!", "naïve café – 東京 🚀", "", "line\nbreak\ttab \x00 nul"]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip_with_bos(text: str) -> None:
    tok = ByteTokenizer(VOCAB, bos_id=1, add_bos=True)
    ids = tok.encode(text)
    raw = text.encode("utf-8")
    assert ids[0] == 1
    assert ids[1:] == [3 + b for b in raw]  # one byte token per UTF-8 byte
    assert tok.decode(ids) == text


def test_no_bos_when_not_asked() -> None:
    tok = ByteTokenizer(VOCAB, bos_id=1, add_bos=False)
    assert tok.encode("A") == [3 + ord("A")]
    assert ByteTokenizer(VOCAB, bos_id=None, add_bos=True).encode("A") == [3 + ord("A")]


def test_byte_tokens_are_found_wherever_they_sit() -> None:
    vocab = list(reversed(VOCAB)) + ["\u2581the", "word"]
    tok = ByteTokenizer(vocab, bos_id=None, add_bos=False)
    ids = tok.encode("é")
    assert [vocab[i] for i in ids] == ["<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "é"
    # non-byte tokens decode to their text, SentencePiece's \u2581 as a space
    assert tok.decode([len(VOCAB), len(VOCAB) + 1]) == " theword"


def test_decode_skips_control_and_unknown_ids_and_replaces_broken_utf8() -> None:
    tok = ByteTokenizer(VOCAB, bos_id=1, add_bos=True)
    assert tok.decode([1, 2, 0, 3 + ord("a"), 10_000, -1]) == "a"
    assert tok.decode([3 + 0xC3]) == "\ufffd"  # a lone lead byte


def test_vocabulary_without_byte_tokens_asks_for_prompt_tokens() -> None:
    bpe = ["<s>", "</s>", "Ġthe", "a", "b"]
    with pytest.raises(UsageError, match="no byte tokens") as e:
        ByteTokenizer(bpe, bos_id=0, add_bos=True)
    assert e.value.tip is not None and "--prompt-tokens" in e.value.tip


def test_vocabulary_missing_one_byte_token_is_refused() -> None:
    vocab = [t for t in VOCAB if t != "<0x7F>"]
    with pytest.raises(UsageError):
        ByteTokenizer(vocab, bos_id=1, add_bos=True)


def test_from_model_reads_the_synthetic_vocabulary(tiny_model: Path) -> None:
    tok = ByteTokenizer.from_model(ModelFile(tiny_model))
    assert tok.bos_id == synth.BOS_ID
    ids = tok.encode("Grüße")
    assert ids[0] == synth.BOS_ID
    assert len(ids) == 1 + len("Grüße".encode())
    assert tok.decode(ids) == "Grüße"
