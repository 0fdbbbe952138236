"""`abbench fleet` end to end on Ray (embedded): simulated devices, their run folders, the
fleet journal and report, exclusivity per device, and bad input refused before anything
starts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from abbench.records import read_journal

pytest.importorskip("ray")


def abbench(*args: str | Path, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def fleet_campaign(tmp: Path, model: Path, devices: list[str],
                   order: str = '["A", "B", "A"]') -> Path:
    path = tmp / "fleet.toml"
    path.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "ft"
        spacing_s = 0
        warmup_tokens = 2
        order = {order}

        [device]
        sample_hz = 5

        [match]  # the hosts under the simulated devices are shared: match on caps alone
        probe_tol = 1
        foreign_load_tol = 64
        cpu_temp_tol_c = 50
        battery_temp_tol_c = 50
        mem_available_tol_frac = 1

        [workload]
        model = "{model}"
        tokens = 6
        timeout_s = 120

        [cells.A]
        [cells.B]
        overlap = true

        [[decision]]
        candidate = "B"
        baseline = "A"
        expect = "not-slower"
        max_regression = 0.5

        [fleet]
        devices = {json.dumps(devices)}
        """))
    return path


def only_folder(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


def spans(run: Path) -> tuple[float, float]:
    cells = read_journal(run)
    return min(c.t_start_wall for c in cells), max(c.t_end_wall for c in cells)


@pytest.mark.slow  # over 20 s alone: the slow run covers it
def test_a_fleet_of_three_simulated_devices(tiny_model: Path, tmp_path: Path) -> None:
    cells = fleet_campaign(tmp_path, tiny_model, ["sim:phone#2", "sim:laptop"])
    p = abbench("fleet", cells, "--out", tmp_path / "out", "--sentinels", tmp_path / "s")
    assert "Traceback" not in p.stderr, p.stderr
    fleet = only_folder(tmp_path / "out")
    report = json.loads((fleet / "fleet-report.json").read_text())
    assert p.returncode == report["exit_status"], p.stdout + p.stderr
    assert p.returncode in (0, 1, 3)
    devices = {d["device"]: d for d in report["devices"]}
    assert list(devices) == ["sim:phone#1", "sim:phone#2", "sim:laptop"]
    for name, d in devices.items():
        assert d["status"] == "done" and d["host"] == socket.gethostname(), d
        run = fleet / d["run"]
        assert json.loads((run / "report.json").read_text())["complete"], name
        assert len(read_journal(run)) == 3
        assert [x["candidate"] for x in d["decisions"]] == ["B"]
    assert devices["sim:phone#1"]["class"] == "simulated phone"
    assert devices["sim:laptop"]["class"] == "simulated laptop"
    # one device history per device: the two phones do not share one
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "sim-laptop.jsonl", "sim-phone-1.jsonl", "sim-phone-2.jsonl"]
    (combined,) = report["combined"]
    assert combined["scope"] == "all devices" and len(combined["verdicts"]) == 3
    assert combined["verdict"] in ("GO", "NO-GO", "INCONCLUSIVE", "OWED")
    assert {c["scope"] for c in report["per_class"]} == {"simulated phone",
                                                         "simulated laptop"}
    # the fleet journal: which host ran which device, and when
    events = [json.loads(line) for line in (fleet / "fleet-journal.jsonl").open()]
    for name in devices:
        start, end = ([e for e in events if e["device"] == name and e["event"] == k]
                      for k in ("start", "end"))
        assert len(start) == len(end) == 1 and start[0]["host"] == socket.gethostname()
        first, last = spans(fleet / devices[name]["run"])
        assert start[0]["t_wall"] <= first <= last <= end[0]["t_wall"]
    text = p.stdout
    assert "B vs A across devices:" in text and "per device class:" in text
    assert (fleet / "fleet-report.md").read_text().startswith("# Fleet report: ft")
    # re-rendered from the folder alone, the same report
    again = abbench("fleet", "--report", fleet)
    assert again.returncode == p.returncode
    assert json.loads((fleet / "fleet-report.json").read_text()) == report


OWN_RAY = """
import json, ray
from abbench.fleet import runner
runner.connect(None, ["sim:phone#1"])
try:
    print(json.dumps(sorted(k for k in ray.cluster_resources() if k.startswith("device:"))))
finally:
    runner.shutdown()
"""


@pytest.mark.slow
def test_a_fleet_without_an_address_starts_its_own_ray(tmp_path: Path) -> None:
    """RAY_ADDRESS in the environment (a shell after `ray start`, or a host where an
    `abbench fleet worker` runs) is not where an embedded fleet goes: it starts its own
    Ray, its devices offered. Ray's own default would join that address (here a port that
    refuses) and refuse the devices' resources there."""
    import os

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
        env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{closed.getsockname()[1]}"}
        p = subprocess.run([sys.executable, "-c", OWN_RAY], env=env, capture_output=True,
                           text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == ["device:sim:phone#1"]


# Run in a child process: a Ray session in this one would break the `Cluster` a later test
# starts in it.
TWO_JOBS = """
import json, pathlib, sys
from abbench.fleet import runner
toml, fleet, sentinels = sys.argv[1:]
runner.connect(None, ["sim:phone#1"])
try:
    job = runner.DeviceJob("sim:phone#1", pathlib.Path(toml).read_text(), fleet,
                           runner.driver_node(), sentinels)
    results = runner.run_jobs([job, job], pathlib.Path(fleet), lambda line: None)
finally:
    runner.shutdown()
print(json.dumps([r["status"] for r in results]))
"""


@pytest.mark.slow
def test_two_campaigns_on_one_device_never_overlap(tiny_model: Path, tmp_path: Path) -> None:
    """The device's Ray resource is one unit: a second campaign for the same device waits
    for the first (from the two run folders' journals)."""
    from abbench.campaign.schema import load_campaign, resolved_toml

    spec = load_campaign(fleet_campaign(tmp_path, tiny_model, ["sim:phone#1"],
                                        order='["A", "B"]')).on("sim:phone#1")
    toml = tmp_path / "device.toml"
    toml.write_text(resolved_toml(spec))
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    p = subprocess.run([sys.executable, "-c", TWO_JOBS, str(toml), str(fleet),
                        str(tmp_path / "s")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == ["done", "done"]
    runs = sorted(p for p in (fleet / "sim_phone_1").iterdir() if p.is_dir())
    assert len(runs) == 2
    (a0, a1), (b0, b1) = sorted(spans(r) for r in runs)
    assert a1 <= b0, "the second campaign started before the first ended"


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "sim:phone#2", "--device", "sim:phone#1"],
     "ERROR: the device `sim:phone#1` is named twice"),
    (["--device", "sim:nosuch"], "ERROR: device `sim:nosuch`: unknown simulated device"),
    (["--address", "127.0.0.1:1"], "ERROR: the Ray cluster at `127.0.0.1:1` does not answer"),
])
def test_bad_input_starts_nothing(tiny_model: Path, tmp_path: Path, args: list[str],
                                  message: str) -> None:
    cells = fleet_campaign(tmp_path, tiny_model, ["sim:phone"])
    p = abbench("fleet", cells, *args, "--out", tmp_path / "out", timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(message), p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_dry_run_shows_where_each_device_runs(tiny_model: Path, tmp_path: Path) -> None:
    cells = fleet_campaign(tmp_path, tiny_model, ["sim:phone#2"])
    p = abbench("fleet", cells, "--dry-run", "--out", tmp_path / "out", timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:2] == ["sim:phone#1: this machine (Ray embedded)",
                         "sim:phone#2: this machine (Ray embedded)"]
    assert lines[2].startswith("plan ft: 3 cells on sim:phone#1")
    assert not (tmp_path / "out").exists()


def test_a_worker_shows_what_its_host_offers(tmp_path: Path) -> None:
    p = abbench("fleet", "worker", "--address", "127.0.0.1:6379", "--sim", "phone#2",
                "--local", "--no-adb", "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr
    host = socket.gethostname()
    lines = p.stdout.splitlines()
    assert lines[:3] == [f"{host} offers local", f"{host} offers sim:phone#1",
                         f"{host} offers sim:phone#2"]
    assert lines[3].endswith('start --address=127.0.0.1:6379 --resources={"device:local":1,'
                             '"device:sim:phone#1":1,"device:sim:phone#2":1} --block')
    p = abbench("fleet", "worker", "--sim", "phone", timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("ERROR: a worker joins a cluster")
    p = abbench("fleet", "worker", "--address", "127.0.0.1:1", "--no-adb", timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("ERROR: this host has no device to offer"), p.stderr


def _wait_for(condition, timeout: float = 90.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    import time

    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_two_hosts_each_run_their_own_devices(tiny_model: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A local Ray cluster of two nodes as two hosts: the head offers two simulated
    phones, a real `abbench fleet worker` joins with a simulated laptop; every device's
    campaign runs on the node that offers it, and the laptop's run folder comes back."""
    import os
    import signal

    import ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a host's own copies go there
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"device:sim:phone#1": 1, "device:sim:phone#2": 1}})
    worker = subprocess.Popen(
        [sys.executable, "-m", "abbench", "fleet", "worker", "--address", cluster.address,
         "--sim", "laptop#1", "--no-adb"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        _wait_for(lambda: "device:sim:laptop#1" in ray.cluster_resources(), what="the worker")
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        ray.shutdown()
        node_of = {r.removeprefix("device:"): node for node, res in nodes.items()
                   for r in res if r.startswith("device:")}
        assert node_of["sim:laptop#1"] != node_of["sim:phone#1"] == node_of["sim:phone#2"]
        cells = fleet_campaign(tmp_path, tiny_model, ["sim:phone#2", "sim:laptop#1"])
        p = abbench("fleet", cells, "--address", cluster.address, "--out", tmp_path / "out",
                    "--sentinels", tmp_path / "s")
        assert p.returncode in (0, 1, 3) and "Traceback" not in p.stderr, p.stderr
        fleet = only_folder(tmp_path / "out")
        events = [json.loads(line) for line in (fleet / "fleet-journal.jsonl").open()]
        ran_on = {e["device"]: e["node"] for e in events if e["event"] == "end"}
        assert ran_on == {d: node_of[d] for d in ("sim:phone#1", "sim:phone#2",
                                                  "sim:laptop#1")}
        assert all(e["status"] == "done" for e in events if e["event"] == "end")
        (laptop_run,) = [p for p in (fleet / "sim_laptop_1").iterdir() if p.is_dir()]
        assert len(read_journal(laptop_run)) == 3  # sent back from the other node
        assert json.loads((fleet / "fleet.json").read_text())["ray_address"] == cluster.address
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        cluster.shutdown()


@pytest.mark.slow
def test_a_worker_killed_mid_cell_loses_only_that_cell(tiny_model: Path,
                                                       tmp_path: Path) -> None:
    import psutil

    cells = fleet_campaign(tmp_path, tiny_model, ["sim:phone"],
                           order='["A", "B", "A", "B", "A", "B"]')
    cells.write_text(cells.read_text().replace("tokens = 6", "tokens = 40"))
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "abbench", "fleet", str(cells), "--out",
                          str(out), "--sentinels", str(tmp_path / "s")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def journal() -> Path | None:
        found = list(out.glob("*/sim_phone/*/journal.jsonl"))
        return found[0] if found and len(found[0].read_text().splitlines()) >= 2 else None

    _wait_for(lambda: journal() is not None, what="two cells")
    path = journal()
    assert path is not None
    (campaign,) = [q for q in psutil.process_iter(["cmdline"]) if q.info["cmdline"]
                   and "campaign" in q.info["cmdline"] and str(out) in " ".join(
                       q.info["cmdline"])]
    campaign.parent().kill()  # the Ray worker running the device's campaign, mid-cell
    _, err = p.communicate(timeout=300)
    assert p.returncode == 3, err
    assert "sim:phone: failed — WorkerCrashedError" in err
    before = read_journal(path.parent)
    assert 2 <= len(before) < 6
    fleet = only_folder(out)
    r = abbench("fleet", "--resume", fleet, "--sentinels", tmp_path / "s")
    assert r.returncode in (0, 1, 3) and "sim:phone: resuming" in r.stderr, r.stderr
    after = read_journal(path.parent)
    assert len(after) == 6
    assert after[: len(before)] == before  # what finished before the kill is kept as it was
    report = json.loads((fleet / "fleet-report.json").read_text())
    assert report["devices"][0]["status"] == "done"
