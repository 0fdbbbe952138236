"""campaign.remote on this machine's own shell: a cell's folder and pid file, the exit
status passed on, killing what a cell left (its whole process group, and only when the
pid still names the process that was started), pulling its files back, the abbench
version check. tests/test_remote_ssh.py runs the same through a real sshd (slow).

The launches here start a session of their own (`start_new_session`), as sshd does for
each command it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from abbench import __version__
from abbench.campaign.remote import RemoteCell, RemoteRun, _unpack, check_abbench
from abbench.errors import CellOutputError, UsageError
from abbench.records.plan import RemoteSpec
from abbench.sensors import open_device


def alive(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace") \
                    and state != "Z":
                found.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return found


def launch(cell: RemoteCell, argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cell.launch(argv), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_cell_runs_in_its_own_emptied_folder_and_its_status_comes_back(
        tmp_path: Path) -> None:
    cell = RemoteCell(open_device("local"), str(tmp_path / "run" / "01-a"))
    (tmp_path / "run" / "01-a").mkdir(parents=True)
    (tmp_path / "run" / "01-a" / "out.csv").write_text("the previous cell's\n")
    p = launch(cell, ["sh", "-c", "ls; pwd > where; exit 3"])
    assert p.wait() == 3
    assert (tmp_path / "run" / "01-a" / "where").read_text().strip() == cell.folder
    assert not (tmp_path / "run" / "01-a" / "out.csv").exists()
    assert not (tmp_path / "run" / "01-a" / "pid").exists()  # removed when it returned


def test_a_timed_out_cell_is_killed_whole_and_checked_gone(tmp_path: Path) -> None:
    marker = f"abbench-remote-test-{os.getpid()}"
    sleep = f"sleep {1000 + os.getpid() % 9000}"  # this test's own grandchildren
    cell = RemoteCell(open_device("local"), str(tmp_path / "01-hang"))
    p = launch(cell, ["sh", "-c", f"{sleep} & {sleep} & wait", marker])
    wait_for(tmp_path / "01-hang" / "pid")
    time.sleep(0.3)
    assert alive(marker) and len(alive(sleep)) >= 2
    assert cell.kill() is None
    p.wait(10)
    assert alive(marker) == [] and alive(sleep) == []
    assert not (tmp_path / "01-hang" / "pid").exists()


def test_a_pid_since_given_to_another_process_is_not_killed(tmp_path: Path) -> None:
    """A pid file whose start time is not the running process's: left alone."""
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (tmp_path / "01-old").mkdir()
        (tmp_path / "01-old" / "pid").write_text(f"{other.pid} {other.pid} 1\n")
        run = RemoteRun(open_device("local"), RemoteSpec(str(tmp_path)), "")
        assert run.sweep() == []
        assert other.poll() is None
        assert not (tmp_path / "01-old" / "pid").exists()
    finally:
        other.kill()
        other.wait()


def test_sweep_kills_what_every_cell_of_the_run_left(tmp_path: Path) -> None:
    marker = f"abbench-sweep-test-{os.getpid()}"
    run = RemoteRun(open_device("local"), RemoteSpec(str(tmp_path)), "run-1")
    procs = [launch(run.cell(label), ["sh", "-c", "sleep 300", marker])
             for label in ("01-a", "02-b")]
    for label in ("01-a", "02-b"):
        wait_for(tmp_path / "run-1" / label / "pid")
    time.sleep(0.2)
    assert len(alive(marker)) >= 2  # each cell's (and its wrapper, whose script holds it)
    assert run.sweep() == []
    for p in procs:
        p.wait(10)
    assert alive(marker) == []


def test_pull_brings_the_files_that_exist_byte_for_byte(tmp_path: Path) -> None:
    cell = RemoteCell(open_device("local"), str(tmp_path / "c"))
    data = bytes(range(256)) * 3 + b"\n== fake 9\n"
    assert launch(cell, [sys.executable, "-c",
                         f"open('summary.json','wb').write({data!r})"]).wait() == 0
    (tmp_path / "c" / "with space.csv").write_text("a,b\n")
    got = cell.pull(["summary.json", "tokens.csv", "with space.csv"])
    assert got == {"summary.json": data, "with space.csv": b"a,b\n"}
    with pytest.raises(CellOutputError, match="cannot read the cell's folder"):
        RemoteCell(open_device("local"), str(tmp_path / "gone")).pull(["summary.json"])


def test_what_comes_back_cut_short_or_garbled_is_said() -> None:
    assert _unpack(b"== a 3\nabc== b c  1\nx") == {"a": b"abc", "b c": b"x"}
    with pytest.raises(CellOutputError, match="a came back cut short"):
        _unpack(b"== a 30\nabc")
    with pytest.raises(CellOutputError, match="garbled"):
        _unpack(b"junk")


def test_the_abbench_there_must_be_this_version(tmp_path: Path) -> None:
    device = open_device("local")
    assert check_abbench(device, (sys.executable, "-m", "abbench")) == __version__
    old = tmp_path / "abbench"
    old.write_text("#!/bin/sh\necho 'abbench 0.0.1'\n")
    old.chmod(0o755)
    with pytest.raises(UsageError, match=f"has abbench 0.0.1 .*, this one is {__version__}"):
        check_abbench(device, (str(old),))
    with pytest.raises(UsageError, match="cannot run abbench"):
        check_abbench(device, (str(tmp_path / "none"),))


def test_prepare_runs_in_order_and_the_first_failure_names_itself(tmp_path: Path) -> None:
    log = tmp_path / "log"
    spec = RemoteSpec(str(tmp_path), prepare=(
        ("sh", "-c", f"echo a >> {log}"), ("sh", "-c", "echo no such >&2; exit 7"),
        ("sh", "-c", f"echo c >> {log}")))
    device = open_device("local")
    notes, why = RemoteRun(device, spec, "run-1").before_cell("01-a")
    assert notes == [] and log.read_text() == "a\n"
    assert why == ("`[device] prepare` command 2 (`sh -c 'echo no such >&2; exit 7'`) exited "
                   f"with status 7 on {device.name}: no such")
    ok = RemoteRun(open_device("local"), RemoteSpec(str(tmp_path), prepare=(("true",),)), "r")
    assert ok.before_cell("01-a") == ([], None)


def test_after_a_cell_its_files_come_back_and_cleanup_runs(tmp_path: Path) -> None:
    there = tmp_path / "run-1" / "01-a"
    (there / "logs").mkdir(parents=True)
    (there / "x.metrics").write_text("free_mib=648\n")
    (there / "logs" / "engine.log").write_text("bmoe: expert streaming ON\n")
    (there / "other.txt").write_text("not asked for\n")
    spec = RemoteSpec(str(tmp_path), pull=("*.metrics", "logs/*.log", "none*"),
                      cleanup=(("sh", "-c", f"touch {tmp_path / 'cleaned'}"),))
    out = tmp_path / "here"
    out.mkdir()
    assert RemoteRun(open_device("local"), spec, "run-1").after_cell("01-a", out) == []
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "device/logs/engine.log", "device/x.metrics"]
    assert (out / "device" / "x.metrics").read_text() == "free_mib=648\n"
    assert (tmp_path / "cleaned").exists()
    failing = RemoteSpec(str(tmp_path), cleanup=(("false",),))
    (note,) = RemoteRun(open_device("local"), failing, "run-1").after_cell("01-a", out)
    assert note.startswith("01-a: `[device] cleanup` command 1 (`false`) exited with status 1")


def test_every_script_sent_to_the_device_is_one_line(tmp_path: Path) -> None:
    """Old adb servers mangle newlines in a shell command: the launch, the kill, the pull
    and the per-cell commands are `;`-separated, as the sampler's batch read is."""
    class Recording:
        name = "rec"
        scripts: list[str] = []

        def shell(self, script: str) -> list[str]:
            self.scripts.append(script)
            return ["sh", "-c", script]

    device = Recording()
    spec = RemoteSpec(str(tmp_path), prepare=(("sync",), ("true",)), pull=("*.metrics",))
    run = RemoteRun(device, spec, "run-1")  # type: ignore[arg-type]
    cell = run.cell("01-a")
    cell.launch(["echo", "a b"], remove=["/x/{cell}.csv"])
    run.before_cell("01-a")
    run.after_cell("01-a", tmp_path / "here")
    assert len(device.scripts) == 4 and not [s for s in device.scripts if "\n" in s]


def test_an_embedded_cells_files_come_back_into_its_folder(tmp_path: Path) -> None:
    cell = RemoteCell(open_device("local"), str(tmp_path / "there"))
    assert launch(cell, ["sh", "-c", "echo '{}' > summary.json; echo t > tokens.csv"]).wait() == 0
    out = tmp_path / "here"
    out.mkdir()
    assert cell.pull_into(out, ["summary.json", "tokens.csv", "route.csv"]) is None
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "tokens.csv"]
    assert RemoteCell(open_device("local"), str(tmp_path / "gone")).pull_into(
        out, ["summary.json"]).startswith("cannot read the cell's folder")  # type: ignore[union-attr]
