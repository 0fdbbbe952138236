"""The cell-to-cell noise through the real CLI: `abbench calibrate` records a device's noise
floor, the next campaign on the device uses it, and sequential campaigns take looks, append
rounds and resume (docs/method.md#the-cell-is-the-unit-of-evidence,
docs/method.md#sequential-campaigns)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_campaign_run import abbench, run_folder, write_campaign

from abbench.analysis.sequential import look_alpha
from abbench.records import read_journal, read_plan, read_repeats


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def test_calibrate_records_a_floor_the_next_campaign_uses(tiny_model: Path,
                                                          tmp_path: Path) -> None:
    # Calibrated like a campaign whose [match] takes the widest tolerances of what this
    # shared host moves (its speed probe, other processes' load beside the test workers,
    # its free memory): those swings are not what is tested here.
    (tmp_path / "like").mkdir()
    like = write_campaign(tmp_path / "like", tiny_model, """
        [match]
        probe_tol = 1
        foreign_load_tol = 64
        mem_available_tol_frac = 1

        [cells.B]
        """)
    p = abbench("calibrate", "--like", like, "--cells", "4", "--spacing", "0",
                "--out", tmp_path / "cal", "--sentinels", tmp_path / "s", "--no-live")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the device's noise floor is now ±" in p.stdout
    (history,) = (tmp_path / "s").glob("*.jsonl")
    records = read_repeats(history)
    calibration = run_folder(tmp_path / "cal")
    labels = [c.label for c in sorted(read_journal(calibration), key=lambda c: c.index)]
    pairs = [(r.first, r.second) for r in records]
    # Every consecutive pair of the four cells is recorded, counted or not; a repeat group
    # with a gap (a cell the host's noise left out of it) adds its own consecutive members.
    consecutive = set(zip(labels, labels[1:]))
    assert len(labels) == 4 and consecutive <= set(pairs) and len(set(pairs)) == len(pairs)
    assert all(r.group is not None for r in records if (r.first, r.second) not in consecutive)
    repeats = [r for r in records if r.group is not None]
    # A group's consecutive members need not be comparable with each other: a cell joins
    # through any member it is (analysis.noise.repeat_groups). Two consecutive cells left
    # apart must not be.
    assert repeats and all(r.fingerprints_equal for r in repeats)
    assert all(not (r.comparable and r.fingerprints_equal) for r in records if r.group is None)
    df = len(repeats)  # one group of n cells has n - 1 degrees of freedom
    assert _report(calibration)["own_noise"]["df"] == df

    # A campaign with no repeat of its own: its verdict's cell level is the device's floor.
    cells = write_campaign(tmp_path, tiny_model, """
        [cells.B]
        overlap = true

        [cells.C]
        base = "B"
        io_lanes = 1

        [[decision]]
        candidate = "C"
        baseline = "B"
        """, head='order = ["B", "C"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode in (0, 1, 3), p.stdout + p.stderr
    r = _report(run_folder(tmp_path / "r"))
    assert r["noise"]["source"] == "device history" and r["noise"]["df"] == df
    assert r["noise_floor"]["campaigns"] == [calibration.name]
    assert not r["own_noise"]["known"]
    assert "cell-to-cell noise ±" in (run_folder(tmp_path / "r") / "report.md").read_text()


def test_calibrate_bad_flags_are_one_error(tmp_path: Path) -> None:
    p = abbench("calibrate", "--cells", "1", "--out", tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("ERROR: --cells 1")
    p = abbench("calibrate", "--device", "bogus", "--dry-run", "--out", tmp_path)
    assert p.returncode == 2 and "ERROR:" in p.stderr and "Traceback" not in p.stderr


SEQUENTIAL = """
    [cells.B]
    overlap = true

    [cells.C]
    base = "B"

    [[decision]]
    candidate = "C"
    baseline = "B"
    min_effect = 0.5
    """


@pytest.mark.slow  # over 20 s alone: the slow run covers it
def test_sequential_campaign_appends_rounds_until_the_budget(tiny_model: Path,
                                                            tmp_path: Path) -> None:
    # C is B under another name: never 1.5x faster, so the decision stays open and the
    # campaign spends its budget of 10 cells in ABBA rounds: B C C B, C C B, C C B.
    cells = write_campaign(tmp_path, tiny_model, SEQUENTIAL,
                           head='order = "abba"\nuntil = "decided"\nmax_cells = 10')
    p = abbench("campaign", cells, "--dry-run")
    assert "sequential: after these 4 cells, ABBA rounds" in p.stdout and "10 cells" in p.stdout
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 3, p.stdout + p.stderr
    folder = run_folder(tmp_path / "r")
    plan = read_plan(folder)
    assert [c.name for c in plan.cells] == list("BCCBCCBCCB")
    assert [lk.cells for lk in plan.looks] == [4, 7, 10]
    # each look at its group-sequential boundary for the looks taken (their levels sum to
    # more than 5%: the looks share their cells)
    fractions = [lk.fraction for lk in plan.looks]
    assert fractions == [0.4, 0.7, 1.0] and plan.looks[-1].final
    assert [lk.alpha for lk in plan.looks] == [
        look_alpha(fractions[: k + 1], k == 2) for k in range(3)]
    assert all(lk.alpha < 0.05 for lk in plan.looks)
    assert "look 1 after 4 cells" in p.stderr and "round: 3 more cells" in p.stderr
    r = _report(folder)
    assert [lk["cells"] for lk in r["looks"]] == [4, 7, 10]
    assert r["decisions"][0]["look"] == 3 and r["decisions"][0]["identical_config"]
    md = (folder / "report.md").read_text()
    assert "Sequential campaign (max 10 cells): 3 looks" in md


@pytest.mark.slow  # 14 s: three engine cells, killed and resumed; the slow run covers it
def test_sequential_campaign_resumes_its_rounds(tiny_model: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, SEQUENTIAL,
                           head='order = "abba"\nuntil = "decided"\nmax_cells = 7')
    env = {**os.environ, "ABBENCH_FAULT": "kill:before-cell:6"}  # dies before the 6th cell
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", str(cells), "--out",
                        str(tmp_path / "r"), "--sentinels", str(tmp_path / "s"), "--no-live"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == -9, p.stderr
    folder = run_folder(tmp_path / "r")
    assert len(read_journal(folder)) == 5 and [lk.cells for lk in read_plan(folder).looks] == [4]
    p = abbench("campaign", "--resume", folder, "--sentinels", tmp_path / "s", "--no-live")
    assert p.returncode == 3, p.stdout + p.stderr
    plan = read_plan(folder)
    assert [c.name for c in plan.cells] == list("BCCBCCB")
    assert [lk.cells for lk in plan.looks] == [4, 7] and plan.looks[-1].final
    assert [r.index for r in read_journal(folder)] == list(range(7))


def test_calibrate_like_a_campaign_keeps_its_conditions(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    p = abbench("calibrate", "--like", root / "cells" / "thermal-demo-gated.toml", "--cells",
                "4", "--dry-run", "--out", tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("plan calibrate-thermal-demo-gated: 4 cells on sim:phone")
    assert [ln.split()[0] for ln in lines[1:5]] == ["01-B", "02-B", "03-B", "04-B"]
    assert "drop_cold_experts=0.75" in lines[1]
    assert any(ln.startswith("gate before each cell: cpu_temp_max_c=30.7") for ln in lines)
    assert not any(ln.startswith("decision:") for ln in lines)
    p = abbench("calibrate", "--like", root / "cells" / "quickstart.toml", "--device",
                "sim:phone", "--dry-run", "--out", tmp_path)
    assert p.returncode == 0 and "6 cells on sim:phone" in p.stdout.splitlines()[0]


def test_an_unreadable_history_is_a_warning_not_a_lost_campaign(tiny_model: Path,
                                                                tmp_path: Path) -> None:
    import socket

    history = tmp_path / "s" / f"{socket.gethostname()}.jsonl"
    history.parent.mkdir()
    history.write_text("{torn\n{\"kind\": \"repeat\"}\n")  # a bad line, then a short one
    cells = write_campaign(tmp_path, tiny_model, """
        [match]
        probe_tol = 1  # the widest: this host's own swings are not what is tested here
        mem_available_tol_frac = 1
        foreign_load_tol = 64

        [cells.B]
        overlap = true
        """, head='order = ["B", "B"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WARNING: the device history cannot be read" in p.stderr
    assert "WARNING: the run's repeats could not be added" in p.stderr
    assert "Traceback" not in p.stderr
    folder = run_folder(tmp_path / "r")
    r = _report(folder)
    assert r["noise_floor"]["df"] == 0
    pair = r["pairs"][0]
    if pair["state"] == "matched":
        assert r["own_noise"]["df"] == 1
    else:  # the speed probe is relative to the campaign's first: one taken in a burst of
        # the other workers' load can put the next past even the widest tolerance (seen
        # twice in the parallel run); the two Bs are then not a repeat, and say why
        failed = [c["name"] for c in pair["criteria"] if c["status"] == "fail"]
        assert failed == ["probe"], pair
        assert r["own_noise"]["df"] == 0
    assert history.read_text().startswith("{torn\n")  # not ours to rewrite
