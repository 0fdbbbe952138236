"""records/text.py: text from files abbench did not write — decoded, bounded, its numbers
checked, its names quoted so that a message stays one readable line."""

from __future__ import annotations

from pathlib import Path

import pytest

from abbench.errors import ForeignRunError
from abbench.records import text
from abbench.records.text import clip, number, quote, read_text, read_text_lossy


def test_quote_is_a_repr_shortened_to_one_line() -> None:
    assert quote("abc") == "'abc'"
    long = quote("x" * 1000 + "\n" * 5, 40)
    assert long == repr("x" * 37 + "...") and "\n" not in long
    assert quote("a\nb") == "'a\\nb'"


def test_clip_escapes_control_characters_and_shortens() -> None:
    assert clip("wall_ms") == "wall_ms"
    assert clip("a\x1b[2Jb") == "a\\x1b[2Jb"  # a terminal escape shown, not obeyed
    assert clip("é") == "é"
    assert clip("y" * 50, 10) == "yyyyyyy..."


def test_read_text_drops_a_leading_bom_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes("\ufeffstep,wall_ms\r\n1,\ufeff2\n".encode())
    assert read_text(path) == "step,wall_ms\r\n1,\ufeff2\n"  # only the leading one


def test_read_text_refuses_bytes_that_are_not_utf8_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(ForeignRunError) as e:
        read_text(path)
    assert str(e.value) == f"{path}: not UTF-8 text (byte 3)"


def test_an_unreadable_file_is_a_foreign_run_error(tmp_path: Path) -> None:
    with pytest.raises(ForeignRunError, match="cannot read"):
        read_text(tmp_path / "absent.csv")
    with pytest.raises(ForeignRunError, match="cannot read"):
        read_text_lossy(tmp_path)  # a folder


def test_a_line_over_the_bound_names_its_line(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text, "MAX_LINE_BYTES", 8)
    path = tmp_path / "a.metrics"
    path.write_bytes(b"a=1\nb=2\n" + b"c" * 9 + b"\n")
    with pytest.raises(ForeignRunError) as e:
        read_text_lossy(path)
    assert e.value.line == 3 and "longer than 8 bytes" in str(e.value)


def test_read_text_lossy_keeps_what_decodes_and_says_what_did_not(tmp_path: Path) -> None:
    path = tmp_path / "engine.log"
    path.write_bytes("\ufeffgeneration: 4 tokens\n".encode())
    assert read_text_lossy(path) == ("generation: 4 tokens\n", None)
    path.write_bytes(b"tok \xe2\x82\n tok/s=3.0\n")  # a token cut mid-character
    got, note = read_text_lossy(path)
    assert got == "tok \ufffd\n tok/s=3.0\n"
    assert note == ("not UTF-8 from byte 4 (1 undecodable sequence read as U+FFFD; the rest "
                    "of the file is used)")
    path.write_bytes(b"\xff a \xff")
    assert "(2 undecodable sequences read" in (read_text_lossy(path)[1] or "")


def test_number_reads_a_finite_number() -> None:
    assert number("664.200", "a.csv", 2, "`wall_ms`") == 664.2
    assert number(" -1e3 ", "a.csv", 2, "`wall_ms`") == -1000.0


@pytest.mark.parametrize(("field", "problem"), [
    ("abc", "'abc' is not a number"), ("", "'' is not a number"),
    ("nan", "'nan' is not a finite number"), ("-inf", "'-inf' is not a finite number"),
    ("1e999", "'1e999' is not a finite number"),
    # finite, but past what a record holds: refused here, where the file is named
    ("-2e18", "'-2e18' is out of range (at most 1e+18)"),
])
def test_number_names_the_file_line_and_field(field: str, problem: str) -> None:
    with pytest.raises(ForeignRunError) as e:
        number(field, Path("runs/a.csv"), 7, "`wall_ms`")
    assert str(e.value) == f"runs/a.csv:7: `wall_ms`: {problem}"
    assert (e.value.source, e.value.line) == ("runs/a.csv", 7)
