"""Campaigns on an `adb:` device, its faults tried: a device not attached, a bmoe cell
past its timeout (nothing of it left on the device), the device unplugged in the middle of
a cell (the campaign stops, `--resume` finishes once it is back), `[stage]` pushing with
`adb push`. No phone here: tests/fake_adb.py is an adb client whose device is this
machine, printing what the real client prints when the device is not there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import bmoe_standin
import fake_adb
import pytest
from sshd import processes_matching

from abbench.records import read_journal

SERIAL = "R5CT1234567"


@pytest.fixture
def adb(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment that puts the fake adb first on PATH, and its state folder."""
    bin_dir, state = fake_adb.install(tmp_path / "adb")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_ADB_STATE": str(state)}, state


def campaign(tmp: Path, body: str, device: str = "") -> Path:
    path = tmp / "cells.toml"
    path.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "phone"
        spacing_s = 0.2
        warmup_tokens = 2

        [device]
        transport = "adb:{SERIAL}"
        sample_hz = 4
        remote_dir = "{tmp / "device"}"
        """) + textwrap.dedent(device) + textwrap.dedent(body))
    return path


def run(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)


def folder_of(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def test_a_device_not_attached_is_one_error(adb: tuple[dict[str, str], Path],
                                            tmp_path: Path) -> None:
    env, state = adb
    (state / "gone").touch()
    cells = campaign(tmp_path, '[cells.a]\ncommand = ["true"]\n')
    p = run(env, "campaign", cells, "--out", tmp_path / "r", "--no-live")
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR:")]
    assert errors == [f"ERROR: adb device `{SERIAL}` is not ready: error: device '{SERIAL}' "
                      "not found"]
    assert "adb devices -l" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_a_bmoe_campaign_over_adb_stages_pulls_and_kills_what_hangs(
        adb: tuple[dict[str, str], Path], tmp_path: Path, tiny_model: Path) -> None:
    env, state = adb
    here = bmoe_standin.install(tmp_path / "build")
    hung = bmoe_standin.install(tmp_path / "hung-build", hang=True)
    phone = tmp_path / "data-local-tmp"
    phone.mkdir()
    marker = f"adb-hang-{os.getpid()}"
    cells = campaign(tmp_path, f"""
        [workload]
        model = "{phone / "model.gguf"}"
        tokens = 12

        [cells.B]
        engine = "bmoe"
        bmoe_bin = "{phone}"
        bmoe = {{ moe_stream = true, cache_mb = 2048, drop_cold_experts = 0.75 }}

        [cells.hung]
        engine = "bmoe"
        bmoe_bin = "{hung.parent}"
        prompt = "{marker}"
        timeout_s = 3

        [stage]
        push = true
        [stage.files]
        "{phone / "model.gguf"}" = "{tiny_model}"
        "{phone / "bmoe-cli"}" = "{here}"
        """)
    cells.write_text(cells.read_text().replace("[campaign]\n",
                                               '[campaign]\norder = ["B", "hung", "B"]\n'))
    p = run(env, "campaign", cells, "--out", tmp_path / "r", "--no-live")
    assert p.returncode in (0, 1, 3), p.stderr
    calls = [json.loads(x) for x in (state / "calls.jsonl").read_text().splitlines()]
    pushes = [c for c in calls if c[2] == "push"]
    assert [c[4] for c in pushes] == [f"{phone / 'model.gguf'}.part",
                                      f"{phone / 'bmoe-cli'}.part"]
    b1, hang, b2 = read_journal(folder_of(tmp_path / "r"))
    assert (b1.status, b2.status) == ("ok", "ok"), (b1.error, b2.error)
    assert b1.fingerprint == b2.fingerprint
    for b in (b1, b2):
        own = folder_of(tmp_path / "r") / "cells" / b.label
        assert (own / "bmoe.metrics").read_text().startswith("peak_rss_kb=")
    assert hang.status == "timeout" and processes_matching(marker) == []


@pytest.mark.slow
def test_a_device_unplugged_mid_cell_stops_the_campaign_and_resume_finishes_it(
        adb: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, state = adb
    marker = f"adb-lost-{os.getpid()}"
    cells = campaign(tmp_path, f"""
        [cells.long]
        command = ["sh", "-c", "sleep 120", "{marker}"]
        timeout_s = 200

        [cells.a]
        command = ["sh", "-c", "echo 'generation: 8 tokens, 0.1 s/token (10.0 tok/s)'"]
        """)

    def unplug() -> None:
        deadline = time.monotonic() + 120
        while not processes_matching(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        (state / "gone").touch()

    cutter = threading.Thread(target=unplug)
    cutter.start()
    p = run(env, "campaign", cells, "--out", tmp_path / "r", "--no-live")
    cutter.join()
    folder = folder_of(tmp_path / "r")
    try:
        assert p.returncode == 4, p.stderr
        assert f"stopped: adb device `{SERIAL}` is not ready: error: device '{SERIAL}' not " \
            "found" in p.stderr
        (lost,) = read_journal(folder)
        assert lost.status == "failed" and lost.error is not None
        assert lost.error.startswith("exited with status 1")
        assert json.loads((folder / "status.json").read_text())["state"] == "interrupted"
        assert processes_matching(marker), "the device's command outlived its connection"
    finally:
        (state / "gone").unlink()
    q = run(env, "campaign", "--resume", folder, "--no-live")
    assert q.returncode in (0, 3), q.stderr
    assert [r.status for r in read_journal(folder)] == ["failed", "ok"]
    assert processes_matching(marker) == []  # the resume killed what the lost cell left
