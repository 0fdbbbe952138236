"""adb and ssh transports against fake `adb`/`ssh` executables placed first on PATH.

The fakes record their argv (one JSON line per call) and either print canned output or,
like a device's shell, run the command line they were handed with `sh -c`.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from abbench.errors import UsageError
from abbench.sensors import open_device, transports
from abbench.sensors.readers import REMOTE_GLOBS
from abbench.sensors.transports import SSH_OPTIONS
from abbench.sensors.tree import MARKER, LocalTree, batch_script, parse_batch
from abbench.sim import open_device as open_any_device

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"
PHONE = FIXTURES / "android-qwen"

FAKE = """#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + args) + "\\n")
if "get-state" in args:
    print(os.environ.get("FAKE_STATE", "device"))
    sys.exit(0)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
command = args[-1]
if os.environ.get("FAKE_EXEC"):          # behave like the device's shell
    sys.exit(subprocess.run(["sh", "-c", command]).returncode)
if "@@abbench@@" in command and "FAKE_BATCH" in os.environ:
    sys.stdout.write(open(os.environ["FAKE_BATCH"]).read())
    sys.exit(0)
sys.stdout.write(os.environ.get("FAKE_STDOUT", ""))
sys.stderr.write(os.environ.get("FAKE_STDERR", ""))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake adb and ssh first on PATH; returns the argv log file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("adb", "ssh"):
        exe = bin_dir / name
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "argv.jsonl"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def batch_of_tree(root: Path, out: Path) -> Path:
    """What the device would print for the snapshot script, for a fixture tree."""
    tree = LocalTree(root)
    chunks = []
    for pattern in [*REMOTE_GLOBS, "/dumpsys/*"]:
        for path in tree.glob(pattern):
            chunks.append(f"{MARKER}{path}\n{tree.read(path)}\n")
    out.write_text("".join(chunks))
    return out


NASTY = ["printf", "%s\\n", "a b", "$(touch pwned)", "`touch pwned`", "; rm -rf x", "it's",
         "*", "$HOME", "a\nb", "--"]


# --- adb -----------------------------------------------------------------------------------

def test_adb_run_quotes_every_argument(fakes: Path) -> None:
    device = open_device("adb:R5CT40ABC")
    assert (device.name, device.transport, device.simulated) == ("R5CT40ABC", "adb:R5CT40ABC",
                                                                 False)
    device.run(NASTY, timeout=10)
    log = calls(fakes)
    assert log[0] == ["adb", "-s", "R5CT40ABC", "get-state"]
    assert log[1] == ["adb", "-s", "R5CT40ABC", "shell", shlex.join(NASTY)]
    assert shlex.split(log[1][-1]) == NASTY
    assert device.command(NASTY) == log[1]
    assert open_device("local").command(NASTY) == NASTY


def test_adb_arguments_reach_the_device_shell_literally(fakes: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_EXEC", "1")
    monkeypatch.chdir(tmp_path)
    done = open_device("adb:emulator-5554").run(NASTY, timeout=10)
    assert done.returncode == 0
    assert done.stdout == "".join(f"{arg}\n" for arg in NASTY[2:])
    assert not (tmp_path / "pwned").exists()


def test_adb_sample_is_one_batched_call(fakes: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_BATCH", str(batch_of_tree(PHONE, tmp_path / "batch.txt")))
    device = open_device("adb:R5CT40ABC")
    local = open_device("local", root=PHONE)
    values = device.sample()
    assert values == local.sample()
    assert values["cpu.policy0.cap_khz"] == 2188800
    assert values["android.thermal_status"] == 1
    assert values["battery.status"] == "Discharging"      # power_supply beats dumpsys
    assert values["temp.cpu_c"] == 99.6                   # the HAL's stuck values, for now
    device.sample()
    log = calls(fakes)
    assert len(log) == 3  # get-state, then exactly one shell call per sample
    for call in log[1:]:
        assert call[:4] == ["adb", "-s", "R5CT40ABC", "shell"] and len(call) == 5
        assert call[4] == transports.SNAPSHOT_SCRIPT


def test_adb_sample_of_a_real_shell(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake runs the script with sh on this machine: the script must be valid sh."""
    monkeypatch.setenv("FAKE_EXEC", "1")
    values = open_device("adb:X").sample()
    assert values["mem.available_mib"] > 0 and "load.1m" in values


def test_adb_failures(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    device = open_device("adb:R5CT40ABC")
    monkeypatch.setenv("FAKE_RC", "1")
    monkeypatch.setenv("FAKE_STDERR", "error: device 'R5CT40ABC' not found\n")
    assert device.sample() == {}
    assert device.last_error is not None and "not found" in device.last_error
    monkeypatch.setenv("FAKE_STATE", "unauthorized")
    with pytest.raises(UsageError, match="not ready: unauthorized"):
        open_device("adb:R5CT40ABC")


def test_adb_timeout_is_a_gap(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    device = open_device("adb:slow")
    monkeypatch.setattr(transports, "SNAPSHOT_TIMEOUT_S", 0.3)
    monkeypatch.setenv("FAKE_SLEEP", "3")
    assert device.sample() == {}
    assert "no answer" in (device.last_error or "")
    with pytest.raises(subprocess.TimeoutExpired):
        device.run(["true"], timeout=0.3)


def test_missing_adb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="`adb` is not on PATH"):
        open_device("adb:R5CT40ABC")
    with pytest.raises(UsageError, match="`ssh` is not on PATH"):
        open_device("ssh:lab-box")


# --- ssh -----------------------------------------------------------------------------------

def test_ssh_run_and_sample(fakes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    device = open_device("ssh:bench@lab-box")
    assert (device.name, device.transport) == ("bench@lab-box", "ssh:bench@lab-box")
    device.run(NASTY, timeout=10)
    monkeypatch.setenv("FAKE_BATCH", str(batch_of_tree(FIXTURES / "linux-laptop",
                                                       tmp_path / "batch.txt")))
    values = device.sample()
    assert values["cpu.policy2.capped"] is True and values["temp.cpu_c"] == 52.0
    assert "cpu.all.cur_khz" not in values  # psutil describes this machine, not the host
    log = calls(fakes)
    prefix = ["ssh", *SSH_OPTIONS, "bench@lab-box"]
    assert log[0] == [*prefix, "true"]
    assert log[1] == [*prefix, shlex.join(NASTY)] == device.command(NASTY)
    assert log[2] == [*prefix, shlex.join(["sh", "-c", transports.SNAPSHOT_SCRIPT])]


def test_ssh_sample_of_a_real_shell(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_EXEC", "1")
    assert open_device("ssh:lab-box").sample()["mem.available_mib"] > 0


def test_ssh_unreachable(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_RC", "255")
    monkeypatch.setenv("FAKE_STDERR", "ssh: connect to host lab-box port 22: No route to host\n")
    with pytest.raises(UsageError, match="not reachable: ssh: connect to host"):
        open_device("ssh:lab-box")


# --- transport strings ----------------------------------------------------------------------

@pytest.mark.parametrize("spec,message", [
    ("adb:", "not a valid serial"),
    ("adb:-s", "not a valid serial"),
    ("ssh:-oProxyCommand=touch x", "not a valid host"),
    ("ssh:two words", "not a valid host"),
    ("sim:phone-hot", "unknown simulated device profile `phone-hot`"),
    ("sim:", "`sim:` needs a profile"),
    ("usb:1234", "unknown transport `usb:1234`"),
    ("", "unknown transport"),
])
def test_bad_transports(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        open_any_device(spec)


def test_root_is_for_local_only(fakes: Path) -> None:
    with pytest.raises(UsageError, match="--root applies to the local transport only"):
        open_device("adb:X", root=PHONE)


# --- the batch script ------------------------------------------------------------------------

def test_batch_script_reads_a_tree_through_sh() -> None:
    """Run the real script with sh on patterns rooted at the fixture tree."""
    prefix = str(PHONE)
    script = batch_script([prefix + g for g in REMOTE_GLOBS],
                          {"/dumpsys/none": "dumpsys-that-does-not-exist"})
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert out.returncode == 0  # a missing command or file does not fail the whole read
    tree = parse_batch(out.stdout)
    local = LocalTree(PHONE)
    expected = {p for g in REMOTE_GLOBS for p in local.glob(g)}
    assert {p[len(prefix):] for p in tree.files} == expected
    for path, content in tree.files.items():
        assert content == local.read(path[len(prefix):])
    assert "/dumpsys/none" not in tree.files  # a failed command is absent, not empty


def test_batch_script_refuses_unsafe_text() -> None:
    with pytest.raises(ValueError):
        batch_script(["/proc/meminfo; rm -rf /"])
    with pytest.raises(ValueError):
        batch_script(["/proc/meminfo"], {"/x": "dumpsys $(reboot)"})


def test_an_ssh_cell_is_launched_with_the_samplers_options(
        fakes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cell's command on ssh: goes through the device's own command line — BatchMode
    # included — so it can never stop at a password prompt the sampler would not.
    from abbench.cli import main

    monkeypatch.setenv("FAKE_EXEC", "1")
    cells = tmp_path / "cells.toml"
    cells.write_text(
        '[campaign]\nname = "ssh"\nspacing_s = 0\n[device]\ntransport = "ssh:bench@lab-box"\n'
        f'remote_dir = "{tmp_path / "dev"}"\n'
        '[cells.ext]\ncommand = ["sh", "-c", '
        '"echo generation: 4 tokens, 0.500 s/token \\\\(2.000 tok/s\\\\)"]\n'
        'output = "stdout-summary"\n')
    rc = main(["campaign", str(cells), "--out", str(tmp_path / "r"), "--sentinels",
               str(tmp_path / "s"), "--no-live"])
    assert rc == 0
    launched = [c for c in calls(fakes) if "generation:" in c[-1]]
    assert launched and all(c[:8] == ["ssh", *SSH_OPTIONS, "bench@lab-box"]
                            for c in launched), launched
