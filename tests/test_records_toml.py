"""records/toml.py: parsing with the position of a syntax error, the line of each key, and
writing a resolved campaign that reads back as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abbench.records.toml import (
    KeyLines,
    TOMLDecodeError,
    dump_key,
    dump_table,
    dump_value,
    error_position,
    parse,
)


def _syntax_error(text: str) -> tuple[str, int | None, int | None]:
    with pytest.raises(TOMLDecodeError) as e:
        parse(text)
    return error_position(e.value, text)


def test_a_syntax_error_gives_its_line_and_column_apart_from_the_message() -> None:
    msg, line, col = _syntax_error("a = 1\nb c = 2\n")
    assert (line, col) == (2, 3)
    assert "line" not in msg and msg.startswith("Expected '='")


def test_a_syntax_error_at_the_end_is_placed_on_the_last_line() -> None:
    msg, line, col = _syntax_error('a = 1\nx = "abc')
    assert (line, col) == (2, 9)  # after the last character of the last line
    assert "end of document" not in msg


def test_key_lines_follow_crlf_quoted_headers_and_literal_multiline_strings() -> None:
    text = ("[campaign]\r\nname = 'x'\r\n"
            '["cells"."B.v2"]\r\n'
            "note = '''\r\nthreads = 9\r\n'''\r\n"
            "threads = 4\r\n"
            "# tokens = 1\r\n"
            "[[decision]]\r\nbaseline = 'B'\r\n")
    lines = KeyLines(text)
    assert lines.line(("campaign", "name")) == 2
    assert lines.line(("cells", "B.v2")) == 3
    assert lines.line(("cells", "B.v2", "threads")) == 7  # not the line inside the string
    assert lines.line(("cells", "B.v2", "tokens")) == 3  # a comment is not a key: its table
    assert lines.line(("decision", 0, "baseline")) == 10
    assert lines.line(("decision", 1)) is None


def test_a_key_keeps_its_first_line() -> None:
    # tomllib refuses a repeated key; the line that matters is where it was first set
    assert KeyLines("a = 1\na = 2\n").line(("a",)) == 1


@pytest.mark.parametrize(("value", "text"), [
    (True, "true"), (False, "false"), (3, "3"), (2.0, "2.0"), (1e16, "1e+16"), (-0.0, "-0.0"),
    (np.float64(0.1), "0.1"),  # not numpy's repr `np.float64(0.1)`
    (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"),
    ('a"b\\c', '"a\\"b\\\\c"'), ("\x01\x7f", '"\\u0001\\u007f"'), ("tab\t", '"tab\\t"'),
    ([1, "x", [True]], '[1, "x", [true]]'), ((1.5,), "[1.5]"),
    ({"a": 1, "b c": "d"}, '{ a = 1, "b c" = "d" }'),
])
def test_dump_value(value: object, text: str) -> None:
    assert dump_value(value) == text


def test_dump_value_refuses_what_toml_cannot_hold() -> None:
    with pytest.raises(TypeError, match="cannot write NoneType as TOML"):
        dump_value(None)
    with pytest.raises(TypeError, match="cannot write object"):
        dump_value([object()])


def test_dump_key_quotes_only_what_a_bare_key_cannot_be() -> None:
    assert dump_key("cache_mib-2") == "cache_mib-2"
    assert [dump_key(k) for k in ("B.v2", "a b", "", "é")] == ['"B.v2"', '"a b"', '""', '"é"']


def test_written_tables_read_back_as_they_were() -> None:
    strings = ["plain", 'quote " and \\', "line\nbreak", "\x00nul\x1fus\x7f", "é ☃ 𝄞", ""]
    items = {"name": "B", "tokens": 64, "temp": 0.7, "on": True, "sizes": [1, 2],
             "none": None, "strings": strings, "weird key.x": 1e-300}
    text = "\n".join([*dump_table(["cells", "B.v2"], items),
                      *dump_table(["decision"], {"baseline": "B"}, array=True),
                      *dump_table(["decision"], {"baseline": "C"}, array=True)]) + "\n"
    doc = parse(text)
    cell = doc["cells"]["B.v2"]
    assert cell == {k: v for k, v in items.items() if v is not None}
    assert doc["decision"] == [{"baseline": "B"}, {"baseline": "C"}]
    assert type(cell["temp"]) is float and type(cell["tokens"]) is int
    lines = KeyLines(text)
    assert lines.line(("cells", "B.v2", "tokens")) == 3
    assert lines.line(("cells", "B.v2", "weird key.x")) == 8  # `none` left out
    assert lines.line(("decision", 1, "baseline")) == 12


def test_a_non_finite_float_reads_back() -> None:
    doc = parse("\n".join(f"k{i} = {dump_value(v)}" for i, v in
                          enumerate([math.nan, math.inf, -math.inf])))
    assert math.isnan(doc["k0"]) and doc["k1"] == math.inf and doc["k2"] == -math.inf
