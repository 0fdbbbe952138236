"""Android's own view of the device: `dumpsys battery` and `dumpsys thermalservice`.

Over adb these run in the same batched shell call as the sysfs reads; their output is
captured under the pseudo-paths in `DUMPSYS` (a fixture tree holds them as files there),
so the readers below take a root like every other reader.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Collection
from typing import Any

from abbench.records import keys
from abbench.sensors.readers import Root, Zone, fail_soft, unique_key, zone_values
from abbench.sensors.tree import as_tree

# pseudo-path in a device snapshot -> the fixed command whose output it holds
DUMPSYS = {
    "/dumpsys/battery": "dumpsys battery",
    "/dumpsys/thermalservice": "dumpsys thermalservice",
}

# BatteryManager.BATTERY_STATUS_*, named as sysfs names them
BATTERY_STATUS = {1: "Unknown", 2: "Charging", 3: "Discharging", 4: "Not charging", 5: "Full"}
# PowerManager.THERMAL_STATUS_*
THERMAL_STATUS = {0: "none", 1: "light", 2: "moderate", 3: "severe", 4: "critical",
                  5: "emergency", 6: "shutdown"}
# android.os.Temperature.TYPE_*: CPU, GPU and battery feed the aggregates; the BCL types are
# voltages, currents and percentages, not temperatures.
HAL_KIND = {0: "cpu", 1: "gpu", 2: "battery"}
HAL_NOT_TEMPERATURE = {6, 7, 8}

_TEMPERATURE = re.compile(r"Temperature\{([^}]*)\}")


@fail_soft
def parse_dumpsys_battery(text: str) -> dict[str, Any]:
    """`dumpsys battery`:

        Current Battery Service state:
          (UPDATES STOPPED -- use 'reset' to restart)     <- only after `dumpsys battery set`
          AC powered: false
          USB powered: true
          status: 2
          level: 87
          scale: 100
          temperature: 281                                <- deci-°C
          ...
    Values set with `dumpsys battery set/unplug` are not measurements; such a snapshot is
    flagged `android.battery_overridden`.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep:
            fields.setdefault(name.strip().lower(), value.strip())
    out: dict[str, Any] = {}
    with contextlib.suppress(KeyError, ValueError):
        out[keys.BATTERY_TEMP_C] = int(fields["temperature"]) / 10.0
    try:
        status = int(fields["status"])
        out[keys.BATTERY_STATUS] = BATTERY_STATUS.get(status, f"status {status}")
    except (KeyError, ValueError):
        pass
    try:
        level, scale = int(fields["level"]), int(fields.get("scale", "100"))
        out[keys.BATTERY_CAPACITY_PCT] = round(100 * level / scale) if scale > 0 else level
    except (KeyError, ValueError):
        pass
    plugged = [fields.get(f"{source} powered") for source in ("ac", "usb", "wireless", "dock")]
    if any(p is not None for p in plugged):
        out[keys.BATTERY_PLUGGED] = "true" in plugged
    if out and "UPDATES STOPPED" in text:
        out[keys.ANDROID_BATTERY_OVERRIDDEN] = True
    return out


def _hal_section(text: str) -> list[str]:
    """The Temperature lines of the freshest section present.

    `dumpsys thermalservice` lists temperatures under "Current temperatures from HAL:" (read
    now) and "Cached temperatures:" (last callbacks); an excerpt may have neither header.
    """
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            current = line.strip()
        if _TEMPERATURE.search(line):
            sections.setdefault(current, []).append(line)
    for header in ("Current temperatures from HAL:", "Cached temperatures:"):
        if header in sections:
            return sections[header]
    return [line for lines in sections.values() for line in lines]


def parse_thermalservice(text: str) -> tuple[int | None, list[Zone]]:
    """`dumpsys thermalservice` (see tests/fixtures/sensors/android/ for real output):

        Thermal Status: 1
        Current temperatures from HAL:
            Temperature{mValue=46.2, mType=0, mName=cpu-0-0-usr, mStatus=0}
            Temperature{mValue=28.5, mType=2, mName=battery, mStatus=0}
    mValue in °C (NaN when unread), mType an android.os.Temperature.TYPE_*, mStatus the
    sensor's own throttling severity. Returns the thermal status and one zone per sensor,
    keyed `android.temp.<name>_c`.
    """
    status = None
    match = re.search(r"^\s*Thermal Status:\s*(-?\d+)", text, re.MULTILINE)
    if match:
        status = int(match.group(1))
    zones: list[Zone] = []
    names: set[str] = set()
    taken: set[str] = set()
    for line in _hal_section(text):
        match = _TEMPERATURE.search(line)
        assert match is not None
        fields = dict(part.strip().partition("=")[::2] for part in match.group(1).split(","))
        name = fields.get("mName", "").strip()
        try:
            value, kind = float(fields["mValue"]), int(fields.get("mType", "-1"))
        except (KeyError, ValueError):
            continue
        if not name or name in names or math.isnan(value) or kind in HAL_NOT_TEMPERATURE:
            continue
        names.add(name)
        key = unique_key(keys.ANDROID_ZONE_PREFIX, name, taken)
        zones.append(Zone(f"hal:{name}", name, HAL_KIND.get(kind, "other"), value, key))
    return status, zones


def read_android_thermal(root: Root = "/") -> tuple[int | None, list[Zone]]:
    """Thermal status and HAL zones from a snapshot's `/dumpsys/thermalservice`; fail-soft."""
    try:
        text = as_tree(root).read("/dumpsys/thermalservice")
        return parse_thermalservice(text) if text else (None, [])
    except Exception:
        return None, []


def status_values(status: int | None) -> dict[str, Any]:
    if status is None:
        return {}
    return {keys.ANDROID_THERMAL_STATUS: status,
            keys.ANDROID_THERMAL_STATUS_NAME: THERMAL_STATUS.get(status, str(status))}


def collect_android_thermal(root: Root = "/", ignore: Collection[str] = ()) -> dict[str, Any]:
    """`android.thermal_status` (0 none .. 6 shutdown), its name, `android.temp.<name>_c`
    per HAL sensor, and the HAL's CPU / GPU / battery sensors folded into `temp.cpu_c`,
    `gpu.temp_c`, `battery.temp_c`."""
    status, zones = read_android_thermal(root)
    return {**status_values(status), **zone_values(zones, ignore)}


@fail_soft
def collect_android_battery(root: Root = "/") -> dict[str, Any]:
    """`dumpsys battery` from a snapshot's `/dumpsys/battery`; see `parse_dumpsys_battery`."""
    text = as_tree(root).read("/dumpsys/battery")
    return parse_dumpsys_battery(text) if text else {}
