"""Fast, deterministic campaigns for the fault and concurrency tests: external cells (a tiny
Python script writing a bmoe CSV after a delay) on a local device whose sensors are a copy
of a fixture tree, so tok/s, entry states and decisions depend on nothing but the files."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from abbench.analysis.campaign import analyze
from abbench.records import CellRecord, Sample, keys, read_journal, read_samples
from abbench.report import json_report

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"
# A campaign that ran: its decisions GO (0), or OWED (3) where the speed probe — a timed loop,
# noisy on a shared machine — unmatched the pair; `comparable_report` pins the probe.
RAN = (0, 3)

# argv: OUT RATE N DELAY [MODE]. Rows vary with the token index (not randomly), so the
# bootstrap intervals are the same in every run; the CSV is renamed into place, so a
# killed cell never leaves half of one. MODE `once` sleeps an hour on its first run (a
# marker file beside OUT tells the runs apart): a cell that outlives a killed campaign.
CELL = textwrap.dedent("""\
    import os, sys, time
    out, rate, n, delay = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    if sys.argv[5:] == ["once"] and not os.path.exists(out + ".ran"):
        open(out + ".ran", "w").close()
        time.sleep(3600)
    time.sleep(delay)
    rows = ["token,wall_ms,read_bytes"]
    rows += [f"{i},{1000 / rate * (1 + 0.02 * ((i * 7) % 5)):.3f},{4096 + i}" for i in range(n)]
    with open(out + ".tmp", "w") as f:
        f.write("\\n".join(rows) + "\\n")
    os.replace(out + ".tmp", out)
    """)


def abbench(*args: str | Path, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def sensor_tree(tmp: Path) -> Path:
    """A private copy of the laptop fixture tree (tests may break it mid-run)."""
    tree = tmp / "tree"
    if not tree.exists():
        shutil.copytree(FIXTURES / "linux-laptop", tree)
    return tree


def ext_cell(tmp: Path, name: str, rate: float, n: int = 24, delay: float = 0.15,
             mode: str = "") -> str:
    """A `[cells.NAME]` table running the script above."""
    script = tmp / "cell.py"
    if not script.exists():
        script.write_text(CELL)
    out = tmp / f"out-{name}.csv"
    argv = [sys.executable, str(script), str(out), f"{rate:g}", str(n), f"{delay:g}"]
    argv += [mode] if mode else []
    return (f"[cells.{name}]\ncommand = {json.dumps(argv)}\n"
            f"output = {json.dumps('bmoe-csv:' + str(out))}\n")


def write_campaign(tmp: Path, cells: str, order: list[str], decisions: str = "",
                   name: str = "f", extra: str = "") -> Path:
    """cells.toml for `cells` (ext_cell tables) in `order`, sampling the tree at 20 Hz."""
    text = textwrap.dedent(f"""\
        [campaign]
        name = "{name}"
        spacing_s = 0
        warmup_tokens = 2
        order = {json.dumps(order)}

        [device]
        transport = "local"
        root = "{sensor_tree(tmp)}"
        sample_hz = 20

        [match]
        probe_tol = 1.0  # the local speed probe is a timed loop on a shared machine
        foreign_load_tol = 64  # and other jobs come and go on it

        [workload]
        engine = "external"
        timeout_s = 30
        """) + extra + "\n" + cells + "\n" + decisions
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def aba_campaign(tmp: Path) -> Path:
    """A, B, A (a sentinel of A) and the decision B vs A: the fault tests' campaign."""
    cells = ext_cell(tmp, "A", 10) + "\n" + ext_cell(tmp, "B", 12)
    decision = '[[decision]]\ncandidate = "B"\nbaseline = "A"\nmin_effect = 0.03\n'
    return write_campaign(tmp, cells, ["A", "B", "A"], decision)


def run_folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []


def sentinel_file(sentinels: Path) -> Path:
    """This machine's sentinel history (the local device is named after the host)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "device"
    return sentinels / f"{name}.jsonl"


def comparable_report(run: Path, scratch: Path) -> dict[str, Any]:
    """report.json of `run` with what timing decides taken out, for comparing two runs of
    the same cells (an interrupted-and-resumed one against an uninterrupted one).

    Equal by construction in both: cells, order, statuses, tok/s and intervals (the CSVs
    are deterministic, the bootstrap seeded by label), fingerprints, entry caps,
    temperatures and memory (a static sensor tree), pairs, drift, tells and decisions.
    Timing-derived, so left out: wall and monotonic times (the readings around a cell's
    too), the sample count per cell, the
    gap between cells (a resume adds the restart), the run folder's path, when the
    noise-floor snapshot was taken and the history file it names, and the speed
    probe — a timed loop on a shared machine, which `[match] probe_tol` would turn into
    matched or not at random — pinned to 1 in a copy of the journal before analysing.
    Likewise the other processes' load (`load.foreign_cores`, `load.runnable_tasks`),
    taken out of a copy of the samples: whether a tick falls between a cell's tag and its
    start is timing.
    """
    copy_dir = scratch / f"cmp-{run.name}"
    shutil.copytree(run, copy_dir)
    pinned = []
    for r in read_journal(copy_dir):
        d = r.to_json()
        d["entry"]["probe_index"] = 1.0
        pinned.append(json.dumps(d) + "\n")
    (copy_dir / "journal.jsonl").write_text("".join(pinned))
    host_load = (keys.FOREIGN_CORES, keys.RUNNABLE_TASKS)
    samples = [Sample(s.t_mono, s.t_wall, {k: v for k, v in s.values.items()
                                           if k not in host_load}, s.cell)
               for s in read_samples(copy_dir)]
    (copy_dir / "samples.jsonl").write_text("".join(json.dumps(s.to_json()) + "\n"
                                                    for s in samples))
    doc = json_report.build(analyze(copy_dir))
    doc = copy.deepcopy(doc)
    doc.pop("run")
    if doc.get("noise_floor"):
        for key in ("t_wall", "history"):
            doc["noise_floor"].pop(key)
    for c in doc["cells"]:
        for key in ("t_start_wall", "t_end_wall"):
            c.pop(key)
        c["entry"].pop("t_wall")
        c["during"].pop("samples")
        for reading in c["around"]:  # the entry reading's time, as the entry's
            reading.pop("t_wall")
    for p in doc["pairs"]:
        p["criteria"] = [x for x in p["criteria"] if x["name"] != "gap"]
    for d in doc["decisions"]:
        for comp in d["pairs"] + d["unmatched"]:
            comp["reasons"] = [r for r in comp["reasons"] if " s between the cells" not in r]
    return doc


def journal_lines(run: Path) -> list[str]:
    """The journal's complete lines (a torn last line left out)."""
    try:
        text = (run / "journal.jsonl").read_text()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def check_journal(run: Path, before: list[str], planned: int) -> list[CellRecord]:
    """Every planned cell once, in order, and every line journaled before the fault kept
    byte for byte (a completed cell neither lost nor re-run)."""
    records = read_journal(run)
    assert [r.index for r in records] == list(range(planned))
    after = journal_lines(run)
    assert after[:len(before)] == before
    return records


def check_samples(run: Path) -> None:
    """Samples tagged with a cell were taken while its journaled run was in flight: none
    left over from an attempt a kill cut short (the resume untags those)."""
    spans = {r.index: (r.t_start_mono, r.t_end_mono) for r in read_journal(run)}
    for s in read_samples(run):
        if s.cell is not None:
            start, end = spans[s.cell]
            assert start - 0.3 <= s.t_mono <= end + 0.3, (s.cell, s.t_mono, start, end)


def campaign(cells: Path, tmp: Path, fault: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {"ABBENCH_FAULT": fault} if fault else {}
    return abbench("campaign", cells, "--out", tmp / "r", "--sentinels", tmp / "s",
                   "--no-live", env=env, timeout=timeout)


def resume(run: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    return abbench("campaign", "--resume", run, "--sentinels", tmp / "s", "--no-live")


def start(cells: Path, tmp: Path, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "abbench", "campaign", str(cells), "--out", str(tmp / "r"),
         "--sentinels", str(tmp / "s"), "--no-live"], text=True,
        **{"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen})


def wait_for_child(tmp: Path, label: str, proc: subprocess.Popen[str]) -> Path:
    """cells/LABEL/child.json, once the campaign has started that cell's process."""
    deadline = time.monotonic() + 60
    while not (found := list((tmp / "r").glob(f"*/cells/{label}/child.json"))):
        assert time.monotonic() < deadline and proc.poll() is None, f"{label} never started"
        time.sleep(0.05)
    return found[0]
