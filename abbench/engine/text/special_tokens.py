"""What llama.cpp makes of a vocabulary's special tokens by their text: each token's
attributes (what a prompt is split around, what prints) and the tokens that end generation.

llama.cpp's vocabulary loader (src/llama-vocab.cpp, `llama_vocab::impl::load`, at the pinned
commit) decides both from the file's token types, its special-token ids and lists of token
texts, for every tokenizer type alike. `special_tokens` follows it rule by rule, in order:

1. a token's attributes are its file type (all NORMAL when `token_type` is absent);
2. each role in ROLES (end of turn, end of message, the six fill-in-the-middle ids) that the
   file leaves without an id is found by its texts, and the token found is made CONTROL too;
3. control tokens named "...unused..." are marked UNUSED as well;
4. the FIM pad, repository and separator tokens end generation, and so does every token
   named in EOG_NAMES, which is made CONTROL too;
5. harmony's channel tokens (HARMONY_SHOWN) become USER_DEFINED: printed, and split out of
   a prompt even when special tokens are not parsed;
6. EOS, EOT and EOM end generation;
7. `<|end|>` ends a harmony message, not the generation: when `<|return|>` and `<|call|>`
   (gpt-oss), or `<|call|>`/`<|calls|>` and `<|flush|>` (solar-open), end generation too,
   `<|end|>` is taken out and becomes USER_DEFINED;
8. `</s>` is an ordinary token where `<|tool_response>` or `<|plamo:eos|>` ends
   generation: it is taken out and becomes NORMAL.

Where llama.cpp looks a role up by text it walks a hash map, so of two candidates for one
role (`<|fim_pad|>` and `<PAD>`, say) its hash order picks one; this takes the lowest id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntFlag


class Attr(IntFlag):
    """A token's attributes, as llama.h's `llama_token_attr` numbers them."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# A file's `tokenizer.ggml.token_type` (gguf.TokenType) -> its attribute; others UNDEFINED.
TYPE_ATTR = {1: Attr.NORMAL, 2: Attr.UNKNOWN, 3: Attr.CONTROL, 4: Attr.USER_DEFINED,
             5: Attr.UNUSED, 6: Attr.BYTE}
SPECIAL = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN  # split out of a prompt first
HIDDEN = Attr.CONTROL | Attr.UNKNOWN  # not printed, not split out unless parsing special

# Each role: the keys that give its id (a later key overrides an earlier one), then the
# texts that stand for it when no key does.
ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "eot": (("tokenizer.ggml.eot_token_id",),
            ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>")),
    "eom": (("tokenizer.ggml.eom_token_id",), ("<|eom_id|>",)),
    "fim_pre": (("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
                ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                 "▁<PRE>", "<|code_prefix|>", "<|prefix|>")),
    "fim_suf": (("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
                ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                 "▁<SUF>", "<|code_suffix|>", "<|suffix|>")),
    "fim_mid": (("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
                ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                 "▁<MID>", "<|code_middle|>", "<|middle|>")),
    "fim_pad": (("tokenizer.ggml.fim_pad_token_id",),
                ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    "fim_rep": (("tokenizer.ggml.fim_rep_token_id",),
                ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    "fim_sep": (("tokenizer.ggml.fim_sep_token_id",), ("<|file_sep|>",)),
}
EOG_ROLES = ("fim_pad", "fim_rep", "fim_sep")  # rule 4; EOT and EOM join at rule 6

# Tokens that end generation by their text (rule 4).
EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})
HARMONY_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # rule 5


@dataclass(frozen=True)
class SpecialTokens:
    attrs: tuple[Attr, ...]  # per token id
    eog: frozenset[int]  # the ids that end generation

    def __post_init__(self) -> None:
        if any(not 0 <= i < len(self.attrs) for i in self.eog):
            raise ValueError("an end-of-generation id outside the vocabulary")


def special_tokens(tokens: Sequence[str], types: Sequence[int], eos_id: int | None,
                   role_ids: Mapping[str, int] | None = None) -> SpecialTokens:
    """llama.cpp's attributes and end-of-generation set for a vocabulary: its token texts,
    file token types, EOS id and the ids the file gives roles of ROLES (by role name)."""
    n = len(tokens)
    attrs = [TYPE_ATTR.get(t, Attr.UNDEFINED) for t in types] or [Attr.NORMAL] * n
    # Text -> id, a text listed twice naming its last id: llama.cpp's map, which its text
    # rules walk, so an earlier duplicate is never changed by them.
    by_text = {t: i for i, t in enumerate(tokens)}
    roles = _find_roles(by_text, attrs, role_ids or {})
    unused = [i for t, i in by_text.items() if attrs[i] & Attr.CONTROL and "unused" in t]
    for i in unused:
        attrs[i] |= Attr.UNUSED
    eog = {roles[r] for r in EOG_ROLES if roles[r] is not None}
    for text, i in by_text.items():
        if text in EOG_NAMES:
            eog.add(i)
            attrs[i] |= Attr.CONTROL
    for text in HARMONY_SHOWN:
        if text in by_text:
            attrs[by_text[text]] = Attr.USER_DEFINED
    eog |= {i for i in (eos_id, roles["eot"], roles["eom"]) if i is not None and 0 <= i < n}
    _end_is_no_eog(tokens, attrs, eog)
    _plain_s_is_no_eog(tokens, attrs, eog)
    return SpecialTokens(tuple(attrs), frozenset(eog))


def _find_roles(by_text: Mapping[str, int], attrs: list[Attr],
                role_ids: Mapping[str, int]) -> dict[str, int | None]:
    """Each role's id: the file's, else its first text found (which becomes CONTROL)."""
    n = len(attrs)
    roles: dict[str, int | None] = {}
    for role, (_, texts) in ROLES.items():
        given = role_ids.get(role)
        if given is not None and 0 <= given < n:
            roles[role] = given
            continue
        found = sorted(by_text[t] for t in texts if t in by_text)
        roles[role] = found[0] if found else None
        if found:
            attrs[found[0]] |= Attr.CONTROL
    return roles


def _end_is_no_eog(tokens: Sequence[str], attrs: list[Attr], eog: set[int]) -> None:
    """Rule 7: `<|end|>` leaves EOG beside gpt-oss's or solar-open's real ends."""
    texts = {tokens[i]: i for i in sorted(eog)}  # the last id of a text, as llama.cpp's loop
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        end = texts["<|end|>"]
        eog.discard(end)
        attrs[end] = Attr.USER_DEFINED


def _plain_s_is_no_eog(tokens: Sequence[str], attrs: list[Attr], eog: set[int]) -> None:
    """Rule 8: `</s>` leaves EOG where gemma4's or PLaMo's own end marker is there."""
    texts = {tokens[i]: i for i in sorted(eog)}
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        s = texts["</s>"]
        eog.discard(s)
        attrs[s] = Attr.NORMAL
