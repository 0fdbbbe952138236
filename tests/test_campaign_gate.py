"""The thermal gate on its own (campaign/gate.py): which readings hold a cell back, polling
until they clear, giving up after the timeout, a missing sensor never holding it."""

from __future__ import annotations

from typing import Any

import pytest

from abbench.campaign.gate import unmet, wait_for_gate
from abbench.campaign.tables import GateTable


class Readings:
    """A device whose readings step through a list (the last one repeats)."""

    def __init__(self, *values: dict[str, Any]) -> None:
        self.values = list(values)
        self.polls = 0

    def sample(self) -> dict[str, Any]:
        self.polls += 1
        return self.values[min(self.polls - 1, len(self.values) - 1)]


HOT = {"temp.cpu_c": 47.1, "battery.temp_c": 36.5, "mem.available_mib": 3000.0,
       "cpu.policy4.cap_khz": 2_000_000, "cpu.policy4.hw_max_khz": 2_400_000}
COOL = {"temp.cpu_c": 40.0, "battery.temp_c": 35.0, "mem.available_mib": 5000.0,
        "cpu.policy4.cap_khz": 2_400_000, "cpu.policy4.hw_max_khz": 2_400_000}
GATE = GateTable(cpu_temp_max_c=45.0, battery_temp_max_c=36.0, mem_available_min_mib=4000,
                 caps_at_max=True, probe_min=0.97, poll_s=0.01, timeout_s=1.0)


def test_every_condition_names_its_reading() -> None:
    why = unmet(GATE, HOT, 0.9)
    assert why == ["cpu 47.1 C > 45 C", "battery 36.5 C > 36 C",
                   "MemAvailable 3000 MiB < 4000 MiB", "policy4 capped at 2000 of 2400 MHz",
                   "speed probe 0.900 < 0.97"]
    assert unmet(GATE, COOL, 1.0) == []


def test_a_sensor_the_device_lacks_never_holds_the_gate() -> None:
    assert unmet(GATE, {}, None) == []
    # a cap without a hardware maximum cannot be told capped: it does not hold the gate
    assert unmet(GATE, {"cpu.cpu.cap_khz": 1_555_200}, 1.0) == []


def test_the_gate_waits_until_the_device_is_back() -> None:
    device = Readings(HOT, HOT, COOL)
    said: list[str] = []
    wait = wait_for_gate(GATE, device, lambda: 1.0, said.append)  # type: ignore[arg-type]
    assert not wait.gave_up and wait.polls == 3 and device.polls == 3
    assert wait.reasons[0] == "cpu 47.1 C > 45 C"  # why it waited: the first poll's reasons
    assert len(said) == 2 and said[0].startswith("gate: waiting 0/1 s — cpu 47.1 C > 45 C")


def test_the_gate_gives_up_after_its_timeout_and_says_so() -> None:
    gate = GateTable(cpu_temp_max_c=45.0, poll_s=0.05, timeout_s=0.2)
    wait = wait_for_gate(gate, Readings(HOT), lambda: 1.0, lambda _: None)  # type: ignore[arg-type]
    assert wait.gave_up and wait.waited_s >= 0.2 and wait.reasons == ("cpu 47.1 C > 45 C",)


def test_a_simulated_device_s_gate_counts_device_seconds() -> None:
    # 900 simulated seconds at 8 simulated seconds per wall second: about 0.1 s of wall time
    gate = GateTable(cpu_temp_max_c=45.0, poll_s=10.0, timeout_s=0.8)
    wait = wait_for_gate(gate, Readings(HOT), lambda: 1.0, lambda _: None,  # type: ignore[arg-type]
                         time_scale=8.0)
    assert wait.gave_up and wait.waited_s == pytest.approx(0.1, abs=0.08)


def test_a_reading_at_its_limit_does_not_hold_the_gate() -> None:
    at = {"temp.cpu_c": 45.0, "battery.temp_c": 36.0, "mem.available_mib": 4000.0,
          "cpu.policy4.cap_khz": 2_400_000, "cpu.policy4.hw_max_khz": 2_400_000}
    assert unmet(GATE, at, 0.97) == []


def test_only_the_conditions_asked_for_are_checked() -> None:
    # a hot, capped device with a fast probe passes a gate that asks only for the probe
    assert unmet(GateTable(probe_min=0.97), HOT, 1.0) == []
    caps_only = GateTable(caps_at_max=True)
    assert unmet(caps_only, HOT, 0.5) == ["policy4 capped at 2000 of 2400 MHz"]


def test_the_probe_runs_only_when_the_gate_asks_for_it() -> None:
    probes: list[int] = []

    def probe() -> float:
        probes.append(1)
        return 1.0

    wait_for_gate(GateTable(cpu_temp_max_c=45.0), Readings(COOL), probe, lambda _: None)  # type: ignore[arg-type]
    assert probes == []
    wait_for_gate(GATE, Readings(COOL), probe, lambda _: None)  # type: ignore[arg-type]
    assert probes == [1]


def test_a_ready_device_passes_at_once_and_says_nothing() -> None:
    said: list[str] = []
    wait = wait_for_gate(GATE, Readings(COOL), lambda: 1.0, said.append)  # type: ignore[arg-type]
    assert (wait.gave_up, wait.polls, wait.reasons, said) == (False, 1, (), [])
    assert wait.waited_s < 0.5
