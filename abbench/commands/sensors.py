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
import sys
import time
from typing import Any, TextIO

from abbench.commands.args import positive_int
from abbench.sensors.device import Device, thermal_gaps
from abbench.sensors.probe import speed_probe
from abbench.sim import open_device

SAMPLE_SPACING_S = 0.5
PROBE_REPS = 5


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "sensors",
        help="list what a device's sensors expose and print a live reading",
        description="List the sensors a device exposes (cpufreq caps, thermal zones, battery, "
        "memory, pressure, load, NVML, Android thermal status), print live readings and a "
        "speed-probe figure. Keys and platforms: docs/sensors.md.",
    )
    p.add_argument("--transport", default="local", metavar="local|adb:SERIAL|ssh:HOST",
                   help="where the device is (default: local)")
    p.add_argument("--root", default="/", metavar="PATH",
                   help="read sysfs and /proc under PATH instead of / (local only; fixtures)")
    p.add_argument("--samples", type=positive_int, default=1, metavar="N",
                   help=f"readings to print, {SAMPLE_SPACING_S:g} s apart (default 1)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (exposes, samples, probe) instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = open_device(args.transport, args.root)
    rows = device.describe()
    samples: list[dict[str, Any]] = []
    for i in range(args.samples):
        if i:
            time.sleep(SAMPLE_SPACING_S)
        samples.append({"t_wall": time.time(), "values": device.sample()})
    probe = speed_probe(PROBE_REPS) if device.kind == "local" else None
    if args.json:
        doc = {"device": device.name, "transport": device.transport,
               "simulated": device.simulated, "exposes": dict(rows), "samples": samples,
               "thermal_gaps": thermal_gaps(samples[-1]["values"]),
               "speed_probe_s": probe}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(device, rows, samples, probe, sys.stdout)
    return 0


def _fmt(value: Any) -> str:
    return str(round(value, 3)) if isinstance(value, float) else str(value)


def render(device: Device, rows: list[tuple[str, str]], samples: list[dict[str, Any]],
           probe: float | None, out: TextIO) -> None:
    width = max(len(name) for name, _ in rows)
    for name, what in rows:
        out.write(f"{name:<{width}}  {what}\n")
    for i, sample in enumerate(samples, 1):
        values = sample["values"]
        stamp = time.strftime("%H:%M:%S", time.localtime(sample["t_wall"]))
        out.write(f"\nreading {i}/{len(samples)} at {stamp}: {len(values)} values\n")
        if not values:
            why = f": {device.last_error}" if device.last_error else ""
            out.write(f"  (nothing could be read{why})\n")
        key_width = max((len(k) for k in values), default=0)
        for key in sorted(values):
            out.write(f"  {key:<{key_width}}  {_fmt(values[key])}\n")
    gaps = thermal_gaps(samples[-1]["values"]) if samples else []
    if gaps:
        out.write(f"\nmissing: {' and '.join(gaps)}. A campaign on this device cannot see "
                  "frequency caps or heat directly; the speed probe is the only thermal "
                  "signal (its index falls when the CPU slows down).\n")
    if probe is not None:
        out.write(f"\nspeed probe: {probe * 1e3:.1f} ms (fixed workload, min of {PROBE_REPS} "
                  "repetitions; a campaign reports first probe / this probe)\n")
    else:
        out.write("\nspeed probe: not run (it measures the machine running abbench, not a "
                  f"{device.kind} device)\n")
