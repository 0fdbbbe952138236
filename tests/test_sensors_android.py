"""`dumpsys battery` and `dumpsys thermalservice`: the real qwen.state excerpt, full output."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from abbench.sensors import android
from abbench.sensors.tree import SnapshotTree

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"
ANDROID = FIXTURES / "android"


def text(name: str) -> str:
    return (ANDROID / name).read_text()


def test_real_qwen_state_excerpt() -> None:
    status, zones = android.parse_thermalservice(text("thermalservice-qwen-before.txt"))
    assert status == 1
    assert [(z.label, z.kind, z.temp_c, z.key) for z in zones] == [
        ("CPU0", "cpu", 99.6, "android.temp.cpu0_c"),
        ("CPU1", "cpu", 97.3, "android.temp.cpu1_c"),
        ("CPU2", "cpu", 99.6, "android.temp.cpu2_c"),
        ("CPU3", "cpu", 99.6, "android.temp.cpu3_c"),
    ]
    tree = SnapshotTree({"/dumpsys/thermalservice": text("thermalservice-qwen-after.txt")})
    assert android.collect_android_thermal(tree) == {
        "android.thermal_status": 2, "android.thermal_status_name": "moderate",
        "android.temp.cpu0_c": 99.6, "android.temp.cpu1_c": 97.3,
        "android.temp.cpu2_c": 99.6, "android.temp.cpu3_c": 99.6, "temp.cpu_c": 99.6,
    }


def test_full_output_prefers_current_hal_temperatures() -> None:
    status, zones = android.parse_thermalservice(text("thermalservice-full.txt"))
    assert status == 3
    by_name = {z.label: z for z in zones}
    # current section wins over cached (battery 31.4 not 30.1); BCL types (vbat, ibat,
    # socd) are not temperatures; NaN is unread; thresholds and cooling devices are skipped
    assert list(by_name) == ["battery", "cpu-0-0-0", "cpu-1-0-0", "gpuss-0",
                             "skin-msm-therm", "modem-0"]
    assert by_name["battery"].temp_c == 31.4
    v = android.collect_android_thermal(
        SnapshotTree({"/dumpsys/thermalservice": text("thermalservice-full.txt")}))
    assert v["android.thermal_status_name"] == "severe"
    assert v["temp.cpu_c"] == 74.5 and v["gpu.temp_c"] == 61.0 and v["battery.temp_c"] == 31.4
    assert v["android.temp.skin-msm-therm_c"] == 41.7
    ignored = android.collect_android_thermal(
        SnapshotTree({"/dumpsys/thermalservice": text("thermalservice-full.txt")}),
        ignore={"hal:cpu-1-0-0"})
    assert ignored["temp.cpu_c"] == 68.25 and "android.temp.cpu-1-0-0_c" not in ignored


def test_dumpsys_battery() -> None:
    assert android.parse_dumpsys_battery(text("battery.txt")) == {
        "battery.temp_c": 38.1, "battery.status": "Charging", "battery.capacity_pct": 80,
        "battery.plugged": True,
    }
    overridden = android.parse_dumpsys_battery(text("battery-overridden.txt"))
    assert overridden == {
        "battery.temp_c": 35.5, "battery.status": "Discharging", "battery.capacity_pct": 50,
        "battery.plugged": False, "android.battery_overridden": True,
    }


def test_absent_or_empty_dumpsys() -> None:
    assert android.collect_android_battery(SnapshotTree({})) == {}
    assert android.collect_android_thermal(SnapshotTree({})) == {}
    assert android.parse_thermalservice("") == (None, [])
    assert android.parse_dumpsys_battery("Can't find service: battery\n") == {}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.text(max_size=400))
def test_fuzzed_dumpsys_never_raises(battery: str, thermal: str) -> None:
    tree = SnapshotTree({"/dumpsys/battery": battery,
                         "/dumpsys/thermalservice": "Thermal Status: 1\n\tTemperature{" + thermal})
    assert isinstance(android.collect_android_battery(tree), dict)
    assert isinstance(android.collect_android_thermal(tree), dict)
    assert isinstance(android.collect_android_thermal(
        SnapshotTree({"/dumpsys/thermalservice": thermal})), dict)
