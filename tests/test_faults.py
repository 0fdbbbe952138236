"""Fault injection through the real CLI (docs/reliability.md): kill -9 at chosen and at
random points, then `--resume`. Cells that fail, Ctrl-C, a full disk and sensors that
vanish are in test_faults_cells_and_io.py (two modules: the workers run them side by side).

Deterministic faults use the test-only hook `ABBENCH_FAULT=ACTION:POINT:N`
(abbench/fsutil.py): the campaign SIGKILLs itself, gets a SIGINT or hits ENOSPC the Nth time
it reaches POINT — halfway through writing a file of that name, or at `before-cell`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
from faults_helper import (
    RAN,
    aba_campaign,
    campaign,
    check_journal,
    check_samples,
    comparable_report,
    ext_cell,
    journal_lines,
    resume,
    run_folders,
    sentinel_file,
    start,
    wait_for_child,
    write_campaign,
)

from abbench.campaign.recovery import proc_start
from abbench.records import read_samples

KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, float]:
    """The uninterrupted run's comparable report, and how long the campaign took."""
    tmp = tmp_path_factory.mktemp("baseline")
    t0 = time.monotonic()
    p = campaign(aba_campaign(tmp), tmp)
    wall = time.monotonic() - t0
    assert p.returncode in RAN, p.stderr
    (run,) = run_folders(tmp / "r")
    doc = comparable_report(run, tmp)
    assert [d["verdict"] for d in doc["decisions"]] == ["GO"]
    return doc, wall


def check_resumed(run: Path, tmp: Path, before: list[str], baseline: dict) -> None:
    """What every kill-then-resume must leave: each planned cell once, the cells journaled
    before the kill untouched, honest samples, the uninterrupted run's report, a complete
    status, no temp files, and one sentinel history line per sentinel cell."""
    check_journal(run, before, planned=3)
    check_samples(run)
    assert comparable_report(run, tmp) == baseline
    assert json.loads((run / "status.json").read_text())["state"] == "complete"
    assert "INCOMPLETE" not in (run / "report.md").read_text()
    assert not list(run.glob(".*.tmp"))
    lines = sentinel_file(tmp / "s").read_text().splitlines()
    mine = [json.loads(x) for x in lines if json.loads(x)["run"].endswith(run.name)]
    assert sorted(d["cell"] for d in mine if "kind" not in d) == ["01-A", "03-A"]
    # ... and the run's one repeat, once, however often the run was resumed and reported
    assert [(d["first"], d["second"]) for d in mine if d.get("kind") == "repeat"] == [
        ("01-A", "03-A")]


# -- kill -9 at chosen points, then --resume ------------------------------------------------

# point -> cells journaled when it fires (None: depends on timing)
KILL_POINTS: dict[str, int | None] = {
    "noise-floor.json:1": 0,     # between the plan and the noise-floor snapshot: no cell
    "before-cell:3": 2,          # between cells: cell 3's folder not yet made
    "journal.jsonl:2": 1,        # half of cell 2's journal line written
    "SENTINELS:1": 1,            # half of cell 1's sentinel history line written
    "samples.jsonl:4": None,     # half of a sample written (0.2 s in: cell 1, or before)
    "report.md:1": 3,            # rendering: report.json renamed, report.md half-written
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_kill_9_at_a_point_then_resume_equals_an_uninterrupted_run(
    point: str, baseline: tuple[dict, float], tmp_path: Path
) -> None:
    fault = "kill:" + point.replace("SENTINELS", sentinel_file(tmp_path).name)
    p = campaign(aba_campaign(tmp_path), tmp_path, fault)
    assert p.returncode == KILLED, p.stderr
    (run,) = run_folders(tmp_path / "r")
    before = journal_lines(run)
    assert len(before) == KILL_POINTS[point] or KILL_POINTS[point] is None
    r = resume(run, tmp_path)
    assert r.returncode in RAN, r.stderr
    assert "Traceback" not in r.stderr
    if point.startswith("journal"):
        assert "torn by a crash" in r.stderr and "02-B runs again" in r.stderr
    if point.startswith("SENTINELS"):
        assert "dropped a torn last line" in r.stderr
    check_resumed(run, tmp_path, before, baseline[0])


def test_kill_9_mid_cell_kills_the_orphaned_cell_on_resume(tmp_path: Path) -> None:
    """The campaign alone dies mid-cell (as under the OOM killer); its cell sleeps on, and
    the resume must kill it before re-running the cell in the same folder, and untag the
    samples the dead attempt left."""
    cells = write_campaign(tmp_path, ext_cell(tmp_path, "A", 10) + "\n"
                           + ext_cell(tmp_path, "S", 10, mode="once"), ["A", "S"])
    proc = start(cells, tmp_path)
    child_json = wait_for_child(tmp_path, "02-S", proc)
    time.sleep(0.5)  # ten samples into the cell
    proc.kill()
    proc.wait()
    (run,) = run_folders(tmp_path / "r")
    child = json.loads(child_json.read_text())
    try:
        assert proc_start(child["pid"]) == child["start"], "the orphan should still run"
        assert any(s.cell == 1 for s in read_samples(run))
        before = journal_lines(run)
        assert len(before) == 1
        r = resume(run, tmp_path)
        assert r.returncode == 0, r.stderr
        assert proc_start(child["pid"]) is None, "the orphaned cell outlived the resume"
        records = check_journal(run, before, planned=2)
        assert [x.status for x in records] == ["ok", "ok"]
        check_samples(run)  # the dead attempt's samples no longer count for cell 2
    finally:
        if proc_start(child["pid"]) == child["start"]:
            os.kill(child["pid"], signal.SIGKILL)


def _random_kill_then_resume(seed: int, baseline: tuple[dict, float], tmp: Path) -> None:
    doc, wall = baseline
    delay = random.Random(seed).uniform(0.0, 1.1 * wall)
    cells = aba_campaign(tmp)
    proc = start(cells, tmp, start_new_session=True)
    try:
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)  # the campaign and its cell, as a crash would
    except ProcessLookupError:
        pass  # it had finished
    finally:
        proc.wait()
    started = [f for f in run_folders(tmp / "r") if (f / "plan.json").is_file()]
    why = f"seed {seed}: killed after {delay:.2f} s"
    if not started:  # killed before the plan was written: nothing ran, start again
        r = campaign(cells, tmp)
        (run,) = [f for f in run_folders(tmp / "r") if (f / "plan.json").is_file()]
        before: list[str] = []
    else:
        (run,) = started
        before = journal_lines(run)
        r = resume(run, tmp)
    assert r.returncode in RAN, f"{why}\n{r.stderr}"
    assert "Traceback" not in r.stderr, why
    check_resumed(run, tmp, before, doc)


# One random moment in the default run (the fixed points above cover each file's write);
# the slow run draws thirty more.
@pytest.mark.parametrize("seed", range(1))
def test_kill_9_at_a_random_moment_then_resume(seed: int, baseline: tuple[dict, float],
                                               tmp_path: Path) -> None:
    _random_kill_then_resume(seed, baseline, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 33))
def test_kill_9_at_a_random_moment_then_resume_many(seed: int, baseline: tuple[dict, float],
                                                    tmp_path: Path) -> None:
    _random_kill_then_resume(seed, baseline, tmp_path)
