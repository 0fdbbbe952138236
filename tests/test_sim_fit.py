"""`abbench sim fit`: run folders recorded from a known profile, without waiting on a clock
(the ThermalModel driven through a synthetic schedule, or the SimulatedDevice on a fake
clock), fitted through the real CLI; the profile's constants must come back."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import run_main

from abbench.commands.sim import render_toml
from abbench.records import CellRecord, EntryState, Plan, PlannedCell, Sample, append_jsonl
from abbench.records.cell_config import cell_config
from abbench.sim.device import SimulatedDevice, ThermalModel
from abbench.sim.fit import read_timeline
from abbench.sim.profile import Profile, Trip, load_profile
from abbench.sim.thermal import Segment, simulate

HZ = 2.0
FITTED = ("heat_c_per_s", "soc_tau_s", "case_tau_s", "ambient_tau_s", "ambient_c",
          "idle_load")
# (start, end) wall s: six 40 s cells, 30-120 s apart, boundaries off the sampling grid
CELLS = ((20.3, 60.3), (90.1, 130.1), (190.7, 230.7), (320.2, 360.2), (480.9, 520.9),
         (565.4, 605.4))
END_S = 725.0


def known_profile(time_scale: float = 1.0) -> Profile:
    """The shipped phone's clusters (and any keys added since) with constants of our own,
    so the test does not move when the shipped numbers are re-tuned."""
    base = load_profile("phone")
    hw = {c.policy: c.hw_max_khz for c in base.clusters}
    last = base.clusters[-1].policy
    trips = (Trip(42.0, {last: int(hw[last] * 0.75)}),
             Trip(46.0, {p: int(h * 0.6) for p, h in hw.items()}))
    return dataclasses.replace(
        base, name="known", time_scale=time_scale, idle_load=0.1, ambient_c=25.0,
        start_soc_c=35.0, start_case_c=30.0, heat_c_per_s=1.0, soc_tau_s=20.0,
        case_tau_s=300.0, ambient_tau_s=150.0, hysteresis_c=3.0, trip_sensor="soc",
        trips=trips)


def profile_file(profile: Profile, path: Path) -> Path:
    d = {k: v for k, v in dataclasses.asdict(profile).items() if v is not None}
    path.write_text(render_toml(d, ["the known profile"]), encoding="utf-8")
    assert load_profile(str(path)) == profile
    return path


def write_run(folder: Path, device: str, spans: Sequence[tuple[float, float]],
              samples: Sequence[Sample]) -> Path:
    """A run folder as `abbench campaign` leaves it: plan, journal, samples."""
    folder.mkdir(parents=True)
    cells = tuple(PlannedCell(i, "B", cell_config({}), label=f"{i:02d}-B")
                  for i in range(len(spans)))
    plan = Plan("simfit-test", cells, spacing_s=30.0, warmup_tokens=0, device=device)
    (folder / "plan.json").write_text(json.dumps(plan.to_json()), encoding="utf-8")
    for i, (t0, t1) in enumerate(spans):
        append_jsonl(folder / "journal.jsonl", CellRecord(
            index=i, name="B", label=f"{i:02d}-B", status="ok", t_start_wall=1e9 + t0,
            t_end_wall=1e9 + t1, t_start_mono=t0, t_end_mono=t1,
            entry=EntryState(t_wall=1e9 + t0, simulated=True)).to_json(), fsync=False)
    for s in samples:
        append_jsonl(folder / "samples.jsonl", s.to_json(), fsync=False)
    return folder


def _cell_at(t: float, spans: Sequence[tuple[float, float]]) -> int | None:
    return next((i for i, (a, b) in enumerate(spans) if a <= t < b), None)


def drive_model(profile: Profile, spans: Sequence[tuple[float, float]] = CELLS,
                end_s: float = END_S) -> list[Sample]:
    """Samples at HZ from a ThermalModel run through `spans` (wall s): load 1 inside a span,
    idle_load outside, switched exactly at the span edges; rounded as the tree rounds."""
    model = ThermalModel(profile)
    edges = sorted({x for span in spans for x in span})
    out, t, k = [], 0.0, 0
    while t <= end_s:
        caps = model.caps_khz()
        values: dict[str, Any] = {"temp.cpu_c": round(model.soc_c * 1000) / 1000,
                                  "battery.temp_c": round(model.case_c * 10) / 10,
                                  "mem.total_mib": 11449, "mem.available_mib": 6000}
        for c in profile.clusters:
            values[f"cpu.{c.policy}.cap_khz"] = caps[c.policy]
            values[f"cpu.{c.policy}.hw_max_khz"] = c.hw_max_khz
        out.append(Sample(t, 1e9 + t, values, _cell_at(t, spans)))
        k += 1
        nxt = k / HZ
        for a, b in zip([t, *[e for e in edges if t < e < nxt]],
                        [*[e for e in edges if t < e < nxt], nxt]):
            load = 1.0 if _cell_at((a + b) / 2, spans) is not None else profile.idle_load
            model.advance((b - a) * profile.time_scale, load)
        t = nxt
    return out


def fit(capsys: pytest.CaptureFixture[str], run: Path, out: Path, *extra: str
        ) -> tuple[Profile, str]:
    rc, stdout, stderr = run_main(["sim", "fit", str(run), "-o", str(out), *extra], capsys)
    assert rc == 0, stdout + stderr
    return load_profile(str(out)), stdout


def assert_recovered(got: Profile, true: Profile, tol: float = 0.10) -> None:
    for key in FITTED:
        assert getattr(got, key) == pytest.approx(getattr(true, key), rel=tol), key
    composed = []  # what each engaged level caps, trip caps compose by min
    caps = {c.policy: c.hw_max_khz for c in true.clusters}
    for t in true.trips:
        caps = {p: min(v, t.caps_khz.get(p, v)) for p, v in caps.items()}
        composed.append({p: v for p, v in caps.items()
                         if v < dict((c.policy, c.hw_max_khz) for c in true.clusters)[p]})
    assert [dict(t.caps_khz) for t in got.trips] == composed
    for g, t in zip(got.trips, true.trips):
        assert g.temp_c == pytest.approx(t.temp_c, abs=0.3)
    assert got.clusters == true.clusters


# -- the fit through the CLI -----------------------------------------------------------------


def test_fit_recovers_a_known_profile(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    true = known_profile()
    spec = f"sim:{profile_file(true, tmp_path / 'known.toml')}"
    run = write_run(tmp_path / "run", spec, CELLS, drive_model(true))
    got, stdout = fit(capsys, run, tmp_path / "fitted.toml")
    assert_recovered(got, true)
    assert got.hysteresis_c == pytest.approx(true.hysteresis_c, rel=0.1)
    assert got.time_scale == 1.0 and got.name == "fitted"
    text = (tmp_path / "fitted.toml").read_text()
    assert "start_soc_c =" not in text  # a planned campaign starts on a cool device
    assert str(run.resolve()) in text and "Residual RMS: SoC" in text
    assert "idle_load" in stdout and "residual RMS" in stdout
    assert f'transport = "sim:{tmp_path / "fitted.toml"}"' in stdout


def test_time_scale_from_the_source_profile_and_from_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    true = known_profile(time_scale=4.0)  # the same heating, in a quarter of the wall time
    spans = [(a / 4, b / 4) for a, b in CELLS]
    samples = drive_model(true, spans, END_S / 4)
    spec = f"sim:{profile_file(true, tmp_path / 'known.toml')}"
    got, _ = fit(capsys, write_run(tmp_path / "sim", spec, spans, samples),
                 tmp_path / "a.toml")
    assert got.time_scale == 4.0
    assert_recovered(got, true, tol=0.15)
    # a real device's run is fitted at time scale 1 unless told otherwise
    got, _ = fit(capsys, write_run(tmp_path / "real", "adb:R5CT", spans, samples),
                 tmp_path / "b.toml", "--time-scale", "4", "--idle-load", "0.1")
    assert got.time_scale == 4.0 and got.idle_load == 0.1
    assert_recovered(got, true, tol=0.15)


def test_recorded_on_the_simulated_device(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The same fit on samples the SimulatedDevice wrote and its readers read back, at
    time scale 4 (each sample rewrites the tree: a quarter of the samples)."""
    true = known_profile(time_scale=4.0)
    spec = f"sim:{profile_file(true, tmp_path / 'known.toml')}"
    # attach/detach happen on a sampler tick, so the journal's spans start and end on one
    spans = [(math.ceil(a * HZ / 4) / HZ, math.ceil(b * HZ / 4) / HZ) for a, b in CELLS]
    clock = FakeClock()
    dev = SimulatedDevice(true, spec, clock=clock, background=False)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    samples = []
    try:
        for k in range(int(END_S / 4 * HZ) + 1):
            clock.t = k / HZ
            if any(clock.t == a for a, _ in spans):
                dev.throttle(child.pid)
            elif any(clock.t == b for _, b in spans):
                dev.unthrottle()
            samples.append(Sample(clock.t, 1e9 + clock.t, dev.sample(),
                                  _cell_at(clock.t, spans)))
    finally:
        dev.close()
        child.kill()
        child.wait()
    got, _ = fit(capsys, write_run(tmp_path / "run", spec, spans, samples),
                 tmp_path / "fitted.toml")
    assert got.time_scale == 4.0
    assert_recovered(got, true)


def test_trips_on_the_case_are_told_apart(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A device whose trips read a skin sensor (the case): engagements agree on the case
    to its 0.1 °C steps, and disagree on the SoC."""
    base = known_profile()
    true = dataclasses.replace(base, trip_sensor="case", hysteresis_c=0.4, trips=(
        Trip(29.6, dict(base.trips[0].caps_khz)), Trip(30.2, dict(base.trips[1].caps_khz))))
    spec = f"sim:{profile_file(true, tmp_path / 'known.toml')}"
    got, stdout = fit(capsys, write_run(tmp_path / "run", spec, CELLS, drive_model(true)),
                      tmp_path / "fitted.toml")
    assert got.trip_sensor == "case"
    assert_recovered(got, true)
    assert got.hysteresis_c == pytest.approx(0.4, abs=0.1)
    assert "case temperature where caps were lifted" in stdout


def test_a_gap_in_the_timeline_restarts_from_the_measured_state(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A resumed campaign: minutes without samples (and a cell in them) between two parts;
    each part is integrated from its own first sample."""
    true = known_profile()
    samples = [s for s in drive_model(true) if not 250 <= s.t_mono < 420]
    spec = f"sim:{profile_file(true, tmp_path / 'known.toml')}"
    run = write_run(tmp_path / "run", spec, CELLS, samples)
    assert len(read_timeline(run, 1.0).segments) == 2
    got, _ = fit(capsys, run, tmp_path / "fitted.toml")
    assert_recovered(got, true)


def test_a_run_without_caps_gets_a_placeholder_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    true = dataclasses.replace(known_profile(), trips=())
    samples = _strip(drive_model(true), lambda k: k.startswith("cpu."))
    run = write_run(tmp_path / "run", "ssh:lab", CELLS, samples)
    rc, _, stderr = run_main(["sim", "fit", str(run), "-o", str(tmp_path / "p.toml")], capsys)
    assert rc == 0 and "WARNING: the run has no cpufreq caps" in stderr
    got = load_profile(str(tmp_path / "p.toml"))
    assert len(got.clusters) == 1 and got.trips == () and got.time_scale == 1.0
    assert got.soc_tau_s == pytest.approx(true.soc_tau_s, rel=0.1)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# -- refusals --------------------------------------------------------------------------------


def _strip(samples: list[Sample], drop: Callable[[str], bool]) -> list[Sample]:
    return [dataclasses.replace(s, values={k: v for k, v in s.values.items() if not drop(k)})
            for s in samples]


@pytest.mark.parametrize("case, says", [
    ("sensorless", "CPU temperature (`temp.cpu_c`)"),
    ("short", "the fit needs at least"),
    ("missing", "no such run folder"),
    ("no-plan", "not a run folder"),
    ("cold", "no cell ran"),
    ("lost-profile", "whose profile cannot be loaded"),
])
def test_bad_runs_are_refused_with_one_error(case: str, says: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    true = known_profile()
    samples = drive_model(true, CELLS[:1], 80.0)
    run = tmp_path / "run"
    if case == "sensorless":
        write_run(run, "local", CELLS[:1], _strip(samples, lambda k: k.startswith("temp.")))
    elif case == "short":
        write_run(run, "local", CELLS[:1], samples[40:70])
    elif case == "no-plan":
        write_run(run, "local", CELLS[:1], samples)
        (run / "plan.json").unlink()
    elif case == "cold":
        write_run(run, "local", (), samples)
    elif case == "lost-profile":
        write_run(run, f"sim:{tmp_path / 'gone.toml'}", CELLS[:1], samples)
    out = tmp_path / "p.toml"
    rc, stdout, stderr = run_main(["sim", "fit", str(run), "-o", str(out)], capsys)
    lines = stderr.strip().splitlines()
    assert rc == 2 and stdout == "" and not out.exists()
    assert len([x for x in lines if x.startswith("ERROR:")]) == 1, stderr
    assert lines[0].startswith("ERROR: ") and str(run) in lines[0] and says in lines[0]


def test_output_must_be_a_toml_file(tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, stderr = run_main(["sim", "fit", str(tmp_path), "-o", str(tmp_path / "x.txt")],
                             capsys)
    assert rc == 2 and stderr.startswith("ERROR: the profile must be a .toml file")


# -- the integrator against the simulator ----------------------------------------------------


def test_exact_integration_matches_the_thermal_model() -> None:
    """An independent check of `simulate`: the sim's own Euler steps, no trips, a load step."""
    p = dataclasses.replace(known_profile(), trips=())
    model = ThermalModel(p)
    soc, case = [model.soc_c], [model.case_c]
    for k in range(400):  # 100 s idle, then 100 s loaded, in 0.5 s samples
        model.advance(0.5, p.idle_load if k < 200 else 1.0)
        soc.append(model.soc_c)
        case.append(model.case_c)
    import numpy as np
    busy = np.array([0.0] * 200 + [1.0] * 200)
    seg = Segment(np.full(400, 0.5), busy, np.ones(400), np.arange(401), 0)
    v = {k: getattr(p, k) for k in FITTED}
    ms, mc = simulate(v, seg, p.start_soc_c, p.start_case_c)
    assert np.max(np.abs(ms - soc)) < 0.05 and np.max(np.abs(mc - case)) < 0.01
