"""`abbench fleet FILE [--device T ...] [--address A] [--out DIR] [--dry-run]`, `abbench
fleet --resume FLEET` and `abbench fleet --report FLEET`: one campaign on many devices,
on Ray (docs/fleet.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from abbench.analysis.fleet import analyze_fleet
from abbench.campaign.plan import describe_plan, plan_campaign
from abbench.campaign.run_folder import new_run_folder
from abbench.campaign.schema import CampaignSpec, load_campaign, resolved_toml
from abbench.commands.outcome import why_nothing
from abbench.errors import (
    EXIT_INTERRUPTED,
    EXIT_NO_MEASUREMENT,
    AbbenchError,
    Interrupted,
    NoMeasurement,
    UsageError,
)
from abbench.fleet import runner
from abbench.fleet.devices import attached, expand
from abbench.fsutil import atomic_write_text
from abbench.records.fleet import (
    FLEET_CAMPAIGN_FILE,
    FLEET_PLAN_FILE,
    FleetPlan,
    device_folder,
    last_ends,
    read_fleet_journal,
    read_fleet_plan,
)
from abbench.report.fleet import text_lines, write_fleet_reports
from abbench.textsafe import shown

HELP = "run one campaign on many devices (Ray), with verdicts across them"
DESCRIPTION = ("Run the campaign of FILE on every device of its `[fleet] devices` (or "
               "--device), each device's campaign an ordinary one on the host that has the device, "
               "never two at once on one device; then report each device's verdicts, each device "
               "class's and a combined verdict across devices. Without --address, Ray runs "
               "embedded in this process. Exit status as for a campaign, over the combined "
               "verdicts.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="the campaign file (cells.toml)")
    p.add_argument("--device", action="append", default=[], metavar="TRANSPORT",
                   help="a device to run on (repeatable; replaces `[fleet] devices`): "
                   "local, adb:SERIAL, ssh:HOST, sim:PROFILE, or sim:PROFILE#N for N "
                   "simulated devices")
    p.add_argument("--address", default=None, metavar="RAY_ADDRESS",
                   help="join the Ray cluster at this address (`ray start --head`) instead "
                   "of starting Ray embedded")
    p.add_argument("--out", default="reports", metavar="DIR",
                   help="where the fleet folder is created (default: reports/)")
    p.add_argument("--sentinels", default=None, metavar="DIR",
                   help="the device history folder on each host (default: sentinels/; "
                   "a resumed fleet: the one it started with)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the devices, print which runs where and the plan; run nothing")
    p.add_argument("--resume", metavar="FLEET",
                   help="continue a fleet: every device campaign that did not finish "
                   "resumes from its journal (one never started starts)")
    p.add_argument("--report", metavar="FLEET", help="re-render a fleet folder's report")
    w = p.add_argument_group(
        "abbench fleet worker [--address RAY_ADDRESS]",
        "on each host: offer the devices attached to it to the cluster (`ray start` with "
        "one exclusive resource per device), so a device's campaign runs on its host and "
        "never two at once on one device; `adb devices` are found, the others named here")
    w.add_argument("--sim", action="append", default=[], metavar="PROFILE[#N]",
                   help="offer N simulated devices of PROFILE (repeatable)")
    w.add_argument("--ssh", action="append", default=[], metavar="HOST",
                   help="offer the ssh: device HOST, checked reachable (repeatable)")
    w.add_argument("--local", action="store_true", help="offer this machine itself")
    w.add_argument("--no-adb", action="store_true", help="do not offer `adb devices`")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    if a.file == "worker":
        return _worker(a)
    if a.report:
        return _report(Path(a.report))
    if a.resume:
        return _resume(Path(a.resume), a)
    if not a.file:
        raise UsageError("give a campaign file, or --resume FLEET",
                         tip="abbench fleet cells/quickstart.toml --device sim:phone#2")
    spec = load_campaign(Path(a.file))
    devices = expand(a.device or list(spec.fleet.devices))
    if not a.address:
        _check_local(devices)
    plan = plan_campaign(spec.on(devices[0]))
    if a.dry_run:
        for d in devices:
            print(f"{d}: " + ("this machine (Ray embedded)" if not a.address
                              else f"the host of the cluster at {a.address} offering it"))
        for line in describe_plan(plan):
            print(line)
        return 0
    address = runner.connect(a.address, devices)
    try:
        fleet = new_run_folder(Path(a.out), f"fleet-{spec.campaign.name}")
        sentinels = Path(a.sentinels or "sentinels").resolve()
        fplan = FleetPlan(spec.campaign.name, str(a.file), tuple(devices), time.time(),
                          address, str(sentinels))
        atomic_write_text(fleet / FLEET_PLAN_FILE, json.dumps(fplan.to_json()) + "\n")
        atomic_write_text(fleet / FLEET_CAMPAIGN_FILE, resolved_toml(spec))
        print(f"fleet {fleet}: {spec.campaign.name} on {len(devices)} devices, "
              f"{len(plan.cells)} cells each", file=sys.stderr)
        jobs = [_job(spec, d, fleet, sentinels) for d in devices]
        _run(jobs, fleet)
    finally:
        runner.shutdown()
    return _report(fleet)


def _run(jobs: list[runner.DeviceJob], fleet: Path) -> None:
    """The jobs; after Ctrl-C each device's campaign stops with what it finished (they
    are told to when their Ray worker goes) and the fleet can be resumed."""
    try:
        runner.run_jobs(jobs, fleet, _progress)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: the device campaigns in {fleet} stop with what "
                          "they finished", tip=f"continue with: abbench fleet --resume "
                          f"{fleet}", folder=fleet) from None


def _resume(fleet: Path, a: argparse.Namespace) -> int:
    fplan = read_fleet_plan(fleet)
    spec = load_campaign(fleet / FLEET_CAMPAIGN_FILE)
    ends = last_ends(read_fleet_journal(fleet))
    todo = [d for d in fplan.devices if ends.get(d) is None or ends[d].status != "done"]
    if not todo:
        print(f"{fleet}: every device's campaign is done", file=sys.stderr)
        return _report(fleet)
    if not (a.address or fplan.ray_address):
        _check_local(todo)
    runner.connect(a.address or fplan.ray_address or None, todo)
    sentinels = Path(a.sentinels or fplan.sentinels or "sentinels")
    try:
        jobs = []
        for d in todo:
            run_name = _resumable(fleet / device_folder(d))
            job = _job(spec, d, fleet, sentinels)
            if run_name:  # a host with its own copy resumes that; another gets this one
                copy = runner.tar_folder(fleet / device_folder(d) / run_name)
                job = dataclasses.replace(job, resume_run=run_name, resume_tar=copy)
            jobs.append(job)
        _run(jobs, fleet)
    finally:
        runner.shutdown()
    return _report(fleet)


def _worker(a: argparse.Namespace) -> int:
    if not a.address:
        raise UsageError("a worker joins a cluster: give --address",
                         tip="on the head host: `ray start --head`; it prints the address")
    devices = attached(a.sim, a.ssh, a.local, adb=not a.no_adb)
    if not devices:
        raise UsageError("this host has no device to offer",
                         tip="attach an adb device, or give --local, --ssh HOST or --sim "
                         "PROFILE#N")
    argv = runner.worker_argv(a.address, devices)
    host = socket.gethostname()
    for d in devices:
        print(f"{host} offers {d}")
    if a.dry_run:
        print(" ".join(argv))
        return 0
    runner.probe(a.address)
    print(f"joining {a.address} (Ctrl-C to leave)", file=sys.stderr, flush=True)
    try:
        return subprocess.run(argv).returncode
    except FileNotFoundError:
        raise UsageError("Ray's `ray` command is not installed",
                         tip="pip install -e '.[fleet]'") from None
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _resumable(device_dir: Path) -> str:
    """The device's run folder that a resume continues (the newest with a plan), or ""."""
    runs = sorted(p for p in device_dir.glob("*/plan.json")) if device_dir.is_dir() else []
    return runs[-1].parent.name if runs else ""


def _report(fleet: Path) -> int:
    analysis = analyze_fleet(fleet)
    write_fleet_reports(analysis)
    for line in text_lines(analysis):
        print(line)
    if analysis.exit_status == EXIT_NO_MEASUREMENT:  # one ERROR, as a campaign's
        why = "; ".join(f"{o.device}: " + (why_nothing(o.analysis) if o.analysis is not None
                                            else o.note or o.status)
                        for o in analysis.devices[:3])
        more = f"; and {len(analysis.devices) - 3} more" if len(analysis.devices) > 3 else ""
        raise NoMeasurement(f"no device produced a valid measurement ({why}{more})",
                            tip=f"{fleet / 'fleet-report.md'} has each device's report")
    return analysis.exit_status


def _job(spec: CampaignSpec, device: str, fleet: Path, sentinels: Path) -> runner.DeviceJob:
    return runner.DeviceJob(device=device, campaign_toml=resolved_toml(spec.on(device)),
                            fleet=str(fleet.resolve()), driver_node=runner.driver_node(),
                            sentinels=str(sentinels.resolve()))


def _check_local(devices: list[str]) -> None:
    """Every device of an embedded fleet opens on this machine (nothing started else)."""
    from abbench.sim import open_device

    for d in devices:
        try:
            open_device(d).close()
        except AbbenchError as e:
            raise UsageError(f"device `{d}`: {e.message}", tip=e.tip) from None


def _progress(line: str) -> None:
    # lines carry what other machines sent (device names, their errors)
    print(shown(line), file=sys.stderr, flush=True)
