"""Tokenization as llama.cpp does it, from the model file's own vocabulary.

`tokenizer.ggml.model = "llama"` is SentencePiece as llama.cpp runs it (its SPM tokenizer):
the text is split around special tokens; each piece of plain text gets a leading space
when it opens the prompt or follows a special token (`add_space_prefix`, on by default),
its spaces become "▁", and its characters are merged pairwise — always the adjacent pair
whose merged text is the vocabulary token of highest score, leftmost on a tie — until no
pair forms a token; what is left that is no token is spelt in byte tokens (`<0xNN>`). BOS
opens the ids when `add_bos` (the default for this model type), EOS closes them when
`add_eos`. Decoding hides control and unknown tokens, turns "▁" back into spaces and
byte tokens into their bytes. Written from llama.cpp's behaviour (src/llama-vocab.cpp at
the pinned commit) and checked against its `llama-tokenize` in tests/test_llamacpp.py.

`tokenizer.ggml.model = "gpt2"` is byte-level BPE as llama.cpp runs it: the same split
around special tokens, then the pre-tokenizer named by `tokenizer.ggml.pre` (its regex, as
llama.cpp lists it) cuts each plain piece into words, each word's UTF-8 bytes are spelt in
GPT-2's byte-to-character alphabet and merged by the file's `tokenizer.ggml.merges` in rank
order. The BPE itself is Hugging Face `tokenizers`' (built from the file's vocabulary and
merges), not a hand-written one. No space prefix; BOS only when `add_bos_token` says so.
Decoding maps a token's characters back to its bytes.

What is split out of a prompt first, what prints and what ends generation follow the
attributes llama.cpp gives each token, by its file type and by its text
(special_tokens.py): harmony's `<|channel|>`-style tokens print, a gpt-oss `<|end|>` prints
and does not end generation, a control token prints nothing. llama.cpp's `clean_spaces`
(off for `gpt-4o`) is not read: only its whole-sequence detokenizer applies it, and
llama-completion and llama-tokenize print token by token, as abbench does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gguf import TokenType

from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.bpe_merge import merge_ranks, merge_symbols, merge_word
from abbench.engine.text.special_tokens import HIDDEN, ROLES, SPECIAL, Attr, special_tokens
from abbench.errors import ModelFileError, UsageError

SPACE = "\u2581"  # SentencePiece's visible space
_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
NO_TOKENIZER_TIP = "give the prompt as token ids: --prompt-tokens 1,2,3"

# The pre-tokenizers of `tokenizer.ggml.pre` this reads, with their regexes as llama.cpp's
# src/llama-vocab.cpp lists them (at the pinned commit), by the names that select them.
QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
               r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Qwen3.5's: qwen2's, with combining marks (\p{M}) inside letter runs and out of the
# punctuation runs (llama.cpp splits it with a hand-written splitter, src/unicode.cpp)
QWEN35_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k's split (gpt-oss) in llama.cpp's spelling, not tiktoken's: a letter "not a-z" is an
# upper-case word's letter, "not A-Z" a lower-case one's, so every non-ASCII letter counts
# as both (as in llama.cpp, which runs it on text with each non-ASCII letter collapsed to
# one stand-in byte); marks are no letters; digits go in threes.
GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT,
                  "gpt2": GPT2_SPLIT, "mpt": GPT2_SPLIT, "olmo": GPT2_SPLIT,
                  "gpt-4o": GPT4O_SPLIT, "llama4": GPT4O_SPLIT, "kanana2": GPT4O_SPLIT,
                  "talkie": GPT4O_SPLIT, "qwen35": QWEN35_SPLIT}


def end_of_generation(mf: ModelFile) -> frozenset[int]:
    """The ids that end generation, as llama.cpp finds them (special_tokens.py); for a
    vocabulary this cannot tokenize with (the prompt came as ids), from the token texts
    and the file's EOS alone. `--ignore-eos` never samples them, as llama.cpp's doesn't."""
    try:
        v = read_vocab(mf)
    except (UsageError, ModelFileError):
        tokens = [t if isinstance(t, str) else "" for t in mf.array("tokenizer.ggml.tokens")
                  or []]
        eos = mf.get("tokenizer.ggml.eos_token_id")
        known = isinstance(eos, int) and not isinstance(eos, bool) and 0 <= eos < len(tokens)
        return special_tokens(tokens, [], eos if known else None).eog
    return special_tokens(v.tokens, v.types, v.eos_id, dict(v.role_ids)).eog


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    model: str = "llama"  # tokenizer.ggml.model: "llama" (SPM) or "gpt2" (byte-level BPE)
    merges: tuple[str, ...] = ()  # BPE merges, "left right", by rank
    pre: str = "default"  # tokenizer.ggml.pre: the BPE pre-tokenizer
    # The ids the file gives special_tokens.ROLES (end of turn, fill-in-the-middle, ...)
    role_ids: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.scores) == len(self.types):
            raise ValueError("tokens, scores and types differ in length")
        if any(r not in ROLES or not 0 <= i < len(self.tokens) for r, i in self.role_ids):
            raise ValueError("a role id names no role of ROLES or no token")


def tokenizer_for(mf: ModelFile) -> Tokenizer:
    """The tokenizer the model file declares (`tokenizer.ggml.model`)."""
    vocab = read_vocab(mf)
    kind = {"gpt2": BpeTokenizer, "gemma4": Gemma4Tokenizer}.get(vocab.model, SpmTokenizer)
    return kind(vocab, str(mf.path))


class Tokenizer:
    """What llama.cpp's tokenizers share: BOS/EOS, special tokens matched in the text first,
    and how a token prints. Subclasses tokenize the plain text between special tokens."""

    def __init__(self, vocab: Vocab, source: str = "the model") -> None:
        self.vocab = vocab
        self.source = source
        # Text -> id; a text listed twice maps to its last id, as llama.cpp's map does.
        self._ids = {t: i for i, t in enumerate(vocab.tokens)}
        rules = special_tokens(vocab.tokens, vocab.types, vocab.eos_id, dict(vocab.role_ids))
        self.attrs, self.end_ids = rules.attrs, rules.eog
        # Longest first, so that a special token containing another is matched whole.
        special = [i for i, a in enumerate(self.attrs) if a & SPECIAL and vocab.tokens[i]]
        self._special = sorted(special, key=lambda i: -len(vocab.tokens[i].encode()))

    @classmethod
    def from_model(cls, mf: ModelFile) -> Tokenizer:
        return cls(read_vocab(mf), str(mf.path))

    def _plain(self, text: str, after_special: bool) -> list[int]:
        raise NotImplementedError

    def _normal_piece(self, text: str) -> bytes:
        raise NotImplementedError

    # -- encoding ----------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True
               ) -> list[int]:
        """Token ids of `text`, BOS/EOS as the file asks (`add_special`); special tokens
        written in the text are matched as tokens unless `parse_special` is off (control
        and unknown tokens only: user-defined ones always are)."""
        v = self.vocab
        out: list[int] = []
        if add_special and v.add_bos and v.bos_id is not None:
            out.append(v.bos_id)
        after_special = True  # the prompt's start counts as a special token's end
        for part in self._partition(text, parse_special):
            if isinstance(part, int):
                out.append(part)
                after_special = True
                continue
            out += self._plain(part, after_special)
            after_special = False
        if add_special and v.add_eos and v.eos_id is not None:
            out.append(v.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """`text` split into plain pieces and special token ids, each special token's text
        matched left to right (longest tokens first)."""
        parts: list[str | int] = [text] if text else []
        for i in self._special:
            if not parse_special and self.attrs[i] & HIDDEN:
                continue
            word = self.vocab.tokens[i]
            split: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or word not in part:
                    split.append(part)
                    continue
                pieces = part.split(word)
                for j, piece in enumerate(pieces):
                    if j:
                        split.append(i)
                    if piece:
                        split.append(piece)
            parts = split
        return parts

    # -- decoding ----------------------------------------------------------------------

    def piece(self, token: int) -> bytes:
        """What llama.cpp prints for one token, by its attributes: nothing for control and
        unknown tokens (nor unused ones), a user-defined token's text, "▁" as a space, a
        byte token's byte."""
        if not 0 <= token < len(self.vocab.tokens):
            return b""
        attr, text = self.attrs[token], self.vocab.tokens[token]
        if attr & HIDDEN:
            return b""
        if attr & Attr.USER_DEFINED:
            return text.encode("utf-8")
        if attr & Attr.NORMAL:
            return self._normal_piece(text)
        if attr & Attr.BYTE:
            return self._byte_piece(token)
        return b""

    def _byte_piece(self, token: int) -> bytes:
        return b""

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` as llama.cpp prints them one by one (bytes joined first, so a
        character spelt in byte tokens comes out whole)."""
        return b"".join(self.piece(i) for i in ids).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        """End of generation, as llama.cpp decides it (special_tokens.py)."""
        return token in self.end_ids


class SpmTokenizer(Tokenizer):
    """llama.cpp's SPM tokenizer over a `Vocab`."""

    def __init__(self, vocab: Vocab, source: str = "the model") -> None:
        super().__init__(vocab, source)
        self._byte_ids: list[int | None] = [
            self._ids.get(f"<0x{b:02X}>", self._ids.get(chr(b)) if b < 128 else None)
            for b in range(256)]
        # A byte token's byte; one whose text is no `<0xNN>` prints nothing (llama.cpp
        # would read garbage there: the file is odd, not unreadable).
        self._token_bytes = {i: int(t[3:5], 16) for i, t in enumerate(vocab.tokens)
                             if self.attrs[i] & Attr.BYTE and _BYTE.fullmatch(t)}

    def _plain(self, text: str, after_special: bool) -> list[int]:
        prefixed = " " + text if self.vocab.add_space_prefix and after_special else text
        return self._spm(prefixed.replace(" ", SPACE))

    def _normal_piece(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8")

    def _byte_piece(self, token: int) -> bytes:
        b = self._token_bytes.get(token)
        return b"" if b is None else bytes([b])

    def _spm(self, text: str) -> list[int]:
        """One plain piece (spaces already "▁"): characters merged by best-scoring pair."""
        ids, scores = self._ids, self.vocab.scores

        def priority(left: str, right: str) -> float | None:
            i = ids.get(left + right)
            return None if i is None else -scores[i]  # the best-scoring piece first

        out: list[int] = []
        for piece in merge_symbols(text, priority):
            token = ids.get(piece)
            out += [token] if token is not None else self._bytes(piece)
        return out

    def _bytes(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            i = self._byte_ids[b]
            if i is None:
                raise UsageError(f"{self.source}: the text holds byte 0x{b:02X}, which this "
                                 f"vocabulary cannot spell (no byte token <0x{b:02X}>)",
                                 tip=NO_TOKENIZER_TIP)
            ids.append(i)
        return ids


class Gemma4Tokenizer(SpmTokenizer):
    """llama.cpp's `gemma4` tokenizer: BPE on raw UTF-8 (no byte-level alphabet), spaces
    as "▁" and no space prefix, each run of newlines and each line between them merged by
    rank on its own (a run of newlines that is a token whole is that token), what is no
    token spelt in byte tokens; it prints as SentencePiece's."""

    def __init__(self, vocab: Vocab, source: str = "the model") -> None:
        super().__init__(vocab, source)
        self._ranks = merge_ranks(vocab.merges, source)

    def _plain(self, text: str, after_special: bool) -> list[int]:
        out: list[int] = []
        for word in _LINES.findall(text.replace(" ", SPACE)):
            if word[0] == "\n" and word in self._ids:
                out.append(self._ids[word])
                continue
            for sym in merge_word(word, self._ranks):
                token = self._ids.get(sym)
                out += [token] if token is not None else self._bytes(sym)
        return out


_LINES = re.compile(r"[^\n]+|\n+")  # llama.cpp's gemma4 pre-tokenizer


class BpeTokenizer(Tokenizer):
    """llama.cpp's byte-level BPE (`gpt2`) over a `Vocab`, the BPE run by Hugging Face
    `tokenizers` from the file's own vocabulary and merges."""

    def __init__(self, vocab: Vocab, source: str = "the model") -> None:
        super().__init__(vocab, source)
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        split = PRE_TOKENIZERS[vocab.pre]
        merges = []
        for rank, m in enumerate(vocab.merges):
            cut = m.find(" ", 1)  # as llama.cpp splits a merge
            if cut < 0:
                raise ModelFileError(f"{source}: `tokenizer.ggml.merges` entry {rank} "
                                     f"({m!r}) is not two symbols separated by a space")
            merges.append((m[:cut], m[cut + 1:]))
        bpe = models.BPE(vocab=self._ids, merges=merges, fuse_unk=False)
        self._bpe = Tokenizer(bpe)
        self._bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self._char_byte = {c: b for b, c in enumerate(byte_alphabet())}

    def _plain(self, text: str, after_special: bool) -> list[int]:
        return list(self._bpe.encode(text, add_special_tokens=False).ids)

    def _normal_piece(self, text: str) -> bytes:
        # A character outside the byte alphabet is kept as its UTF-8 (as llama.cpp does).
        return b"".join(bytes([self._char_byte[c]]) if c in self._char_byte
                        else c.encode("utf-8") for c in text)


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character map: byte b is spelt by character `byte_alphabet()[b]`
    (printable bytes as themselves, the rest shifted past U+0100)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, str] = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return [chars[b] for b in range(256)]


def read_vocab(mf: ModelFile) -> Vocab:
    """The vocabulary of a model file (SPM or byte-level BPE), with llama.cpp's defaults
    for absent keys."""
    model = mf.get("tokenizer.ggml.model")
    tokens = mf.array("tokenizer.ggml.tokens")
    if not tokens:
        raise UsageError(f"{mf.path}: no tokenizer in the file (`tokenizer.ggml.tokens` "
                         "missing)", tip=NO_TOKENIZER_TIP)
    if model not in ("llama", "gpt2", "gemma4"):
        raise UsageError(f"{mf.path}: tokenizer `tokenizer.ggml.model` = {model!r} is not "
                         "supported (`llama` SentencePiece, `gpt2` byte-level BPE and "
                         "`gemma4` BPE are)", tip=NO_TOKENIZER_TIP)
    bpe, gemma4 = model == "gpt2", model == "gemma4"
    pre = str(mf.get("tokenizer.ggml.pre", "default"))
    if bpe and pre not in PRE_TOKENIZERS:
        raise UsageError(f"{mf.path}: BPE pre-tokenizer `tokenizer.ggml.pre` = {pre!r} is "
                         f"not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})",
                         tip=NO_TOKENIZER_TIP)
    n = len(tokens)
    scores = mf.array("tokenizer.ggml.scores") or [0.0] * n
    types = mf.array("tokenizer.ggml.token_type") or [int(TokenType.NORMAL)] * n
    merges = mf.array("tokenizer.ggml.merges") or []
    if (bpe or gemma4) and not merges:
        raise ModelFileError(f"{mf.path}: a `{model}` tokenizer without "
                             "`tokenizer.ggml.merges`")
    checks: list[tuple[str, list[object], type | tuple[type, ...], int | None]] = [
        ("tokenizer.ggml.tokens", tokens, str, n),
        ("tokenizer.ggml.scores", scores, (int, float), n),
        ("tokenizer.ggml.token_type", types, int, n),
        ("tokenizer.ggml.merges", merges, str, None)]
    for key, values, kind, length in checks:
        if length is not None and len(values) != length:
            raise ModelFileError(f"{mf.path}: `{key}` has {len(values)} entries for {n} "
                                 "tokens")
        if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
            raise ModelFileError(f"{mf.path}: `{key}` holds values of the wrong type")
    # llama.cpp's defaults per tokenizer type: SPM adds BOS and a space prefix; BPE
    # neither, and its default BOS/EOS id is 11 (whatever `tokenizer.ggml.pre` says);
    # gemma4 has no default ids, always adds BOS (llama.cpp overrides the key) and no space.
    ids = (None, None) if gemma4 else (11, 11) if bpe else (1, 2)
    return Vocab(
        tokens=tuple(str(t) for t in tokens), scores=tuple(float(s) for s in scores),
        types=tuple(int(t) for t in types),
        bos_id=_token_id(mf, "tokenizer.ggml.bos_token_id", ids[0], n),
        eos_id=_token_id(mf, "tokenizer.ggml.eos_token_id", ids[1], n),
        add_bos=gemma4 or bool(mf.get("tokenizer.ggml.add_bos_token", not bpe)),
        add_eos=bool(mf.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=not (bpe or gemma4)
        and bool(mf.get("tokenizer.ggml.add_space_prefix", True)),
        model=str(model), merges=tuple(str(m) for m in merges), pre=pre,
        role_ids=_role_ids(mf, n),
    )


def _token_id(mf: ModelFile, key: str, default: int | None, n: int) -> int | None:
    """A special token's id from metadata `key`; absent, llama.cpp's `default` id where
    the vocabulary of `n` tokens has it."""
    value = mf.get(key)
    if value is None:
        return default if default is not None and default < n else None
    if not isinstance(value, int) or not 0 <= value < n:
        raise ModelFileError(f"{mf.path}: metadata `{key}` is {value!r}, outside the "
                             f"vocabulary of {n} tokens")
    return value


def _role_ids(mf: ModelFile, n: int) -> tuple[tuple[str, int], ...]:
    """The ids the file gives special_tokens.ROLES, a role's later key overriding its
    earlier one as llama.cpp reads them (`fim_pre_token_id`, then `prefix_token_id`)."""
    found = []
    for role, (keys, _) in ROLES.items():
        ids = [i for key in keys if (i := _token_id(mf, key, None, n)) is not None]
        if ids:
            found.append((role, ids[-1]))
    return tuple(found)
