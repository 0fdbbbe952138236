"""What a crashed campaign leaves in its run folder, and the repairs `--resume` makes
before running more cells into it.

A kill -9 (or power loss) can leave: a journal or samples line torn halfway (cut off, with
a warning for the journal: that cell runs again); samples tagged with the cell that was in
flight (untagged: they describe a run that left no record, and must not count in its
re-run's statistics, though the timeline keeps them); temp files of an unfinished
temp-and-rename; and the cell's own process, orphaned and still running (killed: it would
write into the folder its cell re-runs in, and load the machine). Each cell's process is
noted in `cells/NN-NAME/child.json` when it starts, so the resume can tell it apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import warnings
from pathlib import Path

from abbench.errors import RecordError
from abbench.fsutil import atomic_write_text, cut_torn_tail
from abbench.records import Plan, Sample, read_samples


def repair(folder: Path, plan: Plan, done: set[int]) -> None:
    """Make a run folder safe to append to; `done` are the journaled cell indices."""
    journal = folder / "journal.jsonl"
    dropped = cut_torn_tail(journal)
    if dropped:
        following = next((c for c in plan.cells if c.index not in done), None)
        again = f"; cell {following.label} runs again" if following else ""
        warnings.warn(f"{journal}: its last line was torn by a crash ({dropped} bytes): "
                      f"dropped{again}", stacklevel=2)
    cut_torn_tail(folder / "samples.jsonl")  # a torn sample is a gap, not worth a warning
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    for cell in plan.cells:
        if cell.index not in done:
            reap_orphan(folder / "cells" / cell.label / "child.json")
    _untag_in_flight(folder, done)


def _untag_in_flight(folder: Path, done: set[int]) -> None:
    try:
        samples = read_samples(folder)
    except RecordError:
        return  # not ours to rewrite: the report names the bad line
    if not any(s.cell is not None and s.cell not in done for s in samples):
        return
    atomic_write_text(folder / "samples.jsonl", "".join(
        json.dumps((s if s.cell is None or s.cell in done
                    else Sample(s.t_mono, s.t_wall, s.values, None)).to_json(),
                   separators=(",", ":"), allow_nan=False) + "\n" for s in samples))


def proc_start(pid: int) -> str | None:
    """A live process's start time: field 22 of /proc/PID/stat (clock ticks since boot),
    which with the pid names one process whatever pid reuse does. None where the process
    is gone, a zombie, or there is no /proc (an orphan then cannot be told apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after "PID (COMM)": state is field 3
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def note_child(path: Path, pid: int) -> None:
    """Who runs the cell, so that a resume can kill it if the campaign died first (best
    effort: a disk too full for this note is reported by the journal write after it)."""
    with contextlib.suppress(OSError):
        atomic_write_text(path, json.dumps({"pid": pid, "start": proc_start(pid)}) + "\n")


def reap_orphan(path: Path) -> None:
    """Kill the process `path` (a child.json) names if it is still the one that ran."""
    try:
        doc = json.loads(path.read_text())
        pid, start = int(doc["pid"]), doc["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if start is None or proc_start(pid) != start:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGCONT)  # a simulated device may have left it stopped
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):  # what it started: a cell leads its own group
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while proc_start(pid) == start and time.monotonic() < deadline:
        time.sleep(0.02)
