"""Every sample key: the flat names a sampler tick's readings go by in samples.jsonl.

A reader produces them (`sensors`), the campaign reads the entry state and the gate from
them, the importers write them from archived logs, the analysis and the report read them.
This table is the only place they are spelled; everything else uses these names and
functions. Per-policy and per-zone keys are families: `cpu.<policy>.cap_khz`,
`temp.<zone>_c`, `android.temp.<sensor>_c`, `gpu.<i>.<name>` for GPUs after the first.

Like pyperf's metadata table, each key says its type, unit, label and producer; a key a
newer reader adds and this table lacks is still recorded and shown, with its raw name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SampleKey:
    pattern: str   # the key, `<...>` for the family's variable part
    type: str      # "float" | "int" | "bool" | "str"
    unit: str      # "°C", "kHz", "MiB", "%", "MHz", "W", "" (none)
    label: str     # what a report calls it
    source: str    # the reader that produces it (sensors module, or "import")


# -- the keys --------------------------------------------------------------------------------

CPU_TEMP_C = "temp.cpu_c"
BATTERY_TEMP_C = "battery.temp_c"
BATTERY_STATUS = "battery.status"
BATTERY_CAPACITY_PCT = "battery.capacity_pct"
BATTERY_PLUGGED = "battery.plugged"
BATTERY_POWER_W = "battery.power_w"  # the battery's power flow, W, >= 0 (direction: status)
MEM_AVAILABLE_MIB = "mem.available_mib"
MEM_TOTAL_MIB = "mem.total_mib"
MEM_FREE_MIB = "mem.free_mib"
ANDROID_THERMAL_STATUS = "android.thermal_status"
ANDROID_THERMAL_STATUS_NAME = "android.thermal_status_name"
ANDROID_BATTERY_OVERRIDDEN = "android.battery_overridden"
CPU_ALL_CUR_KHZ = "cpu.all.cur_khz"          # psutil: one frequency for the whole CPU
CPU_ALL_HW_MAX_KHZ = "cpu.all.hw_max_khz"
LOAD_KEYS = ("load.1m", "load.5m", "load.15m")  # /proc/loadavg, else os.getloadavg()
# /proc/stat less the cell's and the campaign's own /proc/PID/stat: busy cores that other
# processes took, averaged since the previous reading (a span's mean is its ticks' mean)
FOREIGN_CORES = "load.foreign_cores"
RUNNABLE_TASKS = "load.runnable_tasks"           # /proc/stat procs_running, at the reading
PSI_PREFIX = "psi."                            # psi.<resource>.<some|full>_<avg10|avg60>
GPU_TEMP_C = "gpu.temp_c"
GPU_SM_CLOCK_MHZ = "gpu.sm_clock_mhz"
GPU_THROTTLE_REASONS = "gpu.throttle_reasons"

ZONE_PREFIX = "temp."                  # temp.<thermal zone type>_c
RAPL_PREFIX = "rapl."                  # rapl.<domain>.energy_uj / .max_uj (powercap)
ANDROID_ZONE_PREFIX = "android.temp."  # android.temp.<HAL sensor>_c
CPU_PREFIX = "cpu."
POLICY_FIELDS = ("cap_khz", "hw_max_khz", "cur_khz", "capped")

TABLE: tuple[SampleKey, ...] = (
    SampleKey(CPU_TEMP_C, "float", "°C", "CPU temperature (hottest CPU zone)", "sensors.readers"),
    SampleKey(ZONE_PREFIX + "<zone>_c", "float", "°C", "thermal zone", "sensors.readers"),
    SampleKey(BATTERY_TEMP_C, "float", "°C", "battery temperature", "sensors.readers"),
    SampleKey(BATTERY_STATUS, "str", "", "battery status", "sensors.readers"),
    SampleKey(BATTERY_CAPACITY_PCT, "int", "%", "battery charge", "sensors.readers"),
    SampleKey(BATTERY_PLUGGED, "bool", "", "plugged in", "sensors.android"),
    SampleKey(BATTERY_POWER_W, "float", "W", "battery power", "sensors.readers"),
    SampleKey(RAPL_PREFIX + "<domain>.energy_uj", "int", "µJ", "RAPL energy counter",
              "sensors.readers"),
    SampleKey(RAPL_PREFIX + "<domain>.max_uj", "int", "µJ", "RAPL counter range",
              "sensors.readers"),
    SampleKey(MEM_AVAILABLE_MIB, "float", "MiB", "MemAvailable", "sensors.readers"),
    SampleKey(MEM_TOTAL_MIB, "float", "MiB", "MemTotal", "sensors.readers"),
    SampleKey(MEM_FREE_MIB, "float", "MiB", "MemFree", "sensors.readers"),
    SampleKey(CPU_PREFIX + "<policy>.cap_khz", "int", "kHz", "frequency cap",
              "sensors.readers"),
    SampleKey(CPU_PREFIX + "<policy>.hw_max_khz", "int", "kHz", "hardware maximum",
              "sensors.readers"),
    SampleKey(CPU_PREFIX + "<policy>.cur_khz", "int", "kHz", "current frequency",
              "sensors.readers"),
    SampleKey(CPU_PREFIX + "<policy>.capped", "bool", "", "capped", "sensors.readers"),
    SampleKey(CPU_ALL_CUR_KHZ, "int", "kHz", "current frequency (psutil)", "sensors.host"),
    SampleKey(CPU_ALL_HW_MAX_KHZ, "int", "kHz", "hardware maximum (psutil)", "sensors.host"),
    SampleKey(ANDROID_THERMAL_STATUS, "int", "", "Android thermal status", "sensors.android"),
    SampleKey(ANDROID_THERMAL_STATUS_NAME, "str", "", "Android thermal status",
              "sensors.android"),
    SampleKey(ANDROID_ZONE_PREFIX + "<sensor>_c", "float", "°C", "thermal HAL sensor",
              "sensors.android"),
    SampleKey(ANDROID_BATTERY_OVERRIDDEN, "bool", "", "dumpsys battery overridden",
              "sensors.android"),
    *(SampleKey(k, "float", "", f"load average ({k[5:]})", "sensors.readers")
      for k in LOAD_KEYS),
    SampleKey(FOREIGN_CORES, "float", "cores", "foreign CPU load (other processes)",
              "sensors.cputime"),
    SampleKey(RUNNABLE_TASKS, "int", "tasks", "runnable tasks (run queue)", "sensors.cputime"),
    SampleKey(PSI_PREFIX + "<resource>.<kind>_<window>", "float", "%", "pressure stall",
              "sensors.readers"),
    SampleKey(GPU_TEMP_C, "float", "°C", "GPU temperature", "sensors.host (NVML)"),
    SampleKey(GPU_SM_CLOCK_MHZ, "int", "MHz", "GPU SM clock", "sensors.host (NVML)"),
    SampleKey("gpu.sm_max_clock_mhz", "int", "MHz", "GPU SM maximum clock", "sensors.host (NVML)"),
    SampleKey("gpu.power_w", "float", "W", "GPU power", "sensors.host (NVML)"),
    SampleKey("gpu.throttle_mask", "int", "", "GPU throttle reasons (mask)", "sensors.host (NVML)"),
    SampleKey(GPU_THROTTLE_REASONS, "str", "", "GPU throttle reasons", "sensors.host (NVML)"),
    SampleKey("gpu.<i>.<name>", "", "", "a later GPU's reading (as gpu.<name>)",
              "sensors.host (NVML)"),
)

# Readings an entry state takes from a tick, with the EntryState field each fills; matching
# compares them (with the caps).
ENTRY_READINGS = ((CPU_TEMP_C, "cpu_temp_c"), (BATTERY_TEMP_C, "battery_temp_c"),
                  (MEM_AVAILABLE_MIB, "mem_available_mib"))
ENTRY_KEYS = tuple(key for key, _ in ENTRY_READINGS)

# Where a reading stands in its cell (`journal.Sample.position`, written by imports): the
# entry state `before` it, a reading `during` it (inside its span), a snapshot taken
# `after` it, the driver's `exit` line. A sampler tick has none: its `cell` says where it fell.
BEFORE, DURING, AFTER, EXIT = "before", "during", "after", "exit"
POSITIONS = (BEFORE, DURING, AFTER, EXIT)


# -- families --------------------------------------------------------------------------------

def policy_key(policy: str, field: str) -> str:
    """`cpu.<policy>.<field>`, field one of POLICY_FIELDS."""
    return f"{CPU_PREFIX}{policy}.{field}"


def cap_khz(policy: str) -> str:
    return policy_key(policy, "cap_khz")


def hw_max_khz(policy: str) -> str:
    return policy_key(policy, "hw_max_khz")


def capped(policy: str) -> str:
    return policy_key(policy, "capped")


_POLICY = re.compile(rf"{re.escape(CPU_PREFIX)}(.+)\.({'|'.join(POLICY_FIELDS)})\Z")


def policy_of(key: str, field: str) -> str | None:
    """The policy of a `cpu.<policy>.<field>` key, None for another key (psutil's whole-CPU
    reading is the policy `all`)."""
    m = _POLICY.match(key)
    return m[1] if m and m[2] == field else None


def policies(values: dict[str, Any], field: str) -> dict[str, Any]:
    """{policy: value} of one per-policy field in a tick's values."""
    return {p: v for k, v in values.items() if (p := policy_of(k, field)) is not None}


def is_zone_temp(key: str) -> bool:
    """A thermal-zone temperature (`temp.<zone>_c`, `temp.cpu_c` included)."""
    return key.startswith(ZONE_PREFIX) and key.endswith("_c")


def psi_key(resource: str, kind: str, window: str) -> str:
    return f"{PSI_PREFIX}{resource}.{kind}_{window}"


def android_zone(sensor: str) -> str:
    return f"{ANDROID_ZONE_PREFIX}{sensor}_c"


def rapl_energy(domain: str) -> str:
    """`rapl.<domain>.energy_uj`: a powercap RAPL domain's cumulative energy counter."""
    return f"{RAPL_PREFIX}{domain}.energy_uj"


def rapl_max(domain: str) -> str:
    """`rapl.<domain>.max_uj`: the value at which that counter wraps to 0."""
    return f"{RAPL_PREFIX}{domain}.max_uj"


_RAPL = re.compile(rf"{re.escape(RAPL_PREFIX)}(.+)\.energy_uj\Z")


def rapl_domains(values: dict[str, Any]) -> list[str]:
    """The RAPL domains a tick's values carry a counter for, in key order."""
    return [m[1] for k in values if (m := _RAPL.match(k))]


def gpu_prefix(index: int) -> str:
    """The first GPU's keys are `gpu.<name>`, later ones `gpu.<i>.<name>`."""
    return "gpu." if index == 0 else f"gpu.{index}."


def _regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"<[^>]*>", pattern)
    return re.compile(".+".join(re.escape(part) for part in parts) + r"\Z")


# Exact keys before families: `cpu.all.hw_max_khz` is psutil's, not a policy's.
_PATTERNS = tuple((_regex(e.pattern), e) for e in sorted(TABLE, key=lambda e: "<" in e.pattern))


def describe(key: str) -> SampleKey | None:
    """The table's entry for a key, families included; None for a key it does not know."""
    return next((entry for rx, entry in _PATTERNS if rx.match(key)), None)
