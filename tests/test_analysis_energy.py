"""Energy per token and mean power of a cell (analysis/energy.py,
docs/sensors.md#power-and-energy), on
constructed sample series with known truth: a battery's draw, RAPL counters that wrap, and
the readings that must give no figure (charging, plugged in, direction unknown)."""

from __future__ import annotations

import json
import math
from pathlib import Path

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


# -- from the readers' fixture trees (tests/fixtures/sensors) to J/token --------------------

SENSORS = Path(__file__).parent / "fixtures" / "sensors"


def _ticks(tree: Path, n: int = 8, dt: float = 0.5) -> list[Sample]:
    """n ticks of a device whose files do not change, as the sampler would record them."""
    from abbench.sensors.readers import collect_battery, collect_rapl

    values = {**collect_battery(tree), **collect_rapl(tree)}
    return [Sample(i * dt, 1000 + i * dt, dict(values), 0) for i in range(n)]


def test_an_android_battery_tree_gives_its_current_times_voltage_per_token() -> None:
    # current_now -612000 µA (negative: discharging), voltage_now 3862000 µV.
    e = cell_energy(_ticks(SENSORS / "android-power"), STEADY, seed=1)
    assert e.source == "battery"
    assert e.power_w.estimate == pytest.approx(0.612 * 3.862)
    assert e.j_per_token.estimate == pytest.approx(0.612 * 3.862 / 100)


def test_a_charging_android_tree_is_unusable_for_energy() -> None:
    e = cell_energy(_ticks(SENSORS / "android-power-charging"), STEADY, seed=1)
    assert not e.known and "charging" in e.note


def test_a_laptop_tree_prefers_its_battery_and_a_rapl_wrap_is_counted(tmp_path: Path) -> None:
    laptop = SENSORS / "laptop-power"
    e = cell_energy(_ticks(laptop), STEADY, seed=1)
    assert e.source == "battery" and e.power_w.estimate == pytest.approx(8.734)
    # The same laptop's RAPL package counter over four ticks 0.5 s apart, wrapping once:
    # 3 J per interval = 6 W.
    import shutil

    from abbench.sensors.readers import collect_rapl

    tree = tmp_path / "t"
    shutil.copytree(laptop, tree)
    counter = tree / "sys/class/powercap/intel-rapl:0/energy_uj"
    wrap = int((tree / "sys/class/powercap/intel-rapl:0/max_energy_range_uj").read_text())
    ticks = []
    for i in range(4):
        counter.write_text(f"{(wrap - 4_000_000 + i * 3_000_000) % wrap}\n")
        v = {k: x for k, x in collect_rapl(tree).items() if "package" in k}
        ticks.append(Sample(i * 0.5, 1000 + i * 0.5, v, 0))
    assert ticks[2].values[keys.rapl_energy("package-0")] < \
        ticks[1].values[keys.rapl_energy("package-0")]  # wrapped
    e = cell_energy(ticks, STEADY, seed=1)
    assert e.source == "rapl package-0" and e.power_w.estimate == pytest.approx(6.0)
    assert e.j_per_token.estimate == pytest.approx(0.06)


# -- decisions on energy (metric = "energy_per_token"), by simulation with known truth -----


def _energy_run(tmp: Path, seed: int, candidate_w: float, rate_noise: float = 0.02,
                decision: dict | None = None) -> dict:
    from runs_helper import cell, make_run

    from abbench.analysis.campaign import analyze

    rng = np.random.default_rng(seed)
    cells = []
    for name in ["B", "C"] * 4:  # equal speed (100 tok/s); C draws candidate_w, B 3 W
        # cell-to-cell noise of 2% on the speed and the draw alike
        jitter = float(np.exp(0.02 * rng.standard_normal()))
        cells.append(cell(name, 100 * jitter, power=(3.0 if name == "B" else candidate_w)
                          * jitter, config=name, noise=rate_noise))
    run = make_run(tmp, cells, warmup=0, seed=seed, decisions=[decision or {
        "candidate": "C", "baseline": "B", "min_effect": 0.05,
        "metric": "energy_per_token"}])
    a = analyze(run)
    return {"decision": a.decisions[0], "analysis": a}


def test_a_candidate_drawing_a_fifth_less_power_is_a_go_on_energy(tmp_path: Path) -> None:
    # Truth: C's J/token is 0.8 of B's, so its tokens per joule 1.25 x.
    verdicts = []
    for k in range(6):
        (tmp_path / str(k)).mkdir()
        d = _energy_run(tmp_path / str(k), k, candidate_w=2.4)["decision"]
        assert d.metric == "energy_per_token"
        assert d.ratio.low < 1.25 < d.ratio.high or d.verdict == "GO"
        verdicts.append(d.verdict)
    assert verdicts.count("GO") >= 5, verdicts


def test_an_energy_a_a_never_says_go_and_the_report_says_energy(tmp_path: Path) -> None:
    from abbench.report import write_reports

    for k in range(6):
        (tmp_path / str(k)).mkdir()
        out = _energy_run(tmp_path / str(k), 100 + k, candidate_w=3.0)
        assert out["decision"].verdict != "GO", out["decision"].reason
    run = out["analysis"].run
    write_reports(run)
    report = json.loads((run / "report.json").read_text())
    assert report["decisions"][0]["metric"] == "energy_per_token"
    md = (run / "report.md").read_text()
    assert "J/token lower by 0.05" in md and "energy per token than B" in md


def test_an_energy_decision_without_power_readings_is_owed_and_says_why(
        tmp_path: Path) -> None:
    from runs_helper import cell, make_run

    from abbench.analysis.campaign import analyze

    run = make_run(tmp_path, [cell("B", 100), cell("C", 100)], decisions=[{
        "candidate": "C", "baseline": "B", "metric": "energy_per_token"}])
    (d,) = analyze(run).decisions
    assert d.verdict == "OWED"
    (u,) = d.unmatched
    assert "no energy figure for cell" in u.match.reasons[-1]
