"""Bursts on the simulated device: the profile's `[bursts]` table, the schedule drawn from
its seed, the share of each duty period a process runs during a burst, and the foreign
load a visible burst shows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from abbench.errors import UsageError
from abbench.records import keys
from abbench.records.toml import tomllib
from abbench.sim.bursts import Bursts, BurstSchedule
from abbench.sim.device import SimulatedDevice
from abbench.sim.profile import Profile, load_profile, profile_text

SPEC = Bursts(rate_per_min=1.0, duration_s=(20.0, 60.0), depth=(0.2, 0.4), seed=7)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _raw(name: str = "phone-bursts") -> dict[str, Any]:
    return tomllib.loads(profile_text(name)[0])


def test_the_bursts_profile_loads_and_plain_profiles_have_none() -> None:
    p = load_profile("phone-bursts")
    assert p.bursts is not None and p.bursts.rate_per_min > 0
    assert 0.2 <= p.bursts.depth[0] <= p.bursts.depth[1] <= 0.4
    assert load_profile("phone").bursts is None
    # phone-bursts is phone plus bursts: the same thermal model
    phone = dataclasses.replace(load_profile("phone"), name=p.name, bursts=p.bursts)
    assert phone == p


@pytest.mark.parametrize("change, match", [
    ({"rate_per_min": -1}, r"`bursts\.rate_per_min`: = -1"),
    ({"depth": [0.4, 0.2]}, r"`bursts\.depth`: = \[0\.4, 0\.2\]"),
    ({"depth": [0.2, 1.0]}, r"`bursts\.depth`"),
    ({"depth": [0.2]}, r"`bursts\.depth`: must be two numbers"),
    ({"duration_s": [0, 10]}, r"`bursts\.duration_s`"),
    ({"duration_s": "long"}, r"`bursts\.duration_s`: expected an array of numbers"),
    ({"visible": 1}, r"`bursts\.visible`: expected a boolean"),
    ({"seed": -3}, r"`bursts\.seed`"),
    ({"sed": 3}, r"`bursts\.sed`: unknown key"),
])
def test_bad_bursts_keys_are_one_message_naming_the_key(change: dict, match: str) -> None:
    d = _raw()
    d["bursts"] = d["bursts"] | change
    with pytest.raises(UsageError, match=r"simulated device profile test: " + match) as e:
        Profile.from_dict(d, "test")
    if "sed" in change:
        assert e.value.tip == "did you mean `seed`?"


def test_the_schedule_is_the_seeds_whatever_order_it_is_asked_in() -> None:
    forward, backward = BurstSchedule(SPEC), BurstSchedule(SPEC)
    for t in range(0, 3600, 7):
        forward.depth_at(float(t))
    assert backward.depth_at(3600.0) == forward.depth_at(3600.0)
    assert backward.until(3600.0) == forward.until(3600.0)
    other = BurstSchedule(dataclasses.replace(SPEC, seed=8)).until(3600.0)
    assert other != forward.until(3600.0)
    bursts = forward.until(36_000.0)
    for b, nxt in zip(bursts, bursts[1:]):
        assert 20.0 <= b.end_s - b.start_s <= 60.0 and 0.2 <= b.depth <= 0.4
        assert nxt.start_s >= b.end_s  # two states: quiet or one burst
    # quiet spells average 60 s / rate_per_min (about 600 of them here)
    quiet = [nxt.start_s - b.end_s for b, nxt in zip(bursts, bursts[1:])]
    assert 50.0 < sum(quiet) / len(quiet) < 70.0
    assert BurstSchedule(dataclasses.replace(SPEC, rate_per_min=0.0)).until(1e6) == []


def test_depth_at_and_mean_depth_follow_the_bursts() -> None:
    s = BurstSchedule(SPEC)
    b = s.until(600.0)[0]
    assert s.depth_at(b.start_s - 0.01) == 0.0
    assert s.depth_at(b.start_s) == b.depth == s.depth_at(b.end_s - 0.01)
    assert s.depth_at(b.end_s) == 0.0
    length = b.end_s - b.start_s
    # half a span inside the burst, half before it
    assert s.mean_depth(b.start_s - length, b.end_s) == pytest.approx(b.depth / 2)
    assert s.mean_depth(b.start_s, b.start_s) == 0.0


def _device(bursts: Bursts | None) -> tuple[SimulatedDevice, Clock]:
    clock = Clock()
    profile = dataclasses.replace(load_profile("phone"), bursts=bursts)
    return SimulatedDevice(profile, clock=clock, background=False), clock


def test_a_burst_takes_its_depth_off_the_share_each_duty_period_runs() -> None:
    dev, clock = _device(SPEC)
    try:
        assert dev.bursts is not None
        b = dev.bursts.until(600.0)[0]
        scale = dev.time_scale
        clock.t = (b.start_s - 1.0) / scale  # wall seconds: simulated / time scale
        assert dev.burst_depth() == 0.0 and dev.run_fraction() == dev.probe_factor() == 1.0
        clock.t = (b.start_s + 1.0) / scale
        assert dev.burst_depth() == b.depth
        assert dev.run_fraction() == pytest.approx(1.0 - b.depth)
        dev.force_clock_fraction(0.5)  # capped and in a burst: both slow it
        assert dev.run_fraction() == pytest.approx(0.5 * (1.0 - b.depth))
        clock.t = (b.end_s + 0.1) / scale
        assert dev.run_fraction() == pytest.approx(0.5)
    finally:
        dev.close()


@pytest.mark.parametrize("visible", [True, False])
def test_a_visible_burst_shows_as_foreign_load(monkeypatch, visible: bool) -> None:
    dev, clock = _device(dataclasses.replace(SPEC, visible=visible))
    try:
        assert dev.bursts is not None
        # this machine's own foreign load, held still: what the sensor reads without bursts
        monkeypatch.setattr(dev._cpu, "read", lambda *_: {keys.FOREIGN_CORES: 0.1})
        b = dev.bursts.until(600.0)[0]
        clock.t = b.start_s / dev.time_scale
        dev.sample()
        clock.t = b.end_s / dev.time_scale  # this reading's interval: the whole burst
        inside = dev.sample()[keys.FOREIGN_CORES]
        cores = dev._cores
        assert inside == pytest.approx(0.1 + b.depth * cores if visible else 0.1, abs=1e-3)
        quiet_end = dev.bursts.until(10_000.0)[1].start_s
        clock.t = quiet_end / dev.time_scale  # a quiet interval: the real value only
        assert dev.sample()[keys.FOREIGN_CORES] == pytest.approx(0.1)
        # unknown stays unknown: no value from the sensor, none added
        monkeypatch.setattr(dev._cpu, "read", lambda *_: {})
        clock.t += 10.0
        assert keys.FOREIGN_CORES not in dev.sample()
    finally:
        dev.close()
