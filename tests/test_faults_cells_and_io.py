"""Fault injection through the real CLI (docs/reliability.md): cells that crash, hang, exit
non-zero or write garbage, Ctrl-C, a full disk, and sensors that vanish or read garbage
mid-run; and the write layer's and the gap rules' own tests. Kill -9 then `--resume` is in
test_faults.py.

Deterministic faults use the test-only hook `ABBENCH_FAULT=ACTION:POINT:N`
(abbench/fsutil.py): the campaign gets a SIGINT or hits ENOSPC the Nth time it reaches
POINT — halfway through writing a file of that name.
"""

from __future__ import annotations

import errno
import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from faults_helper import (
    RAN,
    aba_campaign,
    abbench,
    campaign,
    check_journal,
    ext_cell,
    journal_lines,
    resume,
    run_folders,
    sensor_tree,
    start,
    wait_for_child,
    write_campaign,
)
from runs_helper import cell, make_run

from abbench import fsutil
from abbench.analysis.campaign import analyze
from abbench.campaign.recovery import proc_start
from abbench.errors import WriteError
from abbench.fsutil import atomic_write_text, cut_torn_tail
from abbench.records import append_jsonl, read_journal, read_samples
from abbench.sensors import Sampler

# -- cells that fail --------------------------------------------------------------------------

def _script_cell(tmp: Path, name: str, body: str, timeout: float | None = None) -> str:
    script = tmp / f"{name}.py"
    script.write_text(textwrap.dedent(body))
    out = tmp / f"out-{name}.csv"
    return (f"[cells.{name}]\ncommand = {json.dumps([sys.executable, str(script), str(out)])}\n"
            f"output = {json.dumps('bmoe-csv:' + str(out))}\n"
            + (f"timeout_s = {timeout}\n" if timeout else ""))


FAILING = {
    # name: (script, status, what the error says, what the stderr tail holds)
    "crash": ("import sys\nprint('x' * 50000, file=sys.stderr)\n"
              "print('boom: crashed', file=sys.stderr)\nsys.exit(3)\n",
              "failed", "exited with status 3", "boom: crashed"),
    "segv": ("import os, signal, sys\nprint('about to segfault', file=sys.stderr, flush=True)\n"
             "os.kill(os.getpid(), signal.SIGSEGV)\n",
             "failed", "killed by SIGSEGV", "about to segfault"),
    "hang": ("import sys, time\nprint('hanging', file=sys.stderr, flush=True)\n"
             "time.sleep(60)\n",
             "timeout", "no result after the 1 s timeout", "hanging"),
    "garbage": ("import sys\nopen(sys.argv[1], 'wb').write(b'\\x00\\xff<html>not a csv\\n')\n"
                "print('wrote garbage', file=sys.stderr)\n",
                "failed", "is not a column name", "wrote garbage"),
    "nan": ("import sys\nopen(sys.argv[1], 'w').write('# summary tok/s=nan\\nwall_ms\\n1\\n')\n"
            "print('wrote nan', file=sys.stderr)\n",
            "failed", "tok/s: 'nan' is not a finite number", "wrote nan"),
}


def test_failing_cells_are_recorded_with_their_stderr_and_leave_their_pairs_owed(
    tmp_path: Path
) -> None:
    cells = ext_cell(tmp_path, "A", 10) + "\n" + "\n".join(
        _script_cell(tmp_path, name, body, 1 if name == "hang" else None)
        for name, (body, *_) in FAILING.items())
    order = ["A", *FAILING, "A"]
    decisions = "".join(f'[[decision]]\ncandidate = "{n}"\nbaseline = "A"\n' for n in FAILING)
    p = campaign(write_campaign(tmp_path, cells, order, decisions), tmp_path)
    # Every decision OWED, and none has a valid cell of its candidate: no measurement.
    assert p.returncode == 5, p.stderr
    assert "Traceback" not in p.stderr
    (run,) = run_folders(tmp_path / "r")
    records = read_journal(run)
    assert [r.name for r in records] == order  # the campaign went on after each
    assert records[0].status == records[-1].status == "ok"
    for r in records[1:-1]:
        _, status, error, tail = FAILING[r.name]
        assert r.status == status, (r.name, r.error)
        assert error in (r.error or ""), (r.name, r.error)
        assert tail in r.stderr_tail and len(r.stderr_tail) <= 4000, r.name
        assert r.tokens_per_s is None
    hang = records[order.index("hang")]
    assert hang.t_end_mono - hang.t_start_mono < 10
    report = json.loads((run / "report.json").read_text())
    assert [d["verdict"] for d in report["decisions"]] == ["OWED"] * len(FAILING)
    assert "a re-run of the failed cell" in report["decisions"][0]["settle"]  # crash: adjacent


# -- Ctrl-C -------------------------------------------------------------------------------

def test_ctrl_c_leaves_a_partial_report_marked_interrupted_and_resume_completes_it(
    tmp_path: Path
) -> None:
    cells = write_campaign(tmp_path, ext_cell(tmp_path, "A", 10) + "\n"
                           + ext_cell(tmp_path, "S", 10, mode="once"), ["A", "S"])
    proc = start(cells, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_child(tmp_path, "02-S", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    assert "Traceback" not in err and "--resume" in err
    (run,) = run_folders(tmp_path / "r")
    child = json.loads((run / "cells" / "02-S" / "child.json").read_text())
    assert proc_start(child["pid"]) is None, "Ctrl-C left the cell running"
    assert json.loads((run / "status.json").read_text())["state"] == "interrupted"
    report = json.loads((run / "report.json").read_text())
    assert (report["state"], report["complete"], report["cells_recorded"]) == (
        "interrupted", False, 1)
    assert "INCOMPLETE: 1 of 2 cells recorded (state: interrupted)" in (
        run / "report.md").read_text()
    assert "INCOMPLETE" in (run / "report.html").read_text()
    r = resume(run, tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((run / "report.json").read_text())
    assert (report["state"], report["complete"]) == ("complete", True)
    assert "INCOMPLETE" not in (run / "report.md").read_text()


def test_ctrl_c_while_writing_the_report_says_so_and_report_writes_it(tmp_path: Path) -> None:
    p = campaign(aba_campaign(tmp_path), tmp_path, "interrupt:report.md:1")
    assert p.returncode == 4, p.stderr
    (run,) = run_folders(tmp_path / "r")
    assert "ERROR: interrupted while writing the report" in p.stderr
    assert f"TIP: write it with: abbench report {run}" in p.stderr
    assert "Traceback" not in p.stderr
    assert len(read_journal(run)) == 3 and not (run / "report.md").exists()
    assert not list(run.glob(".*.tmp"))
    r = abbench("report", run)
    assert r.returncode in RAN, r.stderr
    assert "INCOMPLETE" not in (run / "report.md").read_text()


# -- a full disk ----------------------------------------------------------------------------

@pytest.mark.parametrize("point, status, file", [
    ("journal.jsonl:2", 2, "journal.jsonl"),   # cell 2 ran, its record cannot be written
    ("plan.json:1", 2, "plan.json"),           # before anything ran
    ("report.html:1", 2, "report.html"),       # every cell recorded, the report not
    ("samples.jsonl:5", RAN, None),            # a sample lost: a gap, the campaign goes on
])
def test_full_disk_fails_with_one_clear_error_and_leaves_the_journal_readable(
    point: str, status: int | tuple[int, ...], file: str | None, tmp_path: Path
) -> None:
    p = campaign(aba_campaign(tmp_path), tmp_path, "enospc:" + point)
    assert p.returncode in (status if isinstance(status, tuple) else (status,)), p.stderr
    assert "Traceback" not in p.stderr
    errors = [x for x in p.stderr.splitlines() if x.startswith("ERROR:")]
    if file == "plan.json":  # nothing ran: the half-made run folder is not left behind
        assert list(run_folders(tmp_path / "r")) == []
        assert len(errors) == 1 and file in errors[0] and "no space left" in errors[0]
        return
    (run,) = run_folders(tmp_path / "r")
    for line in journal_lines(run):
        json.loads(line)  # whole lines only
    journal = run / "journal.jsonl"
    assert not journal.exists() or journal.read_text().endswith("\n")
    read_samples(run)
    if file is None:
        assert [r.status for r in read_journal(run)] == ["ok"] * 3
        return
    assert len(errors) == 1 and file in errors[0] and "no space left on device" in errors[0]
    assert "TIP: free some space on that disk" in p.stderr
    if file == "journal.jsonl":
        assert len(read_journal(run)) == 1
        state = json.loads((run / "status.json").read_text())
        assert state["state"] == "failed" and file in state["error"]
        assert f"--resume {run}" in p.stderr
        before = journal_lines(run)
        r = resume(run, tmp_path)
        assert r.returncode in RAN, r.stderr
        check_journal(run, before, planned=3)
    elif file == "report.html":
        assert len(read_journal(run)) == 3 and f"abbench report {run}" in p.stderr
        assert not list(run.glob(".*.tmp"))
        r = abbench("report", run, env={"ABBENCH_FAULT": "enospc:report.md:1"})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"ERROR: cannot write {run / 'report.md'}: no space left")
        r = abbench("report", run)
        assert r.returncode in RAN, r.stderr
        assert (run / "report.html").is_file()


# -- sensors that vanish or read garbage mid-run ---------------------------------------------

GAP = """\
import os, subprocess, sys, time
tree, rest = sys.argv[1], sys.argv[2:]
zone = os.path.join(tree, "sys/class/thermal/thermal_zone2")        # x86_pkg_temp: the CPU
away = os.path.join(tree, "zone2.gone")
cap = os.path.join(tree, "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq")
time.sleep(0.3)
os.rename(zone, away)                               # the CPU temperature sensor vanishes
good = open(cap).read()
open(cap, "w").write("garbage\\n")                   # a frequency cap reads garbage
time.sleep(0.6)
os.rename(away, zone)
open(cap, "w").write(good)
time.sleep(0.3)
sys.exit(subprocess.call(rest))                     # then the cell itself
"""


def test_sensor_vanishing_or_reading_garbage_mid_cell_is_a_gap_that_unmatches(
    tmp_path: Path
) -> None:
    tree = sensor_tree(tmp_path)
    gap = tmp_path / "gap.py"
    gap.write_text(GAP)
    b = ext_cell(tmp_path, "B", 12)
    g = b.replace("[cells.B]", "[cells.G]").replace(
        "command = [", f"command = [{json.dumps(sys.executable)}, {json.dumps(str(gap))}, "
        f"{json.dumps(str(tree))}, ", 1)
    cells = write_campaign(tmp_path, ext_cell(tmp_path, "A", 10) + "\n" + b + "\n" + g,
                           ["A", "G", "A", "B"])
    p = campaign(cells, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    (run,) = run_folders(tmp_path / "r")
    assert [r.status for r in read_journal(run)] == ["ok"] * 4
    during_g = [s.values for s in read_samples(run) if s.cell == 1]
    assert any("temp.cpu_c" not in v for v in during_g)  # the gap is in the timeline
    assert any("cpu.policy0.cap_khz" not in v for v in during_g)
    assert any("temp.cpu_c" in v for v in during_g)      # and the sensor came back
    others = [s.values for s in read_samples(run) if s.cell in (0, 2, 3)]
    assert all("temp.cpu_c" in v and "cpu.policy0.cap_khz" in v for v in others)
    pairs = json.loads((run / "report.json").read_text())["pairs"]
    status = [{c["name"]: c for c in pair["criteria"]} for pair in pairs]
    for crit in status[:2]:  # the pairs with G: unmatched on the sensors that had a gap
        assert "sensor gap during cell 2 (02-G)" in crit["caps"]["detail"]
        assert "`cpu.policy0.cap_khz` missing from" in crit["caps"]["detail"]
        assert "`temp.cpu_c` missing from" in crit["cpu_temp"]["detail"]
        assert crit["caps"]["status"] == crit["cpu_temp"]["status"] == "fail"
        assert crit["mem_available"]["status"] == "ok"  # the other sensors still hold
    assert pairs[0]["state"] == pairs[1]["state"] == "unmatched"
    # Without G, the same sensors hold (the pair's state also rests on the speed probe, a
    # timed loop on a shared machine: not asserted here).
    assert status[2]["caps"]["status"] == status[2]["cpu_temp"]["status"] == "ok"


# -- the write layer and the gap rules, in process ------------------------------------------

def test_append_cuts_a_torn_tail_and_keeps_a_whole_line_without_its_newline(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text('{"a":1}\n{"b":2')  # a crash tore the second line
    append_jsonl(path, {"c": 3})
    assert path.read_text() == '{"a":1}\n{"c":3}\n'
    assert "dropped a torn last line (6 bytes)" in str(recwarn.pop().message)
    path.write_text('{"a":1}\n{"b":2}')  # whole, only its newline missing: readers count it
    append_jsonl(path, {"c": 3})
    assert path.read_text() == '{"a":1}\n{"b":2}\n{"c":3}\n'
    assert cut_torn_tail(tmp_path / "absent.jsonl") == 0


def test_a_failed_append_or_write_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.jsonl"
    append_jsonl(path, {"a": 1})
    (tmp_path / "report.md").write_text("old\n")
    monkeypatch.setattr(fsutil, "_fault_hits", Counter())
    for point, write in (("journal.jsonl", lambda: append_jsonl(path, {"b": "x" * 100})),
                         ("report.md", lambda: atomic_write_text(tmp_path / "report.md",
                                                                 "new\n" * 100))):
        monkeypatch.setenv("ABBENCH_FAULT", f"enospc:{point}:1")
        with pytest.raises(OSError) as e:
            write()
        assert e.value.errno == errno.ENOSPC and e.value.filename.endswith(point)
        error = WriteError.from_os(e.value, "continue with: X")
        assert error.message == f"cannot write {e.value.filename}: no space left on device"
        assert error.tip == "free some space on that disk, then continue with: X"
    assert path.read_text() == '{"a":1}\n'  # the half line undone
    assert (tmp_path / "report.md").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.jsonl", "report.md"]


def test_sensor_gaps_count_only_what_a_cell_had_and_lost(tmp_path: Path) -> None:
    caps = {"policy0": 2_000_000, "policy4": 2_400_000}
    lost = {"policy0": 2_000_000}  # policy4's cap unreadable in one sample
    run = make_run(tmp_path, [cell("A", 40, caps_during=[caps, caps]),
                              cell("B", 40, caps_during=[caps, lost, caps]),
                              cell("C", 40, caps_during=[caps])])
    a = analyze(run)
    assert [c.during.gaps for c in a.cells] == [{}, {"cpu.policy4.cap_khz": 1}, {}]
    assert [p.state for p in a.pairs] == ["unmatched", "unmatched"]
    for p in a.pairs:
        (reason,) = p.reasons
        assert reason == ("caps sensor gap during cell 2 (02-B): `cpu.policy4.cap_khz` "
                          "missing from 1 of 3 samples")


def test_a_reading_at_one_cells_entry_only_unmatches(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("A", 40), cell("B", 40, cpu_temp=None),
                              cell("C", 40, cpu_temp=None)])
    a = analyze(run)
    first = {c.name: c for c in a.pairs[0].criteria}["cpu_temp"]
    assert first.status == "fail"
    assert first.detail == "cpu temp measured for cell 1 only: a sensor gap at cell 2's entry"
    second = {c.name: c for c in a.pairs[1].criteria}["cpu_temp"]
    assert second.status == "not measured"  # after it vanished for good: like no sensor
    assert a.pairs[1].state == "matched"


def test_sampler_leaves_out_readings_that_are_not_finite_scalars() -> None:
    class Garbage:
        def sample(self) -> dict[str, Any]:
            return {"temp.cpu_c": math.nan, "cpu.policy0.cap_khz": math.inf, "ok": 1.5,
                    "list": [1], "none": None, "status": "Charging", "flag": True}

    got: list[dict[str, Any]] = []
    with Sampler(Garbage(), hz=50, sink=lambda t, w, v: got.append(v)):
        while not got:
            time.sleep(0.01)
    assert got[0] == {"ok": 1.5, "status": "Charging", "flag": True}
