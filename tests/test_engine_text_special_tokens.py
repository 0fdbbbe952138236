"""llama.cpp's attributes and end-of-generation set by token text (special_tokens.py), on
small in-memory vocabularies: the harmony rules (gpt-oss), the `<|end|>` rule and its
solar-open form, control-looking tokens made control, roles found by text or given by id,
the `</s>` rule, duplicate texts; Qwen's vocabulary as before."""

from __future__ import annotations

import pytest

from abbench.engine.text.special_tokens import Attr, SpecialTokens, special_tokens

N, U, C, D, UNUSED, B = 1, 2, 3, 4, 5, 6  # gguf.TokenType
HARMONY = ["<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>",
           "<|return|>", "<|call|>", "<|constrain|>"]


def rules(tokens: list[str], types: list[int] | None = None, eos: int | None = None,
          **role_ids: int) -> SpecialTokens:
    return special_tokens(tokens, types if types is not None else [C] * len(tokens), eos,
                          role_ids)


def test_gpt_oss_end_is_a_printed_token_not_an_end() -> None:
    """With <|return|>, <|call|> and <|end|> all ending generation, <|end|> leaves the set
    and becomes user-defined; the channel tokens become user-defined whatever the file
    says; <|endoftext|> and the EOS (<|return|>) end generation, control as before."""
    r = rules(HARMONY + ["hi"], [C] * len(HARMONY) + [N], eos=5)
    assert r.eog == {0, 5, 6}
    assert [r.attrs[i] for i in (1, 2, 3, 4, 7)] == [Attr.USER_DEFINED] * 5
    assert r.attrs[0] == r.attrs[5] == r.attrs[6] == Attr.CONTROL
    assert r.attrs[8] == Attr.NORMAL


@pytest.mark.parametrize("missing", ["<|return|>", "<|call|>"])
def test_end_stays_an_end_without_both_return_and_call(missing: str) -> None:
    tokens = [t for t in HARMONY if t != missing]
    r = rules(tokens)
    end = tokens.index("<|end|>")
    assert end in r.eog and r.attrs[end] == Attr.CONTROL


def test_solar_opens_calls_and_flush_take_end_out_too() -> None:
    r = rules(["<|end|>", "<|calls|>", "<|flush|>"])
    assert r.eog == {1, 2} and r.attrs[0] == Attr.USER_DEFINED
    assert rules(["<|end|>", "<|flush|>"]).eog == {0, 1}  # no call: <|end|> stays


def test_control_looking_tokens_become_control_and_keep_their_type() -> None:
    """A NORMAL <|endoftext|> is made control as well (it stops printing); a
    USER_DEFINED one keeps that bit too, as llama.cpp ORs the control bit in."""
    r = rules(["<|endoftext|>", "<|im_end|>"], [N, D])
    assert r.eog == {0, 1}
    assert r.attrs == (Attr.NORMAL | Attr.CONTROL, Attr.USER_DEFINED | Attr.CONTROL)


def test_fill_in_the_middle_tokens_found_by_text() -> None:
    """Qwen's FIM pad, repository and file-separator tokens end generation; its prefix
    does not; each found is made control."""
    tokens = ["<|fim_prefix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "x"]
    r = rules(tokens, [N] * 5)
    assert r.eog == {1, 2, 3}
    assert all(r.attrs[i] == Attr.NORMAL | Attr.CONTROL for i in range(4))
    assert r.attrs[4] == Attr.NORMAL


def test_a_role_the_file_gives_an_id_is_not_looked_up_by_text() -> None:
    tokens = ["<|fim_pad|>", "pad", "turn"]
    r = rules(tokens, [N] * 3, fim_pad=1, eot=2)
    assert r.eog == {1, 2}  # the given ids; <|fim_pad|> is no longer found by its text
    assert r.attrs == (Attr.NORMAL,) * 3  # and given ids are not made control
    assert rules(tokens, [N] * 3, fim_pad=99).eog == {0}  # outside: as if not given


def test_two_candidates_for_a_role_the_lowest_id_wins() -> None:
    r = rules(["<PAD>", "<|fim_pad|>"], [N, N])
    assert r.eog == {0} and r.attrs == (Attr.NORMAL | Attr.CONTROL, Attr.NORMAL)


def test_unused_control_tokens_are_marked_unused() -> None:
    r = rules(["<unused0>", "unused"], [C, N])
    assert r.attrs == (Attr.CONTROL | Attr.UNUSED, Attr.NORMAL)


def test_plain_s_is_an_ordinary_token_beside_gemma4s_end() -> None:
    r = rules(["</s>", "<|tool_response>", "<eos>"])
    assert r.eog == {1, 2} and r.attrs[0] == Attr.NORMAL
    assert rules(["</s>", "<eos>"]).eog == {0, 1}


def test_a_text_listed_twice_is_ruled_by_its_last_id() -> None:
    r = rules(["<|end|>", "<|return|>", "<|call|>", "<|end|>"], [N, C, C, N])
    assert r.eog == {1, 2}
    assert r.attrs[0] == Attr.NORMAL and r.attrs[3] == Attr.USER_DEFINED


def test_qwens_vocabulary_is_as_before() -> None:
    r = rules(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a"], [C, C, C, N], eos=0)
    assert r.eog == {0, 2} and r.attrs == (Attr.CONTROL,) * 3 + (Attr.NORMAL,)


def test_types_map_to_attributes() -> None:
    r = rules(["a", "b", "c", "d", "e", "f", "g"], [N, U, C, D, UNUSED, B, 9])
    assert r.attrs == (Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED,
                       Attr.UNUSED, Attr.BYTE, Attr.UNDEFINED)
    assert special_tokens(["a"], [], None).attrs == (Attr.NORMAL,)  # no types: all normal
    assert rules(["a"], eos=7).eog == frozenset()  # an EOS outside is ignored
    with pytest.raises(ValueError, match="outside"):
        SpecialTokens((Attr.NORMAL,), frozenset({1}))
