"""records/schema.py: one validator read two ways (strict for files people write, lenient
for records abbench wrote), every problem a BadField naming its key path."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from abbench.errors import BadField
from abbench.records.schema import (
    LIMIT,
    build,
    check_keys,
    describe,
    did_you_mean,
    from_dict,
    is_number,
    show,
    typed,
)


@dataclass(frozen=True)
class Inner:
    count: int
    rate: float = 1.0


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    tags: tuple[str, ...] = ()
    limit: float | None = None
    either: int | str = 0
    counts: dict[str, int] = field(default_factory=dict)
    items: tuple[Inner, ...] = ()


GOOD = {"name": "B", "inner": {"count": 2}}


def _problem(raw: object, strict: bool = True) -> BadField:
    with pytest.raises(BadField) as e:
        build(Outer, raw, strict=strict)
    return e.value


def test_a_table_becomes_its_dataclass_with_defaults_and_tuples() -> None:
    got = build(Outer, {**GOOD, "tags": ["a", "b"], "counts": {"x": 1}, "limit": 3})
    assert got == Outer("B", Inner(2, 1.0), ("a", "b"), 3.0, 0, {"x": 1})
    assert isinstance(got.tags, tuple)
    assert type(got.limit) is float  # an integer is a number where a float is asked


def test_strict_refuses_an_unknown_key_and_suggests_the_closest() -> None:
    e = _problem({**GOOD, "tgas": []})
    assert e.key == ("tgas",) and e.problem == "unknown key" and e.tip == "did you mean `tags`?"


def test_lenient_ignores_unknown_keys_from_newer_writers() -> None:
    assert from_dict(Outer, {**GOOD, "added_later": {"x": 1}}) == build(Outer, GOOD)


def test_a_missing_key_is_named_at_its_table() -> None:
    e = _problem({"name": "B", "inner": {"rate": 2.0}})
    assert e.key == ("inner",) and e.problem == "missing key `count`"
    assert str(e) == "`inner`: missing key `count`"


@pytest.mark.parametrize(("raw", "key", "problem"), [
    ({**GOOD, "inner": {"count": True}}, ("inner", "count"),
     "expected an integer, got a boolean (true)"),
    ({**GOOD, "inner": {"count": 1.5}}, ("inner", "count"),
     "expected an integer, got a float (1.5)"),
    ({**GOOD, "inner": {"count": 2, "rate": False}}, ("inner", "rate"),
     "expected a number, got a boolean (false)"),
    ({**GOOD, "inner": {"count": 2, "rate": float("nan")}}, ("inner", "rate"),
     "must be a finite number (got nan)"),
    ({**GOOD, "inner": {"count": 2, "rate": float("-inf")}}, ("inner", "rate"),
     "must be a finite number (got -inf)"),
    ({**GOOD, "inner": {"count": 10**19}}, ("inner", "count"),
     "10000000000000000000 is too large (at most 1e+18)"),
    ({**GOOD, "inner": {"count": 2, "rate": 1e19}}, ("inner", "rate"),
     "1e+19 is too large (at most 1e+18)"),
    ({**GOOD, "name": "a\x00b"}, ("name",), "must not contain a NUL character"),
    ({**GOOD, "tags": ["a", 3]}, ("tags", 1), "expected a string, got an integer (3)"),
    ({**GOOD, "tags": "a"}, ("tags",), 'expected an array of strings, got a string ("a")'),
    ({**GOOD, "counts": {"x": "1"}}, ("counts", "x"), 'expected an integer, got a string ("1")'),
    ({**GOOD, "limit": "3"}, ("limit",), 'expected a number, got a string ("3")'),
    ({**GOOD, "either": 1.5}, ("either",), "expected an integer or a string, got a float (1.5)"),
    ({**GOOD, "items": [{"count": 1}, {"count": "x"}]}, ("items", 1, "count"),
     'expected an integer, got a string ("x")'),
    ({**GOOD, "inner": []}, ("inner",), "expected a table, got an array"),
])
def test_each_wrong_value_is_named_by_its_key_path(raw: dict, key: tuple, problem: str) -> None:
    e = _problem(raw)
    assert (e.key, e.problem) == (key, problem)


def test_optional_and_union_fields_take_what_they_allow() -> None:
    assert build(Outer, {**GOOD, "limit": None}).limit is None
    assert build(Outer, {**GOOD, "either": "x"}).either == "x"
    assert build(Outer, {**GOOD, "either": 4}).either == 4


def test_a_record_calls_a_table_an_object() -> None:
    assert _problem({**GOOD, "inner": 3}, strict=False).problem == \
        "expected an object, got an integer (3)"
    assert _problem([], strict=False).problem == "expected an object, got an array"


def test_an_array_of_tables_is_named_as_the_format_names_it() -> None:
    assert _problem({**GOOD, "items": 1}).problem == \
        "expected an array of tables, got an integer (1)"


def test_a_record_names_an_array_of_objects_with_one_space() -> None:
    assert _problem({**GOOD, "items": 1}, strict=False).problem == \
        "expected an array of objects, got an integer (1)"


def test_given_fields_come_from_the_caller_not_the_table() -> None:
    assert build(Inner, {"rate": 2}, count=5) == Inner(5, 2.0)
    with pytest.raises(BadField) as e:
        build(Inner, {"count": 1}, count=5)  # the table may not set it
    assert e.value.key == ("count",) and e.value.problem == "unknown key"
    assert from_dict(Inner, {"count": 1, "rate": 3}) == Inner(1, 3.0)


def test_the_key_path_starts_where_the_caller_says() -> None:
    with pytest.raises(BadField) as e:
        build(Inner, {"count": "x"}, ("cells", 2))
    assert str(e.value) == '`cells[2].count`: expected an integer, got a string ("x")'


def test_typed_checks_one_json_value() -> None:
    assert typed(3, float, ("v",)) == 3.0 and type(typed(3, float, ("v",))) is float
    with pytest.raises(BadField) as e:
        typed("3", float, ("values", "cpu.policy0.cap_khz"))
    assert str(e.value).startswith('`values."cpu.policy0.cap_khz"`: expected a number')


@pytest.mark.parametrize(("value", "ok"), [
    (0, True), (-2.5, True), (LIMIT, True), (10**18, True), (10**18 + 1, False), (1e19, False),
    (float("nan"), False), (float("inf"), False), (True, False), ("1", False), (None, False),
    # compared as an integer: no OverflowError
    pytest.param(10**5000, False, id="thousands-of-digits"),
])
def test_is_number(value: object, ok: bool) -> None:
    assert is_number(value) is ok


def test_check_keys_takes_a_tip_and_names_the_root() -> None:
    with pytest.raises(BadField) as e:
        check_keys((), {"cmapaign": {}}, ["campaign", "device"])
    assert e.value.key == ("cmapaign",) and e.value.problem == "unknown table"
    assert e.value.tip == "did you mean `campaign`?"
    with pytest.raises(BadField) as e:
        check_keys(("cells", "B"), {"cache": 1}, ["cache_mib"], tip=lambda k: f"{k}: in MiB")
    assert e.value.key == ("cells", "B", "cache") and e.value.tip == "cache: in MiB"
    check_keys(("t",), {"a": 1}, ["a", "b"])  # every key valid: nothing raised


def test_did_you_mean() -> None:
    assert did_you_mean("tokns", ["tokens", "seed"]) == "did you mean `tokens`?"
    assert did_you_mean("zzz", ["tokens", "seed"]) == "valid keys: `tokens`, `seed`"
    assert did_you_mean("zzz", ["tokens"], "values") == "values: `tokens`"
    many = [f"key{i}" for i in range(20)]
    assert did_you_mean("zzz", many) == "docs/cells.md lists every key"
    assert did_you_mean("zzz", many, "values") is None


@pytest.mark.parametrize(("value", "shown"), [
    (None, "null"), (True, "true"), (1.5, "1.5"), ("a\nb", '"a\\nb"'), ([1, "x"], '[1, "x"]'),
    ({"a": 1}, "{ a = 1 }"), (10**40, "a 41-digit number"),
    pytest.param(-(10**5000), "a number of thousands of digits", id="thousands-of-digits"),
    ("x" * 100, '"' + "x" * 56 + "..."),
])
def test_show_writes_a_value_as_the_file_would_shortened(value: object, shown: str) -> None:
    assert show(value) == shown
    assert len(show(value)) <= 60


@pytest.mark.parametrize(("value", "said"), [
    (False, "a boolean (false)"), (3, "an integer (3)"), (2.0, "a float (2.0)"),
    ("s", 'a string ("s")'), ([1], "an array"), ({}, "a table"), (None, "null"),
])
def test_describe(value: object, said: str) -> None:
    assert describe(value) == said
    assert describe({}, "an object") == "an object"
