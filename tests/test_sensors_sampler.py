"""The sampler thread: ticks, sink calls, gaps that never kill it, a clean stop."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from abbench.errors import ConfigError
from abbench.sensors import Sampler, open_device

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"


class Flaky:
    """Raises on every third sample."""

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> dict[str, Any]:
        self.n += 1
        if self.n % 3 == 0:
            raise OSError("sensor vanished")
        return {"n": self.n}


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_ticks_call_the_sink_with_timestamps() -> None:
    got: list[tuple[float, float, dict[str, Any]]] = []
    device = open_device("local", root=FIXTURES / "android-qwen")
    with Sampler(device, hz=100, sink=lambda m, w, v: got.append((m, w, v))) as s:
        wait_for(lambda: len(got) >= 5)
        assert s.running
    assert not s.running
    assert s.gaps == 0 and s.ticks == len(got)
    monos = [m for m, _, _ in got]
    assert monos == sorted(monos)
    assert all(abs(w - time.time()) < 60 for _, w, _ in got)
    assert got[-1][2]["cpu.policy0.cap_khz"] == 2188800
    assert s.latest == got[-1][2]


def test_first_sample_is_immediate() -> None:
    got: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with Sampler(Flaky(), hz=0.1, sink=lambda m, w, v: got.append(v)):
        wait_for(lambda: got)
    assert time.monotonic() - t0 < 2  # neither waited a 10 s tick nor hung on exit


def test_failing_sample_and_sink_leave_gaps() -> None:
    seen: list[int] = []

    def sink(t_mono: float, t_wall: float, values: dict[str, Any]) -> None:
        seen.append(values["n"])
        if values["n"] == 4:
            raise ValueError("disk full")

    with Sampler(Flaky(), hz=200, sink=sink) as s:
        wait_for(lambda: s.ticks >= 12)
        assert s.running
    assert 3 not in seen and 6 not in seen and 4 in seen and 5 in seen
    assert s.gaps >= 5                  # samples 3, 6, 9, 12 and the sink at 4
    assert s.last_error is not None
    assert s.ticks == len(seen) + s.gaps - 1   # sample 4 reached the sink, then failed


def test_stops_when_the_block_raises() -> None:
    with pytest.raises(KeyError), Sampler(Flaky(), hz=50) as s:
        wait_for(lambda: s.ticks >= 1)
        raise KeyError("campaign failed")
    assert not s.running
    assert not any(t.name == "abbench-sampler" and t.is_alive() for t in threading.enumerate()
                   if t is s._thread)


def test_latest_starts_empty_and_no_sink_is_fine() -> None:
    s = Sampler(Flaky(), hz=100)
    assert s.latest == {} and s.ticks == 0
    with s:
        wait_for(lambda: s.latest)
    assert s.latest["n"] >= 1


def test_a_hung_device_does_not_hang_the_exit() -> None:
    release = threading.Event()

    class Hung:
        def sample(self) -> dict[str, Any]:
            release.wait(10)
            return {}

    t0 = time.monotonic()
    with Sampler(Hung(), hz=10, join_timeout_s=0.2):
        time.sleep(0.05)
    assert time.monotonic() - t0 < 2
    release.set()


@pytest.mark.parametrize("hz", [0, -1, float("nan"), float("inf")])
def test_bad_rate(hz: float) -> None:
    with pytest.raises(ConfigError):
        Sampler(Flaky(), hz=hz)
