"""Device state during and after a cell (issue 29, class 3), through `abbench import`.

`tests/fixtures/imports/readings-driver/`: three runs in the seed engine's v1 CSV format and
the driver log that ran them, an `ENTRY STATE:` and an `EXIT STATE:` line per run with
`t_wall=`. Cell 1 enters capped at 2.80 of 3.30 GHz; cell 3 enters at the maximum and its
exit line shows 1.90 GHz — the only reading that does.

`tests/fixtures/imports/readings-state/`: three runs with `.state` snapshots (the order
given by `--order`). qwen_a enters capped at 2.80 GHz and leaves at the maximum; qwen_b has
a `--- DURING ---` snapshot with policy6 capped at 3.00 GHz; qwen_c enters at the maximum
and its AFTER block shows policy0 at 1.90 GHz, and its `.metrics` has `*_after_*` keys.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from abbench.cli import main
from abbench.errors import RecordError
from abbench.records import Sample, read_journal, read_samples

FIXTURES = Path(__file__).parent / "fixtures" / "imports"
DRIVER = FIXTURES / "readings-driver"
STATE = FIXTURES / "readings-state"
STATE_ORDER = ("--order", "qwen_a,qwen_b,qwen_c")


def run_import(src: Path, out: Path, capsys: pytest.CaptureFixture[str],
               *args: str) -> tuple[str, dict[str, Any]]:
    """The import's printed report and its report.json."""
    assert main(["import", str(src), "--out", str(out), "--style", "plain", *args]) in (0, 3)
    printed = capsys.readouterr().out
    return printed, json.loads((out / "report.json").read_text())


def tells(doc: dict[str, Any], kind: str) -> dict[int, str]:
    return {t["cell"]: t["detail"] for t in doc["tells"] if t["kind"] == kind}


def md_row(out: Path, cell: str) -> str:
    """Cell `cell`'s row of report.md's cells table (the one with a "caps during" column)."""
    lines = (out / "report.md").read_text().splitlines()
    head = next(i for i, ln in enumerate(lines) if "| caps during |" in ln)
    (row,) = [ln for ln in lines[head:] if ln.startswith(f"| {cell} |")][:1]
    return row


# -- driver logs: EXIT STATE lines --------------------------------------------------------


def test_a_cap_read_only_at_a_cells_exit_is_a_tell_for_that_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    printed, doc = run_import(DRIVER, tmp_path / "run", capsys)
    after = tells(doc, "capped_after")
    assert list(after) == [2]  # cell 1 entered capped, but left at the maximum
    assert after[2].startswith("policy0 1.90 GHz at cell 3's exit (hardware max 3.30 GHz, "
                               "3.30 GHz at entry)")
    assert "cell 3 (qwen_sg) [capped_after]: policy0 1.90 GHz at cell 3's exit" in printed


def test_the_caps_timeline_names_the_cell_each_cap_was_read_at(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lowest cap is cell 3's, read at its exit: not pinned on cell 1, the first cell
    that had a cap at all."""
    _, doc = run_import(DRIVER, tmp_path / "run", capsys)
    assert doc["caps_timeline"] == [
        "policy0 capped from cell 1 (3.30 → 2.80 GHz), lowest 1.90 GHz at cell 3's exit"]


def test_the_during_column_does_not_repeat_the_entry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    printed, doc = run_import(DRIVER, out, capsys)
    third = "not read during (entry at max; exit capped policy0 1.90 GHz)"
    assert third in md_row(out, "3") and third in printed
    assert "not read during (entry capped policy0 2.80 GHz; exit at max)" in md_row(out, "1")
    assert [c["during"]["during_caps"] for c in doc["cells"]] == [[], [], []]


def test_exit_lines_are_kept_with_their_time_and_position(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    _, doc = run_import(DRIVER, out, capsys)
    samples = read_samples(out)
    assert [(s.cell, s.position) for s in samples] == [
        (0, "before"), (0, "exit"), (1, "before"), (1, "exit"), (2, "before"), (2, "exit")]
    assert samples[5].values["cpu.policy0.cap_khz"] == 1900000
    assert samples[5].t_wall == 1784531040.0
    journal = read_journal(out)
    # the end of each run is its exit line's time: qwen_pf's line names no run, the entry
    # line above it does
    assert [r.t_end_wall - r.t_start_wall for r in journal] == [40.0, 40.0, 40.0]
    info = json.loads((out / "import.json").read_text())
    assert info["cells"][1]["facts"]["t_end"]["source"] == \
        "driver.log:7 (`EXIT STATE:` t_wall=)"
    exits = [r for r in doc["cells"][2]["around"] if r["position"] == "exit"]
    assert [(r["t_wall"], r["caps_khz"]["policy0"], r["thermal_status"]) for r in exits] == \
        [(1784531040.0, 1900000, 2)]


def test_an_exit_line_without_a_time_is_said_and_not_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    shutil.copytree(DRIVER, src)
    log = src / "driver.log"
    log.write_text(log.read_text().replace("EXIT STATE: cell=qwen_sg t_wall=1784531040 ",
                                           "EXIT STATE: cell=qwen_sg "))
    _, doc = run_import(src, tmp_path / "run", capsys)
    assert "capped_after" not in {t["kind"] for t in doc["tells"]}
    info = json.loads((tmp_path / "run" / "import.json").read_text())
    assert any(n.startswith("driver.log:10 (exit): a reading of run qwen_sg with no time")
               for n in info["notes"])


# -- .state snapshots: BEFORE, DURING, AFTER; .metrics *_after_* --------------------------


def test_a_state_after_block_is_a_tell_and_a_during_snapshot_fills_the_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    _, doc = run_import(STATE, out, capsys, *STATE_ORDER)
    after = tells(doc, "capped_after")
    assert list(after) == [2]
    assert after[2].startswith("policy0 1.90 GHz at the end of cell 3 (hardware max 3.30 GHz")
    assert doc["caps_timeline"] == [
        "policy0 capped from cell 1 (3.30 → 2.80 GHz), lowest 1.90 GHz at the end of cell 3",
        "policy6 capped from cell 2 (3.80 → 3.00 GHz)"]
    assert [c["during"]["during_caps"] for c in doc["cells"]] == [
        [], [{"policy0": 3300000, "policy6": 3000000}], []]
    assert "| changing, capped policy6 |" in md_row(out, "2")
    assert "not read during (entry at max; after capped policy0 1.90 GHz)" in md_row(out, "3")


def test_every_snapshot_is_a_sample_with_its_position(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    _, doc = run_import(STATE, out, capsys, *STATE_ORDER)
    assert [(s.cell, s.position) for s in read_samples(out)] == [
        (0, "before"), (0, "after"), (1, "before"), (1, "during"), (1, "after"),
        (2, "before"), (2, "after")]
    # `.metrics` `*_after_*` keys: a reading after the run, with no time
    untimed = [r for r in doc["cells"][2]["around"] if r["t_wall"] is None]
    assert untimed == [{"position": "after", "t_wall": None, "caps_khz": {}, "hw_max_khz": {},
                        "cpu_temp_c": 71.8, "battery_temp_c": 36.9,
                        "mem_available_mib": 5988120 / 1024, "thermal_status": None}]


def test_a_reading_belongs_to_the_cell_whose_span_holds_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A during snapshot in qwen_a's file, taken while qwen_b ran (09:02:20, inside qwen_b's
    09:01:50 – 09:02:40), is qwen_b's reading, not qwen_a's."""
    src = tmp_path / "src"
    shutil.copytree(STATE, src)
    with (src / "qwen_a.state").open("a") as f:
        f.write("--- DURING ---\ndate: Mon Jul 20 09:02:20 CEST 2026\n"
                "policy0: scaling_max=2200000 hw_max=3300000 cur=806400\n")
    _, doc = run_import(src, tmp_path / "run", capsys, *STATE_ORDER)
    during = [c["during"]["during_caps"] for c in doc["cells"]]
    assert during[0] == [] and {"policy0": 2200000} in during[1]
    assert doc["caps_timeline"][0] == ("policy0 capped from cell 1 (3.30 → 2.80 GHz), "
                                       "lowest 1.90 GHz at the end of cell 3")


# -- the record: old run folders still read ------------------------------------------------


def test_a_sample_without_a_position_reads_and_writes_as_before(tmp_path: Path) -> None:
    tick = {"t_mono": 1.0, "t_wall": 2.0, "values": {}, "cell": 0}
    assert Sample.from_json(tick).position is None
    assert Sample.from_json(tick).to_json() == tick  # a sampler tick's line is unchanged
    (tmp_path / "samples.jsonl").write_text(json.dumps({**tick, "position": "later"}) + "\n")
    with pytest.raises(RecordError, match="position"):
        read_samples(tmp_path)
