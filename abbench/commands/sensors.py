"""`abbench sensors`: what a device exposes, a live reading, and the speed probe.

    abbench sensors                          # this machine
    abbench sensors --transport adb:SERIAL   # a phone over adb
    abbench sensors --samples 5              # five readings, 0.5 s apart

Where the device has no cpufreq caps or CPU temperature it says so, and that the speed
probe is then the only thermal signal a campaign has.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any, TextIO

from abbench import __version__
from abbench.campaign.remote import abbench_there
from abbench.commands.args import number
from abbench.sensors.device import Device, thermal_gaps
from abbench.sensors.probe import SHELL_LOOP_ITERATIONS, device_probe, speed_probe
from abbench.sim import open_device
from abbench.textsafe import shown

SAMPLE_SPACING_S = 0.5
PROBE_REPS = 5
MAX_SAMPLES = 7200  # an hour of readings: what a look at a device needs
sample_count = number("the count", 1, MAX_SAMPLES, whole=True)


HELP = "list what a device's sensors expose and print a live reading"
DESCRIPTION = ("List the sensors a device exposes (cpufreq caps, thermal zones, battery, "
               "memory, pressure, load, NVML, Android thermal status), print live readings and a "
               "speed-probe figure. Keys and platforms: docs/sensors.md.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transport", default="local", metavar="local|adb:SERIAL|ssh:HOST",
                   help="where the device is (default: local)")
    p.add_argument("--root", default="/", metavar="PATH",
                   help="read sysfs and /proc under PATH instead of / (local only; fixtures)")
    p.add_argument("--samples", type=sample_count, default=1, metavar="N",
                   help=f"readings to print, {SAMPLE_SPACING_S:g} s apart, each as it is "
                   f"taken (default 1, at most {MAX_SAMPLES}: an hour; a campaign records "
                   "longer)")
    p.add_argument("--abbench", default="abbench", metavar="CMD",
                   help="adb/ssh: the command that runs abbench on the device, whose "
                   "version is shown (default: abbench on the device's PATH; a campaign's "
                   "`[device] abbench`)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (exposes, samples, probe) instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = open_device(args.transport, args.root)
    rows = device.describe()
    if device.kind in ("adb", "ssh"):  # what an embedded cell there needs
        rows.append(("abbench", _abbench_row(device, shlex.split(args.abbench))))
    out = None if args.json else sys.stdout
    if out is not None:
        render_exposes(rows, out)
    samples: list[dict[str, Any]] = []
    for i in range(args.samples):
        if i:
            time.sleep(SAMPLE_SPACING_S)
        samples.append({"t_wall": time.time(), "values": device.sample()})
        if out is not None:  # each reading as it comes: a long --samples shows progress
            render_reading(device, samples[-1], i + 1, args.samples, out)
            out.flush()
    probe = (speed_probe(PROBE_REPS) if device.kind == "local"
             else device_probe(device) if device.kind in ("adb", "ssh") else None)
    if out is None:
        doc = {"device": device.name, "transport": device.transport,
               "simulated": device.simulated, "exposes": dict(rows), "samples": samples,
               "thermal_gaps": thermal_gaps(samples[-1]["values"]),
               "speed_probe_s": probe}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_summary(device, samples[-1], probe, out)
    return 0


def _abbench_row(device: Device, abbench: list[str]) -> str:
    version, said = abbench_there(device, tuple(abbench))
    shown = shlex.join(abbench)
    if version is None:
        return f"not runnable as `{shown}` ({said}): embedded cells cannot run there"
    if version != __version__:
        return f"{version} ({shown}); this one is {__version__}: embedded cells refused"
    return f"{version} ({shown}), as this one: embedded cells can run there"


def _fmt(value: Any) -> str:
    return str(round(value, 3)) if isinstance(value, float) else str(value)


def render_exposes(rows: list[tuple[str, str]], out: TextIO) -> None:
    width = max(len(shown(name)) for name, _ in rows)
    for name, what in rows:
        out.write(f"{shown(name):<{width}}  {shown(what)}\n")  # a remote device's words


def render_reading(device: Device, sample: dict[str, Any], i: int, n: int,
                   out: TextIO) -> None:
    values = sample["values"]
    stamp = time.strftime("%H:%M:%S", time.localtime(sample["t_wall"]))
    out.write(f"\nreading {i}/{n} at {stamp}: {len(values)} values\n")
    if not values:
        why = f": {device.last_error}" if device.last_error else ""
        out.write(f"  (nothing could be read{shown(why)})\n")
    key_width = max((len(shown(k)) for k in values), default=0)
    for key in sorted(values):  # keys and values a remote device named
        out.write(f"  {shown(key):<{key_width}}  {shown(_fmt(values[key]))}\n")


def render_summary(device: Device, last: dict[str, Any], probe: float | None,
                   out: TextIO) -> None:
    gaps = thermal_gaps(last["values"])
    if gaps:
        out.write(f"\nmissing: {' and '.join(gaps)}. A campaign on this device cannot see "
                  "frequency caps or heat directly; the speed probe is the only thermal "
                  "signal (its index falls when the CPU slows down).\n")
    if probe is not None and device.kind in ("adb", "ssh"):
        out.write(f"\nspeed probe: {probe * 1e3:.1f} ms (the device's shell loop of "
                  f"{SHELL_LOOP_ITERATIONS} steps timed there, min of 3 repetitions; a "
                  "campaign reports first probe / this probe)\n")
    elif probe is not None:
        out.write(f"\nspeed probe: {probe * 1e3:.1f} ms (fixed workload, min of {PROBE_REPS} "
                  "repetitions; a campaign reports first probe / this probe)\n")
    elif device.kind in ("adb", "ssh"):
        out.write("\nspeed probe: not measured (the device's `date` gives no nanoseconds, or "
                  "its shell did not answer): a campaign there matches and gates without "
                  "it\n")
    else:
        out.write("\nspeed probe: not run (it measures the machine running abbench, not a "
                  f"{device.kind} device)\n")
