"""A cell's slices from its records (abbench/analysis/slices.py)."""

from __future__ import annotations

import math

import pytest

from abbench.analysis.slices import slice_stats
from abbench.records import Sample, keys
from abbench.records.slices import SliceRecord


def _rec(k: int, start: float, end: float, tokens: int = 3) -> SliceRecord:
    return SliceRecord(cell=0, partner=1, slice=k, turn=2 * k, tokens=tokens,
                       t_start_mono=start, t_end_mono=end, t_start_wall=1e9 + start,
                       t_end_wall=1e9 + end)


def test_each_slice_reads_its_own_tokens_and_the_ticks_inside_its_span() -> None:
    wall = [10.0, 10.0, 10.0, 20.0, 20.0, 20.0, 5.0]
    slice_of = [0, 0, 0, 1, 1, 1, 2]
    samples = [Sample(0.5, 0.0, {keys.FOREIGN_CORES: 0.2}, 0),
               Sample(1.0, 0.0, {keys.FOREIGN_CORES: 0.4}, 0),
               Sample(2.5, 0.0, {keys.FOREIGN_CORES: 1.5}, 1),  # the partner's turn
               Sample(3.5, 0.0, {keys.FOREIGN_CORES: 2.0}, 0),
               Sample(3.6, 0.0, {"other": 1.0}, 0)]
    got = slice_stats([_rec(0, 0.0, 1.0), _rec(1, 3.0, 4.0), _rec(2, 5.0, 6.0, 1)], wall,
                      slice_of, samples)
    assert [s.tokens for s in got] == [3, 3, 1]
    assert got[0].log_rate == pytest.approx(math.log(100.0))
    assert got[1].log_rate == pytest.approx(math.log(50.0))
    assert got[0].foreign_cores == pytest.approx(0.3)
    assert got[1].foreign_cores == pytest.approx(2.0)
    assert got[2].foreign_cores is None  # no tick ended inside it: unknown, not 0


def test_a_cell_without_turns_or_its_slice_column_has_no_throughput_per_slice() -> None:
    assert slice_stats([], [10.0, 10.0], [0, 0], []) == ()
    (s,) = slice_stats([_rec(0, 0.0, 1.0)], [10.0, 10.0], [], [])
    assert s.tokens == 0 and math.isnan(s.log_rate)
