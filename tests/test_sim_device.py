"""The simulated device: profiles, the thermal model, the tree the readers see, the
duty-cycling of an attached process, and a campaign on `sim:PATH.toml` end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_campaign_run import abbench, run_folder, write_campaign

from abbench.errors import UsageError
from abbench.records import keys, read_journal, read_samples
from abbench.records.toml import tomllib
from abbench.sim import open_device
from abbench.sim.device import SimulatedDevice, ThermalModel
from abbench.sim.profile import Profile, load_profile, shipped_profiles

HOT = Path(__file__).parent / "fixtures" / "sim-hot.toml"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def sim():
    clock = FakeClock()
    made: list[SimulatedDevice] = []

    def make(profile: Profile | str = "phone") -> tuple[SimulatedDevice, FakeClock]:
        p = load_profile(profile) if isinstance(profile, str) else profile
        d = SimulatedDevice(p, clock=clock, background=False)
        made.append(d)
        return d, clock

    yield make
    for d in made:
        d.close()


def test_shipped_profiles_load_and_validate() -> None:
    assert {"phone", "laptop"} <= set(shipped_profiles())
    for name in shipped_profiles():
        p = load_profile(name)
        assert p.clusters and p.time_scale > 0
    assert load_profile(str(HOT)).time_scale == 30.0
    with pytest.raises(UsageError, match="unknown simulated device profile"):
        load_profile("nope")
    with pytest.raises(UsageError) as e:
        open_device("sim:nope")
    assert "sim:phone" in (e.value.tip or "")


def _raw(path: Path) -> dict:
    return tomllib.loads(path.read_text())


@pytest.mark.parametrize("change, match", [
    ({"time_scale": 0}, "time_scale"),
    ({"soc_tau_s": 0.1}, "soc_tau_s"),
    ({"idle_load": 2}, "idle_load"),
    ({"bogus": 1}, "`bogus`: unknown key"),
    ({"trip_sensor": "skin"}, "trip_sensor"),
    ({"start_soc_c": "hot"}, "start_soc_c"),
    ({"clusters": []}, "clusters"),
    ({"trips": [{"temp_c": 40.0, "caps_khz": {"policy9": 1}}]}, "unknown policy"),
    ({"trips": [{"temp_c": 40.0, "caps_khz": {"policy0": 1}},
                {"temp_c": 39.0, "caps_khz": {"policy0": 1}}]}, "ascending"),
])
def test_invalid_profiles_are_usage_errors(change: dict, match: str) -> None:
    d = _raw(HOT) | change
    with pytest.raises(UsageError, match=match):
        Profile.from_dict(d, "test")


def test_a_profile_past_what_toml_or_python_reads_is_a_usage_error() -> None:
    from abbench.sim.profile import profile_from_text

    for text, match in (("x = " + "9" * 5000, "a value Python cannot read"),
                        ("x = " + "[" * 2000 + "]" * 2000, "nested too deeply|invalid")):
        with pytest.raises(UsageError, match=match):
            profile_from_text(text, "p.toml")


def test_model_heats_under_load_and_cools_idle(sim) -> None:
    dev, clock = sim("phone")
    t0 = dev.sample()["temp.cpu_c"]
    dev._pid = os.getpid()  # loaded, without duty-cycling anything
    clock.t += 30.0
    hot = dev.sample()
    dev._pid = None
    assert hot["temp.cpu_c"] > t0 + 5
    clock.t += 600.0
    cooled = dev.sample()
    assert cooled["temp.cpu_c"] < hot["temp.cpu_c"] - 5
    assert cooled["battery.temp_c"] > 25.0  # the case lags, above ambient


@pytest.mark.parametrize("node", ["soc", "case"])
def test_caps_drop_at_trip_points_with_hysteresis(sim, node: str) -> None:
    p = dataclasses.replace(load_profile("phone"), trip_sensor=node)
    dev, clock = sim(p)
    m = dev.model

    def heat_to(temp_c: float) -> None:  # only the node the trips read moves the caps
        setattr(m, f"{node}_c", temp_c)
        setattr(m, "case_c" if node == "soc" else "soc_c", p.ambient_c)
        m._update_level()

    hw = {c.policy: c.hw_max_khz for c in p.clusters}
    assert m.caps_khz() == hw and dev.probe_factor() == 1.0
    first, second = p.trips[0], p.trips[1]
    heat_to(first.temp_c + 0.1)
    assert m.level == 1 and m.caps_khz()["policy7"] == first.caps_khz["policy7"]
    heat_to(second.temp_c + 0.1)
    assert m.level == 2 and dev.probe_factor() < 1.0
    heat_to(second.temp_c - p.hysteresis_c / 2)  # below the trip, within hysteresis
    assert m.level == 2
    heat_to(second.temp_c - p.hysteresis_c - 0.1)
    assert m.level == 1
    heat_to(p.ambient_c)
    assert m.level == 0 and m.caps_khz() == hw


def test_without_start_temperatures_the_device_starts_at_idle_equilibrium() -> None:
    p = load_profile("phone")
    m = ThermalModel(p)
    soc, case = m.soc_c, m.case_c
    m.advance(3600.0, p.idle_load)
    assert m.soc_c == pytest.approx(soc, abs=0.01) and m.case_c == pytest.approx(case, abs=0.01)
    assert p.ambient_c < case < soc and m.level == 0


def test_readers_see_the_tree(sim) -> None:
    dev, clock = sim("phone")
    assert dev.simulated and dev.name == "sim-phone" and dev.transport == "sim:phone"
    dev.model.soc_c = 52.0
    dev.model.case_c = 31.5  # the phone's trips read the case: one trip engaged
    dev.model._update_level()
    v = dev.sample()
    assert v["cpu.policy0.cap_khz"] == 1804800 and v["cpu.policy0.capped"] is False
    assert v["cpu.policy7.capped"] is True
    assert v["temp.cpu_c"] == pytest.approx(52.0, abs=0.01)
    assert v["battery.temp_c"] == pytest.approx(31.5, abs=0.1)
    assert v["mem.available_mib"] == 6000
    # Power: idle here (no cell attached), from µA (negative: discharging) and µV.
    cf = dev.model.clock_fraction()
    assert v[keys.BATTERY_POWER_W] == pytest.approx(0.8 + 5.0 * 0.1 * cf, rel=1e-4)
    assert v[keys.BATTERY_STATUS] == "Discharging"
    current = int((dev.root / "sys/class/power_supply/battery/current_now").read_text())
    assert current < 0


def test_a_capped_busy_device_draws_less_power_but_more_than_its_base() -> None:
    model = ThermalModel(load_profile("phone"))
    full = model.power_w(1.0)
    assert full == pytest.approx(0.8 + 5.0)
    model.case_c = 36.0  # every trip engaged: clock fraction 0.59
    model._update_level()
    assert model.power_w(1.0) == pytest.approx(0.8 + 5.0 * model.clock_fraction())
    assert 0.8 < model.power_w(1.0) < full and model.power_w(0.0) == 0.8


# Spins for `seconds` of wall time and prints the CPU seconds it got: the share of the
# wall time it was allowed to run. Unlike a count of loop iterations, that share does not
# move with the host's own speed (which drifts by 10-40% on shared machines).
BUSY = ("import sys, time\n"
        "end = time.monotonic() + float(sys.argv[1])\n"
        "c0 = time.process_time()\n"
        "while time.monotonic() < end:\n    pass\n"
        "print(time.process_time() - c0)\n")


def _busy(seconds: float, dev: SimulatedDevice | None) -> float:
    """CPU seconds a child spinning for `seconds` of wall time got."""
    child = subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    if dev is not None:
        dev.throttle(child.pid)
    try:
        out, _ = child.communicate(timeout=30)
    finally:
        if dev is not None:
            dev.unthrottle()
    return float(out)


@pytest.mark.alone  # it measures CPU shares of duty-cycled children
def test_duty_cycling_slows_a_cpu_bound_child_and_leaves_it_continued(sim) -> None:
    dev, _ = sim("phone")
    dev.force_clock_fraction(0.5)
    free = _busy(1.0, None)
    throttled = _busy(1.0, dev)
    # Half the wall time stopped: about half the CPU time (timer slack on a busy host
    # moves it by a few percent).
    assert 0.35 * free < throttled < 0.65 * free, (free, throttled)
    # detach leaves a still-running process continued
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        dev.force_clock_fraction(0.1)
        dev.throttle(child.pid)
        time.sleep(0.3)
        dev.unthrottle()
        time.sleep(0.05)
        state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state in ("S", "R"), state
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


@pytest.mark.alone  # it measures CPU shares of duty-cycled children
def test_a_cell_that_starts_its_engine_is_throttled_with_it(sim) -> None:
    """A cell leads its process group (`CellChild`); what its wrapper starts (a bmoe
    cell's bmoe-cli, in the background of its `.metrics` wrapper) is duty-cycled too."""
    dev, _ = sim("phone")
    dev.force_clock_fraction(0.5)
    wrapped = f'"{sys.executable}" -c "$0" 1.0 & wait'
    child = subprocess.Popen(["sh", "-c", wrapped, BUSY], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    dev.throttle(child.pid)
    try:
        out, _ = child.communicate(timeout=30)
    finally:
        dev.unthrottle()
    free = _busy(1.0, None)
    assert float(out) < 0.65 * free, (free, out)


@pytest.mark.alone  # it measures CPU shares of duty-cycled children
def test_the_speed_probe_runs_for_real_and_is_throttled_like_a_cell(sim) -> None:
    # The probe on a simulated device is a real process that the device
    # duty-cycles, so it sees the simulated caps and the host's own load
    # (docs/sensors.md#the-simulated-device-simprofile).
    from abbench.sensors.probe import ProbeWorker

    dev, _ = sim("phone")
    worker = ProbeWorker(sys.executable)
    try:
        for fraction in (0.5, 0.8):
            # Timed over whole duty periods, the probe reads the clock fraction (within
            # this host's own noise), not a repetition that fell between two stops. The
            # host's own swings can move one pair of measurements past the band: a
            # fraction fails only when three pairs in a row do.
            seen = []
            for _ in range(3):
                free = worker.measure(3, dev.probe_rep_s)
                dev.force_clock_fraction(fraction)
                dev.throttle(worker.pid)
                try:
                    throttled = worker.measure(3, dev.probe_rep_s)
                finally:
                    dev.unthrottle()
                    dev.force_clock_fraction(None)
                seen.append(throttled / free)
                if 0.75 / fraction < seen[-1] < 1.3 / fraction:
                    break
            else:
                pytest.fail(f"fraction {fraction}: throttled/free {seen}, expected "
                            f"{0.75 / fraction:.2f} .. {1.3 / fraction:.2f}")
    finally:
        worker.close()


@pytest.mark.alone  # it measures CPU shares of duty-cycled children
def test_campaign_on_a_simulated_device(tiny_model: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, """
        [cells.B]
        overlap = true

        [cells.C]
        base = "B"
        io_lanes = 1
        """, head='order = ["B", "C", "B"]')
    cells.write_text(cells.read_text().replace('transport = "local"',
                                               f'transport = "sim:{HOT}"'))
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stdout + p.stderr
    folder = run_folder(tmp_path / "r")
    records = read_journal(folder)
    assert [r.status for r in records] == ["ok"] * 3
    assert all(r.entry.simulated for r in records)
    assert records[0].entry.probe_index == pytest.approx(1.0)
    later = [s for s in read_samples(folder) if s.cell in (1, 2)]
    assert any(s.values.get("cpu.policy4.capped") for s in later)
    assert "SIMULATED" in (folder / "report.md").read_text()
    # Every cell has an energy figure from the simulated battery: 0.8 W + 5 W × clocks.
    report = json.loads((folder / "report.json").read_text())
    for c in report["cells"]:
        assert c["energy_source"] == "battery", c["energy_note"]
        power = c["power_w"]["estimate"]
        assert 0.8 < power <= 5.8 + 1e-6
        rate = c["tokens_per_s"]["estimate"]
        assert c["energy_per_token_j"]["estimate"] == pytest.approx(power / rate)
    # The run keeps the profile it ran on: `abbench sim fit` reads it, not today's file.
    assert (folder / "device-profile.toml").read_text() == HOT.read_text()


def test_profile_is_frozen() -> None:
    p = load_profile("phone")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.time_scale = 2.0  # type: ignore[misc]


def test_sensors_command_describes_the_simulated_device(
        capsys: pytest.CaptureFixture[str]) -> None:
    from abbench.cli import main
    assert main(["sensors", "--transport", "sim:phone", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["transport"] == "sim:phone" and doc["simulated"] is True
    assert doc["thermal_gaps"] == []
    assert doc["samples"][0]["values"]["cpu.policy7.hw_max_khz"] == 3187200
