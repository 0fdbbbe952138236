"""Campaigns sharing a reports/ and a sentinels/ folder at once (docs/reliability.md): run
folders are made with an atomic mkdir, and appended files (a device's sentinel history)
take one locked write per line, so neither collides nor interleaves."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

from faults_helper import RAN, ext_cell, run_folders, sentinel_file, write_campaign

from abbench.campaign.run_folder import new_run_folder
from abbench.records import append_jsonl, read_journal, read_jsonl

WORKERS = 12


def _make_folder(root: str, barrier: multiprocessing.synchronize.Barrier,
                 out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    barrier.wait()
    out.put(str(new_run_folder(Path(root), "same")))


def test_run_folders_started_in_the_same_second_are_distinct(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_make_folder, args=(str(tmp_path / "reports"), barrier, out))
             for _ in range(WORKERS)]
    for p in procs:
        p.start()
    folders = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(set(folders)) == WORKERS
    assert sorted(folders) == sorted(str(p) for p in run_folders(tmp_path / "reports"))


def _append_many(path: str, worker: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    for n in range(60):
        # Lines larger than a pipe buffer and than Python's write buffer, where an
        # unlocked, buffered append could be split into several writes.
        append_jsonl(Path(path), {"worker": worker, "n": n, "pad": "x" * (20_000 + n)},
                     fsync=False)


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_append_many, args=(str(path), w, barrier)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_text().split("\n")
    assert lines[-1] == ""
    docs = [json.loads(x) for x in lines[:-1]]  # every line whole
    assert sorted((d["worker"], d["n"]) for d in docs) == [(w, n) for w in range(4)
                                                           for n in range(60)]
    assert all(len(d["pad"]) == 20_000 + d["n"] for d in docs)


def test_two_campaigns_sharing_reports_and_sentinels(tmp_path: Path) -> None:
    """Two real campaigns started together, each with a sentinel, into one reports/ and
    one sentinels/ folder: two whole run folders, and a history holding both."""
    procs = []
    for name in ("one", "two"):
        tmp = tmp_path / name
        tmp.mkdir()
        cells = write_campaign(tmp, ext_cell(tmp, "A", 10, n=24, delay=0.05) + "\n"
                               + ext_cell(tmp, "B", 12, n=24, delay=0.05),
                               ["A", "B", "A", "B"], name="same")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "abbench", "campaign", str(cells),
             "--out", str(tmp_path / "reports"), "--sentinels", str(tmp_path / "sentinels"),
             "--no-live"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode in RAN, err
    runs = run_folders(tmp_path / "reports")
    assert len(runs) == 2
    for run in runs:
        assert [r.status for r in read_journal(run)] == ["ok"] * 4
        assert json.loads((run / "status.json").read_text())["state"] == "complete"
        assert (run / "report.json").is_file()
    history = sentinel_file(tmp_path / "sentinels")
    assert history.read_text().endswith("\n")
    entries = read_jsonl(history)  # raises on any line that is not whole
    by_run = {run.name: sorted(d["cell"] for d in entries if d["run"].endswith(run.name)
                               and "kind" not in d)
              for run in runs}
    assert by_run == {run.name: ["01-A", "02-B", "03-A", "04-B"] for run in runs}
