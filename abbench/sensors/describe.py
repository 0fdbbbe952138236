"""The rows `Device.describe` shows (`abbench sensors`): one line per source, from one
sample's values and how each source was read."""

from __future__ import annotations

from typing import Any

import abbench.sensors.host as host
from abbench.records import keys
from abbench.sensors.readers import CPUFREQ_GLOB
from abbench.sensors.tree import natural_key


def describe_cpufreq(v: dict[str, Any], how: str | None) -> str:
    policies = sorted(keys.policies(v, "cap_khz"), key=natural_key)
    if not policies:
        note = " (psutil: current frequency only, no cap)" if keys.CPU_ALL_CUR_KHZ in v else ""
        return f"missing: no {CPUFREQ_GLOB}{note}"
    parts = []
    for p in policies:
        cap, hw = v.get(keys.cap_khz(p)), v.get(keys.hw_max_khz(p))
        parts.append(f"{p} cap {cap} of {hw} kHz" + (" CAPPED" if v.get(keys.capped(p))
                                                      else ""))
    return f"{len(policies)} policies via {how}: " + "; ".join(parts)


def describe_battery(v: dict[str, Any], how: str | None) -> str:
    if how is None:
        return "missing: no power_supply of type Battery"
    parts = [f"{v[keys.BATTERY_TEMP_C]:.1f} °C" if keys.BATTERY_TEMP_C in v else "no temperature",
             str(v.get(keys.BATTERY_STATUS, "status unknown"))]
    if keys.BATTERY_CAPACITY_PCT in v:
        parts.append(f"{v[keys.BATTERY_CAPACITY_PCT]}%")
    if v.get(keys.ANDROID_BATTERY_OVERRIDDEN):
        parts.append("OVERRIDDEN by `dumpsys battery set` (run `dumpsys battery reset`)")
    return f"{', '.join(parts)} ({how})"


def describe_power(v: dict[str, Any], rapl_how: str | None) -> str:
    parts = []
    if keys.BATTERY_POWER_W in v:
        status = v.get(keys.BATTERY_STATUS, "status unknown")
        # only a battery that alone feeds the device measures what the device draws
        unusable = status != "Discharging" or v.get(keys.BATTERY_PLUGGED)
        note = ": not usable for energy" if unusable else ""
        parts.append(f"battery {v[keys.BATTERY_POWER_W]:.2f} W, {status}{note} (power_supply)")
    domains = keys.rapl_domains(v)
    if domains:
        parts.append(f"RAPL {', '.join(domains)} energy counters ({rapl_how})")
    if not parts:
        return ("missing: no power_supply power_now or current_now × voltage_now, no readable "
                "powercap RAPL energy_uj (root-only since Linux 5.10)")
    return "; ".join(parts)


def describe_cpu_time(v: dict[str, Any], how: str | None) -> str:
    if how is None:
        return "missing: no readable /proc/stat (no foreign load, no run queue)"
    runnable = v.get(keys.RUNNABLE_TASKS)
    foreign = v.get(keys.FOREIGN_CORES)
    return (f"{'?' if runnable is None else runnable} tasks runnable; foreign load "
            + ("from the second reading on" if foreign is None
               else f"{foreign:.2f} cores since the previous reading") + f" ({how})")


def describe_nvml(v: dict[str, Any], on_host: bool) -> str:
    if not on_host:
        return "not read (NVML describes this machine, not the device)"
    if keys.GPU_TEMP_C in v or keys.GPU_SM_CLOCK_MHZ in v:
        gpus = 1 + len({k.split(".")[1] for k in v if k.split(".")[1].isdigit()})
        return (f"{gpus} GPU(s); GPU 0 {v.get(keys.GPU_TEMP_C, '?')} °C, SM "
                f"{v.get(keys.GPU_SM_CLOCK_MHZ, '?')} MHz, throttle "
                f"{v.get(keys.GPU_THROTTLE_REASONS, '?')}")
    if host.import_pynvml() is None:
        return "pynvml not importable (optional: pip install nvidia-ml-py)"
    return "pynvml importable, but no GPU answered"
