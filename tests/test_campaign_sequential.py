"""The rounds a sequential campaign appends (campaign/sequential.py): ABBA blocks of cells,
and in an interleaved campaign two pairs, each arm taking the first turn once, the first
started by the arm that did not start the decision's last pair."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from abbench.campaign import load_campaign, plan_campaign
from abbench.campaign.run_folder import write_plan
from abbench.campaign.runner import CampaignRun, RunOptions
from abbench.campaign.sequential import LookOutcome, interleaved_round, next_round
from abbench.records import Look, read_plan
from abbench.sensors import open_device


def test_a_round_is_abba_starting_with_the_candidate_after_the_baseline() -> None:
    assert next_round("C", [("C", "B")]) == ["B", "C", "C", "B"]
    assert next_round("B", [("C", "B")]) == ["C", "C", "B"]


@pytest.mark.parametrize(("pairs", "expected"), [
    ([], ["B", "C", "C", "B"]),  # no pair yet: the baseline starts
    ([("B", "C"), ("C", "B")], ["B", "C", "C", "B"]),
    ([("B", "C")], ["C", "B", "B", "C"]),  # B started the last pair: C starts the next
    ([("B", "C"), ("B", "E")], ["C", "B", "B", "C"]),  # another decision's pairs aside
])
def test_an_interleaved_round_is_two_pairs_alternating_who_starts(
        pairs: list[tuple[str, str]], expected: list[str]) -> None:
    assert interleaved_round(pairs, [("C", "B")]) == expected


def test_an_interleaved_round_of_two_decisions_sees_its_own_pairs() -> None:
    assert interleaved_round([("B", "C"), ("C", "B")], [("C", "B"), ("E", "B")]) == [
        "B", "C", "C", "B", "B", "E", "E", "B"]


def test_a_look_appends_the_round_as_interleaved_pairs(tmp_path: Path) -> None:
    cells = tmp_path / "cells.toml"
    cells.write_text("""\
[campaign]
interleave = "slices"
until = "decided"
max_cells = 12

[workload]
model = "synthetic:tiny"
tokens = 32

[cells.B]

[cells.C]
io_lanes = 1

[[decision]]
candidate = "C"
baseline = "B"
""")
    plan = plan_campaign(load_campaign(cells))
    folder = tmp_path / "run"
    folder.mkdir()
    write_plan(folder, plan)
    outcome = LookOutcome(Look(4, 0.3, 0.01), (("C", "B"),))
    run = CampaignRun(folder, plan, open_device("local"),
                      RunOptions(look=lambda *_: outcome), 2.0, None)
    more = run._look(SimpleNamespace(note=lambda line: None, plan=plan))  # type: ignore[arg-type]
    assert [(c.label, c.interleaved_with) for c in more] == [
        ("05-B", 5), ("06-C", 4), ("07-C", 7), ("08-B", 6)]
    again = read_plan(folder)
    assert [(a.name, b.name) for a, b in again.pairs()] == [("B", "C"), ("C", "B")] * 2
    assert again.looks == (outcome.look,)
