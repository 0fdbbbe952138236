"""Sentinel runs in the device history (campaign/sentinels.py): a sentinel and the cell it
repeats append one line each when they succeed; a resume appends only what a kill kept
from being written, and never extends a history it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

from abbench.campaign.sentinels import append_sentinel, resend_sentinels
from abbench.records import (
    CellRecord,
    EntryState,
    GateWait,
    Plan,
    PlannedCell,
    append_jsonl,
    config_key,
)
from abbench.records.cell_config import cell_config

CELLS = (PlannedCell(0, "B", cell_config({"model": "m"}), label="01-B"),
         PlannedCell(1, "C", cell_config({"model": "m", "x": 1}), label="02-C"),
         PlannedCell(2, "B", cell_config({"model": "m"}), sentinel_of=0, label="03-B"))
PLAN = Plan(campaign="t", cells=CELLS, spacing_s=0.0, warmup_tokens=0, device="local")


class NamedDevice:
    name = "lab box"  # not a file name: the history is lab_box.jsonl
    simulated = False


def record(cell: PlannedCell, status: str = "ok") -> CellRecord:
    return CellRecord(index=cell.index, name=cell.name, label=cell.label, status=status,
                      t_start_wall=100.0 + cell.index, t_end_wall=101.0 + cell.index,
                      t_start_mono=0.0, t_end_mono=1.0, entry=EntryState(t_wall=100.0),
                      gate=GateWait(), tokens_per_s=10.0 + cell.index, fingerprint="fp")


def lines(sentinels: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (sentinels / "lab_box.jsonl").read_text().splitlines()]


def test_a_sentinel_and_its_twin_append_a_line_each(tmp_path: Path) -> None:
    run, sentinels = tmp_path / "run", tmp_path / "sentinels"
    for cell in CELLS:
        append_sentinel(sentinels, NamedDevice(), PLAN, run, cell, record(cell))  # type: ignore[arg-type]
    first, second = lines(sentinels)
    assert (first["cell"], second["cell"]) == ("01-B", "03-B")  # C repeats nothing
    assert first == {
        "device": "lab box", "simulated": False, "campaign": "t", "run": str(run),
        "cell": "01-B", "name": "B", "config_key": config_key({"model": "m"}),
        "t_wall": 100.0, "tokens_per_s": 10.0, "fingerprint": "fp",
        "entry": EntryState(t_wall=100.0).to_json(),
    }


def test_a_failed_sentinel_appends_nothing(tmp_path: Path) -> None:
    append_sentinel(tmp_path, NamedDevice(), PLAN, tmp_path / "run", CELLS[2],  # type: ignore[arg-type]
                    record(CELLS[2], "failed"))
    assert not (tmp_path / "lab_box.jsonl").exists()


def test_a_resume_appends_only_the_lines_the_history_lacks(tmp_path: Path) -> None:
    run, sentinels = tmp_path / "run", tmp_path / "sentinels"
    run.mkdir()
    for cell in CELLS:
        append_jsonl(run / "journal.jsonl", record(cell).to_json())
    # killed after 01-B's history line, before 03-B's
    append_sentinel(sentinels, NamedDevice(), PLAN, run, CELLS[0], record(CELLS[0]))  # type: ignore[arg-type]
    resend_sentinels(sentinels, NamedDevice(), PLAN, run)  # type: ignore[arg-type]
    resend_sentinels(sentinels, NamedDevice(), PLAN, run)  # type: ignore[arg-type]
    assert [x["cell"] for x in lines(sentinels)] == ["01-B", "03-B"]


def test_a_history_that_does_not_parse_is_left_alone(tmp_path: Path) -> None:
    run, sentinels = tmp_path / "run", tmp_path / "sentinels"
    run.mkdir()
    append_jsonl(run / "journal.jsonl", record(CELLS[0]).to_json())
    sentinels.mkdir()
    (sentinels / "lab_box.jsonl").write_text("not json\n{}\n")
    resend_sentinels(sentinels, NamedDevice(), PLAN, run)  # type: ignore[arg-type]
    assert (sentinels / "lab_box.jsonl").read_text() == "not json\n{}\n"
