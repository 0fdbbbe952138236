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

Other tokenizer models (`gpt2` byte-level BPE) are not implemented yet: their prompts are
given as ids (`--prompt-tokens`).
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

from gguf import TokenType

from abbench.engine.gguf_file import ModelFile
from abbench.errors import ModelFileError, UsageError

SPACE = "\u2581"  # SentencePiece's visible space
# Token types llama.cpp partitions the text around before tokenizing the rest.
SPECIAL_TYPES = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
HIDDEN_TYPES = (TokenType.CONTROL, TokenType.UNKNOWN)  # not printed (`special` off)
_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


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

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.scores) == len(self.types):
            raise ValueError("tokens, scores and types differ in length")


class SpmTokenizer:
    """llama.cpp's SPM tokenizer over a `Vocab`."""

    def __init__(self, vocab: Vocab, source: str = "the model") -> None:
        self.vocab = vocab
        self.source = source
        # Text -> id; a text listed twice maps to its last id, as llama.cpp's map does.
        self._ids = {t: i for i, t in enumerate(vocab.tokens)}
        # Longest first, so that a special token containing another is matched whole.
        special = [i for i, t in enumerate(vocab.types) if t in SPECIAL_TYPES
                   and vocab.tokens[i]]
        self._special = sorted(special, key=lambda i: -len(vocab.tokens[i].encode()))
        self._byte_ids: list[int | None] = [
            self._ids.get(f"<0x{b:02X}>", self._ids.get(chr(b)) if b < 128 else None)
            for b in range(256)]
        # A byte token's byte; one whose text is no `<0xNN>` prints nothing (llama.cpp
        # would read garbage there: the file is odd, not unreadable).
        self._token_bytes = {i: int(t[3:5], 16) for i, t in enumerate(vocab.tokens)
                             if vocab.types[i] == TokenType.BYTE and _BYTE.fullmatch(t)}

    @classmethod
    def from_model(cls, mf: ModelFile) -> SpmTokenizer:
        return cls(read_vocab(mf), str(mf.path))

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
            prefixed = " " + part if v.add_space_prefix and after_special else part
            out += self._spm(prefixed.replace(" ", SPACE))
            after_special = False
        if add_special and v.add_eos and v.eos_id is not None:
            out.append(v.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """`text` split into plain pieces and special token ids, each special token's text
        matched left to right (longest tokens first)."""
        parts: list[str | int] = [text] if text else []
        for i in self._special:
            if not parse_special and self.vocab.types[i] in HIDDEN_TYPES:
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

    def _spm(self, text: str) -> list[int]:
        """One plain piece (spaces already "▁"): characters merged by best-scoring pair."""
        sym = list(text)  # the current symbols; "" where merged into its left neighbour
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, length)

        def pair(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = sym[left] + sym[right]
            i = self._ids.get(merged)
            if i is not None:
                heapq.heappush(heap, (-self.vocab.scores[i], left, right, len(merged)))

        for i in range(len(sym) - 1):
            pair(i, i + 1)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != length:
                continue  # one side has been merged since: a stale pair
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            pair(prv[left], left)
            pair(left, nxt[left])
        out: list[int] = []
        i = 0 if sym else -1
        while i >= 0:
            token = self._ids.get(sym[i])
            out += [token] if token is not None else self._bytes(sym[i])
            i = nxt[i]
        return out

    def _bytes(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            i = self._byte_ids[b]
            if i is None:
                raise UsageError(f"{self.source}: the text holds byte 0x{b:02X}, which this "
                                 f"vocabulary cannot spell (no byte token <0x{b:02X}>)",
                                 tip="give the prompt as token ids: --prompt-tokens 1,2,3")
            ids.append(i)
        return ids

    # -- decoding ----------------------------------------------------------------------

    def piece(self, token: int) -> bytes:
        """What llama.cpp prints for one token: nothing for control, unknown and unused
        tokens, "▁" as a space, a byte token's byte."""
        if not 0 <= token < len(self.vocab.tokens):
            return b""
        kind, text = self.vocab.types[token], self.vocab.tokens[token]
        if kind == TokenType.NORMAL:
            return text.replace(SPACE, " ").encode("utf-8")
        if kind == TokenType.USER_DEFINED:
            return text.encode("utf-8")
        if kind == TokenType.BYTE and token in self._token_bytes:
            return bytes([self._token_bytes[token]])
        return b""

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` as llama.cpp prints them one by one (bytes joined first, so a
        character spelt in byte tokens comes out whole)."""
        return b"".join(self.piece(i) for i in ids).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS (the only end-of-generation token this reads)."""
        return token == self.vocab.eos_id


def read_vocab(mf: ModelFile) -> Vocab:
    """The SPM vocabulary of a model file, with llama.cpp's defaults for absent keys."""
    model = mf.get("tokenizer.ggml.model")
    tokens = mf.array("tokenizer.ggml.tokens")
    if not tokens:
        raise UsageError(f"{mf.path}: no tokenizer in the file (`tokenizer.ggml.tokens` "
                         "missing)", tip="give the prompt as token ids: --prompt-tokens 1,2,3")
    if model != "llama":
        raise UsageError(f"{mf.path}: tokenizer `{model}` is not supported yet (only "
                         "`llama`, SentencePiece)",
                         tip="give the prompt as token ids: --prompt-tokens 1,2,3")
    n = len(tokens)
    scores = mf.array("tokenizer.ggml.scores") or [0.0] * n
    types = mf.array("tokenizer.ggml.token_type") or [int(TokenType.NORMAL)] * n
    for key, values, kind in (("tokenizer.ggml.tokens", tokens, str),
                              ("tokenizer.ggml.scores", scores, (int, float)),
                              ("tokenizer.ggml.token_type", types, int)):
        if len(values) != n:
            raise ModelFileError(f"{mf.path}: `{key}` has {len(values)} entries for {n} "
                                 "tokens")
        if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
            raise ModelFileError(f"{mf.path}: `{key}` holds values of the wrong type")

    def token_id(key: str, default: int) -> int | None:
        value = mf.get(key)
        if value is None:  # absent: llama.cpp's default id, where the vocabulary has it
            return default if default < n else None
        if not isinstance(value, int) or not 0 <= value < n:
            raise ModelFileError(f"{mf.path}: metadata `{key}` is {value!r}, outside the "
                                 f"vocabulary of {n} tokens")
        return value

    return Vocab(
        tokens=tuple(str(t) for t in tokens), scores=tuple(float(s) for s in scores),
        types=tuple(int(t) for t in types),
        bos_id=token_id("tokenizer.ggml.bos_token_id", 1),
        eos_id=token_id("tokenizer.ggml.eos_token_id", 2),
        add_bos=bool(mf.get("tokenizer.ggml.add_bos_token", True)),
        add_eos=bool(mf.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(mf.get("tokenizer.ggml.add_space_prefix", True)),
    )
