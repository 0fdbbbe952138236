"""records/summary.py: `RunSummary` — built by attribute, read and written as the files hold
it (run folders from before it included), validated on construction — and the throughput
a cell reported."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from abbench.errors import BadField
from abbench.records.journal import CellRecord
from abbench.records.summary import RunSummary, finite, usable_throughput

RUNS = Path(__file__).parent / "fixtures" / "runs"
COMPACT = {"separators": (",", ":")}  # how the journal writes a line


def _journal_lines() -> list[tuple[str, str]]:
    return [(f"{p.relative_to(RUNS)}:{n}", line) for p in sorted(RUNS.glob("*/journal.jsonl"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)]


def _summary_files() -> list[Path]:
    return sorted(RUNS.glob("*/cells/*/summary.json"))


def test_a_summary_built_by_attribute_writes_its_keys_in_field_order() -> None:
    s = RunSummary(threads=2, tok_per_s=9.5, tokens=64, prefill_tok_per_s=120.0)
    assert json.dumps(s.to_json()) == \
        '{"tokens": 64, "tok/s": 9.5, "prefill_tok/s": 120.0, "threads": 2}'
    assert s.keys == ("tokens", "tok/s", "prefill_tok/s", "threads")
    assert RunSummary.from_json(s.to_json()) == s
    assert RunSummary().to_json() == {}


@pytest.mark.parametrize(("where", "line"), _journal_lines())
def test_every_journal_line_from_before_reads_and_writes_back_the_same_bytes(
        where: str, line: str) -> None:
    d = json.loads(line)
    summary = RunSummary.from_json(d["summary"])
    assert json.dumps(summary.to_json(), **COMPACT) == json.dumps(d["summary"], **COMPACT)
    record = CellRecord.from_json(d)
    assert record.summary == summary
    assert json.dumps(record.to_json(), **COMPACT) == line, where


@pytest.mark.parametrize("path", _summary_files(), ids=lambda p: str(p.relative_to(RUNS)))
def test_every_cells_summary_json_from_before_reads_and_writes_back_the_same(
        path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    summary = RunSummary.from_json(doc["summary"])
    assert list(summary.to_json().items()) == list(doc["summary"].items())


def test_the_old_keys_read_as_their_fields() -> None:
    # An embedded cell from before prefill was batched: no ttft_s, no prefill_tok/s.
    (line,) = [ln for where, ln in _journal_lines() if where == "embedded-sim/journal.jsonl:1"]
    old = RunSummary.from_json(json.loads(line)["summary"])
    assert old.ttft_s is None and old.prefill_tok_per_s is None
    assert "ttft_s" not in old.to_json()
    assert old.tokens == 24 and isinstance(old.tokens, int) and old.threads == 2
    assert old.peak_rss_mib is not None and old.cache_budget_mib is not None
    assert old.extra == {}
    # The seed engine's `# summary` line: every number a float, its own names kept aside.
    seed = RunSummary.from_json({"tokens": 256.0, "s/tok": 0.423, "tok/s": 2.366,
                                 "prefill_tps": 4.6, "threads": 4.0})
    assert seed.tokens == 256.0 and seed.tok_per_s == 2.366
    assert seed.threads is None  # a thread count is a whole number: 4.0 is not read as one
    assert seed.extra == {"prefill_tps": 4.6, "threads": 4.0}
    assert json.dumps(seed.to_json()) == ('{"tokens": 256.0, "s/tok": 0.423, "tok/s": 2.366, '
                                          '"prefill_tps": 4.6, "threads": 4.0}')


def test_what_a_cell_reported_is_kept_even_when_no_field_reads_it() -> None:
    raw = {"tok/s": "fast", "engine": 3, "cache_hit_pct": True, "ttft_s": None,
           "own": {"x": [1.0, math.nan]}, "load_s": math.inf}
    s = RunSummary.from_json(raw)
    assert (s.tok_per_s, s.engine, s.cache_hit_pct, s.ttft_s, s.load_s) == (None,) * 5
    assert s.to_json() == {**raw, "own": {"x": [1.0, None]}, "load_s": None}
    assert list(s.to_json()) == list(raw)
    assert RunSummary.from_json(s.to_json()) == s


@pytest.mark.parametrize(("doc", "problem"), [
    ([1], "expected an object, got an array"),
    ("x", 'expected an object, got a string ("x")'),
])
def test_a_summary_that_is_not_an_object_is_refused(doc: Any, problem: str) -> None:
    with pytest.raises(BadField) as e:
        RunSummary.from_json(doc, ("summary",))
    assert str(e.value) == f"`summary`: {problem}"


@pytest.mark.parametrize(("changes", "says"), [
    ({"tok_per_s": "fast"}, '`"tok/s"`: expected a number, got a string ("fast")'),
    ({"threads": True}, "`threads`: expected an integer, got a boolean (true)"),
    ({"threads": 4.0}, "`threads`: expected an integer, got a float (4.0)"),
    ({"engine": 1}, "`engine`: expected a string, got an integer (1)"),
    ({"tokens": 10**19}, "`tokens`: 10000000000000000000 is too large"),
    ({"tok_per_s": 1.0, "extra": {"tok/s": 2.0}},
     '`"tok/s"`: is given twice: as a field and in `extra`'),
    ({"keys": ("tok/s", "nowhere")}, "`nowhere`: is in `keys` but neither a field nor"),
    ({"keys": ("tok/s", "tok/s")}, "`keys`: names a key twice"),
])
def test_construction_is_validated(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(BadField) as e:
        RunSummary(**changes)
    assert str(e.value).startswith(says)


def test_a_figure_that_is_not_finite_is_written_null_in_its_place() -> None:
    s = RunSummary(tokens=3, s_per_tok=math.nan, tok_per_s=math.inf)
    assert s.to_json() == {"tokens": 3, "s/tok": None, "tok/s": None}
    assert json.dumps(s.to_json(), allow_nan=False)


def test_with_values_keeps_a_keys_place_and_leaves_an_unknown_figure_out() -> None:
    s = RunSummary.from_json({"tok/s": 2.0, "cache_hit_pct": "n/a", "note": "x"})
    assert list(s.with_values(cache_hit_pct=50.0).to_json().items()) == \
        [("tok/s", 2.0), ("cache_hit_pct", 50.0), ("note", "x")]
    assert s.with_values(cache_hit_pct=None).to_json() == {"tok/s": 2.0, "note": "x"}
    assert list(s.with_values(load_s=3.0).to_json()) == ["tok/s", "cache_hit_pct", "note",
                                                         "load_s"]
    with pytest.raises(TypeError):
        s.with_values(not_a_figure=1.0)
    with pytest.raises(BadField):
        s.with_values(load_s="slow")


def test_dataclasses_replace_keeps_the_order_and_adds_a_new_key_last() -> None:
    s = RunSummary.from_json({"threads": 2, "tok/s": 1.0})
    assert list(dataclasses.replace(s, tokens=4).to_json()) == ["threads", "tok/s", "tokens"]


@pytest.mark.parametrize(("doc", "expected"), [
    ({"tok/s": 12.5}, (12.5, None)),
    ({"tok/s": 3}, (3.0, None)),
    ({"tokens": 4}, (None, None)),
    ({"tok/s": 0}, (None, "tok/s = 0")),
    ({"tok/s": -1.0}, (None, "tok/s = -1.0")),
    ({"tok/s": True}, (None, "tok/s = True")),
    ({"tok/s": "fast"}, (None, "tok/s = 'fast'")),
    ({"tok/s": math.inf}, (None, "tok/s = inf")),
    ({"tok/s": None}, (None, "tok/s = None")),
])
def test_usable_throughput(doc: dict[str, Any], expected: tuple[Any, Any]) -> None:
    assert usable_throughput(doc) == expected


def test_finite_clears_every_nan_and_infinity() -> None:
    assert finite({"a": [math.nan, 1.0, {"b": -math.inf}], "c": "nan"}) == \
        {"a": [None, 1.0, {"b": None}], "c": "nan"}
