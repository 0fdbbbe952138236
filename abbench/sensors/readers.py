"""Sensor readers: one fail-soft `collect_*` function per source.

Each reader takes a `root` (a folder, `/` by default, or a `SnapshotTree` fetched from a
remote device), reads what it can and returns flat `{key: value}` readings; a file that is
absent, unreadable or malformed leaves its keys out, and no reader raises (`fail_soft`
is the backstop). Each comments the exact format of the file it parses.

Readers of this machine's own APIs (psutil, NVML) are in `host.py`, Android's dumpsys in
`android.py`. Thermal sources (sysfs zones here, psutil's hwmon chips, the thermal HAL)
return `Zone`s rather than keys, so the device can drop zones that never
change (see `ZoneFreeze` in `device.py`) before `zone_values` folds them into keys.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from abbench.records import keys
from abbench.sensors.tree import Tree, as_tree

Root = str | os.PathLike[str] | Tree
T = TypeVar("T")

CPUFREQ_GLOB = "/sys/devices/system/cpu/cpufreq/policy*"
THERMAL_GLOB = "/sys/class/thermal/thermal_zone*"
POWER_SUPPLY_GLOB = "/sys/class/power_supply/*"
POWERCAP_GLOB = "/sys/class/powercap/*"
PSI_RESOURCES = ("cpu", "memory", "io")

# Every file the readers below may read, as shell patterns: what a remote device sends back.
REMOTE_GLOBS = (
    f"{CPUFREQ_GLOB}/scaling_max_freq",
    f"{CPUFREQ_GLOB}/cpuinfo_max_freq",
    f"{CPUFREQ_GLOB}/scaling_cur_freq",
    f"{THERMAL_GLOB}/type",
    f"{THERMAL_GLOB}/temp",
    f"{POWER_SUPPLY_GLOB}/type",
    f"{POWER_SUPPLY_GLOB}/temp",
    f"{POWER_SUPPLY_GLOB}/status",
    f"{POWER_SUPPLY_GLOB}/capacity",
    f"{POWER_SUPPLY_GLOB}/power_now",
    f"{POWER_SUPPLY_GLOB}/current_now",
    f"{POWER_SUPPLY_GLOB}/voltage_now",
    f"{POWERCAP_GLOB}/name",
    f"{POWERCAP_GLOB}/energy_uj",
    f"{POWERCAP_GLOB}/max_energy_range_uj",
    "/proc/meminfo",
    "/proc/loadavg",
    "/proc/stat",  # sensors/cputime.py: the run queue; the foreign load between cells
    *(f"/proc/pressure/{r}" for r in PSI_RESOURCES),
)

# A reading outside this range is a disabled sensor (-273 °C), a trip threshold or a zone
# that reports something other than a temperature; it is left out.
PLAUSIBLE_C = (-40.0, 150.0)


def _fail_soft(empty: Callable[[], Any]) -> Callable[[Callable[..., T]], Callable[..., T]]:
    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                return empty()

        return wrapper

    return decorate


# A reader that fails returns nothing: its readings become a gap in the timeline.
fail_soft = _fail_soft(dict)
fail_soft_zones = _fail_soft(list)


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _text(text: str | None) -> str | None:
    if text is None:
        return None
    return text.strip() or None


def _slug(text: str) -> str:
    """A zone or sensor name as a key component: lower case, no dots or spaces."""
    return re.sub(r"[^a-z0-9_+-]+", "_", text.strip().lower()).strip("_") or "unnamed"


# --- cpufreq -----------------------------------------------------------------------------

@fail_soft
def collect_cpufreq(root: Root = "/") -> dict[str, Any]:
    """Per policy (cluster): the cap, the hardware max and the current frequency, in kHz.

    /sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq   "2188800\\n"  (the cap)
    /sys/devices/system/cpu/cpufreq/policy0/cpuinfo_max_freq   "3321600\\n"  (hardware max)
    /sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq   "806400\\n"
    A cap below the hardware max means the policy is capped (`cpu.<policy>.capped`).
    """
    tree = as_tree(root)
    out: dict[str, Any] = {}
    for folder in tree.glob(CPUFREQ_GLOB):
        policy = folder.rsplit("/", 1)[-1]
        cap = _int(tree.read(f"{folder}/scaling_max_freq"))
        hw = _int(tree.read(f"{folder}/cpuinfo_max_freq"))
        cur = _int(tree.read(f"{folder}/scaling_cur_freq"))
        for name, value in (("cap_khz", cap), ("hw_max_khz", hw), ("cur_khz", cur)):
            if value is not None:
                out[keys.policy_key(policy, name)] = value
        if cap is not None and hw is not None:
            out[keys.capped(policy)] = cap < hw
    return out


# --- thermal zones -----------------------------------------------------------------------

@dataclass(frozen=True)
class Zone:
    """One temperature sensor. `key` is its flat key, or None when it only feeds an aggregate.

    `kind` is "cpu" (folded into `temp.cpu_c`), "gpu" (into `gpu.temp_c` when NVML says
    nothing), "battery" (into `battery.temp_c` when power_supply says nothing) or "other".
    `id` is stable across samples; the freeze filter tracks zones by it.
    """

    id: str
    label: str
    kind: str
    temp_c: float
    key: str | None


# Zone types that name CPU sensors: Qualcomm (cpu-0-0-usr, cpuss-0, tsens_tz_sensor1), Intel
# (x86_pkg_temp), AMD (k10temp), MediaTek/Exynos (cpu_big0, soc_thermal), Pixel (BIG, MID,
# LITTLE), Raspberry Pi (cpu-thermal).
_CPU_TYPE = re.compile(
    r"cpu|x86_pkg_temp|tsens|coretemp|k10temp|zenpower|apc\d|(^|[-_])soc($|[-_])"
    r"|^(big|mid|little)\d*$", re.IGNORECASE)
_GPU_TYPE = re.compile(r"gpu|g3d|kgsl|mali", re.IGNORECASE)
# Zones that report currents, voltages or a state of charge through the thermal framework
# (battery current limiters, over-current protection): never a CPU temperature.
_NOT_TEMPERATURE = re.compile(
    r"(^|[-_])(ibat|vbat|socd|vdroop\d*|ocp|soft_ocp|batoilo|smpl|vph|bcl)([-_\d]|$)|-lvl\d+$",
    re.IGNORECASE)


def zone_kind(label: str) -> str:
    if _NOT_TEMPERATURE.search(label):
        return "other"
    if _GPU_TYPE.search(label):
        return "gpu"
    if _CPU_TYPE.search(label):
        return "cpu"
    if "batt" in label.lower():
        return "battery"
    return "other"


def unique_key(prefix: str, label: str, taken: set[str]) -> str:
    """`<prefix><label>_c`, with `-2`, `-3` before `_c` on repeats (taken holds the keys)."""
    return unique_name(f"{prefix}{_slug(label)}", taken, "_c")


def unique_name(base: str, taken: set[str], suffix: str = "") -> str:
    """`base` + suffix, else `base-2` + suffix, `-3`, ...: the first not in `taken`, which
    it joins."""
    name, n = base + suffix, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}{suffix}"
    taken.add(name)
    return name


@fail_soft_zones
def read_thermal_zones(root: Root = "/") -> list[Zone]:
    """Every thermal zone with a plausible reading.

    /sys/class/thermal/thermal_zone3/type   "cpu-0-0-usr\\n"
    /sys/class/thermal/thermal_zone3/temp   "45200\\n"        (milli-°C; may be negative)
    A few old drivers report whole °C ("45"); a value under 200 in magnitude is read so.
    Reading `temp` of a powered-down sensor fails with EIO/EINVAL: that zone is skipped.
    CPU zones feed only `temp.cpu_c`; others get `temp.<type>_c` (`-2`, `-3` on repeats).
    """
    tree = as_tree(root)
    zones: list[Zone] = []
    taken: set[str] = {keys.CPU_TEMP_C}
    for folder in tree.glob(THERMAL_GLOB):
        label = _text(tree.read(f"{folder}/type"))
        raw = _int(tree.read(f"{folder}/temp"))
        if label is None or raw is None:
            continue
        temp = float(raw) if abs(raw) < 200 else raw / 1000.0
        if not PLAUSIBLE_C[0] <= temp <= PLAUSIBLE_C[1]:
            continue
        kind = zone_kind(label)
        key = None if kind == "cpu" else unique_key(keys.ZONE_PREFIX, label, taken)
        zones.append(Zone(f"{folder.rsplit('/', 1)[-1]}:{label}", label, kind, temp, key))
    return zones


def zone_values(zones: Iterable[Zone], ignore: Collection[str] = ()) -> dict[str, Any]:
    """Zones as flat keys, leaving out the ignored ids; CPU zones folded into `temp.cpu_c`.

    `gpu.temp_c` and `battery.temp_c` are the hottest GPU / battery zones, for devices whose
    better source (NVML, power_supply, `dumpsys battery`) is absent: the caller lets those
    sources win.
    """
    out: dict[str, Any] = {}
    hottest: dict[str, float] = {}
    for z in zones:
        if z.id in ignore:
            continue
        if z.key is not None:
            out[z.key] = round(z.temp_c, 3)
        if z.kind in ("cpu", "gpu", "battery"):
            hottest[z.kind] = max(hottest.get(z.kind, z.temp_c), z.temp_c)
    aggregate = {"cpu": keys.CPU_TEMP_C, "gpu": keys.GPU_TEMP_C, "battery": keys.BATTERY_TEMP_C}
    for kind, temp in hottest.items():
        out[aggregate[kind]] = round(temp, 3)
    return out


def collect_thermal_zones(root: Root = "/", ignore: Collection[str] = ()) -> dict[str, Any]:
    """`temp.cpu_c` (hottest CPU zone) and `temp.<type>_c` for the others; see above."""
    return zone_values(read_thermal_zones(root), ignore)


# --- power_supply ------------------------------------------------------------------------

# Below these a reading is in mA / mV, as some vendor kernels report, not the ABI's µA / µV:
# no phone running a cell draws under 10 mA, and no battery is under 0.1 V.
MILLIAMP_BELOW = 10_000
MILLIVOLT_BELOW = 100_000


@fail_soft
def collect_battery(root: Root = "/") -> dict[str, Any]:
    """The battery's temperature, charging status, charge and power flow.

    /sys/class/power_supply/battery/type          "Battery\\n"   (others: Mains, USB, Wireless)
    /sys/class/power_supply/battery/temp          "281\\n"       (deci-°C; laptops often lack it)
    /sys/class/power_supply/battery/status        "Discharging\\n"  (Charging, Full, Not charging)
    /sys/class/power_supply/battery/capacity      "87\\n"        (%)
    /sys/class/power_supply/battery/power_now     "8734000\\n"   (µW; ACPI batteries rated in Wh)
    /sys/class/power_supply/battery/current_now   "-612000\\n"   (µA; phones, ACPI rated in Ah)
    /sys/class/power_supply/battery/voltage_now   "3862000\\n"   (µV)
    With several batteries, the first (in natural order) that reports anything.
    `battery.power_w` is always >= 0 (see `battery_power_w`); its direction is `status`.
    """
    tree = as_tree(root)
    for folder in tree.glob(POWER_SUPPLY_GLOB):
        if _text(tree.read(f"{folder}/type")) != "Battery":
            continue
        out: dict[str, Any] = {}
        temp = _int(tree.read(f"{folder}/temp"))
        if temp is not None:
            out[keys.BATTERY_TEMP_C] = temp / 10.0
        status = _text(tree.read(f"{folder}/status"))
        if status is not None:
            out[keys.BATTERY_STATUS] = status
        capacity = _int(tree.read(f"{folder}/capacity"))
        if capacity is not None:
            out[keys.BATTERY_CAPACITY_PCT] = capacity
        power = battery_power_w(_int(tree.read(f"{folder}/power_now")),
                                _int(tree.read(f"{folder}/current_now")),
                                _int(tree.read(f"{folder}/voltage_now")))
        if power is not None:
            out[keys.BATTERY_POWER_W] = power
        if out:
            return out
    return {}


def battery_power_w(power_now: int | None, current_now: int | None,
                    voltage_now: int | None) -> float | None:
    """The battery's power flow in W, >= 0: `power_now` (µW), else |current| × voltage.

    The sign of `current_now` is not portable: the kernel's power_supply ABI says negative
    while discharging, and many phones follow it; ACPI laptop batteries report positive while
    discharging, and some vendor Android kernels invert the ABI. So only the magnitude
    is kept, and `status` says which way the power flows. Current under `MILLIAMP_BELOW` is
    read as mA and voltage under `MILLIVOLT_BELOW` as mV (vendor kernels that ignore the
    ABI's µA / µV). A zero or absent reading is None: nothing was measured.
    """
    if power_now:
        return round(abs(power_now) / 1e6, 6)
    if not current_now or not voltage_now:
        return None
    current_ua, voltage_uv = abs(current_now), abs(voltage_now)
    if current_ua < MILLIAMP_BELOW:
        current_ua *= 1000
    if voltage_uv < MILLIVOLT_BELOW:
        voltage_uv *= 1000
    return round(current_ua * voltage_uv / 1e12, 6)


# --- powercap (RAPL) ---------------------------------------------------------------------

# A top-level RAPL zone: `intel-rapl:0` (AMD CPUs appear under the same driver's names), or
# another vendor's `<vendor>-rapl:<n>`. Not the sub-zones `intel-rapl:0:0` (core, uncore:
# shares of their package's energy; dram on servers), nor `intel-rapl-mmio:0`, the same
# package domain read through a second interface, nor the control type's `intel-rapl`.
_RAPL_ZONE = re.compile(r"[a-z]+-rapl:\d+")


@fail_soft
def collect_rapl(root: Root = "/") -> dict[str, Any]:
    """Each top-level RAPL domain's raw energy counter and the value where it wraps, in µJ.

    /sys/class/powercap/intel-rapl:0/name                  "package-0\\n"     (package-1, psys)
    /sys/class/powercap/intel-rapl:0/energy_uj             "35874514612\\n"   (cumulative)
    /sys/class/powercap/intel-rapl:0/max_energy_range_uj   "262143328850\\n"  (wraps to 0 here)
    Raw counters only: the analysis differences them across the wrap. `energy_uj` is
    root-only since Linux 5.10 (the PLATYPUS side channel): EACCES leaves the domain out.
    A repeated name gets `-2`, `-3`.
    """
    tree = as_tree(root)
    out: dict[str, Any] = {}
    taken: set[str] = set()
    for folder in tree.glob(POWERCAP_GLOB):
        if not _RAPL_ZONE.fullmatch(folder.rsplit("/", 1)[-1]):
            continue
        name = _text(tree.read(f"{folder}/name"))
        energy = _int(tree.read(f"{folder}/energy_uj"))
        if name is None or energy is None:
            continue
        domain = unique_name(_slug(name), taken)
        out[keys.rapl_energy(domain)] = energy
        wrap = _int(tree.read(f"{folder}/max_energy_range_uj"))
        if wrap is not None:
            out[keys.rapl_max(domain)] = wrap
    return out


# --- /proc -------------------------------------------------------------------------------

_MEMINFO_KEYS = {"MemAvailable": keys.MEM_AVAILABLE_MIB, "MemTotal": keys.MEM_TOTAL_MIB,
                 "MemFree": keys.MEM_FREE_MIB}


@fail_soft
def collect_meminfo(root: Root = "/") -> dict[str, Any]:
    """Available, total and free memory in MiB.

    /proc/meminfo:
        MemTotal:       11723836 kB
        MemFree:         1092976 kB
        MemAvailable:    6151240 kB
        ...
    """
    text = as_tree(root).read("/proc/meminfo")
    if text is None:
        return {}
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith("Mem"):  # the three lines wanted; skip parsing the other ~50
            continue
        name, _, rest = line.partition(":")
        parts = rest.split()
        key = _MEMINFO_KEYS.get(name.strip())
        if key and parts and parts[0].isdigit():
            out[key] = round(int(parts[0]) / 1024, 1)
            if len(out) == len(_MEMINFO_KEYS):  # the kernel prints them first: done
                break
    return out


@fail_soft
def collect_pressure(root: Root = "/") -> dict[str, Any]:
    """Pressure stall information, % of the last 10 s (and 60 s) some / all tasks stalled.

    /proc/pressure/cpu (and memory, io):
        some avg10=1.63 avg60=7.31 avg300=13.49 total=433364192
        full avg10=0.00 avg60=0.00 avg300=0.00 total=0
    Absent without CONFIG_PSI, unreadable on most Android builds.
    """
    tree = as_tree(root)
    out: dict[str, Any] = {}
    for resource in PSI_RESOURCES:
        text = tree.read(f"/proc/pressure/{resource}")
        for line in (text or "").splitlines():
            kind, *pairs = line.split()
            wanted = _PSI_WANTED.get(kind, ())
            for pair in pairs:
                name, _, value = pair.partition("=")
                if name in wanted:
                    with contextlib.suppress(ValueError):
                        out[_PSI_KEYS[resource, kind, name]] = float(value)
    return out


# the windows kept per line kind; their keys, spelled once (the sampler reads PSI every tick)
_PSI_WANTED = {"some": ("avg10", "avg60"), "full": ("avg10",)}
_PSI_KEYS = {(resource, kind, name): keys.psi_key(resource, kind, name)
             for resource in PSI_RESOURCES for kind, names in _PSI_WANTED.items()
             for name in names}


@fail_soft
def collect_loadavg(root: Root = "/") -> dict[str, Any]:
    """Load averages over 1, 5 and 15 minutes.

    /proc/loadavg:   "1.10 2.34 2.37 1/85 29998\\n"   (then running/total tasks, last pid)
    """
    text = as_tree(root).read("/proc/loadavg")
    if text is None:
        return {}
    fields = text.split()
    out: dict[str, Any] = {}
    for key, field in zip(keys.LOAD_KEYS, fields[:3]):
        with contextlib.suppress(ValueError):
            out[key] = float(field)
    return out
