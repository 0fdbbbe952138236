"""Matched pairs: every criterion with its values; caps changing; not measured; drift."""

from __future__ import annotations

from pathlib import Path

from runs_helper import AT_MAX, cell, make_run

from abbench.analysis.campaign import analyze

CAPPED = {"policy0": 2_000_000, "policy4": 2_200_000}


def crit(pair, name):  # type: ignore[no-untyped-def]
    return next(c for c in pair.criteria if c.name == name)


def test_pair_matched_on_every_criterion(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44)])
    (p,) = analyze(run).pairs
    assert p.state == "matched", p.reasons
    assert {c.name: c.status for c in p.criteria} == {
        "status": "ok", "adjacent": "ok", "gap": "ok", "gate": "ok", "caps": "ok",
        "cpu_temp": "ok", "battery_temp": "ok", "mem_available": "ok", "probe": "ok",
        "thermal_status": "not measured"}
    assert crit(p, "cpu_temp").first == 40.0 and crit(p, "cpu_temp").tolerance == 3.0


def test_caps_engaged_mid_cell_or_different_caps_unmatch(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44, caps_during=[AT_MAX, CAPPED]),
                              cell("B", 40, caps=CAPPED)])
    a = analyze(run)
    p1, p2 = a.pairs
    assert p1.state == "unmatched" and "caps changed during cell 2" in crit(p1, "caps").detail
    assert p2.state == "unmatched"
    assert a.cells[1].during.capped == ("policy4",)
    assert a.caps_timeline == ("policy4 capped from cell 2 (2.40 → 2.20 GHz)",)


def test_tolerances_gate_and_gap(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44, cpu_temp=44.0),
                              cell("D", 44, cpu_temp=44.0, battery_temp=30.4, mem=6500,
                                   gave_up=True, gap_s=2000),
                              cell("E", 44, cpu_temp=44.0, battery_temp=30.4, mem=6500,
                                   probe=1.02)])
    p1, p2, p3 = analyze(run).pairs
    assert p1.state == "unmatched" and "differ by 4.00 °C (> 3 °C)" in crit(p1, "cpu_temp").detail
    assert crit(p2, "gate").status == "fail" and crit(p2, "mem_available").status == "fail"
    assert crit(p2, "battery_temp").status == "ok"
    assert crit(p3, "gap").status == "fail" and "(> 900 s)" in crit(p3, "gap").detail
    assert crit(p3, "probe").status == "ok"


def test_absent_sensors_are_not_measured_and_probe_only_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, caps=None, cpu_temp=None, battery_temp=None,
                                   mem=None),
                              cell("C", 44, caps=None, cpu_temp=None, battery_temp=None,
                                   mem=None)])
    (p,) = analyze(run).pairs
    assert p.state == "matched"
    assert crit(p, "caps").status == "not measured"
    assert "speed probe only" in (p.note or "")


def test_no_device_state_makes_pairs_unverified(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44)], state=False)
    a = analyze(run)
    assert not a.device_state_recorded
    assert a.pairs[0].state == "unverified"


def test_sentinel_with_equal_fingerprint_and_minus_17_percent_is_drift(tmp_path: Path) -> None:
    run = make_run(tmp_path, [
        cell("B", 4.77, fingerprint="sha256:same"),
        cell("retention-only", 4.5, caps_during=[CAPPED], cpu_temp=44.0),
        cell("spec-2", 3.14, caps=CAPPED, cpu_temp=46.0),
        cell("B", 3.96, caps=CAPPED, cpu_temp=47.0, fingerprint="sha256:same", sentinel_of=0),
    ])
    (d,) = analyze(run).drift
    assert d.verdict == "drift" and d.fingerprints == "equal"
    assert abs(d.ratio.estimate - 3.96 / 4.77) < 0.02
    assert "policy4 capped from cell 2" in d.summary
    assert "CPU temperature at entry rose 40.0 → 47.0 °C" in d.summary
    assert "identical work" in d.summary


def test_sentinel_with_different_fingerprint_is_not_deterministic(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, fingerprint="sha256:a"), cell("C", 40),
                              cell("B", 30, fingerprint="sha256:b", sentinel_of=0)])
    (d,) = analyze(run).drift
    assert d.verdict == "not deterministic"
    assert "not deterministic in that configuration" in d.summary


def test_stable_sentinel(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, fingerprint="f"), cell("C", 40),
                              cell("B", 40, fingerprint="f", sentinel_of=0)])
    assert analyze(run).drift[0].verdict == "stable"


def test_contamination_tells(tmp_path: Path) -> None:
    run = make_run(tmp_path, [
        cell("B", 40, cpu_temp=40.0, dropped=16),
        # B's configuration again (the tells hold a cell against the same kernels)
        cell("C", 30, config="B", cpu_temp=42.0, compute_ms=14.0, read_bytes=3 * 2**20,
             majflt=5, cpu_ms=10.0),
        cell("D", 30, cpu_temp=44.0),
    ])
    tells = analyze(run).tells
    kinds = {(t.cell, t.kind) for t in tells}
    assert (1, "compute_up_work_down") in kinds
    assert (1, "majflt") in kinds
    assert (1, "occupancy_fall") in kinds
    assert (0, "drops") in kinds
    assert (None, "entry_degrading") in kinds
    (drops,) = [t for t in tells if t.kind == "drops"]
    assert "12.5%" in drops.detail
    (degrading,) = [t for t in tells if t.kind == "entry_degrading"]
    assert "40.0 → 42.0 → 44.0 °C" in degrading.detail


def test_a_slide_within_tolerance_is_not_a_tell(tmp_path: Path) -> None:
    """Found on a 128 GiB machine: MemAvailable fell 13 MiB over three cells and was
    flagged; a slide smaller than the matching tolerance is noise."""
    run = make_run(tmp_path, [cell("B", 40, cpu_temp=40.0), cell("C", 40, cpu_temp=41.0),
                              cell("D", 40, cpu_temp=42.5)])
    assert not [t for t in analyze(run).tells if t.kind == "entry_degrading"]


def test_a_sentinel_that_ran_faster_is_not_blamed_on_a_slower_device(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, fingerprint="f"), cell("C", 40),
                              cell("B", 48, fingerprint="f", sentinel_of=0)])
    (d,) = analyze(run).drift
    assert d.verdict == "drift" and d.ratio is not None and d.ratio.estimate > 1
    assert d.attribution == () and "ran faster at the end" in d.summary


# --- the foreign load (docs/method.md#foreign-load) -----------------------------------------

FOREIGN = {"foreign_load_tol": 0.25}


def test_foreign_load_holds_fails_or_is_not_measured(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, foreign=0.10), cell("C", 44, foreign=0.30),
                              cell("B", 40, foreign=1.10), cell("C", 44)], match=FOREIGN)
    a = analyze(run)
    assert a.cells[0].during.foreign_cores == 0.10
    assert a.cells[3].during.foreign_cores is None
    held, failed, unknown = (crit(p, "foreign_load") for p in a.pairs)
    assert (held.status, held.first, held.second, held.tolerance) == ("ok", 0.10, 0.30, 0.25)
    assert held.detail == ("foreign load 0.10 vs 0.30 cores: differ by 0.20 cores "
                           "(<= 0.25 cores)")
    assert failed.status == "fail" and a.pairs[1].state == "unmatched"
    assert "differ by 0.80 cores (> 0.25 cores)" in failed.detail
    assert failed.detail in a.pairs[1].reasons
    assert unknown.status == "not measured" and a.pairs[2].state == "matched"
    assert unknown.detail == "foreign load not measured at cell 4"
    assert "foreign load" in (a.pairs[2].note or "")


def test_foreign_load_is_a_criterion_only_where_the_plan_sets_it(tmp_path: Path) -> None:
    """Plans written before it hold no tolerance: their pairs stay as they were."""
    run = make_run(tmp_path, [cell("B", 40, foreign=0.1), cell("C", 44, foreign=2.0)])
    (p,) = analyze(run).pairs
    assert "foreign_load" not in {c.name for c in p.criteria} and p.state == "matched"


def test_a_pair_unmatched_by_foreign_load_says_what_would_settle_it(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, foreign=0.0), cell("C", 44, foreign=1.5)],
                   decisions=[{"candidate": "C", "baseline": "B", "min_effect": 0.03}],
                   match=FOREIGN)
    (d,) = analyze(run).decisions
    assert d.verdict == "OWED" and "a quieter device" in (d.settle or "")
    assert "foreign_load_tol" in (d.settle or "")
