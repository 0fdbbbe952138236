"""Device: merged readings, the constant-zone rule, vanishing sensors, describe()."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from abbench.records import keys
from abbench.sensors import Device, ZoneFreeze, open_device, thermal_gaps
from abbench.sensors.device import ABSENT_RECHECK_S
from abbench.sensors.readers import Zone
from abbench.sensors.transports import LocalTransport
from abbench.sensors.tree import SnapshotTree, Tree

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"
PHONE = FIXTURES / "android-qwen"
LAPTOP = FIXTURES / "linux-laptop"
LAPTOP_POWER = FIXTURES / "laptop-power"

# the flat keys the campaign relies on (docs/sensors.md#keys)
PHONE_KEYS = {
    "cpu.policy0.cap_khz", "cpu.policy0.hw_max_khz", "cpu.policy0.cur_khz",
    "cpu.policy6.cap_khz", "cpu.policy6.hw_max_khz", "cpu.policy6.cur_khz",
    "temp.cpu_c", "battery.temp_c", "battery.status", "battery.capacity_pct",
    "mem.available_mib", "load.1m", "android.thermal_status", "gpu.temp_c",
}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_local_device_on_a_fixture_tree() -> None:
    device = open_device("local", root=PHONE)
    assert device.name == socket.gethostname()
    assert (device.transport, device.kind, device.simulated) == ("local", "local", False)
    v = device.sample()
    assert set(v) >= PHONE_KEYS
    assert not any(k.startswith("psi.") for k in v)   # the phone tree has no PSI
    assert "cpu.all.cur_khz" not in v                 # psutil is only for this machine's /
    assert v["battery.temp_c"] == 38.1                # power_supply, over the HAL and zones
    assert v["battery.capacity_pct"] == 80


def test_laptop_keys() -> None:
    v = open_device("local", root=str(LAPTOP)).sample()
    assert v["temp.cpu_c"] == 52.0 and v["cpu.policy2.capped"] is True
    assert v["psi.cpu.some_avg10"] == 1.63 and v["psi.io.some_avg10"] == 14.83
    assert "battery.temp_c" not in v and v["battery.status"] == "Discharging"
    assert thermal_gaps(v) == []


def test_this_machine_falls_back_to_psutil() -> None:
    v = open_device("local").sample()
    assert "mem.available_mib" in v and "load.1m" in v
    if not Path("/sys/devices/system/cpu/cpufreq/policy0").exists():
        assert not any(k.endswith(".cap_khz") for k in v)


def test_thermal_gaps() -> None:
    assert thermal_gaps({}) == ["cpufreq caps", "CPU temperature"]
    assert thermal_gaps({"cpu.all.cur_khz": 1}) == ["cpufreq caps", "CPU temperature"]
    assert thermal_gaps({"cpu.policy0.cap_khz": 1, "temp.cpu_c": 40.0}) == []


# --- the constant-zone rule ------------------------------------------------------------------

def z(zid: str, temp: float, kind: str = "cpu") -> Zone:
    return Zone(zid, zid, kind, temp, None)


def test_freeze_ignores_a_zone_constant_while_others_move() -> None:
    freeze = ZoneFreeze(after_s=10, min_samples=3)
    for i in range(6):
        freeze.observe(i * 2.0, [z("stuck", 99.6), z("live", 40 + i * 0.1)])
        assert ("stuck" in freeze.frozen) == (i >= 5)   # 10 s and 3 samples reached at t=10
    assert "live" not in freeze.frozen
    freeze.observe(12.0, [z("stuck", 99.7), z("live", 41.0)])
    assert freeze.frozen == set()                      # it moved: it is a sensor after all


def test_freeze_keeps_everything_when_nothing_moves() -> None:
    freeze = ZoneFreeze(after_s=1, min_samples=2)
    for i in range(10):
        freeze.observe(float(i), [z("a", 50.0), z("b", 45.0)])
    assert freeze.frozen == set()


def _write_zone(root: Path, n: int, label: str, milli_c: int) -> None:
    folder = root / f"sys/class/thermal/thermal_zone{n}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "type").write_text(label + "\n")
    (folder / "temp").write_text(f"{milli_c}\n")


def test_device_drops_the_stuck_hal_cpu_values_of_qwen_state(tmp_path: Path) -> None:
    """The phone's HAL reported CPU0-3 at 99.6/97.3 °C for the whole run (qwen.state, before
    and after); its sysfs CPU zones moved. After the window, temp.cpu_c follows sysfs."""
    root = tmp_path / "phone"
    shutil.copytree(PHONE, root)
    clock = Clock()
    device = Device(LocalTransport(root), "phone", freeze=ZoneFreeze(after_s=30, min_samples=5),
                    clock=clock)
    seen = []
    for i in range(8):
        clock.t = i * 10.0
        _write_zone(root, 3, "cpu-1-0-0", 48200 + 100 * i)
        seen.append(device.sample()["temp.cpu_c"])
    assert seen[:4] == [99.6] * 4
    assert seen[4:] == [48.6, 48.7, 48.8, 48.9]
    assert "CPU0" in dict(device.describe())["thermal zones"]


def test_a_sensor_that_vanishes_is_a_gap(tmp_path: Path) -> None:
    root = tmp_path / "laptop"
    shutil.copytree(LAPTOP, root)
    device = open_device("local", root=root)
    assert "cpu.policy0.cap_khz" in device.sample()
    shutil.rmtree(root / "sys/devices/system/cpu/cpufreq/policy0")
    (root / "proc/meminfo").unlink()
    (root / "sys/class/thermal/thermal_zone2/temp").write_text("")   # EIO-like empty read
    v = device.sample()
    assert "cpu.policy0.cap_khz" not in v and "cpu.policy1.cap_khz" in v
    assert "mem.available_mib" not in v and "temp.cpu_c" not in v
    shutil.rmtree(root)
    assert device.sample() == {}


def test_sample_never_raises() -> None:
    class Dead:
        kind, spec, on_host = "adb", "adb:gone", False

        def snapshot(self) -> Tree:
            raise OSError("device offline")

        def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
            raise AssertionError

    device = Device(Dead(), "gone")
    assert device.sample() == {}
    assert device.last_error == "device offline"
    rows = dict(device.describe())
    assert rows["error"] == "device offline" and rows["cpufreq"].startswith("missing")


def test_describe_lists_sources() -> None:
    rows = dict(open_device("local", root=PHONE).describe())
    assert rows["cpufreq"].startswith("2 policies via sysfs")
    assert "policy0 cap 2188800 of 3321600 kHz CAPPED" in rows["cpufreq"]
    assert rows["thermal zones"].startswith("12 zones via sysfs, 4 CPU")
    assert rows["battery"] == "38.1 °C, Discharging, 80% (power_supply)"
    assert rows["Android"].startswith("thermal status 1 (light), 4 HAL")
    assert rows["GPU (NVML)"].startswith("not read")
    assert rows["power"].startswith("missing: no power_supply power_now")
    empty = dict(open_device("local", root=FIXTURES / "nowhere").describe())
    assert empty["cpufreq"].startswith("missing") and empty["memory"].startswith("missing")


def test_power_keys_and_describe() -> None:
    device = open_device("local", root=LAPTOP_POWER)
    v = device.sample()
    assert v["battery.power_w"] == 8.734 and v["battery.status"] == "Discharging"
    assert {k: v[k] for k in v if k.startswith("rapl.")} == {
        "rapl.package-0.energy_uj": 35874514612, "rapl.package-0.max_uj": 262143328850,
        "rapl.psys.energy_uj": 96385401251, "rapl.psys.max_uj": 262143328850}
    assert dict(device.describe())["power"] == (
        "battery 8.73 W, Discharging (power_supply); "
        "RAPL package-0, psys energy counters (powercap RAPL)")
    charging = dict(open_device("local", root=FIXTURES / "android-power-charging").describe())
    assert charging["power"] == "battery 7.77 W, Charging: not usable for energy (power_supply)"


def test_run_locally_takes_an_argument_list(tmp_path: Path) -> None:
    done = open_device("local").run([sys.executable, "-c", "import sys; print(sys.argv[1:])",
                                     "a b", "$(x)"], timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "['a b', '$(x)']"


def test_sample_is_thread_safe() -> None:
    import threading

    device = open_device("local", root=PHONE)
    results: list[dict[str, Any]] = []

    def work() -> None:
        for _ in range(20):
            results.append(device.sample())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the foreign load is measured between readings (none on the first): the rest is equal
    steady = [{k: v for k, v in r.items() if k != keys.FOREIGN_CORES} for r in results]
    assert len(results) == 80 and all(r == steady[0] for r in steady)


def test_snapshot_tree_device(tmp_path: Path) -> None:
    class Canned:
        kind, spec, on_host = "adb", "adb:canned", False

        def snapshot(self) -> Tree:
            return SnapshotTree({"/proc/loadavg": "0.5 0.4 0.3 1/2 3\n"})

        def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
            raise AssertionError

    assert Device(Canned(), "c").sample() == {"load.1m": 0.5, "load.5m": 0.4, "load.15m": 0.3}


@pytest.mark.parametrize("module", ["abbench.engine", "abbench.campaign", "abbench.analysis"])
def test_sensors_import_nothing_upstream(module: str) -> None:
    code = ("import sys, abbench.sensors; "
            f"sys.exit(any(m.startswith({module!r}) for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


class CountingTree:
    """A fixture tree that counts what the readers ask of it, by top folder."""

    def __init__(self, root: Path) -> None:
        self.tree = LocalTransport(root).tree
        self.asked: list[str] = []

    def read(self, path: str) -> str | None:
        self.asked.append(path)
        return self.tree.read(path)

    def glob(self, pattern: str) -> list[str]:
        self.asked.append(pattern)
        return self.tree.glob(pattern)


class ThisMachine:
    """A transport that says it is this machine's `/` while reading a fixture tree."""

    kind, spec, on_host = "local", "local", True

    def __init__(self, tree: CountingTree) -> None:
        self.tree = tree

    def snapshot(self) -> Tree:
        return self.tree


def test_this_machine_looks_for_an_absent_source_again_only_after_a_while(
        tmp_path: Path) -> None:
    root = tmp_path / "vm"  # a VM: /proc, no cpufreq, no thermal zones, no battery
    shutil.copytree(LAPTOP / "proc", root / "proc")
    tree, clock = CountingTree(root), Clock()
    device = Device(ThisMachine(tree), "vm", clock=clock)  # type: ignore[arg-type]

    def asked_for_sys() -> list[str]:
        device.sample()
        asked = [p for p in tree.asked if p.startswith(("/sys", "/dumpsys"))]
        tree.asked.clear()
        return asked

    assert any("cpufreq" in p for p in asked_for_sys())  # the first reading looks
    clock.t = 1.0
    assert asked_for_sys() == []  # then the ticks skip what is not there
    shutil.copytree(LAPTOP / "sys", root / "sys")  # hardware "appears"
    clock.t = 1.0 + ABSENT_RECHECK_S / 2
    assert asked_for_sys() == [] and "cpu.policy2.cap_khz" not in device.sample()
    clock.t = 1.0 + ABSENT_RECHECK_S
    v = device.sample()
    assert v["cpu.policy2.capped"] is True and v["temp.cpu_c"] == 52.0
    assert any("cpufreq" in p for p in asked_for_sys())  # present: read every tick


def test_a_fixture_tree_is_read_whole_every_tick(tmp_path: Path) -> None:
    # not this machine (a fixture, the simulated device's tree): files appear any time
    root = tmp_path / "tree"
    shutil.copytree(LAPTOP / "proc", root / "proc")
    device = Device(LocalTransport(root), "fixture", clock=Clock())
    assert "cpu.policy2.cap_khz" not in device.sample()
    shutil.copytree(LAPTOP / "sys", root / "sys")
    assert device.sample()["cpu.policy2.capped"] is True
