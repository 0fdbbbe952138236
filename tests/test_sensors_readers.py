"""Readers against fixture trees: exact values, absent and malformed files, fallbacks."""

from __future__ import annotations

import shutil
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from abbench.records import keys
from abbench.sensors import host, readers
from abbench.sensors.tree import LocalTree, SnapshotTree, natural_key

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"
LAPTOP = FIXTURES / "linux-laptop"
PHONE = FIXTURES / "android-qwen"
PHONE_POWER = FIXTURES / "android-power"
PHONE_CHARGING = FIXTURES / "android-power-charging"
LAPTOP_POWER = FIXTURES / "laptop-power"
RAPL = "sys/class/powercap"

TREE_READERS = [readers.collect_cpufreq, readers.collect_thermal_zones,
                readers.collect_battery, readers.collect_rapl, readers.collect_meminfo,
                readers.collect_pressure, readers.collect_loadavg]


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- cpufreq -----------------------------------------------------------------------------

def test_cpufreq_reads_the_qwen_state_policies() -> None:
    # qwen.state BEFORE: policy0: scaling_max=2188800 hw_max=3321600 cur=806400
    assert readers.collect_cpufreq(PHONE) == {
        "cpu.policy0.cap_khz": 2188800, "cpu.policy0.hw_max_khz": 3321600,
        "cpu.policy0.cur_khz": 806400, "cpu.policy0.capped": True,
        "cpu.policy6.cap_khz": 1651200, "cpu.policy6.hw_max_khz": 3801600,
        "cpu.policy6.cur_khz": 806400, "cpu.policy6.capped": True,
    }


def test_cpufreq_laptop_one_policy_capped() -> None:
    v = readers.collect_cpufreq(str(LAPTOP))
    assert [v[f"cpu.policy{i}.capped"] for i in range(4)] == [False, False, True, False]
    assert v["cpu.policy2.cap_khz"] == 2400000 and v["cpu.policy2.cur_khz"] == 2399876


def test_cpufreq_partial_and_garbage_files(tmp_path: Path) -> None:
    base = "sys/devices/system/cpu/cpufreq"
    write(tmp_path, f"{base}/policy0/scaling_max_freq", "1800000\n")
    write(tmp_path, f"{base}/policy0/cpuinfo_max_freq", "<unsupported>\n")
    write(tmp_path, f"{base}/policy10/scaling_cur_freq", "900000\n")
    assert readers.collect_cpufreq(tmp_path) == {
        "cpu.policy0.cap_khz": 1800000, "cpu.policy10.cur_khz": 900000}


@pytest.mark.parametrize("size", [0, 10, 1 << 16, (1 << 16) + 1, 3 << 16])
def test_a_file_comes_whole_whatever_its_size_against_one_read(tmp_path: Path,
                                                               size: int) -> None:
    # /proc/stat on a machine of hundreds of CPUs, a big fixture: past one read's buffer
    (tmp_path / "proc").mkdir()
    text = "".join(chr(ord("a") + i % 26) for i in range(size))
    (tmp_path / "proc" / "stat").write_text(text)
    assert LocalTree(tmp_path).read("/proc/stat") == text


def test_natural_order() -> None:
    names = ["policy10", "policy6", "policy0", "thermal_zone11", "thermal_zone2"]
    assert sorted(names, key=natural_key) == [
        "policy0", "policy6", "policy10", "thermal_zone2", "thermal_zone11"]


# --- thermal zones -----------------------------------------------------------------------

def test_thermal_zones_laptop() -> None:
    # x86_pkg_temp is the only CPU zone; acpitz repeats; iwlwifi_1 has no readable temp
    assert readers.collect_thermal_zones(LAPTOP) == {
        "temp.cpu_c": 52.0,
        "temp.acpitz_c": 27.8,
        "temp.int3400_thermal_c": 20.0,
        "temp.pch_cometlake_c": 45.5,
        "temp.acpitz-2_c": 29.8,
    }


def test_thermal_zones_phone_kinds_and_filters() -> None:
    zones = {z.label: z for z in readers.read_thermal_zones(PHONE)}
    assert {k for k, z in zones.items() if z.kind == "cpu"} == {
        "cpu-0-0-0", "cpu-0-1-0", "cpu-1-0-0", "cpuss-0"}
    assert zones["gpuss-0"].kind == "gpu" and zones["battery"].kind == "battery"
    # current/level zones are never CPU temperatures; -273 °C (a disabled zone) is dropped
    assert zones["pm8550b-ibat-lvl0"].kind == "other" and zones["socd"].kind == "other"
    assert "disabled-tz" not in zones
    v = readers.collect_thermal_zones(PHONE)
    assert v["temp.cpu_c"] == 48.2
    assert v["gpu.temp_c"] == 40.2 and v["temp.gpuss-0_c"] == 40.2
    assert v["battery.temp_c"] == 38.1
    assert v["temp.skin-msm-therm_c"] == 36.9
    assert not any("cpu-" in k for k in v)  # CPU zones only feed the aggregate


def test_thermal_zones_ignore_and_whole_degree_drivers(tmp_path: Path) -> None:
    write(tmp_path, "sys/class/thermal/thermal_zone0/type", "cpu-thermal\n")
    write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "47\n")    # whole °C (old driver)
    write(tmp_path, "sys/class/thermal/thermal_zone1/type", "soc_thermal\n")
    write(tmp_path, "sys/class/thermal/thermal_zone1/temp", "95000\n")
    zones = readers.read_thermal_zones(tmp_path)
    assert [(z.id, z.temp_c) for z in zones] == [
        ("thermal_zone0:cpu-thermal", 47.0), ("thermal_zone1:soc_thermal", 95.0)]
    assert readers.collect_thermal_zones(tmp_path) == {"temp.cpu_c": 95.0}
    assert readers.collect_thermal_zones(
        tmp_path, ignore={"thermal_zone1:soc_thermal"}) == {"temp.cpu_c": 47.0}


@pytest.mark.parametrize("label,kind", [
    ("cpu-0-0-usr", "cpu"), ("cpuss-1", "cpu"), ("x86_pkg_temp", "cpu"),
    ("tsens_tz_sensor3", "cpu"), ("soc_thermal", "cpu"), ("soc", "cpu"), ("BIG", "cpu"),
    ("LITTLE", "cpu"), ("k10temp", "cpu"), ("gpuss-0", "gpu"), ("G3D", "gpu"),
    ("socd", "other"), ("ocp_cpu1", "other"), ("soft_ocp_cpu2", "other"),
    ("pm8550b-ibat-lvl0", "other"), ("vbat", "other"), ("battery", "battery"),
    ("acpitz", "other"), ("skin-therm", "other"), ("xo-therm", "other"),
])
def test_zone_kind(label: str, kind: str) -> None:
    assert readers.zone_kind(label) == kind


# --- power_supply, /proc ------------------------------------------------------------------

def test_battery() -> None:
    assert readers.collect_battery(PHONE) == {
        "battery.temp_c": 38.1, "battery.status": "Discharging", "battery.capacity_pct": 80}
    # laptop batteries rarely report a temperature; AC (Mains) is not a battery
    assert readers.collect_battery(LAPTOP) == {
        "battery.status": "Discharging", "battery.capacity_pct": 87}


def test_meminfo_pressure_loadavg() -> None:
    assert readers.collect_meminfo(PHONE) == {
        "mem.available_mib": round(6151240 / 1024, 1), "mem.free_mib": round(1092976 / 1024, 1)}
    assert readers.collect_meminfo(LAPTOP)["mem.total_mib"] == round(16314136 / 1024, 1)
    assert readers.collect_pressure(LAPTOP) == {
        "psi.cpu.some_avg10": 1.63, "psi.cpu.some_avg60": 7.31, "psi.cpu.full_avg10": 0.0,
        "psi.memory.some_avg10": 0.25, "psi.memory.some_avg60": 0.10,
        "psi.memory.full_avg10": 0.12,
        "psi.io.some_avg10": 14.83, "psi.io.some_avg60": 9.56, "psi.io.full_avg10": 11.5,
    }
    assert readers.collect_loadavg(LAPTOP) == {"load.1m": 1.10, "load.5m": 2.34,
                                               "load.15m": 2.37}


@pytest.mark.parametrize("reader", TREE_READERS, ids=lambda r: r.__name__)
def test_every_reader_on_an_empty_tree_reads_nothing(reader: Any, tmp_path: Path) -> None:
    assert reader(tmp_path) == {}
    assert reader(tmp_path / "does-not-exist") == {}
    assert reader(SnapshotTree({})) == {}


def test_readers_survive_garbage(tmp_path: Path) -> None:
    for rel in ["proc/meminfo", "proc/loadavg", "proc/pressure/cpu",
                "sys/class/power_supply/x/type", "sys/class/power_supply/x/temp",
                "sys/class/power_supply/x/current_now", "sys/class/power_supply/x/voltage_now",
                "sys/class/powercap/intel-rapl:0/name",
                "sys/class/powercap/intel-rapl:0/energy_uj",
                "sys/class/thermal/thermal_zone0/type", "sys/class/thermal/thermal_zone0/temp",
                "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq"]:
        write(tmp_path, rel, "\x00\xff garbage = = avg10=x\n:::\n")
    (tmp_path / "proc/pressure/io").mkdir()  # a directory where a file should be
    for reader in TREE_READERS:
        assert isinstance(reader(tmp_path), dict)


def test_a_reader_that_raises_is_a_gap() -> None:
    class Broken:
        def read(self, path: str) -> str | None:
            raise RuntimeError("sensor driver fell over")

        def glob(self, pattern: str) -> list[str]:
            raise RuntimeError("sensor driver fell over")

    for reader in TREE_READERS:
        assert reader(Broken()) == {}
    assert readers.read_thermal_zones(Broken()) == []


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["/proc/meminfo", "/proc/loadavg", "/proc/pressure/cpu",
                     "/sys/class/power_supply/b/type", "/sys/class/power_supply/b/temp",
                     "/sys/class/power_supply/b/capacity", "/sys/class/power_supply/b/power_now",
                     "/sys/class/power_supply/b/current_now",
                     "/sys/class/power_supply/b/voltage_now",
                     "/sys/class/powercap/intel-rapl:0/name",
                     "/sys/class/powercap/intel-rapl:0/energy_uj",
                     "/sys/class/thermal/thermal_zone0/type",
                     "/sys/class/thermal/thermal_zone0/temp",
                     "/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq",
                     "/sys/devices/system/cpu/cpufreq/policy0/cpuinfo_max_freq"]),
    st.text(max_size=200)))
def test_fuzzed_files_never_raise(files: dict[str, str]) -> None:
    tree = SnapshotTree(files)
    for reader in TREE_READERS:
        assert isinstance(reader(tree), dict)


@pytest.mark.parametrize("root", [PHONE, PHONE_POWER, LAPTOP_POWER], ids=lambda p: p.name)
def test_local_and_snapshot_trees_agree(root: Path) -> None:
    local = LocalTree(root)
    files = {p: local.read(p) or "" for pattern in readers.REMOTE_GLOBS
             for p in local.glob(pattern)}
    snap = SnapshotTree(files)
    for reader in TREE_READERS:
        assert reader(snap) == reader(root), reader.__name__


# --- power and energy ---------------------------------------------------------------------

def test_battery_power_from_power_now() -> None:
    # an ACPI battery rated in Wh: power_now in µW wins over the voltage beside it
    assert readers.collect_battery(LAPTOP_POWER) == {
        "battery.status": "Discharging", "battery.capacity_pct": 62, "battery.power_w": 8.734}


def test_battery_power_from_current_and_voltage() -> None:
    # the kernel ABI's sign: negative µA while discharging; the key keeps the magnitude
    assert readers.collect_battery(PHONE_POWER) == {
        "battery.temp_c": 33.4, "battery.status": "Discharging", "battery.capacity_pct": 64,
        "battery.power_w": 2.363544}   # 0.612 A × 3.862 V


def test_charging_battery_gives_the_magnitude_and_its_status() -> None:
    v = readers.collect_battery(PHONE_CHARGING)
    assert v["battery.status"] == "Charging"
    assert v["battery.power_w"] == 7.768245   # +1.843 A × 4.215 V, into the battery


@pytest.mark.parametrize(("current", "voltage", "watts"), [
    ("-612000", "3862000", 2.363544),   # µA, µV (the ABI)
    ("612000", "3862000", 2.363544),    # ACPI's positive sign while discharging
    ("-612", "3862", 2.363544),         # mA, mV (vendor kernels)
    ("612", "3862000", 2.363544),       # mA, µV
    ("-612000", "3862", 2.363544),      # µA, mV
    ("10000", "3862000", 0.03862),      # 10 mA in µA: at the line, still µA
])
def test_battery_power_units_and_signs(current: str, voltage: str, watts: float) -> None:
    base = "/sys/class/power_supply/battery"
    tree = SnapshotTree({f"{base}/type": "Battery\n", f"{base}/current_now": current + "\n",
                         f"{base}/voltage_now": voltage + "\n"})
    assert readers.collect_battery(tree) == {"battery.power_w": watts}


@pytest.mark.parametrize("files", [
    {},                                                        # no power files at all
    {"current_now": "-612000\n"},                              # no voltage
    {"voltage_now": "3862000\n"},                              # no current
    {"current_now": "0\n", "voltage_now": "3862000\n"},        # nothing flowing
    {"power_now": "0\n"},
    {"power_now": "n/a\n", "current_now": "", "voltage_now": "3862000\n"},
])
def test_battery_power_absent_or_zero_leaves_the_key_out(files: dict[str, str]) -> None:
    base = "/sys/class/power_supply/BAT0"
    tree = SnapshotTree({f"{base}/type": "Battery\n", f"{base}/status": "Discharging\n",
                         **{f"{base}/{name}": text for name, text in files.items()}})
    assert readers.collect_battery(tree) == {"battery.status": "Discharging"}


def test_battery_power_falls_back_from_a_zero_power_now() -> None:
    assert readers.battery_power_w(0, -612000, 3862000) == 2.363544
    assert readers.battery_power_w(-8734000, None, None) == 8.734


def test_rapl_top_level_domains_only() -> None:
    # intel-rapl:0:0 (core), :0:1 (uncore), intel-rapl-mmio:0 and the intel-rapl control
    # folder are not read
    assert readers.collect_rapl(LAPTOP_POWER) == {
        "rapl.package-0.energy_uj": 35874514612, "rapl.package-0.max_uj": 262143328850,
        "rapl.psys.energy_uj": 96385401251, "rapl.psys.max_uj": 262143328850,
    }


def test_rapl_other_vendors_and_repeated_names(tmp_path: Path) -> None:
    for zone, name, energy in [("intel-rapl:0", "package-0", "1200"),
                               ("intel-rapl:1", "package-0", "3400"),
                               ("amd-rapl:0", "Package 1", "5600")]:
        write(tmp_path, f"{RAPL}/{zone}/name", name + "\n")
        write(tmp_path, f"{RAPL}/{zone}/energy_uj", energy + "\n")
    assert readers.collect_rapl(tmp_path) == {
        "rapl.package-0.energy_uj": 1200, "rapl.package-0-2.energy_uj": 3400,
        "rapl.package_1.energy_uj": 5600}


class Denied:
    """A tree whose `energy_uj` files fail as they do for a non-root user since Linux 5.10
    (EACCES: LocalTree.read gives None). Tests run as root, where chmod denies nothing."""

    def __init__(self, root: Path, denied: str) -> None:
        self.tree, self.denied = LocalTree(root), denied

    def read(self, path: str) -> str | None:
        return None if path.startswith(self.denied) else self.tree.read(path)

    def glob(self, pattern: str) -> list[str]:
        return self.tree.glob(pattern)


def test_rapl_unreadable_energy_leaves_the_domain_out(tmp_path: Path) -> None:
    psys_only = {keys.rapl_energy("psys"): 96385401251, keys.rapl_max("psys"): 262143328850}
    denied = Denied(LAPTOP_POWER, f"/{RAPL}/intel-rapl:0/energy_uj")
    assert readers.collect_rapl(denied) == psys_only
    # over adb/ssh a file `cat` could not read is absent from the snapshot
    local = LocalTree(LAPTOP_POWER)
    files = {p: local.read(p) or "" for pattern in readers.REMOTE_GLOBS
             for p in local.glob(pattern) if p != f"/{RAPL}/intel-rapl:0/energy_uj"}
    assert readers.collect_rapl(SnapshotTree(files)) == psys_only
    # a directory where the file should be: the read fails (EISDIR) like EACCES
    shutil.copytree(LAPTOP_POWER, tmp_path / "t")
    (tmp_path / "t" / RAPL / "intel-rapl:0" / "energy_uj").unlink()
    (tmp_path / "t" / RAPL / "intel-rapl:0" / "energy_uj").mkdir()
    assert readers.collect_rapl(tmp_path / "t") == psys_only


def test_power_keys_are_described() -> None:
    values = {**readers.collect_battery(LAPTOP_POWER), **readers.collect_rapl(LAPTOP_POWER)}
    units = {k: (e.unit, e.type) for k in values if (e := keys.describe(k)) is not None}
    assert units == {
        "battery.status": ("", "str"), "battery.capacity_pct": ("%", "int"),
        "battery.power_w": ("W", "float"),
        "rapl.package-0.energy_uj": ("µJ", "int"), "rapl.package-0.max_uj": ("µJ", "int"),
        "rapl.psys.energy_uj": ("µJ", "int"), "rapl.psys.max_uj": ("µJ", "int"),
    }
    assert keys.rapl_domains(values) == ["package-0", "psys"]


# --- psutil fallbacks ---------------------------------------------------------------------

def test_psutil_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    temp = types.SimpleNamespace
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: {
        "coretemp": [temp(label="Package id 0", current=61.0), temp(label="Core 0", current=58.0)],
        "nvme": [temp(label="Composite", current=38.85)],
        "acpitz": [temp(label="", current=27.8), temp(label="", current=-273.0)],
    }, raising=False)
    monkeypatch.setattr(psutil, "cpu_freq", lambda: temp(current=2299.998, min=0.0, max=0.0))
    monkeypatch.setattr(psutil, "sensors_battery",
                        lambda: temp(percent=55.4, secsleft=1, power_plugged=True), raising=False)
    zones = host.read_psutil_temperatures()
    assert readers.zone_values(zones) == {
        "temp.cpu_c": 61.0, "temp.acpitz_c": 27.8, "temp.nvme-composite_c": 38.85}
    assert host.collect_psutil_cpufreq() == {"cpu.all.cur_khz": 2299998}
    assert host.collect_psutil_battery() == {"battery.capacity_pct": 55,
                                                "battery.plugged": True}
    assert host.collect_psutil_memory()["mem.available_mib"] > 0
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: 1 / 0, raising=False)
    assert host.read_psutil_temperatures() == []


# --- NVML ----------------------------------------------------------------------------------

class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, gpus: int = 1, init_fails: bool = False) -> None:
        self.gpus, self.init_fails, self.inits = gpus, init_fails, 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 71 + h

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1755

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 412345

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x20 | 0x4 if h == 0 else 0


def test_nvml_reads_every_gpu() -> None:
    nvml = FakeNvml(gpus=2)
    v = host.collect_nvml(nvml)
    assert v == {
        "gpu.temp_c": 71.0, "gpu.sm_clock_mhz": 1755, "gpu.sm_max_clock_mhz": 1980,
        "gpu.power_w": 412.345, "gpu.throttle_mask": 0x24,
        "gpu.throttle_reasons": "sw_power_cap,sw_thermal",
        "gpu.1.temp_c": 72.0, "gpu.1.sm_clock_mhz": 1755, "gpu.1.sm_max_clock_mhz": 1980,
        "gpu.1.throttle_mask": 0, "gpu.1.throttle_reasons": "none",
    }
    host.collect_nvml(nvml)
    assert nvml.inits == 1


def test_nvml_failed_init_is_remembered() -> None:
    nvml = FakeNvml(init_fails=True)
    assert host.collect_nvml(nvml) == {} and host.collect_nvml(nvml) == {}
    assert nvml.inits == 1


def test_nvml_init_is_remembered_per_module_not_per_address() -> None:
    """Modules made and dropped in turn, failing and working alternately: each reads as
    itself. Keyed by id(), a new module at a freed one's address inherited its result (a
    working fake read nothing, or a failed one read a GPU: a CI failure once)."""
    import gc

    seen: set[int] = set()
    reused = 0
    for i in range(200):
        nvml = FakeNvml(init_fails=i % 2 == 1)
        reused += id(nvml) in seen
        seen.add(id(nvml))
        got = host.collect_nvml(nvml)
        assert (got == {}) == nvml.init_fails, (i, got)
        assert nvml.inits == 1
        del nvml
        # the young generations only: a full collection of the whole suite's heap took
        # 0.14 s, and the module and anything it is in a cycle with are young
        gc.collect(1)
    assert reused  # the case this guards: a new module where a freed one was


def test_throttle_names() -> None:
    assert host.throttle_names(0) == "none"
    assert host.throttle_names(0x1 | 0x40) == "idle,hw_thermal"
    assert host.throttle_names(0x1000) == "0x1000"
