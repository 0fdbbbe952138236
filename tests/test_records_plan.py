"""records/plan.py: plan.json read back as written, older plans still read, and everything
the analysis relies on beyond the types checked, each problem naming the file and key."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from abbench.errors import RecordError
from abbench.records.plan import (
    DecisionSpec,
    Look,
    MatchSpec,
    Plan,
    Sequential,
    config_key,
    read_plan,
)

# plan.json as campaigns wrote it before `min_stability`, `metric` and typed gates
# (tests/fixtures/runs/synthetic/plan.json, three cells).
OLD_PLAN: dict[str, Any] = {
    "campaign": "t",
    "cells": [
        {"index": 0, "name": "B", "config": {"tokens": 64, "arm": "B"}, "sentinel_of": None,
         "label": "01-B"},
        {"index": 1, "name": "C", "config": {"tokens": 64, "arm": "C"}, "sentinel_of": None,
         "label": "02-C"},
        {"index": 2, "name": "B", "config": {"tokens": 64, "arm": "B"}, "sentinel_of": 0,
         "label": "03-B"},
    ],
    "spacing_s": 30, "warmup_tokens": 4, "device": "local",
    "decisions": [{"candidate": "C", "baseline": "B", "min_effect": 0.03},
                  {"candidate": "C", "baseline": "B", "min_effect": 0.03,
                   "expect": "not-slower", "max_regression": 0.05}],
    "match": {"cpu_temp_tol_c": 3.0, "battery_temp_tol_c": 0.5,
              "mem_available_tol_frac": 0.15, "probe_tol": 0.03, "max_gap_s": 900.0},
    "gate": {"cpu_temp_max_c": 45.0, "battery_temp_max_c": None,
             "mem_available_min_mib": None, "caps_at_max": False, "probe_min": None,
             "poll_s": 5.0, "timeout_s": 600.0},
    "format": "abbench-run v1", "sequential": None, "looks": [], "planned_cells": None,
}


def _write(run: Path, doc: Any) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    path = run / "plan.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def _changed(edit: Any) -> dict[str, Any]:
    doc = copy.deepcopy(OLD_PLAN)
    edit(doc)
    return doc


def test_an_older_plan_reads_with_the_defaults_of_what_it_lacks(tmp_path: Path) -> None:
    plan = read_plan(_write(tmp_path, OLD_PLAN).parent)
    assert [c.label for c in plan.cells] == ["01-B", "02-C", "03-B"]
    assert plan.cells[2].sentinel_of == 0
    assert plan.cells[0].config.to_json() == {"tokens": 64, "arm": "B"}
    assert plan.spacing_s == 30.0 and plan.warmup_tokens == 4
    assert plan.decisions == (DecisionSpec("C", "B", 0.03),
                              DecisionSpec("C", "B", 0.03, "not-slower", 0.05))
    assert plan.decisions[0].metric == "tok_per_s"
    assert plan.match == MatchSpec() and plan.match.min_stability is None
    assert plan.gate is not None and plan.gate.cpu_temp_max_c == 45.0
    assert plan.order_known is True and plan.looks == () and plan.sequential is None


def test_a_plan_reads_back_as_it_was_written(tmp_path: Path) -> None:
    plan = Plan.from_json(OLD_PLAN)
    sequential = Plan.from_json({
        **OLD_PLAN, "decisions": [{"candidate": "C", "baseline": "B",
                                   "metric": "energy_per_token"}],
        "match": {"min_stability": 0.9}, "gate": None,
        "sequential": {"max_cells": 12, "max_minutes": 30},
        "looks": [{"cells": 2, "fraction": 0.5, "alpha": 0.01},
                  {"cells": 3, "fraction": 1.0, "alpha": 0.04, "final": True}],
        "planned_cells": 2, "order_known": False})
    for i, p in enumerate([plan, sequential]):
        assert read_plan(_write(tmp_path / str(i), p.to_json()).parent) == p
    assert sequential.sequential == Sequential("decided", 12, 30.0)
    assert sequential.looks[1] == Look(3, 1.0, 0.04, final=True)


def test_a_decision_writes_only_what_older_plans_held() -> None:
    assert DecisionSpec("C", "B").to_json() == {"candidate": "C", "baseline": "B",
                                                "min_effect": 0.0, "expect": "faster"}
    energy = DecisionSpec("C", "B", 0.02, "not-slower", 0.05, "energy_per_token").to_json()
    assert energy["max_regression"] == 0.05 and energy["metric"] == "energy_per_token"
    assert "min_stability" not in MatchSpec().to_json()
    assert MatchSpec(min_stability=0.9).to_json()["min_stability"] == 0.9


def test_a_plan_without_min_stability_writes_none() -> None:
    assert Plan.from_json(OLD_PLAN).to_json()["match"] == OLD_PLAN["match"]


def test_a_folder_without_a_plan_is_not_a_run_folder(tmp_path: Path) -> None:
    with pytest.raises(RecordError) as e:
        read_plan(tmp_path)
    assert str(e.value) == f"{tmp_path}: not a run folder (no plan.json)"


@pytest.mark.parametrize(("text", "problem"), [
    ('{"campaign": ', "malformed plan (Expecting value"),
    ("[" * 100_000, "malformed plan (nested too deeply)"),
    ('{"n": ' + "9" * 5000 + "}", "malformed plan (Exceeds the limit"),
    ("[]", "malformed plan: expected an object, got an array"),
    ('{"campaign": "t"}', "malformed plan: missing key `cells`"),
], ids=["cut", "deep", "huge-number", "array", "missing-key"])
def test_a_plan_that_does_not_parse_names_the_file(tmp_path: Path, text: str,
                                                   problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(RecordError) as e:
        read_plan(tmp_path)
    assert str(e.value).startswith(f"{path}: {problem}")


def test_a_plan_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    (tmp_path / "plan.json").mkdir()
    with pytest.raises(RecordError, match="plan.json: cannot read"):
        read_plan(tmp_path)


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return edit


@pytest.mark.parametrize(("edit", "problem"), [
    (_set(("cells", 1, "index"), 2), "`cells[1].index`: is 2, expected 1 (execution order)"),
    (_set(("cells", 1, "label"), "../02-C"), '`cells[1].label`: is "../02-C", not a folder'),
    (_set(("cells", 2, "sentinel_of"), 2), "`cells[2].sentinel_of`: is 2, not an earlier cell"),
    (_set(("cells", 0, "sentinel_of"), -1), "`cells[0].sentinel_of`: is -1, not an earlier"),
    (_set(("decisions", 1, "baseline"), "C"), "`decisions[1]`: compares `C` with itself"),
    (_set(("decisions", 0, "expect"), "slower"),
     '`decisions[0].expect`: is "slower", expected one of faster, not-slower'),
    (_set(("looks",), [{"cells": 2, "fraction": 0.5, "alpha": 0.01},
                       {"cells": 2, "fraction": 1.0, "alpha": 0.04}]), "`looks[1]`: is not a look"),
    (_set(("looks",), [{"cells": 4, "fraction": 1, "alpha": 0.05}]), "`looks[0]`: is not a look"),
    (_set(("looks",), [{"cells": 1, "fraction": 1, "alpha": 1.0}]), "`looks[0]`: is not a look"),
    (_set(("match", "probe_tol"), "3%"), '`match.probe_tol`: expected a number, got a string'),
    (_set(("cells", 0, "config"), [1]), "`cells[0].config`: expected an object, got an array"),
    (_set(("cells", 0, "config"), {"engine": "warp"}),
     '`cells[0].config.engine`: is "warp", expected one of embedded'),
    (_set(("cells", 1, "config"), {"engine": "external", "command": ["sh"]}),
     "`cells[1].config.output`: is missing"),
    (lambda doc: doc["cells"][2].pop("config"), "`cells[2]`: missing key `config`"),
    (_set(("spacing_s",), float("inf")), "`spacing_s`: must be a finite number"),
])
def test_a_plan_the_analysis_cannot_rely_on_names_the_key(tmp_path: Path, edit: Any,
                                                          problem: str) -> None:
    path = _write(tmp_path, _changed(edit))
    with pytest.raises(RecordError) as e:
        read_plan(tmp_path)
    assert str(e.value).startswith(f"{path}: malformed plan: {problem}")


def test_a_decision_on_an_unknown_metric_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, _changed(_set(("decisions", 0, "metric"), "energy_per_tokens")))
    with pytest.raises(RecordError, match=r"`decisions\[0\]\.metric`"):
        read_plan(tmp_path)


def test_config_key_is_the_work_not_its_spelling() -> None:
    a = config_key({"threads": 2, "model": "m.gguf", "cache": {"b": 1, "a": 2}})
    assert a == '{"cache":{"a":2,"b":1},"model":"m.gguf","threads":2}'
    assert config_key({"cache": {"a": 2, "b": 1}, "threads": 2, "model": "m.gguf",
                       "timeout_s": 60}) == a  # order and the timeout do not change the work
    assert config_key({"threads": 4, "model": "m.gguf", "cache": {"b": 1, "a": 2}}) != a


def test_the_foreign_load_tolerance_is_written_only_when_set(tmp_path: Path) -> None:
    """Plans before it read as no criterion and write back as they were; a plan that sets it
    (every campaign file's does) keeps it."""
    assert Plan.from_json(OLD_PLAN).match.foreign_load_tol is None
    assert "foreign_load_tol" not in MatchSpec().to_json()
    plan = Plan.from_json({**OLD_PLAN, "match": {"foreign_load_tol": 0.25}})
    assert plan.to_json()["match"]["foreign_load_tol"] == 0.25
    assert read_plan(_write(tmp_path, plan.to_json()).parent) == plan


# -- interleaved plans (interleave = "slices") ---------------------------------------------

def _interleaved(doc: dict[str, Any]) -> None:
    doc["cells"].append({"index": 3, "name": "C", "config": {"tokens": 64, "arm": "C"},
                         "sentinel_of": 1, "label": "04-C"})
    for i, partner in enumerate((1, 0, 3, 2)):
        doc["cells"][i]["interleaved_with"] = partner
    doc["interleave"], doc["slice_tokens"] = "slices", 16


def test_an_interleaved_plan_reads_back_as_it_was_written(tmp_path: Path) -> None:
    doc = _changed(_interleaved)
    plan = read_plan(_write(tmp_path, doc).parent)
    assert (plan.interleave, plan.slice_tokens) == ("slices", 16)
    assert [(a.index, b.index) for a, b in plan.pairs()] == [(0, 1), (2, 3)]
    written = plan.to_json()
    assert (written["interleave"], written["slice_tokens"]) == ("slices", 16)
    assert [c["interleaved_with"] for c in written["cells"]] == [1, 0, 3, 2]
    assert read_plan(_write(tmp_path / "again", plan.to_json()).parent) == plan


def test_a_plan_that_does_not_interleave_writes_nothing_of_it() -> None:
    # plans before `interleave` stay byte-identical
    written = Plan.from_json(OLD_PLAN).to_json()
    assert "interleave" not in written and "slice_tokens" not in written
    assert all("interleaved_with" not in c for c in written["cells"])
    assert Plan.from_json(OLD_PLAN).pairs() == []


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda doc: (_interleaved(doc), doc["cells"][0].update(interleaved_with=2)),
     "`cells[0].interleaved_with`: is 2: not a neighbouring cell"),
    (lambda doc: (_interleaved(doc), doc["cells"][1].update(interleaved_with=2)),
     "`cells[0].interleaved_with`: is 1: not a neighbouring cell"),
    (lambda doc: doc["cells"][0].update(interleaved_with=1),
     "`cells[0].interleaved_with`: is 1: not a neighbouring cell"),
    (lambda doc: (_interleaved(doc), doc.update(interleave="pairs")),
     '`interleave`: is "pairs", expected one of cells, slices'),
    (lambda doc: (_interleaved(doc), doc.update(slice_tokens=0)),
     "`slice_tokens`: is 0, expected a count >= 1"),
])
def test_an_interleaved_plan_the_runner_cannot_rely_on_names_the_key(
        tmp_path: Path, edit: Any, problem: str) -> None:
    path = _write(tmp_path, _changed(edit))
    with pytest.raises(RecordError) as e:
        read_plan(tmp_path)
    assert str(e.value).startswith(f"{path}: malformed plan: {problem}")
