"""A fleet's devices: their names, the Ray resource that makes each exclusive, and the
class (model / SoC) each reports of itself."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from abbench.errors import UsageError

RESOURCE_PREFIX = "device:"  # a device's Ray custom resource: `device:sim:phone#1`
_INSTANCES = re.compile(r"(sim:[^#\s]+)#([0-9]+)\Z")


def expand(devices: Sequence[str]) -> list[str]:
    """`sim:PROFILE#N` as N devices `sim:PROFILE#1` .. `#N`; others as given. A device
    named twice (after expansion) is a UsageError naming it; so is an empty list."""
    out: list[str] = []
    for spec in devices:
        spec = spec.strip()
        m = _INSTANCES.match(spec)
        names = [f"{m[1]}#{i}" for i in range(1, int(m[2]) + 1)] if m else [spec]
        if m and int(m[2]) < 1:
            raise UsageError(f"`{spec}`: the number of devices after `#` must be 1 or more")
        for name in names:
            if name in out:
                raise UsageError(f"the device `{name}` is named twice",
                                 tip="a device runs one campaign of a fleet; `sim:PROFILE#N` "
                                 "already names N devices")
            out.append(name)
    if not out:
        raise UsageError("no devices: give `[fleet] devices = [...]` in the campaign file "
                         "or --device", tip="e.g. --device sim:phone#2 --device sim:laptop")
    return out


def resource(device: str) -> str:
    return RESOURCE_PREFIX + device


def device_class(device: str, timeout: float = 10.0) -> str:
    """The device's model and SoC as it reports them ("" when it does not): Android's
    `ro.product.model` / `ro.soc.model`, Linux's DMI product name and CPU model, a simulated
    device's profile. Runs on the host that has the device."""
    kind = device.partition(":")[0]
    if kind == "sim":
        profile = device.partition(":")[2].partition("#")[0]
        return f"simulated {profile}"
    from abbench.sim import open_device  # a fleet worker opens what it runs

    try:
        dev = open_device(device)
    except UsageError:
        return ""
    try:
        if kind == "adb":
            parts = [_out(dev.run(["getprop", p], timeout)) for p in
                     ("ro.product.model", "ro.soc.model")]
        else:
            parts = [_out(dev.run(["cat", "/sys/class/dmi/id/product_name"], timeout)),
                     _cpu_model(_out(dev.run(["cat", "/proc/cpuinfo"], timeout)))]
    except (OSError, subprocess.TimeoutExpired, UsageError):
        return ""
    finally:
        dev.close()
    return " / ".join(p for p in parts if p)


def _out(p: subprocess.CompletedProcess[str]) -> str:
    return p.stdout.strip() if p.returncode == 0 else ""


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "Processor"):
            return value.strip()
    return ""


def attached(sims: Sequence[str], ssh_hosts: Sequence[str], local: bool,
             adb: bool = True, timeout: float = 10.0) -> list[str]:
    """The devices this host offers a fleet: its `adb devices` (state "device"), the
    `ssh:` hosts given (each checked reachable), the simulated ones asked for, and this
    machine itself when `local`. An ssh host that does not answer is a UsageError."""
    out: list[str] = ["local"] if local else []
    if adb and shutil.which("adb"):
        try:
            p = subprocess.run(["adb", "devices"], capture_output=True, text=True,
                               timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            p = None
        for line in (p.stdout.splitlines()[1:] if p is not None and p.returncode == 0 else []):
            serial, _, state = line.partition("\t")
            if state.strip() == "device":
                out.append(f"adb:{serial.strip()}")
    from abbench.sensors import open_device

    for host in ssh_hosts:
        open_device(f"ssh:{host}").close()  # checked now: a worker that cannot reach it says so
        out.append(f"ssh:{host}")
    out += expand([f"sim:{s.removeprefix('sim:')}" for s in sims]) if sims else []
    for i, d in enumerate(out):
        if d in out[:i]:
            raise UsageError(f"the device `{d}` is named twice")
    return out
