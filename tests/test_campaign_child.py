"""A cell's process on its own (campaign/child.py): its command line, through the device's
transport for an external cell; exit status, signal, timeout and a command that cannot
start, each as the journal words it; the stderr tail."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import sys
from pathlib import Path

import pytest

from abbench.campaign.child import (
    CellChild,
    ChildExit,
    cell_argv,
    engine_argv,
    exit_reason,
    stderr_tail,
)
from abbench.records.cell_config import EmbeddedConfig, cell_config
from abbench.sensors import open_device
from abbench.sensors.transports import SSH_OPTIONS

# A fake `ssh` that records its argv (one JSON line per call) and, like the remote shell,
# runs the command line it was handed.
FAKE_SSH = """#!{python}
import json, os, subprocess, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(subprocess.run(["sh", "-c", sys.argv[-1]]).returncode)
"""


@pytest.fixture
def ssh_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `ssh` first on PATH; returns the file its argv lines go to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "ssh"
    exe.write_text(FAKE_SSH.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "ssh-argv.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def run_child(tmp_path: Path, argv: list[str], timeout: float = 30) -> ChildExit:
    return CellChild(open_device("local")).run(argv, tmp_path, timeout)


def test_an_ssh_cell_is_launched_with_the_samplers_options(ssh_log: Path,
                                                           tmp_path: Path) -> None:
    # The sampler's transport says `ssh -o BatchMode=yes HOST`: a cell's command must never
    # stop at a password prompt the sampler would not, so it goes through the same words.
    device = open_device("ssh:bench@lab-box")
    command = ["sh", "-c", "echo 'two words' >&2; exit 0"]
    external = cell_config({"engine": "external", "command": command,
                            "output": "stdout-summary"})
    argv = cell_argv(external, sys.executable, tmp_path, device)
    assert argv == ["ssh", *SSH_OPTIONS, "bench@lab-box", shlex.join(command)]
    assert argv == device.command(command)
    assert CellChild(device).run(argv, tmp_path, 30) == ChildExit("ok", 0)
    check, launch = [json.loads(line) for line in ssh_log.read_text().splitlines()]
    assert check == [*SSH_OPTIONS, "bench@lab-box", "true"]  # open_device's check
    assert launch == [*SSH_OPTIONS, "bench@lab-box", shlex.join(command)]
    assert (tmp_path / "stderr.txt").read_text() == "two words\n"


def test_an_embedded_cell_runs_the_engine_with_its_files_in_the_cell_folder(
        tmp_path: Path) -> None:
    embedded = EmbeddedConfig({"model": "synthetic:tiny", "n_tokens": 4})
    argv = cell_argv(embedded, "PY", tmp_path, open_device("local"))
    assert argv == engine_argv("PY", embedded, tmp_path)
    assert argv[:9] == ["PY", "-m", "abbench", "engine", "run", "--json",
                        str(tmp_path / "summary.json"), "--csv", str(tmp_path / "tokens.csv")]


def test_a_child_that_succeeds_leaves_its_output_and_its_pid(tmp_path: Path) -> None:
    ended = run_child(tmp_path, [sys.executable, "-c", "print('out')"])
    assert ended == ChildExit("ok", 0, None)
    assert (tmp_path / "stdout.txt").read_text() == "out\n"
    assert json.loads((tmp_path / "child.json").read_text())["pid"] > 0


def test_a_failing_child_says_its_status(tmp_path: Path) -> None:
    ended = run_child(tmp_path, [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert ended == ChildExit("failed", 3, "exited with status 3")


def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    ended = run_child(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
    assert ended == ChildExit("timeout", None, "no result after the 0.5 s timeout")
    pid = json.loads((tmp_path / "child.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(pid, 0)


def test_a_command_that_cannot_start_is_a_failed_cell(tmp_path: Path) -> None:
    ended = run_child(tmp_path, [str(tmp_path / "no-such-program")])
    assert ended.status == "failed" and ended.exit_code is None
    assert ended.error == "could not start: No such file or directory"


def test_exit_reasons_name_the_signal() -> None:
    assert exit_reason(0) == "exited with status 0"
    assert exit_reason(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_reason(-200) == "killed by signal 200"


def test_the_stderr_tail_is_the_last_bytes_decoded_leniently(tmp_path: Path) -> None:
    path = tmp_path / "stderr.txt"
    path.write_bytes(b"x" * 5000 + b"\xffend")
    tail = stderr_tail(path)
    assert len(tail) == 4000 and tail.endswith("\ufffdend")
    assert stderr_tail(tmp_path / "absent.txt") == ""
