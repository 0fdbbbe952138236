"""Running a fleet on Ray: each device's campaign is a Ray task that needs the device's
custom resource (one unit, so never two campaigns on one device), run on the host that
advertises it as an ordinary `abbench campaign` child process. The run folder is written
straight into the fleet folder when the task runs on the driver's host, else into the
host's own cache and sent back as a tar when the campaign ends. A journal actor on the
driver's host appends the fleet journal as tasks start and end, whatever host they ran on.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abbench.errors import EXIT_NO_GO, EXIT_NO_MEASUREMENT, EXIT_OK, EXIT_UNDECIDED, UsageError
from abbench.fleet.devices import device_class, resource
from abbench.records.fleet import FleetEvent, append_fleet_event, device_folder

TAIL = 2000  # characters of a failed campaign's stderr kept in the journal


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("Ray is not installed", tip="pip install -e '.[fleet]'") from None
    return ray


def connect(address: str | None, devices: list[str]) -> str:
    """Start Ray embedded (each device of this machine a resource) or join the cluster at
    `address`, whose hosts advertise their devices (`abbench fleet worker`); every device
    must be offered, else a UsageError naming those that are not. Returns the address."""
    ray = import_ray()
    quiet: dict[str, Any] = {"include_dashboard": False, "logging_level": "ERROR",
                             "log_to_driver": False, "configure_logging": False}
    if address:
        probe(address)
        try:
            ray.init(address=address, **quiet)
        except Exception as e:  # noqa: BLE001 — Ray raises many kinds for "no cluster"
            raise UsageError(f"the Ray cluster at `{address}` does not answer "
                             f"({type(e).__name__}: {str(e)[:200]})",
                             tip="start one with `ray start --head`, then `abbench fleet "
                             "worker --address ADDRESS` on each host") from None
        offered = {k for k in ray.cluster_resources() if k.startswith("device:")}
        missing = [d for d in devices if resource(d) not in offered]
        if missing:
            ray.shutdown()
            have = ", ".join(sorted(k.removeprefix("device:") for k in offered)) or "none"
            raise UsageError(f"no host of the cluster at `{address}` offers "
                             + ", ".join(f"`{d}`" for d in missing),
                             tip=f"devices offered: {have}")
        return address
    # A small object store: what travels through it is a result and, from another host,
    # a run folder's tar (Ray's default would reserve 30% of this machine's memory).
    # "local": a Ray of its own, even where RAY_ADDRESS is set or `ray start` ran on this
    # host (an `abbench fleet worker` beside it): with no address Ray would join that
    # cluster, and refuse the resources given here.
    ray.init(address="local", resources={resource(d): 1 for d in devices},
             num_cpus=max(2, os.cpu_count() or 2), object_store_memory=256 * 1024**2,
             **quiet)
    return ""


def probe(address: str, timeout: float = 5.0) -> None:
    """A `HOST:PORT` that accepts no connection is refused now (Ray itself would retry
    for a minute); other forms (`auto`, `ray://...`) are Ray's to resolve."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout).close()
    except OSError as e:
        raise UsageError(f"the Ray cluster at `{address}` does not answer ({e.strerror or e})",
                         tip="start one with `ray start --head`, and give the address it "
                         "prints") from None


class Journal:
    """The fleet journal's one writer (a Ray actor on the driver's host)."""

    def __init__(self, fleet: str) -> None:
        self.fleet = Path(fleet)

    def append(self, event: dict[str, Any]) -> None:
        append_fleet_event(self.fleet, FleetEvent(**event))


@dataclass(frozen=True)
class DeviceJob:
    """What a device's task needs: its campaign text, where its run folder goes."""

    device: str
    campaign_toml: str  # the campaign with `[device] transport` set to this device
    fleet: str  # the fleet folder on the driver's host
    driver_node: str  # the driver's Ray node: a task there writes into `fleet` directly
    sentinels: str  # the device history folder
    resume_run: str = ""  # the run folder's name to resume ("" to start)
    resume_tar: bytes = b""  # that run folder as the fleet has it, for a host without its own


def run_device(job: DeviceJob, journal: Any) -> dict[str, Any]:
    """A device's campaign, on the host that has the device (a Ray task's body)."""
    ray = import_ray()
    node = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    here = node == job.driver_node
    root = (Path(job.fleet) if here else
            Path.home() / ".cache" / "abbench" / "fleet" / Path(job.fleet).name)
    out = root / device_folder(job.device)
    out.mkdir(parents=True, exist_ok=True)
    cls = device_class(job.device)
    ray.get(journal.append.remote({"event": "start", "device": job.device, "host": host,
                                   "node": node, "t_wall": time.time(),
                                   "device_class": cls}))
    before = {p.name for p in out.iterdir() if p.is_dir()}
    if job.resume_run:
        if not (out / job.resume_run).is_dir() and job.resume_tar:
            _untar(job.resume_tar, out)
        args = ["--resume", str(out / job.resume_run)]
    else:
        toml = out / "campaign.toml"
        toml.write_text(job.campaign_toml, encoding="utf-8")
        args = [str(toml), "--out", str(out)]
    cmd = [sys.executable, "-m", "abbench", "campaign", *args, "--sentinels", job.sentinels,
           "--no-live"]
    p = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_interrupt_with_parent)
    runs = sorted(p.name for p in out.iterdir() if p.is_dir() and p.name not in before)
    run = job.resume_run or (runs[-1] if runs else "")
    # A campaign that ran to its end, whatever its cells measured, is done.
    ended = (EXIT_OK, EXIT_NO_GO, EXIT_UNDECIDED, EXIT_NO_MEASUREMENT)
    status = "done" if p.returncode in ended and run else (
        "interrupted" if run else "failed")
    tar = tar_folder(out / run) if run and not here else b""
    return {"device": job.device, "host": host, "node": node, "exit": p.returncode,
            "status": status, "run": run, "device_class": cls, "tar": tar,
            "error": "" if status == "done" else (p.stderr or p.stdout)[-TAIL:],
            "stdout": p.stdout[-TAIL:]}


def _interrupt_with_parent() -> None:
    """In the campaign's child: a SIGINT when the Ray worker that started it dies, so the
    campaign records what it finished and stops (resumable) instead of running on alone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def tar_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(folder, arcname=folder.name)
    return buf.getvalue()


def _untar(data: bytes, into: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        tf.extractall(into, filter="data")


def run_jobs(jobs: list[DeviceJob], fleet: Path,
             progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every job as a Ray task needing its device; their results as they end, each also
    an "end" event in the fleet journal (a task lost with its host: status failed)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    journal = ray.remote(Journal).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(str(fleet))
    task = ray.remote(run_device)
    pending = {task.options(num_cpus=0, max_retries=0, resources={resource(j.device): 1})
               .remote(j, journal): j for j in jobs}
    for j in jobs:
        progress(f"{j.device}: {'resuming ' + j.resume_run if j.resume_run else 'queued'}")
    results = []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(ready[0])
        try:
            r = ray.get(ready[0])
        except Exception as e:  # noqa: BLE001 — a worker or host lost mid-campaign
            r = {"device": job.device, "host": "", "node": "", "exit": None,
                 "status": "failed", "run": job.resume_run, "device_class": "", "tar": b"",
                 "error": f"{type(e).__name__}: {str(e)[-TAIL:]}"}
        if r["tar"]:
            target = fleet / device_folder(job.device)
            shutil.rmtree(target / r["run"], ignore_errors=True)
            _untar(r["tar"], target)
        ray.get(journal.append.remote({
            "event": "end", "device": r["device"], "host": r["host"], "node": r["node"],
            "t_wall": time.time(), "status": r["status"], "run": r["run"],
            "exit": r["exit"], "device_class": r["device_class"], "error": r["error"]}))
        progress(f"{job.device}: {r['status']}" + (f" on {r['host']}" if r["host"] else "")
                 + (f", exit {r['exit']}" if r["exit"] is not None else "")
                 + (f" — {r['error'].strip().splitlines()[-1]}" if r["error"].strip() else ""))
        results.append(r)
    return results


def driver_node() -> str:
    """This process's Ray node (after `connect`)."""
    return str(import_ray().get_runtime_context().get_node_id())


def shutdown() -> None:
    import_ray().shutdown()


def worker_argv(address: str, devices: list[str], block: bool = True) -> list[str]:
    """`ray start` joining the cluster at `address` with each device as an exclusive
    resource of this host (`abbench fleet worker`)."""
    ray_bin = Path(sys.executable).with_name("ray")
    exe = str(ray_bin) if ray_bin.exists() else (shutil.which("ray") or "ray")
    resources = json.dumps({resource(d): 1 for d in devices}, separators=(",", ":"))
    return [exe, "start", f"--address={address}", f"--resources={resources}",
            *(["--block"] if block else [])]
