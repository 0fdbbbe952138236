"""A device: a transport plus every reader, sampled into one flat dict.

`open_device("local" | "adb:SERIAL" | "ssh:HOST")` gives a `Device`; `sample()` reads every
source once (over adb/ssh: one batched shell call) and never raises: a source that fails
or is absent leaves its keys out, which is a gap in the timeline. Where two sources give
the same key, the better one wins: power_supply / `dumpsys battery` over a battery thermal
zone, NVML over a GPU thermal zone, sysfs over psutil (psutil and NVML only describe this
machine, so they are used only for the local transport on `/`).
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import abbench.sensors.host as host
import abbench.sensors.readers as readers
from abbench.errors import AbbenchError, UsageError
from abbench.records import keys
from abbench.sensors.android import (
    THERMAL_STATUS,
    collect_android_battery,
    read_android_thermal,
    status_values,
)
from abbench.sensors.cputime import REMOTE_USER_HZ, ForeignLoad, local_user_hz
from abbench.sensors.describe import (
    describe_battery,
    describe_cpu_time,
    describe_cpufreq,
    describe_nvml,
    describe_power,
)
from abbench.sensors.readers import (
    CPUFREQ_GLOB,
    POWER_SUPPLY_GLOB,
    POWERCAP_GLOB,
    THERMAL_GLOB,
    Zone,
    zone_values,
)
from abbench.sensors.transports import AdbTransport, LocalTransport, SshTransport, Transport
from abbench.sensors.tree import Tree

# How long a sysfs source this machine lacks goes unread before it is looked for again.
ABSENT_RECHECK_S = 30.0


class ZoneFreeze:
    """Ignore temperature zones that never change: trip points, stuck or placeholder sensors.

    Phones expose zones that hold one value forever (a threshold, a disabled sensor, the
    HAL's stale 99.6 °C seen in reference/bmoe's qwen.state); folded into `temp.cpu_c` they
    would pin it. A zone is ignored once it has read exactly the same value for at least
    `min_samples` samples spanning `after_s` seconds while some other zone changed; it is
    used again the moment it changes. When every zone is constant nothing can be told apart
    and nothing is ignored. Real sensors report milli-°C (sysfs) or 0.1 °C (HAL) and move
    by that much within seconds, so a minute of exact equality is not a steady temperature.
    """

    def __init__(self, after_s: float = 60.0, min_samples: int = 10) -> None:
        self.after_s = after_s
        self.min_samples = min_samples
        self.frozen: set[str] = set()
        self._first: dict[str, tuple[float, float]] = {}   # id -> (value, time first seen)
        self._count: dict[str, int] = {}
        self._changed: set[str] = set()

    def observe(self, t: float, zones: Iterable[Zone]) -> None:
        for z in zones:
            if z.id not in self._first:
                self._first[z.id] = (z.temp_c, t)
                self._count[z.id] = 1
            elif z.temp_c != self._first[z.id][0]:
                self._changed.add(z.id)
                self.frozen.discard(z.id)
            else:
                self._count[z.id] += 1
        if not self._changed:
            return
        for zid, (_, t0) in self._first.items():
            if (zid not in self._changed and self._count[zid] >= self.min_samples
                    and t - t0 >= self.after_s):
                self.frozen.add(zid)


@dataclass
class _Reading:
    """One sample's values plus what describe() shows about where they came from."""

    values: dict[str, Any] = field(default_factory=dict)
    zones: list[Zone] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)   # source -> how it was read
    status: int | None = None   # Android's thermal status (an adb snapshot's)


def thermal_gaps(values: dict[str, Any]) -> list[str]:
    """The thermal signals a sample lacks (frequency caps, CPU temperature)."""
    gaps = []
    if not keys.policies(values, "cap_khz"):
        gaps.append("cpufreq caps")
    if keys.CPU_TEMP_C not in values:
        gaps.append("CPU temperature")
    return gaps


class Device:
    """A device the campaign samples and runs commands on (see `open_device`)."""

    def __init__(self, transport: Transport, name: str, *, simulated: bool = False,
                 freeze: ZoneFreeze | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 processes: Tree | None = None) -> None:
        self.name = name
        self.transport = transport.spec
        self.kind = transport.kind
        self.simulated = simulated
        self.last_error: str | None = None
        self._transport = transport
        self._freeze = freeze or ZoneFreeze()
        self._clock = clock
        self._lock = threading.Lock()
        # On this machine: a hardware source found absent (no cpufreq policy, no battery,
        # no thermal zone, as in a VM), by its folder -> when to look for it again
        self._absent: dict[str, float] = {}
        # Where the cells' processes and /proc/stat are read: the sampled tree, unless they
        # run elsewhere (a simulated device's cells run on this machine). The campaign's
        # own process is on the device only when the transport is local.
        self._processes = processes
        local = transport.kind == "local"
        self._cpu = ForeignLoad(local_user_hz() if local else REMOTE_USER_HZ,
                                "self" if local else None)

    def __repr__(self) -> str:
        return f"Device({self.name!r}, {self.transport!r})"

    # -- what every device offers beyond its readings (a real one: nothing to do) ----------

    @property
    def on_host(self) -> bool:
        """Whether its commands run on this machine (local, simulated), not over adb/ssh."""
        return self._transport.on_host

    @property
    def time_scale(self) -> float:
        """Device seconds per wall second: spacing and gate times are device seconds."""
        return 1.0

    @property
    def probe_rep_s(self) -> float:
        """Wall seconds one speed-probe repetition must run (0: the probe's own default)."""
        return 0.0

    @property
    def profile_toml(self) -> str | None:
        """The model the device runs on, kept with a run (a simulated device's profile)."""
        return None

    def throttle(self, pid: int, loads: bool = True) -> None:
        """Run process `pid` as this device would (a simulated device slows it by its caps,
        and heats while it runs unless `loads` is False) until `unthrottle()`. A real
        device throttles by itself."""

    def unthrottle(self) -> None:
        """Stop `throttle`; the process is left running."""

    def watch(self, *pids: int) -> None:
        """Count processes `pids` and their descendants as the cell's own, not foreign
        load (`load.foreign_cores`), from the next reading on; `watch()` forgets them.
        Call it as the cell's processes start (sensors/cputime.py says why)."""
        with self._lock:
            self._cpu.watch(pids)

    def watch_remote(self, pid_file: str | None) -> None:
        """On an adb/ssh device: count the process group that `pid_file` (a remote cell's,
        `campaign.remote`) records as the cell's own, from the next reading on; None
        forgets it."""
        with self._lock:
            if hasattr(self._transport, "group_pid_file"):
                self._transport.group_pid_file = pid_file
                self._cpu.watch_group(pid_file is not None)

    def close(self) -> None:
        """Release what the device holds (a simulated device's thread and tree)."""

    def sample(self) -> dict[str, Any]:
        """One flat dict of readings; absent or failing sources leave their keys out."""
        return self._sample().values

    def _sample(self) -> _Reading:
        with self._lock:  # the sampler thread and the campaign's entry-state reads share it
            try:
                tree = self._transport.snapshot()
            except Exception as e:
                self.last_error = str(e) or type(e).__name__
                return _Reading()
            try:
                reading = self._read(tree)
            except Exception as e:  # a bug in the glue, not a reader: still only a gap
                self.last_error = f"{type(e).__name__}: {e}"
                return _Reading()
            self.last_error = None
            return reading

    def _read(self, tree: Tree) -> _Reading:
        r = _Reading()
        on_host = self._transport.on_host
        now = self._clock()

        def take(source: str, values: dict[str, Any], how: str) -> None:
            if values:
                r.sources.setdefault(source, how)
                for key, value in values.items():
                    r.values.setdefault(key, value)

        def hardware(source: str, read: Callable[[Tree], dict[str, Any]], how: str,
                     folder: str) -> None:
            """A sysfs source. On this machine, one whose folder is empty is not looked
            for again for ABSENT_RECHECK_S: at 10 Hz a VM's four absent sources cost a
            fifth of a tick, and hardware does not appear mid-campaign (a battery
            plugged into a laptop is seen within the recheck)."""
            if not on_host:
                take(source, read(tree), how)
                return
            if now < self._absent.get(folder, -math.inf):
                return
            values = read(tree)
            take(source, values, how)
            if not values and not tree.glob(folder):
                self._absent[folder] = now + ABSENT_RECHECK_S

        hardware("cpufreq", readers.collect_cpufreq, "sysfs", CPUFREQ_GLOB)
        # On Linux psutil's cpu_freq and battery read the sysfs files above, or for cpu_freq
        # /proc/cpuinfo's `cpu MHz` (static in a VM, never a cap, the costliest read of a
        # tick); elsewhere (macOS, BSD) they ask the OS.
        os_api = on_host and sys.platform != "linux"
        if os_api and "cpufreq" not in r.sources:
            take("cpufreq", host.collect_psutil_cpufreq(), "psutil (current only)")
        hardware("battery", readers.collect_battery, "power_supply", POWER_SUPPLY_GLOB)
        if not on_host:  # a snapshot's pseudo-file: an adb device's, never this machine's
            take("battery", collect_android_battery(tree), "dumpsys battery")
        if os_api and "battery" not in r.sources:
            take("battery", host.collect_psutil_battery(), "psutil")
        hardware("power", readers.collect_rapl, "powercap RAPL", POWERCAP_GLOB)
        take("memory", readers.collect_meminfo(tree), "/proc/meminfo")
        if on_host and "memory" not in r.sources:
            take("memory", host.collect_psutil_memory(), "psutil")
        take("pressure", readers.collect_pressure(tree), "/proc/pressure")
        take("load", readers.collect_loadavg(tree), "/proc/loadavg")
        if on_host and "load" not in r.sources:
            take("load", host.collect_os_loadavg(), "os.getloadavg")
        take("cpu time", self._cpu.read(self._processes or tree, self._clock), "/proc/stat")
        if on_host:
            take("gpu", host.collect_nvml(), "NVML")
        self._zones(r, tree, now)
        take("android", status_values(r.status), "dumpsys thermalservice")
        take("thermal", zone_values(r.zones, self._freeze.frozen), "zones")
        return r

    def _zones(self, r: _Reading, tree: Tree, now: float) -> None:
        """The temperature zones into `r`: sysfs, else psutil's (hwmon) on this machine;
        an adb snapshot's HAL sensors besides. Absent sysfs zones are looked for again as
        in _read."""
        on_host = self._transport.on_host
        zones: list[Zone] = []
        if now >= self._absent.get(THERMAL_GLOB, -math.inf):
            zones = readers.read_thermal_zones(tree)
            if zones:
                r.sources["thermal"] = "sysfs"
            elif on_host and not tree.glob(THERMAL_GLOB):
                self._absent[THERMAL_GLOB] = now + ABSENT_RECHECK_S
        if not zones and on_host and "psutil" not in self._absent:
            zones = host.read_psutil_temperatures()
            if zones:
                r.sources["thermal"] = "psutil"
            else:  # hwmon chips do not appear mid-run, and a scan costs ms: never again
                self._absent["psutil"] = math.inf
        hal: list[Zone] = []
        if not on_host:
            r.status, hal = read_android_thermal(tree)
            if r.status is not None or hal:
                r.sources["android"] = "dumpsys thermalservice"
        r.zones = zones + hal
        self._freeze.observe(self._clock(), r.zones)

    def describe(self) -> list[tuple[str, str]]:
        """What this device exposes, one (source, what) row each, from one fresh sample."""
        r = self._sample()
        v = r.values
        rows = [("device", f"{self.name} via {self.transport}"
                 + (" (simulated)" if self.simulated else ""))]
        if self.last_error:
            rows.append(("error", self.last_error))
        rows.append(("cpufreq", describe_cpufreq(v, r.sources.get("cpufreq"))))
        rows.append(("thermal zones", self._describe_zones(r)))
        rows.append(("battery", describe_battery(v, r.sources.get("battery"))))
        rows.append(("power", describe_power(v, r.sources.get("power"))))
        mem = v.get(keys.MEM_AVAILABLE_MIB)
        rows.append(("memory", f"MemAvailable {mem:.0f} MiB ({r.sources['memory']})"
                     if mem is not None else "missing: no /proc/meminfo"))
        psi = sorted({k.split(".")[1] for k in v if k.startswith(keys.PSI_PREFIX)})
        rows.append(("pressure", f"/proc/pressure: {' '.join(psi)}" if psi
                     else "missing: no readable /proc/pressure (kernel without PSI?)"))
        load = v.get(keys.LOAD_KEYS[0])
        rows.append(("load average", f"{load:.2f} ({r.sources['load']})" if load is not None
                     else "missing: no /proc/loadavg"))
        rows.append(("CPU time", describe_cpu_time(v, r.sources.get("cpu time"))))
        rows.append(("GPU (NVML)", describe_nvml(v, self._transport.on_host)))
        status = v.get(keys.ANDROID_THERMAL_STATUS)
        hal = sum(1 for z in r.zones if z.id.startswith("hal:"))
        rows.append(("Android", f"thermal status {status} ({THERMAL_STATUS.get(status, '?')}), "
                     f"{hal} HAL temperature sensors" if "android" in r.sources
                     else "no dumpsys thermalservice (not an Android device)"))
        return rows

    def _describe_zones(self, r: _Reading) -> str:
        sysfs = [z for z in r.zones if not z.id.startswith("hal:")]
        if not sysfs:
            psutil = " and no psutil temperatures" if self._transport.on_host else ""
            return f"missing: no {THERMAL_GLOB}{psutil}"
        cpu = [z.label for z in sysfs if z.kind == "cpu"]
        text = (f"{len(sysfs)} zones via {r.sources.get('thermal', 'sysfs')}, "
                f"{len(cpu)} CPU" + (f" ({', '.join(cpu[:6])}{', ...' if len(cpu) > 6 else ''})"
                                     if cpu else ""))
        if keys.CPU_TEMP_C in r.values:
            text += f"; hottest CPU sensor {r.values[keys.CPU_TEMP_C]:.1f} °C"
        frozen = [z.label for z in r.zones if z.id in self._freeze.frozen]
        if frozen:
            text += f"; ignored as constant: {', '.join(frozen)}"
        return text

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a command (an argument list) on the device, capturing text output.

        Locally as given; over adb/ssh quoted with shlex.join for the device's shell.
        Raises subprocess.TimeoutExpired past `timeout`, UsageError if adb/ssh is missing.
        """
        return self._transport.run(list(argv), timeout)

    def command(self, argv: Sequence[str]) -> list[str]:
        """The local argument list that runs `argv` on the device, for callers that need a
        Popen of their own (streaming output, their own kill): `argv` itself locally,
        `adb -s SERIAL shell QUOTED` or `ssh -o BatchMode=yes HOST QUOTED` remotely."""
        return self._transport.command(argv)

    def shell(self, script: str) -> list[str]:
        """The local argument list that runs `script` with the device's `sh -c`."""
        return self._transport.shell(script)

    def copy_in(self, here: str, there: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Copy the file `here` (this machine's) to `there` on an adb/ssh device. Raises
        UsageError on a device that is this machine, subprocess.TimeoutExpired past
        `timeout`."""
        copy = getattr(self._transport, "copy_in", None)
        if copy is None:
            raise UsageError(f"{self.name} is this machine: nothing to copy to it")
        return copy(here, there, timeout)

    def unreachable(self) -> str | None:
        """Why an adb/ssh device cannot be reached now (its `check`), None where it can
        (and for a device on this machine)."""
        check = getattr(self._transport, "check", None)
        if check is None:
            return None
        try:
            check()
        except AbbenchError as e:
            return e.message
        return None


def open_device(transport: str, root: str | os.PathLike[str] = "/") -> Device:
    """`local`, `adb:SERIAL` or `ssh:HOST` as a Device; anything else is a UsageError
    (`sim:PROFILE` is opened by `abbench.sim.open_device`, which opens these as well).

    Remote transports are checked now (adb present, device attached; ssh host reachable
    without a password), so a campaign fails before its first cell, not during it.
    """
    spec = transport.strip()
    kind, _, arg = spec.partition(":")
    if kind in ("adb", "ssh") and str(root) not in ("/", ""):
        raise UsageError(f"--root applies to the local transport only, not `{spec}`")
    if spec == "local":
        return Device(LocalTransport(root or "/"), socket.gethostname() or "localhost")
    if kind == "adb":
        adb = AdbTransport(arg)
        adb.check()
        return Device(adb, adb.serial)
    if kind == "ssh":
        ssh = SshTransport(arg)
        ssh.check()
        return Device(ssh, ssh.host)
    if kind == "sim":  # abbench.sim.open_device opens these; sensors knows no simulation
        raise UsageError(f"`{spec}` is a simulated device", tip="open it with "
                         "abbench.sim.open_device")
    raise UsageError(f"unknown transport `{transport}`: expected local, adb:SERIAL, "
                     "ssh:HOST or sim:PROFILE")
