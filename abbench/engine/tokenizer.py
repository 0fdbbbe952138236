"""Byte-level tokenization for vocabularies with `<0xNN>` byte tokens.

Every SentencePiece-style vocabulary with byte fallback can encode any text as its UTF-8
bytes (not the canonical segmentation, but a valid one), which is all a workload needs.
Vocabularies without byte tokens (BPE) take `--prompt-tokens` until their merges are done.
"""

from __future__ import annotations

from abbench.engine.gguf_file import ModelFile
from abbench.errors import ModelFileError, UsageError


class ByteTokenizer:
    def __init__(self, tokens: list[str], bos_id: int | None, add_bos: bool,
                 source: str = "the model") -> None:
        self.tokens = tokens
        self.byte_ids: list[int] = []
        index = {t: i for i, t in enumerate(tokens)}
        for b in range(256):
            i = index.get(f"<0x{b:02X}>")
            if i is None:
                raise UsageError(
                    f"{source}: this model's vocabulary has no byte tokens (<0x{b:02X}> is "
                    "missing), so text prompts cannot be encoded yet",
                    tip="give the prompt as token ids: --prompt-tokens 1,2,3",
                )
            self.byte_ids.append(i)
        self.id_to_byte = {i: b for b, i in enumerate(self.byte_ids)}
        self.bos_id = bos_id if add_bos else None

    @classmethod
    def from_model(cls, mf: ModelFile) -> ByteTokenizer:
        tokens = mf.array("tokenizer.ggml.tokens")
        if not tokens:
            raise UsageError(
                f"{mf.path}: no tokenizer in the file (`tokenizer.ggml.tokens` missing)",
                tip="give the prompt as token ids: --prompt-tokens 1,2,3",
            )
        bos = mf.get("tokenizer.ggml.bos_token_id")
        if bos is not None and not (isinstance(bos, int) and 0 <= bos < len(tokens)):
            raise ModelFileError(
                f"{mf.path}: metadata `tokenizer.ggml.bos_token_id` is {bos!r}, outside the "
                f"vocabulary of {len(tokens)} tokens"
            )
        add_bos = bool(mf.get("tokenizer.ggml.add_bos_token", bos is not None))
        return cls([str(t) for t in tokens], None if bos is None else int(bos), add_bos,
                   str(mf.path))

    def encode(self, text: str) -> list[int]:
        ids = [self.byte_ids[b] for b in text.encode("utf-8")]
        return ([self.bos_id] if self.bos_id is not None else []) + ids

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        for i in ids:
            b = self.id_to_byte.get(i)
            if b is not None:
                out.append(b)
            elif 0 <= i < len(self.tokens) and not self.tokens[i].startswith("<"):
                out += self.tokens[i].replace("\u2581", " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")
