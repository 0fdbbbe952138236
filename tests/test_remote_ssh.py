"""Campaigns over `ssh:` against a real OpenSSH server on 127.0.0.1 (tests/sshd.py): the
embedded engine on the host, external and llama.cpp cells, their reports, and the faults
a remote device has — a host gone in the middle of a cell, a key it refuses, a command
past its timeout. The server is this machine, so what is left running "on the device"
is checked in this machine's /proc.

No fake `ssh` here: every call goes through the real client to the real server.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bmoe_standin
import pytest
from conftest import REFERENCE
from sshd import HOST, SshServer, need_sshd, processes_matching

from abbench import __version__
from abbench.records import read_journal

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    need_sshd()
    s = SshServer(tmp_path_factory.mktemp("sshd"))
    s.setup()
    s.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ABBENCH_SSH_CONFIG", str(s.client_config))
        yield s
    s.stop()


@pytest.fixture(scope="module")
def remote_abbench(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """abbench as the host runs it: this checkout's interpreter, with a model cache of the
    host's own (a synthetic model is built there, not copied from here)."""
    cache = tmp_path_factory.mktemp("host-cache")
    return ["env", f"ABBENCH_CACHE={cache}", sys.executable, "-m", "abbench"]


def abbench(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def campaign_file(tmp: Path, body: str, transport: str = f"ssh:{HOST}",
                  device: str = "", model: str = "synthetic:tiny") -> Path:
    path = tmp / "cells.toml"
    path.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "remote"
        spacing_s = 0.2
        warmup_tokens = 2

        [device]
        transport = "{transport}"
        sample_hz = 4
        """) + device + textwrap.dedent(f"""
        [workload]
        model = "{model}"
        tokens = 6
        cache_mib = 1
        """) + textwrap.dedent(body))
    return path


def device_keys(remote_abbench: list[str], folder: Path) -> str:
    return f"abbench = {json.dumps(remote_abbench)}\nremote_dir = \"{folder}\"\n"


def run(cells: Path, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return abbench("campaign", cells, "--out", out / "r", "--sentinels", out / "s",
                   "--no-live", *more)


def folder_of(out: Path) -> Path:
    (folder,) = [p for p in (out / "r").iterdir() if p.is_dir()]
    return folder


def when_running(text: str, then: Callable[[], object]) -> threading.Thread:
    """A thread that calls `then` once a process holding `text` runs on the host (two
    minutes at most)."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if processes_matching(text):
                then()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


GENERATION = "echo 'generation: 8 tokens, 0.1 s/token (10.0 tok/s)'"


def test_sensors_over_ssh_read_the_host_and_its_abbench(server: SshServer,
                                                        remote_abbench: list[str]) -> None:
    p = abbench("sensors", "--transport", f"ssh:{HOST}", "--abbench",
                shlex.join(remote_abbench))
    assert p.returncode == 0, p.stderr
    assert f"{__version__} (" in p.stdout and "as this one" in p.stdout
    assert "ms (the device's shell loop of 50000 steps timed there" in p.stdout
    p = abbench("sensors", "--transport", f"ssh:{HOST}", "--abbench", "/nonexistent/abbench")
    assert p.returncode == 0 and "not runnable as `/nonexistent/abbench`" in p.stdout


def test_a_key_the_host_refuses_is_one_error(server: SshServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    config = server.write_client(tmp_path / "stranger", "stranger_key")
    monkeypatch.setenv("ABBENCH_SSH_CONFIG", str(config))
    p = abbench("sensors", "--transport", f"ssh:{HOST}")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"ERROR: ssh host `{HOST}` is not reachable" in p.stderr
    assert "Permission denied" in p.stderr


def test_an_embedded_cell_over_ssh_does_the_work_it_does_here(
        server: SshServer, remote_abbench: list[str], tmp_path: Path) -> None:
    body = """
        [cells.B]
        drop_cold_experts = 0.75

        [cells.R]
        overlap = true
        """
    there = campaign_file(tmp_path, body,
                          device=device_keys(remote_abbench, tmp_path / "host"))
    p = run(there, tmp_path / "ssh")
    assert p.returncode in (0, 3), p.stderr
    (tmp_path / "here").mkdir()
    here = campaign_file(tmp_path / "here", body, transport="local")
    q = run(here, tmp_path / "local")
    assert q.returncode in (0, 3), q.stderr
    remote, local = folder_of(tmp_path / "ssh"), folder_of(tmp_path / "local")
    a, b = read_journal(remote), read_journal(local)
    assert [r.status for r in a] == ["ok", "ok"], [r.error for r in a]
    assert a[0].entry.probe_index == 1.0 and a[1].entry.probe_index is not None  # there
    assert [r.fingerprint for r in a] == [r.fingerprint for r in b]
    assert None not in [r.fingerprint for r in a]
    for ra, rb in zip(a, b, strict=True):
        cell_a, cell_b = remote / "cells" / ra.label, local / "cells" / rb.label
        assert {p.name for p in cell_a.iterdir()} == {p.name for p in cell_b.iterdir()}
        work = [[(r["step"], r["token"], r["misses"], r["experts_routed"],
                  r["experts_dropped"]) for r in csv.DictReader(
                      line for line in (c / "tokens.csv").read_text().splitlines()
                      if not line.startswith("#"))] for c in (cell_a, cell_b)]
        assert len(work[0]) == 6 and work[0] == work[1]  # each token, and its experts
    assert (remote / "report.md").is_file()
    report = json.loads((remote / "report.json").read_text())
    # the foreign load during each cell, from the host's /proc with the cell's group there
    assert all(isinstance(c["during"]["foreign_cores"], float) for c in report["cells"])
    # the cells ran in their folders on the host, their pid files gone
    host = tmp_path / "host" / remote.name
    assert sorted(p.name for p in host.iterdir()) == [r.label for r in a]
    assert not list(host.glob("*/pid"))


def test_an_abbench_of_another_version_is_refused_before_the_first_cell(
        server: SshServer, tmp_path: Path) -> None:
    fake = tmp_path / "old-abbench"
    fake.write_text("#!/bin/sh\necho 'abbench 0.0.1'\n")
    fake.chmod(0o755)
    cells = campaign_file(tmp_path, "[cells.B]\n",
                          device=device_keys([str(fake)], tmp_path / "host"))
    p = run(cells, tmp_path)
    assert p.returncode == 2, p.stderr
    assert f"has abbench 0.0.1 ({fake}), this one is {__version__}" in p.stderr
    assert not (tmp_path / "host").exists() or not list((tmp_path / "host").rglob("pid"))


def test_each_external_cell_reads_its_own_output(server: SshServer, tmp_path: Path) -> None:
    """Two cells naming one relative output path: the second, which writes nothing, fails;
    it never reads the first one's file."""
    src = REFERENCE / "v1-desktop-2026-07-24" / "pc-E-c5000-io4t4.csv"
    cells = campaign_file(tmp_path, f"""
        [cells.writes]
        command = ["cp", "{src}", "out.csv"]
        output = "bmoe-csv:out.csv"

        [cells.silent]
        command = ["true"]
        output = "bmoe-csv:out.csv"

        [cells.says]
        command = ["sh", "-c", "{GENERATION}; exit 0"]

        [cells.own]
        command = ["cp", "{src}", "{tmp_path}/abs-{{cell}}.csv"]
        output = "bmoe-csv:{tmp_path}/abs-{{cell}}.csv"

        [cells.stale]
        command = ["true"]
        output = "bmoe-csv:{tmp_path}/abs-04-own.csv"
        """, device=f'remote_dir = "{tmp_path / "host"}"\n')
    p = run(cells, tmp_path)
    writes, silent, says, own, stale = read_journal(folder_of(tmp_path))
    assert own.status == "ok" and (tmp_path / "abs-04-own.csv").exists() is False
    assert stale.status == "failed"  # the file own wrote was removed there before it ran
    assert writes.status == "ok" and writes.tokens_per_s == pytest.approx(4.718)
    assert silent.status == "failed" and "out.csv" in (silent.error or "")
    assert says.status == "ok" and says.tokens_per_s == pytest.approx(10.0)
    assert p.returncode in (0, 3), p.stderr


def test_the_engines_own_exit_status_comes_back(server: SshServer, tmp_path: Path) -> None:
    cells = campaign_file(tmp_path, f"""
        [cells.three]
        command = ["sh", "-c", "{GENERATION}; echo 'ERROR: no model' >&2; exit 3"]
        """, device=f'remote_dir = "{tmp_path / "host"}"\n')
    run(cells, tmp_path)
    (rec,) = read_journal(folder_of(tmp_path))
    assert rec.status == "failed" and rec.exit_code == 3
    assert rec.error == "exited with status 3: no model"


def test_a_cell_past_its_timeout_leaves_nothing_running_on_the_host(
        server: SshServer, tmp_path: Path) -> None:
    marker = f"abbench-hang-{os.getpid()}"
    sleep = f"sleep {1000 + os.getpid() % 9000}"  # this test's own grandchildren
    cells = campaign_file(tmp_path, f"""
        [cells.hang]
        command = ["sh", "-c", "{sleep} & {sleep}", "{marker}"]
        timeout_s = 3

        [cells.next]
        command = ["sh", "-c", "{GENERATION}"]
        """, device=f'remote_dir = "{tmp_path / "host"}"\n')
    seen: list[bool] = []
    watch = when_running(sleep, lambda: seen.append(True))
    run(cells, tmp_path)
    watch.join()
    hang, after = read_journal(folder_of(tmp_path))
    assert seen, "the hanging command never ran on the host"
    assert hang.status == "timeout" and hang.error == "no result after the 3 s timeout"
    assert after.status == "ok"
    assert processes_matching(marker) == []
    assert processes_matching(sleep) == []


def test_a_host_gone_mid_cell_stops_the_campaign_and_resume_finishes_it(
        server: SshServer, tmp_path: Path) -> None:
    marker = f"abbench-lost-{os.getpid()}"
    cells = campaign_file(tmp_path, f"""
        [cells.long]
        command = ["sh", "-c", "sleep 120", "{marker}"]
        timeout_s = 200

        [cells.a]
        command = ["sh", "-c", "{GENERATION}"]

        [cells.b]
        command = ["sh", "-c", "{GENERATION}"]
        """, device=f'remote_dir = "{tmp_path / "host"}"\n')
    cutter = when_running(marker, lambda: (time.sleep(1), server.stop()))
    p = run(cells, tmp_path)
    cutter.join()
    try:
        assert p.returncode == 4, p.stdout + p.stderr
        assert f"stopped: ssh host `{HOST}` is not reachable" in p.stderr
        assert "abbench campaign --resume" in p.stderr
        folder = folder_of(tmp_path)
        (lost,) = read_journal(folder)
        assert lost.status == "failed"
        assert lost.error == (f"the ssh connection to {HOST} failed or was lost (ssh's exit "
                              "status 255)")
        assert processes_matching(marker), "the host's command outlived its connection"
        assert json.loads((folder / "status.json").read_text())["state"] == "interrupted"
    finally:
        server.start()
    q = abbench("campaign", "--resume", folder, "--sentinels", tmp_path / "s", "--no-live")
    assert q.returncode in (0, 3), q.stderr
    assert [r.status for r in read_journal(folder)] == ["failed", "ok", "ok"]
    assert processes_matching(marker) == []  # the resume killed what the lost cell left


def test_llama_bench_cells_over_ssh(server: SshServer, tmp_path: Path,
                                    tiny_model: Path) -> None:
    from llamacpp import Unavailable, build

    try:
        bin_dir = build()
    except Unavailable as e:
        pytest.skip(str(e))
    cells = campaign_file(tmp_path, f"""
        [cells.a]
        engine = "llama-bench"
        llama_cpp_bin = "{bin_dir}"
        repetitions = 2

        [cells.b]
        base = "a"
        llama = {{ threads = 1 }}
        """, device=f'remote_dir = "{tmp_path / "host"}"\n', model=str(tiny_model))
    p = run(cells, tmp_path)
    assert p.returncode in (0, 1, 3), p.stderr
    a, b = read_journal(folder_of(tmp_path))
    assert a.status == b.status == "ok", [a.error, b.error]
    assert a.tokens_per_s and b.tokens_per_s and a.fingerprint
    assert (folder_of(tmp_path) / "report.md").is_file()


def test_prepare_pull_and_cleanup_around_each_cell(server: SshServer, tmp_path: Path) -> None:
    """As the field's driver scripts do by hand: clean up before each cell, bring the
    `.metrics` and the log back, a failing preparation failing its cell unrun."""
    log, stop = tmp_path / "host-log", tmp_path / "stop"
    writes = "echo free_mib=648 > a.metrics; echo ran >> engine.log"
    cells = campaign_file(tmp_path, f"""
        [cells.a]
        command = ["sh", "-c", "{writes}; {GENERATION}"]

        [cells.b]
        base = "a"
        """, device=textwrap.dedent(f"""\
            remote_dir = "{tmp_path / "host"}"
            prepare = [["sh", "-c", "echo prepare >> {log}; test ! -e {stop}"], ["sync"]]
            cleanup = [["sh", "-c", "echo cleanup >> {log}; touch {stop}"]]
            pull = ["*.metrics", "*.log", "missing/*"]
            """))
    p = run(cells, tmp_path)
    folder = folder_of(tmp_path)
    a, b = read_journal(folder)
    assert a.status == "ok", a.error
    assert (folder / "cells" / a.label / "device" / "a.metrics").read_text() == "free_mib=648\n"
    assert (folder / "cells" / a.label / "device" / "engine.log").read_text() == "ran\n"
    # a's cleanup left the mark b's preparation refuses: b fails, and is not run
    assert b.status == "failed" and b.error is not None
    assert b.error.startswith("`[device] prepare` command 1 (`sh -c ")
    assert f"exited with status 1 on {HOST}: exit status 1" in b.error
    assert log.read_text().split() == ["prepare", "cleanup", "prepare", "cleanup"]
    assert not (folder / "cells" / b.label / "device").exists()
    assert p.returncode in (0, 3), p.stderr


def test_a_bmoe_campaign_over_ssh_reads_each_cells_csv_and_pulls_its_metrics(
        server: SshServer, tmp_path: Path, tiny_model: Path) -> None:
    """The phone-streaming engine's CLI (its stand-in, tests/bmoe_standin.py) on the host:
    each cell writes its CSV and `.metrics` in its own folder there, both come back, and a
    cell past its timeout leaves no bmoe-cli running there."""
    binary = bmoe_standin.install(tmp_path / "host-bin")
    hung = bmoe_standin.install(tmp_path / "host-hung", hang=True)
    marker = f"bmoe-hang-{os.getpid()}"
    cells = campaign_file(tmp_path, f"""
        [cells.B]
        engine = "bmoe"
        bmoe_bin = "{binary.parent}"
        tokens = 24

        [cells.B.bmoe]
        moe_stream = true
        cache_mb = 2048
        dense_weights = "ahwb"
        drop_cold_experts = 0.75

        [cells.R]
        base = "B"
        bmoe = {{ drop_cold_experts = 0.0, predict_prefetch = true, predict_spec_max = 0 }}

        [cells.hung]
        engine = "bmoe"
        bmoe_bin = "{hung.parent}"
        prompt = "{marker}"
        timeout_s = 3
        """, device=f'remote_dir = "{tmp_path / "host"}"\n', model=str(tiny_model))
    cells.write_text(cells.read_text().replace("[campaign]\n",
                                               '[campaign]\norder = ["B", "R", "hung", "B"]\n'))
    p = run(cells, tmp_path)
    folder = folder_of(tmp_path)
    b1, r1, hang, b2 = read_journal(folder)
    assert [c.status for c in (b1, r1, b2)] == ["ok"] * 3, p.stderr
    for c in (b1, r1, b2):
        own = folder / "cells" / c.label
        rows = [ln for ln in (own / "tokens.csv").read_text().splitlines() if ln[:1].isdigit()]
        assert len(rows) == 24
        metrics = (own / "bmoe.metrics").read_text()
        assert metrics.startswith("peak_rss_kb=") and "mem_avail_floor_kb=" in metrics
        assert json.loads((own / "summary.json").read_text())["preamble"]["moe_stream"] == "1"
        there = list((tmp_path / "host").glob(f"*/{c.label}/bmoe.csv"))
        assert len(there) == 1  # written in its own folder there
    assert b1.fingerprint == b2.fingerprint != r1.fingerprint
    assert hang.status == "timeout" and processes_matching(marker) == []
    assert (folder / "report.md").is_file()


def test_stage_checks_and_pushes_the_files_the_host_needs(server: SshServer, tmp_path: Path,
                                                          tiny_model: Path) -> None:
    """`[stage]` over the real sshd: a file missing there is refused (exit 2, nothing
    run), pushed with `push = true` and found equal by sha256 on the next campaign."""
    binary = bmoe_standin.install(tmp_path / "bin-here")
    host = tmp_path / "host-files"
    host.mkdir()
    body = f"""
        [cells.B]
        engine = "bmoe"
        bmoe_bin = "{host}"
        model = "{host / "model.gguf"}"

        [stage.files]
        "{host / "model.gguf"}" = "{tiny_model}"
        "{host / "bmoe-cli"}" = "{binary}"
        """
    cells = campaign_file(tmp_path, body, device=f'remote_dir = "{tmp_path / "host"}"\n')
    p = run(cells, tmp_path / "1")
    assert p.returncode == 2, p.stderr
    assert "does not hold the files the campaign needs" in p.stderr
    assert f"{host / 'model.gguf'} (missing)" in p.stderr and not list(host.iterdir())
    cells.write_text(cells.read_text().replace("[stage.files]", "[stage]\npush = true\n"
                                                                "[stage.files]"))
    p = run(cells, tmp_path / "2")
    assert p.returncode in (0, 3), p.stderr
    assert (host / "model.gguf").read_bytes() == tiny_model.read_bytes()
    assert os.access(host / "bmoe-cli", os.X_OK) and "copied from" in p.stderr
    (b,) = read_journal(folder_of(tmp_path / "2"))
    assert b.status == "ok", b.error
    p = run(cells, tmp_path / "3")
    assert f"stage: {host / 'model.gguf'}: as {tiny_model}" in p.stderr


@pytest.fixture
def fuse_folder(tmp_path: Path) -> Iterator[Path]:
    """A real FUSE mount (bindfs) of a folder: storage where O_DIRECT is not O_DIRECT."""
    if shutil.which("bindfs") is None:
        if os.environ.get("ABBENCH_REQUIRE_SSHD") == "1":
            pytest.fail("bindfs is not installed (.ci/run installs it)")
        pytest.skip("bindfs is not installed")
    source, mount = tmp_path / "flash", tmp_path / "fuse"
    source.mkdir()
    mount.mkdir()
    done = subprocess.run(["bindfs", str(source), str(mount)], capture_output=True,
                          text=True, timeout=30, check=False)
    if done.returncode != 0:  # a machine without FUSE (no /dev/fuse, no CAP_SYS_ADMIN)
        pytest.skip(f"bindfs cannot mount here: {done.stderr.strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False, timeout=30)


def test_a_model_on_fuse_is_refused_before_the_first_cell(server: SshServer, tmp_path: Path,
                                                          fuse_folder: Path,
                                                          tiny_model: Path) -> None:
    shutil.copyfile(tiny_model, fuse_folder / "model.gguf")
    binary = bmoe_standin.install(tmp_path / "bin")
    cells = campaign_file(tmp_path, f"""
        [cells.B]
        engine = "bmoe"
        bmoe_bin = "{binary.parent}"
        model = "{fuse_folder / "model.gguf"}"
        bmoe = {{ moe_stream = true, cache_mb = 2048 }}
        """, device=f'remote_dir = "{tmp_path / "host"}"\n')
    p = run(cells, tmp_path / "1")
    assert p.returncode == 2, p.stderr
    assert f"cell `B` reads {fuse_folder / 'model.gguf'} with O_DIRECT" in p.stderr
    assert f"on {fuse_folder}, a fuse filesystem" in p.stderr
    assert not (tmp_path / "host").exists()  # nothing ran
    cells.write_text(cells.read_text().replace("cache_mb = 2048", "cache_mb = 2048, "
                                               "no_odirect = true"))
    p = run(cells, tmp_path / "2")
    (b,) = read_journal(folder_of(tmp_path / "2"))
    assert b.status == "ok", (b.error, p.stderr)
