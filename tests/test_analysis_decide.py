"""Decisions: GO / NO-GO / INCONCLUSIVE from matched pairs, OWED, unverified, order."""

from __future__ import annotations

import math
from pathlib import Path

from runs_helper import cell, make_run

from abbench.analysis.campaign import analyze
from abbench.analysis.decide import exit_status

DECIDE = [{"candidate": "C", "baseline": "B", "min_effect": 0.03}]
CAPPED = {"policy0": 2_000_000, "policy4": 2_200_000}


def one(tmp: Path, cells, decisions=DECIDE, **kw):  # type: ignore[no-untyped-def]
    a = analyze(make_run(tmp, cells, decisions, **kw))
    (d,) = a.decisions
    return a, d


def test_go_when_interval_above_min_effect(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 48)], floor=0.02)
    assert d.verdict == "GO" and a.exit_status == 0
    assert d.ratio.low > 1.03
    assert d.noise.source == "device history" and d.noise.df == 30


def test_no_noise_estimate_no_verdict(tmp_path: Path) -> None:
    # A 20% speed-up and a tight token-level interval, but nothing says how far the next
    # identical cell lands: no GO.
    a, d = one(tmp_path, [cell("B", 40), cell("C", 48)])
    assert d.verdict == "INCONCLUSIVE" and a.exit_status == 3
    assert "noise is unknown" in d.reason
    assert "abbench calibrate" in (d.settle or "") and "abba" in (d.settle or "")
    assert not a.noise.known


def test_repeats_in_the_campaign_give_the_noise(tmp_path: Path) -> None:
    cells = [cell("B", 40), cell("C", 48), cell("C", 48.5), cell("B", 40.6), cell("B", 39.7),
             cell("C", 48.2)]
    a, d = one(tmp_path, cells)
    assert a.noise.source == "this campaign"
    assert a.noise.df == 4 and a.groups == ((0, 3, 4), (1, 2, 5))
    assert d.verdict == "GO" and len(d.pairs) == 3
    assert 0 < a.noise.sd < 0.03


def test_an_arm_in_one_span_of_cells_gives_no_verdict_and_no_interval(tmp_path: Path) -> None:
    # B C C B: a burst of load across cells 2-3 would read as the effect, and the two C
    # cells' agreement as quiet (docs/method.md#bursts); the same cells with each arm
    # in two spans decide.
    cells = [cell("B", 40), cell("C", 48), cell("C", 48.5), cell("B", 40.6)]
    _, d = one(tmp_path, cells)
    assert d.verdict == "INCONCLUSIVE"
    assert "every C cell it compares ran in one span (cells 2-3)" in d.reason
    assert d.ratio is not None and d.ratio.estimate > 1.15
    assert math.isnan(d.ratio.low) and math.isnan(d.ratio.high)
    assert "interleave" in (d.settle or "")
    _, d = one(tmp_path / "two", [cell("C", 48), cell("B", 40), cell("C", 48.5),
                                  cell("B", 40.6)])
    assert d.verdict == "GO"


def test_a_burst_on_compared_cells_is_in_the_noise(tmp_path: Path) -> None:
    # C at cells 5-6 was slowed by a burst that its probe saw against cells 2-3, so they
    # are no repeats of 2-3; each is matched to its B neighbour, so the verdict compares
    # them, and its noise must see them (the sensors did not tell them from their pair).
    probes = [1.0, 1.0, 1.0, 1.0, 0.9, 0.9, 0.9]
    names = ["B", "C", "C", "B", "C", "C", "B"]
    rates = [40, 40.4, 39.8, 40.2, 28, 30, 29.5]
    cells = [cell(n, r, probe=p) for n, r, p in zip(names, rates, probes)]
    a, d = one(tmp_path, cells)
    assert (1, 2) in a.groups  # the campaign's repeat groups leave 5-6 apart ...
    assert d.noise is not None and d.noise.sd > 0.1  # ... the decision's noise does not
    assert d.verdict == "INCONCLUSIVE"


def test_repeat_groups_chain_through_comparable_cells(tmp_path: Path) -> None:
    # The probe drifts 2% a cell: neighbours are comparable, the ends are not; the verdict's
    # pairs chain them all, so the noise must hold them all (an A/A campaign said NO-GO when
    # the two extremes were kept out of the group).
    probes = [1.00, 0.98, 0.96, 0.94, 0.92, 0.90]
    names = ["B", "C", "B", "C", "B", "C"]
    rates = [40, 38.5, 41, 40.2, 43, 40]
    same = {"config": "B", "fingerprint": "sha256:B"}
    cells = [cell(n, r, probe=p, **same) for n, r, p in zip(names, rates, probes)]
    a, _ = one(tmp_path, cells)
    assert a.groups == ((0, 1, 2, 3, 4, 5),)
    assert all(m.state == "matched" for m in a.pairs)


def test_cells_with_unequal_work_are_not_repeats(tmp_path: Path) -> None:
    cells = [cell("B", 40), cell("C", 48), cell("B", 41, fingerprint="sha256:other")]
    a, d = one(tmp_path, cells)
    assert a.groups == () and not a.noise.known and d.verdict == "INCONCLUSIVE"


def test_repeats_across_a_cap_are_not_noise(tmp_path: Path) -> None:
    # The sentinel ran capped: its slow-down is explained by a sensor, not noise.
    cells = [cell("B", 40), cell("C", 48), cell("B", 30, caps=CAPPED)]
    a, _ = one(tmp_path, cells)
    assert a.groups == () and not a.own_noise.known


def test_no_go_when_interval_below_one(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 32)], floor=0.02)
    assert d.verdict == "NO-GO" and a.exit_status == 1


def test_inconclusive_when_it_straddles(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 41)], floor=0.05)
    assert d.verdict == "INCONCLUSIVE" and a.exit_status == 3
    assert d.settle and "more matched pair" in d.settle
    assert d.resolvable > 0.1  # one pair at ±5% per cell cannot resolve 3%


def test_seed_decisive_pair_depends_on_the_noise_floor(tmp_path: Path) -> None:
    # The seed's redo: B cool, then the device capped from cell 2; the one matched pair
    # is spec-2 vs the closing B, -21%.
    cells = [cell("B", 4.77), cell("retention-only", 3.5, caps=CAPPED),
             cell("spec-2", 3.14, caps=CAPPED), cell("B", 3.96, caps=CAPPED, sentinel_of=0)]
    spec = [{"candidate": "spec-2", "baseline": "B", "min_effect": 0.03}]
    a, d = one(tmp_path / "4", cells, spec, floor=0.04)
    assert d.verdict == "NO-GO" and [(p.candidate, p.baseline) for p in d.pairs] == [(2, 3)]
    assert a.groups == ()  # the B twins differ by a cap: not a repeat
    assert "device drift" in (d.consistency or "") and "3/4" in (d.consistency or "")
    _, d = one(tmp_path / "25", cells, spec, floor=0.25)
    assert d.verdict == "INCONCLUSIVE"


def test_owed_when_caps_differ_with_no_number(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 30, caps=CAPPED)])
    assert d.verdict == "OWED" and d.ratio is None and a.exit_status == 3
    (u,) = d.unmatched
    assert any("caps differ" in r for r in u.match.reasons)
    assert "gated re-run" in (d.settle or "")


def test_owed_when_not_adjacent(tmp_path: Path) -> None:
    _, d = one(tmp_path, [cell("B", 40), cell("X", 40), cell("C", 44)])
    assert d.verdict == "OWED" and "next to each other" in (d.settle or "")


def test_owed_when_a_cell_is_missing(tmp_path: Path) -> None:
    _, d = one(tmp_path, [cell("B", 40), cell("D", 40)])
    assert d.verdict == "OWED" and "`C`" in d.reason


def test_unverified_never_plain_go(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 48)], state=False, floor=0.02)
    assert d.verdict == "UNVERIFIED" and d.unverified_verdict == "GO"
    assert d.pairs and d.pairs[0].ratio is not None
    assert a.exit_status == 3


def test_order_warning_names_the_reversed_pair(tmp_path: Path) -> None:
    _, d = one(tmp_path, [cell("B", 40), cell("C", 48)], floor=0.02)
    assert d.order_warning and "B ran first in all 1 pair behind" in d.order_warning
    assert "(C then B)" in d.order_warning
    assert d.order.candidate_first == 0 and d.order.baseline_first == 1
    _, d2 = one(tmp_path / "abba", [cell("B", 40), cell("C", 48), cell("C", 48),
                                    cell("B", 40)], floor=0.02)
    assert d2.order_warning is None and len(d2.pairs) == 2
    assert d2.order.position is not None and not d2.order.flagged


def test_order_effect_is_estimated_and_flagged(tmp_path: Path) -> None:
    # Whatever runs second in a pair runs 10% faster: B C C B B C ... in both orders.
    rates = [40, 44 * 1.1, 44, 40 * 1.1, 40, 44 * 1.1, 44, 40 * 1.1]
    names = ["B", "C", "C", "B", "B", "C", "C", "B"]
    cells = [cell(n, r) for n, r in zip(names, rates)]
    _, d = one(tmp_path, cells, floor=0.01)
    assert d.order.candidate_first and d.order.baseline_first
    assert abs(d.order.position.estimate - 1.1) < 0.03
    assert d.order.flagged and "second cell of a pair" in (d.order_warning or "")
    assert abs(d.ratio.estimate - 1.1) < 0.03  # balanced: the ratio is not biased


def test_not_slower_decisions(tmp_path: Path) -> None:
    spec = [{"candidate": "C", "baseline": "B", "expect": "not-slower",
             "max_regression": 0.05}]
    _, d = one(tmp_path / "same", [cell("B", 40), cell("C", 39.8)], spec, floor=0.01)
    assert d.verdict == "GO" and "not slower" in d.reason and d.threshold == 0.95
    _, d = one(tmp_path / "slow", [cell("B", 40), cell("C", 30)], spec, floor=0.01)
    assert d.verdict == "NO-GO"
    _, d = one(tmp_path / "noisy", [cell("B", 40), cell("C", 39)], spec, floor=0.1)
    assert d.verdict == "INCONCLUSIVE"


def test_an_a_a_comparison_is_named(tmp_path: Path) -> None:
    same = {"config": "B", "fingerprint": "sha256:B"}
    cells = [cell("B", 40), cell("C", 40.3, **same), cell("B", 40.1), cell("C", 39.9, **same)]
    a, d = one(tmp_path, cells)
    assert d.identical and a.groups == ((0, 1, 2, 3),)


def test_drift_the_sensors_did_not_see_enters_the_noise(tmp_path: Path) -> None:
    # The sentinel moved 25% with every sensor steady: a repeat, and the reason the
    # interval is wide — the report says so beside the verdict.
    cells = [cell("B", 40), cell("C", 40), cell("C", 40), cell("B", 50, sentinel_of=0)]
    a, d = one(tmp_path, cells)
    assert any(x.verdict == "drift" for x in a.drift)
    assert a.noise.sd > 0.1 and d.verdict == "INCONCLUSIVE"
    assert "every sensor held steady" in (d.consistency or "")


def test_sequential_decision_freezes_at_the_look_that_decided_it(tmp_path: Path) -> None:
    from abbench.records import Look

    names = ["B", "C", "B", "C", "B", "C", "B"]
    rates = [40, 48, 40, 48, 40, 40, 40]  # decided by cell 4; later cells say otherwise
    looks = (Look(4, 4 / 7, 0.02), Look(7, 1.0, 0.03, True))
    a, d = one(tmp_path, [cell(n, r) for n, r in zip(names, rates)],
               floor=0.02, looks=looks, sequential={"max_cells": 7})
    assert [lk.cells for lk in a.looks] == [4, 7]
    assert d.verdict == "GO" and d.look == 1 and d.alpha == 0.02
    assert a.looks[1].decisions[0].verdict != "GO"


def test_exit_status_no_go_wins() -> None:
    assert exit_status([]) == 0


def test_owed_by_a_sensor_gap_asks_for_the_sensor_not_a_gate() -> None:
    from abbench.analysis.decide import Comparison, _settle_owed
    from abbench.analysis.matching import Criterion, PairMatch

    gap = Criterion("cpu_temp", "fail", 40.0, None, 3.0,
                    "cpu temp sensor gap during cell 2 (02-C): `temp.cpu_c` missing from 4 "
                    "of 20 samples")
    ok = Criterion("caps", "ok", [], [], None, "caps equal")
    pair = PairMatch(0, 1, "unmatched", (gap, ok), (gap.detail,))
    advice = _settle_owed("C", "B", [Comparison(1, 0, pair, None)])
    assert "cpu_temp sensor readable throughout" in advice and "gated" not in advice
    heat = Criterion("battery_temp", "fail", 30.0, 31.0, 0.5, "battery 30.0 vs 31.0 °C")
    pair = PairMatch(0, 1, "unmatched", (gap, heat), (gap.detail, heat.detail))
    advice = _settle_owed("C", "B", [Comparison(1, 0, pair, None)])
    assert "sensor readable throughout" in advice and "a gated re-run" in advice
