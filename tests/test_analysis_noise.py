"""Which repeats count as noise, and the device history's floor counts what the campaign counted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from runs_helper import cell, make_run

from abbench.analysis.campaign import analyze
from abbench.analysis.noise import comparable, history_floor
from abbench.records import RepeatRecord


def _record(first: str, second: str, ratio: float, comparable: bool, t: float,
            group: int | None = 0) -> RepeatRecord:
    return RepeatRecord(
        device="phone", run="cal", campaign="cal", t_wall=t, config_key="k", name="B",
        first=first, second=second, log_ratio=ratio, token_variance_first=0.0,
        token_variance_second=0.0, fingerprints_equal=True, matched=comparable,
        comparable=comparable, group=group)


def test_a_group_linked_through_a_third_cell_counts_every_member() -> None:
    # Cells 1, 2, 3 form one repeat group (each comparable with cell 1), but 2 and 3 are
    # not comparable with each other: the group's consecutive link 2 -> 3 still counts, as
    # it did in the campaign's own noise (3 cells, 2 df).
    records = [_record("01-B", "02-B", 0.02, True, 1.0),
               _record("02-B", "03-B", -0.04, False, 2.0)]
    floor = history_floor(records, "h.jsonl", 10.0)
    assert floor.df == 2 and floor.repeats == 3
    # cells at log rates 0, 0.02, -0.02 (relative to the first): their sample variance
    assert math.sqrt(floor.variance) == pytest.approx(0.02)


def test_an_ungrouped_record_is_kept_but_never_counted() -> None:
    records = [_record("01-B", "02-B", 0.02, True, 1.0),
               _record("02-B", "05-B", -0.3, False, 2.0, group=None)]
    assert history_floor(records, "h.jsonl", 10.0).df == 1


def test_repeats_with_different_foreign_load_are_not_comparable(tmp_path: Path) -> None:
    """`comparable` takes every criterion but adjacency and gap: a burst of other
    processes' load on one repeat keeps it out of the noise estimate, as a cap would."""
    cells = [cell("B", 40, foreign=0.0), cell("B", 30, foreign=1.0), cell("B", 40, foreign=0.05)]
    (tmp_path / "with").mkdir()
    a = analyze(make_run(tmp_path / "with", cells, match={"foreign_load_tol": 0.25}))
    assert not comparable(a.matches[(0, 1)]) and comparable(a.matches[(0, 2)])
    assert a.groups == ((0, 2),)
    (tmp_path / "before").mkdir()  # a plan from before the criterion: every repeat counts
    assert analyze(make_run(tmp_path / "before", cells)).groups == ((0, 1, 2),)
