"""Energy per token and mean power of a cell (analysis/energy.py, DESIGN 12), on
constructed sample series with known truth: a battery's draw, RAPL counters that wrap, and
the readings that must give no figure (charging, plugged in, direction unknown)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abbench.analysis.energy import cell_energy
from abbench.records import Sample, keys

STEADY = np.full(128, 10.0)  # 100 tok/s


def battery(watts: list[float], status: str | None = "Discharging", dt: float = 0.25,
            **extra: object) -> list[Sample]:
    out = []
    for i, w in enumerate(watts):
        v: dict[str, object] = {keys.BATTERY_POWER_W: w, **extra}
        if status is not None:
            v[keys.BATTERY_STATUS] = status
        out.append(Sample(i * dt, 1000 + i * dt, v, 0))
    return out


def rapl(energies_uj: list[int], domain: str = "package-0", max_uj: int = 2**32,
         dt: float = 0.5) -> list[Sample]:
    return [Sample(i * dt, 1000 + i * dt, {keys.rapl_energy(domain): e,
                                           keys.rapl_max(domain): max_uj}, 0)
            for i, e in enumerate(energies_uj)]


def test_a_discharging_battery_gives_watts_over_tokens_per_second() -> None:
    rng = np.random.default_rng(0)
    e = cell_energy(battery(list(3.0 + 0.1 * rng.standard_normal(40))), STEADY, seed=1)
    assert e.source == "battery" and e.note is None
    assert e.power_w.estimate == pytest.approx(3.0, abs=0.05)
    assert e.power_w.low < 3.0 < e.power_w.high
    assert e.j_per_token.estimate == pytest.approx(e.power_w.estimate / 100.0)
    assert e.j_per_token.low < 0.03 < e.j_per_token.high


def test_the_interval_covers_the_truth_at_about_its_level() -> None:
    # Known truth: 2 W mean with noise on the power and on the token times; 200 cells.
    rng = np.random.default_rng(5)
    covered = 0
    for k in range(200):
        watts = list(2.0 + 0.2 * rng.standard_normal(30))
        steady = 10.0 * (1 + 0.05 * rng.standard_normal(64))
        e = cell_energy(battery(watts), steady, seed=k)
        covered += e.j_per_token.low <= 0.02 <= e.j_per_token.high
    assert 0.88 <= covered / 200 <= 0.995


@pytest.mark.parametrize("status", ["Charging", "Full", "Not charging"])
def test_a_charging_battery_gives_no_figure_and_says_why(status: str) -> None:
    samples = battery([3.0] * 10)
    samples[4] = battery([3.0], status=status)[0]
    e = cell_energy(samples, STEADY, seed=1)
    assert not e.known and e.source is None
    assert e.note is not None and status.lower() in e.note and "charger" in e.note


def test_plugged_in_or_direction_unknown_gives_no_figure() -> None:
    plugged = cell_energy(battery([3.0] * 10, **{keys.BATTERY_PLUGGED: True}), STEADY, seed=1)
    assert not plugged.known and "plugged in" in plugged.note
    unknown = cell_energy(battery([3.0] * 10, status=None), STEADY, seed=1)
    assert not unknown.known and "direction" in unknown.note


def test_rapl_counters_are_differenced_across_a_wrap() -> None:
    # 5 W for 0.5 s = 2.5 J = 2_500_000 µJ per interval; the counter wraps at 10 J.
    wrap = 10_000_000
    counters = [(7_000_000 + i * 2_500_000) % wrap for i in range(9)]
    assert any(b < a for a, b in zip(counters, counters[1:]))
    e = cell_energy(rapl(counters, max_uj=wrap), STEADY, seed=1)
    assert e.source == "rapl package-0"
    assert e.power_w.estimate == pytest.approx(5.0)
    assert e.j_per_token.estimate == pytest.approx(0.05)


def test_psys_is_preferred_and_a_wrap_without_its_range_is_skipped() -> None:
    samples = rapl([0, 1_000_000, 2_000_000], domain="package-0")
    for s, e in zip(samples, [0, 4_000_000, 8_000_000]):
        s.values[keys.rapl_energy("psys")] = e
    assert cell_energy(samples, STEADY, seed=1).source == "rapl psys"
    odd = [Sample(0.0, 0.0, {keys.rapl_energy("package-0"): 5_000_000}, 0),
           Sample(0.5, 0.5, {keys.rapl_energy("package-0"): 1_000}, 0),  # reset, no range
           Sample(1.0, 1.0, {keys.rapl_energy("package-0"): 1_501_000}, 0)]
    e = cell_energy(odd, STEADY, seed=1)
    assert e.power_w.estimate == pytest.approx(3.0)  # only the second interval counts


def test_a_charging_battery_falls_back_to_rapl_and_says_so() -> None:
    samples = rapl([0, 2_000_000, 4_000_000, 6_000_000])
    for s in samples:
        s.values[keys.BATTERY_POWER_W] = 9.0
        s.values[keys.BATTERY_STATUS] = "Charging"
    e = cell_energy(samples, STEADY, seed=1)
    assert e.source == "rapl package-0" and e.power_w.estimate == pytest.approx(4.0)
    assert "charging" in e.note and "RAPL package-0 used" in e.note


def test_nothing_recorded_or_one_reading_or_no_steady_window() -> None:
    assert not cell_energy([], STEADY, seed=1).known
    assert cell_energy([], STEADY, seed=1).note is None
    one = cell_energy(battery([2.5]), STEADY, seed=1)
    assert one.j_per_token.estimate == pytest.approx(0.025)
    assert math.isnan(one.j_per_token.low)  # one reading: no interval
    short = cell_energy(battery([2.5] * 5), np.array([10.0]), seed=1)
    assert short.power_w.estimate == pytest.approx(2.5) and short.j_per_token is None
