"""llama.cpp's SPM tokenizer (`tokenizer.ggml.model = "llama"`): the merge rule by hand,
the space prefix, special tokens, byte fallback, BOS/EOS and what decoding hides; its
byte-level BPE (`gpt2`) on the synthetic BPE vocabulary: round trips, special tokens, a
deterministic vocabulary, and files it cannot read; gpt-oss's `gpt-4o` pre-tokenizer (words
read off llama.cpp's regex) and how its harmony tokens print, split and end generation. The
same texts against a real llama.cpp build are in tests/test_llamacpp.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFWriter, TokenType
from test_engine_gguf_model_file import rewrite_gguf
from tokenizers import Regex, pre_tokenizers

from abbench.engine import synth
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.tokenizer import (
    GPT4O_SPLIT,
    PRE_TOKENIZERS,
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
HARMONY = ("<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>",
           "<|return|>", "<|call|>")  # gpt-oss's, in the synthetic vocabulary's order
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


# -- gpt-oss: the `gpt-4o` pre-tokenizer and harmony's special tokens -------------------------


def words(text: str, pre: str = "gpt-4o") -> list[str]:
    """`text` cut by pre-tokenizer `pre`'s regex as BpeTokenizer runs it."""
    split = pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated")
    return [w for w, _ in split.pre_tokenize_str(text)]


# Each expectation read off llama.cpp's regex: letters run "not a-z"* then "not A-Z"+ (or
# "not a-z"+ then "not A-Z"*) behind one optional non-letter, non-digit, non-newline;
# a contraction stays on its word; digits go in threes; other symbols run together with
# newlines and slashes after them; whitespace before a word is left to the word.
GPT4O_WORDS = [
    ("Hello world", ["Hello", " world"]),
    ("camelCase HTTPServer ALLCAPS", ["camel", "Case", " HTTPServer", " ALLCAPS"]),
    ("don't DON'T I'm you're we'll it'S", ["don't", " DON'T", " I'm", " you're", " we'll",
                                            " it'S"]),
    ("'tis x 's", ["'tis", " x", " '", "s"]),  # a contraction ends a word, begins none
    ("12345 2026 3.14159", ["123", "45", " ", "202", "6", " ", "3", ".", "141", "59"]),
    ("a1 ٣٤٥٦", ["a", "1", " ", "٣٤٥", "٦"]),  # Arabic-Indic digits are digits
    # A non-ASCII letter is "not a-z" and "not A-Z" both (tiktoken's own regex would cut
    # "café" from "ÉTÉ"):
    ("naïve café", ["naïve", " café"]),
    ("Ελληνικά русский 東京", ["Ελληνικά", " русский", " 東京"]),
    ("caféÉTÉ ÉcoleNormale", ["caféÉ", "TÉ", " École", "Normale"]),
    ("e\u0301té", ["e", "\u0301té"]),  # a combining mark is no letter
    ("line\nbreak\ttab", ["line", "\n", "break", "\ttab"]),
    ("a\n\n  b", ["a", "\n\n", " ", " b"]),
    ("x \n y\r\n", ["x", " \n", " y", "\r\n"]),
    ("  two  spaces  ", [" ", " two", " ", " spaces", "  "]),
    ("end.\n\nNext a/b/", ["end", ".\n\n", "Next", " a", "/b", "/"]),
    ("Hello, world! 🚀🔥 $100", ["Hello", ",", " world", "!", " 🚀🔥", " $", "100"]),
]


@pytest.mark.parametrize(("text", "expected"), GPT4O_WORDS)
def test_the_gpt4o_pre_tokenizer_cuts_words_as_llama_cpps_regex(text: str,
                                                                 expected: list[str]) -> None:
    assert words(text) == expected
    assert "".join(expected) == text


def test_llama_cpps_other_names_for_the_gpt4o_pre_tokenizer() -> None:
    assert {p for p, r in PRE_TOKENIZERS.items() if r == GPT4O_SPLIT} == {
        "gpt-4o", "llama4", "kanana2", "talkie"}


def harmony_bpe(pre: str = "gpt-4o", special: tuple[str, ...] = HARMONY) -> BpeTokenizer:
    """gpt-oss's special tokens (control in the file, as its converter writes them), the
    byte alphabet, and one merge, "a B"; EOS is <|return|>."""
    tokens = [*special, *byte_alphabet(), "aB"]
    types = [C] * len(special) + [N] * 257
    v = Vocab(tuple(tokens), (0.0,) * len(tokens), tuple(types), 0,
              special.index("<|return|>"), False, False, False, model="gpt2",
              merges=("a B",), pre=pre)
    return BpeTokenizer(v)


def test_a_gpt4o_vocabulary_is_cut_by_its_own_regex() -> None:
    """qwen2 keeps "aB" one word, which the merge makes one token; gpt-4o cuts it."""
    assert harmony_bpe("qwen2").encode("aB") == [len(HARMONY) + 256]
    gpt4o = harmony_bpe()
    assert texts(gpt4o, gpt4o.encode("aB")) == ["a", "B"]


def test_harmony_tokens_print_and_end_does_not_end_generation() -> None:
    tok = harmony_bpe()
    ids = tok.encode("<|start|>assistant<|channel|>final<|message|>Hi<|end|>x<|return|>")
    shown = "<|start|>assistant<|channel|>final<|message|>Hi<|end|>x"
    assert tok.decode(ids) == shown  # <|return|> prints nothing; the rest print
    assert tok.end_ids == {0, 5, 6} and not tok.is_eog(4) and tok.is_eog(5)
    # User-defined tokens are split out even when special tokens are not parsed:
    plain = tok.encode("<|end|><|return|>", parse_special=False)
    assert plain[0] == 4 and 5 not in plain


def test_without_call_end_is_an_end_that_prints_nothing() -> None:
    tok = harmony_bpe(special=tuple(t for t in HARMONY if t != "<|call|>"))
    end = tok.vocab.tokens.index("<|end|>")
    assert tok.is_eog(end) and tok.piece(end) == b""


def test_end_of_generation_reads_the_files_role_ids(tiny_bpe: Path, tmp_path: Path) -> None:
    """`tokenizer.ggml.eot_token_id` joins the set, as llama.cpp adds it."""
    r = GGUFReader(tiny_bpe)
    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(path, "qwen3moe")
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                "tokenizer.ggml.eos_token_id"):
        field = r.fields[key]
        sub = field.types[-1] if len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), field.types[0], sub)
    w.add_uint32("tokenizer.ggml.eot_token_id", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    assert read_vocab(ModelFile(path)).role_ids == (("eot", 1),)
    assert end_of_generation(ModelFile(path)) == {0, 1, 2}


def test_end_of_generation_without_a_usable_tokenizer(tiny_bpe: Path, tmp_path: Path) -> None:
    """A pre-tokenizer this cannot run (the prompt then comes as ids): the ends are still
    found from the token texts and the EOS."""
    odd = rewrite_gguf(tiny_bpe, tmp_path / "odd.gguf",
                       set_keys={"tokenizer.ggml.pre": "llama3"})
    assert end_of_generation(ModelFile(odd)) == {0, 2}


def test_a_role_id_must_name_a_role_and_a_token() -> None:
    v = vocab().vocab
    with pytest.raises(ValueError, match="role"):
        replace(v, role_ids=(("eot", len(v.tokens)),))
    with pytest.raises(ValueError, match="role"):
        replace(v, role_ids=(("bos", 1),))
