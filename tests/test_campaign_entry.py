"""A cell's entry state (campaign/entry.py): the readings it records, and the speed-probe
index against the campaign's first probe, kept across a resume; on a simulated device the
probe runs in a worker the device throttles like a cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from abbench.campaign import entry
from abbench.campaign.entry import SpeedIndex, entry_state
from abbench.records import keys


def test_entry_state_takes_caps_temperatures_memory_and_status() -> None:
    values = {keys.cap_khz("policy4"): 2_000_000.0, keys.hw_max_khz("policy4"): 2_400_000,
              keys.CPU_TEMP_C: 47.1, keys.MEM_AVAILABLE_MIB: 3000.0,
              keys.ANDROID_THERMAL_STATUS: 2.0}
    state = entry_state(values, 0.97, simulated=True)
    assert state.caps_khz == {"policy4": 2_000_000} and state.hw_max_khz == {"policy4": 2_400_000}
    assert (state.cpu_temp_c, state.battery_temp_c, state.mem_available_mib) == (47.1, None,
                                                                                 3000.0)
    assert (state.probe_index, state.thermal_status, state.simulated) == (0.97, 2, True)
    assert state.capped() == ["policy4"]
    assert entry_state({}, None, simulated=False).thermal_status is None


class RealDevice:
    simulated = False
    kind = "local"


def test_the_index_is_the_first_probe_over_this_one(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([0.2, 0.4, 0.25])
    monkeypatch.setattr(entry, "speed_probe", lambda: next(times))
    speed = SpeedIndex(tmp_path, RealDevice(), "python")  # type: ignore[arg-type]
    speed.load()
    assert speed.index() == 1.0 and speed.index() == pytest.approx(0.5)
    resumed = SpeedIndex(tmp_path, RealDevice(), "python")  # type: ignore[arg-type]
    resumed.load()  # measured against the campaign's first probe, not its own
    assert resumed.index() == pytest.approx(0.8)


class SimDevice:
    simulated = True
    kind = "local"
    probe_rep_s = 0.01

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def throttle(self, pid: int, loads: bool = True) -> None:
        self.calls.append(("throttle", (pid, loads)))

    def unthrottle(self) -> None:
        self.calls.append(("unthrottle", None))


class FakeWorker:
    started: list[str] = []

    def __init__(self, python: str) -> None:
        self.started.append(python)
        self.pid = 4242
        self.closed = False

    def measure(self, reps: int, min_rep_s: float) -> float:
        return 0.5

    def close(self) -> None:
        self.closed = True


def test_a_simulated_device_throttles_its_probe_without_heating(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "ProbeWorker", FakeWorker)
    device = SimDevice()
    speed = SpeedIndex(tmp_path, device, "py")  # type: ignore[arg-type]
    assert speed.index() == 1.0 and speed.index() == 1.0
    assert FakeWorker.started == ["py"]  # one worker for the whole campaign
    assert device.calls == [("throttle", (4242, False)), ("unthrottle", None)] * 2
    worker = speed._worker
    speed.close()
    assert isinstance(worker, FakeWorker) and worker.closed and speed._worker is None


class ShellDevice:
    """An adb/ssh device whose shell answers the probe script with `answer`."""

    simulated = False
    kind = "ssh"

    def __init__(self, answer: str, rc: int = 0) -> None:
        self.answer, self.rc = answer, rc
        self.ran: list[list[str]] = []

    def run(self, argv: list[str], timeout: float) -> object:
        self.ran.append(list(argv))
        from types import SimpleNamespace

        return SimpleNamespace(stdout=self.answer, returncode=self.rc)


def test_an_ssh_devices_probe_runs_there_or_is_not_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def never() -> float:
        raise AssertionError("this machine's probe says nothing of the device")

    monkeypatch.setattr(entry, "speed_probe", never)
    device = ShellDevice("50000000\n40000000\n45000000\n")
    speed = SpeedIndex(tmp_path, device, "python")  # type: ignore[arg-type]
    assert speed.index() == 1.0 and speed.first == 0.04
    assert device.ran[0][:2] == ["sh", "-c"] and "date +%s%N" in device.ran[0][2]
    device.answer = "80000000\n"
    assert speed.index() == 0.5
    busybox = SpeedIndex(tmp_path / "b", ShellDevice("1733480000%N\n"),  # type: ignore[arg-type]
                         "python")
    (tmp_path / "b").mkdir()
    assert busybox.index() is None and busybox.first is None
