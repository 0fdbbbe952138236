"""records/jsonl.py: JSON lines appended whole, read back with the line of every error (a
torn last line forgiven), and single JSON record files."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from abbench.errors import RecordError
from abbench.records.jsonl import append_jsonl, numbered_jsonl, read_jsonl, read_record


@dataclass(frozen=True)
class Point:
    x: float
    label: str = ""


def test_appended_objects_read_back_one_compact_line_each(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    objects = [{"a": 1, "b": [1.5, None]}, {"s": "é\n\"", "t": True}]
    for obj in objects:
        append_jsonl(path, obj, fsync=False)
    assert path.read_text(encoding="utf-8").split("\n") == [
        '{"a":1,"b":[1.5,null]}', json.dumps(objects[1], separators=(",", ":")), ""]
    assert read_jsonl(path) == objects


def test_a_non_finite_number_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    append_jsonl(path, {"ok": 1}, fsync=False)
    with pytest.raises(ValueError):
        append_jsonl(path, {"tok/s": float("nan")}, fsync=False)
    assert read_jsonl(path) == [{"ok": 1}]


def test_an_append_after_a_crash_cuts_the_torn_line_first(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"a":1}\n{"b":', encoding="utf-8")  # a write cut short
    assert read_jsonl(path) == [{"a": 1}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        append_jsonl(path, {"c": 3}, fsync=False)
    assert any("torn last line" in str(w.message) for w in caught)
    assert path.read_text(encoding="utf-8") == '{"a":1}\n{"c":3}\n'


def test_lines_are_numbered_as_in_the_file_blank_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"a":1}\n\n   \n{"a":2}\r\n{"a":3}', encoding="utf-8")
    assert numbered_jsonl(path) == [(1, {"a": 1}), (4, {"a": 2}), (5, {"a": 3})]


def test_an_absent_file_has_no_lines(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "absent.jsonl") == []


@pytest.mark.parametrize(("text", "problem"), [
    ('{"a":1}\n{"a":\n{"a":3}\n', "2: not a JSON line (Expecting value)"),
    ('{"a":1}\n{"a":\n', "2: not a JSON line (Expecting value)"),  # has its newline: not torn
    ('{"a":1}\n[1, 2]\n', "2: expected a JSON object"),
    ('"text"\n', "1: expected a JSON object"),
    ('{"n":' + "9" * 5000 + "}\n", "1: not a JSON line (a number too long)"),
    ("[" * 100_000 + "\n", "1: not a JSON line (nested too deeply)"),
], ids=["mid-file", "last-with-newline", "array", "string", "huge-number", "deep"])
def test_a_bad_line_names_the_file_and_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecordError) as e:
        read_jsonl(path)
    assert str(e.value) == f"{path}:{problem}"


def test_bytes_that_are_not_utf8_do_not_stop_the_read(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"name":"a\xffb"}\n')
    assert read_jsonl(path) == [{"name": "a\ufffdb"}]


def test_an_unreadable_file_is_a_record_error(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="cannot read"):
        read_jsonl(tmp_path)  # a folder


def test_read_record_builds_the_dataclass_or_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    assert read_record(path, Point, "point") is None
    path.write_text('{"x": 2, "later": 1}', encoding="utf-8")
    assert read_record(path, Point, "point") == Point(2.0)
    path.write_text('{"x": "2"}', encoding="utf-8")
    with pytest.raises(RecordError) as e:
        read_record(path, Point, "point")
    assert str(e.value) == f'{path}: malformed point: `x`: expected a number, got a string ("2")'
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(RecordError, match=r"malformed point: expected an object, got an array"):
        read_record(path, Point, "point")


@pytest.mark.parametrize("data", [b'{"x": 1', b'{"x": "\xff"}', b"[" * 100_000, b"{}" * 2],
                         ids=["cut", "not-utf8", "deep", "two-objects"])
def test_read_record_of_a_file_that_does_not_parse(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(data)
    with pytest.raises(RecordError) as e:
        read_record(path, Point, "point")
    assert str(e.value).startswith(f"{path}: malformed point (")


def test_jsonl_records_are_read_in_order_and_a_bad_one_names_its_line(tmp_path: Path) -> None:
    from abbench.errors import BadField, RecordError
    from abbench.records.jsonl import read_jsonl_records

    def read(d: dict) -> int:  # type: ignore[type-arg]
        if not isinstance(d.get("x"), int):
            raise BadField("x", "is not an integer")
        return d["x"]

    path = tmp_path / "r.jsonl"
    path.write_text('{"x": 1}\n\n{"x": 2}\n')
    assert read_jsonl_records(path, read, "thing") == [1, 2]
    assert read_jsonl_records(tmp_path / "absent.jsonl", read, "thing") == []
    path.write_text('{"x": 1}\n{"x": "two"}\n')
    with pytest.raises(RecordError, match=r"r\.jsonl:2: malformed thing: .*x"):
        read_jsonl_records(path, read, "thing")
