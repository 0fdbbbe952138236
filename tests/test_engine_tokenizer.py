"""llama.cpp's SPM tokenizer (`tokenizer.ggml.model = "llama"`): the merge rule by hand,
the space prefix, special tokens, byte fallback, BOS/EOS and what decoding hides; its
byte-level BPE (`gpt2`) on the synthetic BPE vocabulary: round trips, special tokens, a
deterministic vocabulary, and files it cannot read. The same texts against a real
llama.cpp build are in tests/test_llamacpp.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gguf import TokenType
from test_engine_gguf_file import rewrite_gguf

from abbench.engine import synth
from abbench.engine.gguf_file import ModelFile
from abbench.engine.tokenizer import (
    SPACE,
    BpeTokenizer,
    SpmTokenizer,
    Vocab,
    byte_alphabet,
    end_of_generation,
    read_vocab,
    tokenizer_for,
)
from abbench.errors import ModelFileError, UsageError

SPECIAL = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
N, C, U, B, D = (int(TokenType.NORMAL), int(TokenType.CONTROL), int(TokenType.UNKNOWN),
                 int(TokenType.BYTE), int(TokenType.USER_DEFINED))


def vocab(pieces: dict[str, float] | None = None, user: tuple[str, ...] = (),
          **kw: bool) -> SpmTokenizer:
    """Special tokens, the 256 byte tokens, then `pieces` (text: score) and user tokens."""
    pieces = pieces or {}
    tokens = SPECIAL + BYTES + list(pieces) + list(user)
    scores = [0.0] * (3 + 256) + list(pieces.values()) + [0.0] * len(user)
    types = [U, C, C] + [B] * 256 + [N] * len(pieces) + [D] * len(user)
    settings = {"add_bos": True, "add_eos": False, "add_space_prefix": True} | kw
    return SpmTokenizer(Vocab(tuple(tokens), tuple(scores), tuple(types), 1, 2, **settings))


def texts(tok: SpmTokenizer, ids: list[int]) -> list[str]:
    return [tok.vocab.tokens[i] for i in ids]


def byte_ids(text: str) -> list[int]:
    return [3 + b for b in text.encode("utf-8")]


def test_bytes_only_vocabulary_spells_the_escaped_text_with_bos() -> None:
    tok = vocab()
    # A leading space is added and every space becomes "▁", as llama.cpp does for SPM.
    assert tok.encode("Hi there") == [1, *byte_ids(f"{SPACE}Hi{SPACE}there")]
    assert tok.encode("") == [1]
    assert tok.encode("Hi", add_special=False) == byte_ids(f"{SPACE}Hi")


def test_pairs_merge_best_score_first_and_leftmost_on_a_tie() -> None:
    # "abc": ab (score 1) and bc (score 2) compete for b: bc wins, then a stays alone.
    tok = vocab({"ab": 1.0, "bc": 2.0}, add_space_prefix=False)
    assert texts(tok, tok.encode("abc", add_special=False)) == ["<0x61>", "bc"]
    # Equal scores: the leftmost pair merges first.
    tied = vocab({"ab": 1.0, "bc": 1.0}, add_space_prefix=False)
    assert texts(tied, tied.encode("abc", add_special=False)) == ["ab", "<0x63>"]
    # Merges build on merges: a+b, then ab+c.
    chain = vocab({"ab": 1.0, "abc": 0.5}, add_space_prefix=False)
    assert texts(chain, chain.encode("abcab", add_special=False)) == ["abc", "ab"]


def test_a_word_piece_with_the_space_marker() -> None:
    tok = vocab({f"{SPACE}t": -1.0, f"{SPACE}the": -0.5, "th": -2.0, "he": -3.0})
    assert texts(tok, tok.encode("the", add_special=False)) == [f"{SPACE}the"]


def test_special_tokens_in_the_text_are_tokens_and_reopen_the_space_prefix() -> None:
    tok = vocab()
    ids = tok.encode("a</s>b")
    assert ids == [1, *byte_ids(f"{SPACE}a"), 2, *byte_ids(f"{SPACE}b")]
    # Without parse_special, control tokens are plain text; user-defined ones still match.
    assert tok.encode("a</s>", parse_special=False) == [1, *byte_ids(f"{SPACE}a</s>")]
    user = vocab(user=("<tool>",))
    tool = len(user.vocab.tokens) - 1
    assert user.encode("x<tool>", add_special=False, parse_special=False) == [
        *byte_ids(f"{SPACE}x"), tool]


def test_add_eos_and_no_bos_follow_the_file() -> None:
    tok = vocab(add_bos=False, add_eos=True)
    assert tok.encode("a") == [*byte_ids(f"{SPACE}a"), 2]


def test_decode_hides_control_tokens_and_joins_bytes() -> None:
    tok = vocab({f"{SPACE}c": 3.0, f"{SPACE}ca": 2.0, f"{SPACE}caf": 1.0})
    ids = tok.encode("café")
    assert texts(tok, ids)[:2] == ["<s>", f"{SPACE}caf"]
    assert tok.decode(ids) == " café"  # BOS hidden, "▁" a space, é's two bytes joined
    assert tok.decode([2, 0, 10_000, -1]) == ""
    assert tok.decode([3 + 0xC3]) == "\ufffd"  # a lone lead byte


def test_a_byte_the_vocabulary_cannot_spell_is_a_clear_error() -> None:
    v = vocab().vocab
    missing = SpmTokenizer(Vocab(v.tokens[:3] + v.tokens[4:], v.scores[1:], v.types[1:], 1, 2,
                                 True, False, True))
    with pytest.raises(UsageError, match="byte 0x00") as e:
        missing.encode("\x00")
    assert e.value.tip is not None and "--prompt-tokens" in e.value.tip


def test_the_synthetic_vocabulary_from_the_file(tiny_model: Path) -> None:
    tok = SpmTokenizer.from_model(ModelFile(tiny_model))
    assert tok.vocab.bos_id == synth.BOS_ID and tok.vocab.add_bos
    ids = tok.encode("Grüße")
    assert ids[0] == synth.BOS_ID and len(ids) == 1 + len(f"{SPACE}Grüße".encode())
    # Byte tokens decode to their bytes, "▁" (E2 96 81) included, as llama.cpp prints them.
    assert tok.decode(ids) == f"{SPACE}Grüße"
    assert read_vocab(ModelFile(tiny_model)).add_space_prefix


# -- byte-level BPE (`gpt2`) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe") / "tiny-bpe.gguf"
    synth.write_model(replace(synth.preset("tiny"), tokenizer="gpt2"), path)
    return path


def test_the_byte_alphabet_spells_each_byte_once() -> None:
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert all(alphabet[b] == chr(b) for b in range(ord("!"), ord("~") + 1))
    assert alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ"  # GPT-2's spellings


def test_the_synthetic_bpe_vocabulary_from_the_file(tiny_bpe: Path) -> None:
    tok = tokenizer_for(ModelFile(tiny_bpe))
    v = tok.vocab
    assert isinstance(tok, BpeTokenizer) and v.model == "gpt2" and v.pre == "qwen2"
    assert len(v.tokens) == synth.BPE_VOCAB_SIZE and len(v.merges) > 100
    assert not v.add_bos and not v.add_space_prefix and v.bos_id == v.eos_id == 0
    # Merges do their work: a word from the corpus is fewer tokens than its bytes.
    assert len(tok.encode(" engine")) < len(" engine")


@pytest.mark.parametrize("text", ["Hello world", "naïve café – 東京 🚀", "  two  spaces  ",
                                  "3.14159 and 2026", "line\nbreak\ttab", "it's DON'T", "a"])
def test_bpe_decodes_to_the_text_it_encoded(tiny_bpe: Path, text: str) -> None:
    tok = tokenizer_for(ModelFile(tiny_bpe))
    ids = tok.encode(text)
    assert all(0 <= i < len(tok.vocab.tokens) for i in ids)
    assert tok.decode(ids) == text


def test_bpe_special_tokens_in_the_text_are_tokens_that_print_nothing(tiny_bpe: Path) -> None:
    tok = tokenizer_for(ModelFile(tiny_bpe))
    start = tok.vocab.tokens.index("<|im_start|>")
    ids = tok.encode("<|im_start|>hi<|endoftext|>")
    assert ids[0] == start and ids[-1] == 0
    assert tok.decode(ids) == "hi" and tok.piece(start) == b""
    assert tok.encode("<|im_start|>", parse_special=False) != [start]


def test_the_bpe_vocabulary_is_the_same_every_time(tiny_bpe: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.gguf"
    synth.write_model(replace(synth.preset("tiny"), tokenizer="gpt2"), again)
    assert again.read_bytes() == tiny_bpe.read_bytes()


def test_an_unsupported_pre_tokenizer_names_the_key(tiny_bpe: Path, tmp_path: Path) -> None:
    odd = rewrite_gguf(tiny_bpe, tmp_path / "odd.gguf",
                       set_keys={"tokenizer.ggml.pre": "llama3"})
    with pytest.raises(UsageError, match=r"`tokenizer.ggml.pre` = 'llama3' is not supported"):
        tokenizer_for(ModelFile(odd))
    bare = rewrite_gguf(tiny_bpe, tmp_path / "bare.gguf", drop_keys={"tokenizer.ggml.merges"})
    with pytest.raises(ModelFileError, match="tokenizer.ggml.merges"):
        tokenizer_for(ModelFile(bare))


def test_end_of_generation_is_eos_and_llama_cpps_named_tokens(tmp_path: Path) -> None:
    """The BPE synthetic vocabulary: <|endoftext|> is EOS (0) and <|im_end|> (2) ends
    generation too, as llama.cpp's vocabulary loader marks it; <|im_start|> does not."""
    path = tmp_path / "bpe.gguf"
    synth.write_model(replace(synth.preset("tiny"), tokenizer="gpt2"), path)
    assert end_of_generation(ModelFile(path)) == {0, 2}
    spm = tmp_path / "spm.gguf"
    synth.write_model(synth.preset("tiny"), spm)
    assert end_of_generation(ModelFile(spm)) == {synth.EOS_ID}
