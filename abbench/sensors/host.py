"""Readers of this machine through its own APIs: psutil fallbacks and NVML.

They describe the machine running abbench, so the device uses them only for the local
transport on `/`, and only where sysfs and /proc say nothing (see `device.py`). Fail-soft
like every reader: an absent API or a failing call leaves its keys out.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import weakref
from collections.abc import Callable
from typing import Any

from abbench.records import keys
from abbench.sensors.readers import (
    PLAUSIBLE_C,
    Zone,
    fail_soft,
    fail_soft_zones,
    unique_key,
    zone_kind,
)

# psutil's chip names for CPU package/core sensors (Linux hwmon names, macOS/BSD labels).
_PSUTIL_CPU_CHIPS = re.compile(r"coretemp|k10temp|zenpower|cpu|soc|package", re.IGNORECASE)


@fail_soft_zones
def read_psutil_temperatures() -> list[Zone]:
    """psutil.sensors_temperatures(): {chip: [shwtemp(label, current °C, high, critical)]}.

    Used where sysfs thermal zones are absent (hwmon-only Linux, BSD); `temp.<chip>_c`
    (or `temp.<chip>-<label>_c`) per sensor, CPU chips folded into `temp.cpu_c`.
    """
    import psutil

    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return []
    zones: list[Zone] = []
    taken: set[str] = {keys.CPU_TEMP_C}
    for chip, entries in sorted(read().items()):
        for i, entry in enumerate(entries):
            temp = float(entry.current)
            if not PLAUSIBLE_C[0] <= temp <= PLAUSIBLE_C[1]:
                continue
            label = f"{chip}-{entry.label}" if entry.label else chip
            kind = "cpu" if _PSUTIL_CPU_CHIPS.search(label) else zone_kind(label)
            key = None if kind == "cpu" else unique_key(keys.ZONE_PREFIX, label, taken)
            zones.append(Zone(f"psutil:{chip}:{i}", label, kind, temp, key))
    return zones


@fail_soft
def collect_psutil_cpufreq() -> dict[str, Any]:
    """psutil.cpu_freq(): scpufreq(current, min, max) in MHz, the whole machine.

    Used where sysfs cpufreq is absent. On Linux without cpufreq it is /proc/cpuinfo's
    `cpu MHz` (max 0: unknown); nowhere does it give a cap, so `cpu.all` never reads capped.
    """
    import psutil

    freq = psutil.cpu_freq()
    if freq is None:
        return {}
    out: dict[str, Any] = {}
    if freq.current:
        out[keys.CPU_ALL_CUR_KHZ] = round(freq.current * 1000)
    if freq.max:
        out[keys.CPU_ALL_HW_MAX_KHZ] = round(freq.max * 1000)
    return out


@fail_soft
def collect_psutil_memory() -> dict[str, Any]:
    """psutil.virtual_memory() where /proc/meminfo is absent (macOS, BSD)."""
    import psutil

    vm = psutil.virtual_memory()
    return {keys.MEM_AVAILABLE_MIB: round(vm.available / 2**20, 1),
            keys.MEM_TOTAL_MIB: round(vm.total / 2**20, 1)}


@fail_soft
def collect_psutil_battery() -> dict[str, Any]:
    """psutil.sensors_battery(): sbattery(percent, secsleft, power_plugged); no temperature."""
    import psutil

    read = getattr(psutil, "sensors_battery", None)
    battery = read() if read is not None else None
    if battery is None:
        return {}
    out: dict[str, Any] = {keys.BATTERY_CAPACITY_PCT: round(battery.percent)}
    if battery.power_plugged is not None:
        out[keys.BATTERY_PLUGGED] = bool(battery.power_plugged)
    return out


@fail_soft
def collect_os_loadavg() -> dict[str, Any]:
    """os.getloadavg() where /proc/loadavg is absent (macOS, BSD)."""
    one, five, fifteen = os.getloadavg()
    return dict(zip(keys.LOAD_KEYS, (one, five, fifteen), strict=True))


# NVML (optional: only when pynvml is importable)

# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits, in the order NVML defines them.
THROTTLE_REASONS = (
    (0x1, "idle"), (0x2, "app_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"), (0x100, "display_clocks"),
)
# keyed by the module itself, weakly: an id() key outlives its object, and a new object at
# the same address would inherit another's init result
_nvml_initialised: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def throttle_names(mask: int) -> str:
    """`sw_thermal,hw_slowdown` for a reasons mask; `none` when no bit is set."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    unknown = mask & ~sum(bit for bit, _ in THROTTLE_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return ",".join(names) or "none"


@functools.cache
def import_pynvml() -> Any:
    """The pynvml module, or None; tried once per process (a failed import is not cheap)."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except Exception:
        return None
    return pynvml


@fail_soft
def collect_nvml(module: Any = None) -> dict[str, Any]:
    """GPU temperature, SM clock and throttle reasons from NVML, if `pynvml` is importable.

    GPU 0 reads as `gpu.temp_c`, `gpu.sm_clock_mhz`, `gpu.sm_max_clock_mhz`, `gpu.power_w`,
    `gpu.throttle_reasons` (names, see `throttle_names`) and `gpu.throttle_mask`; GPU i > 0
    as `gpu.<i>.temp_c` and so on. nvmlInit runs once per process; a failed init (no
    driver) is remembered, so a machine without a GPU pays for it once.
    """
    nvml = module if module is not None else import_pynvml()
    if nvml is None:
        return {}
    if nvml not in _nvml_initialised:
        try:
            nvml.nvmlInit()
            _nvml_initialised[nvml] = True
        except Exception:
            _nvml_initialised[nvml] = False
    if not _nvml_initialised[nvml]:
        return {}
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    out: dict[str, Any] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        prefix = keys.gpu_prefix(i)
        reads: list[tuple[str, Callable[[], Any]]] = [
            ("temp_c", lambda h=handle: float(
                nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))),
            ("sm_clock_mhz", lambda h=handle: int(
                nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))),
            ("sm_max_clock_mhz", lambda h=handle: int(
                nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))),
            ("power_w", lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("throttle_mask", lambda h=handle: int(reasons(h))),
        ]
        for name, read in reads:
            # one unsupported query (power on some boards) leaves only its key out
            with contextlib.suppress(Exception):
                out[prefix + name] = read()
        if prefix + "throttle_mask" in out:
            out[prefix + "throttle_reasons"] = throttle_names(out[prefix + "throttle_mask"])
    return out
