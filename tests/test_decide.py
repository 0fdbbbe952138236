"""Decisions: GO / NO-GO / INCONCLUSIVE from matched pairs, OWED, unverified, order."""

from __future__ import annotations

from pathlib import Path

from runs_helper import cell, make_run

from abbench.analysis.campaign import analyze
from abbench.analysis.decide import exit_status

DECIDE = [{"candidate": "C", "baseline": "B", "min_effect": 0.03}]
CAPPED = {"policy0": 2_000_000, "policy4": 2_200_000}


def one(tmp: Path, cells, **kw):  # type: ignore[no-untyped-def]
    a = analyze(make_run(tmp, cells, DECIDE, **kw))
    (d,) = a.decisions
    return a, d


def test_go_when_interval_above_min_effect(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 48)])
    assert d.verdict == "GO" and a.exit_status == 0
    assert d.ratio.low > 1.03


def test_no_go_when_interval_below_one(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40), cell("C", 32)])
    assert d.verdict == "NO-GO" and a.exit_status == 1


def test_inconclusive_when_it_straddles(tmp_path: Path) -> None:
    a, d = one(tmp_path, [cell("B", 40, noise=0.3), cell("C", 41, noise=0.3)])
    assert d.verdict == "INCONCLUSIVE" and a.exit_status == 3
    assert d.settle


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
    a, d = one(tmp_path, [cell("B", 40), cell("C", 48)], state=False)
    assert d.verdict == "UNVERIFIED" and d.unverified_verdict == "GO"
    assert d.pairs and d.pairs[0].ratio is not None
    assert a.exit_status == 3


def test_order_warning_names_the_reversed_pair(tmp_path: Path) -> None:
    _, d = one(tmp_path, [cell("B", 40), cell("C", 48)])
    assert d.order_warning and "B ran first in every pair" in d.order_warning
    assert "(C then B)" in d.order_warning
    _, d2 = one(tmp_path / "abba", [cell("B", 40), cell("C", 48), cell("C", 48),
                                    cell("B", 40)])
    assert d2.order_warning is None and len(d2.pairs) == 2


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
