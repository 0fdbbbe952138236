"""records/bmoe_view.py and the v2 file's turns: a speculative group is one decode, a run's
headline is what its user waits through, and a session's trailers are its turns — read as
the seed engine writes them (tests/bmoe_formats: csv_metrics_sink.cpp's format strings)."""

from __future__ import annotations

import math
import random
from unittest import mock

import bmoe_formats as f
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from abbench.records import bmoe_csv
from abbench.records.bmoe_csv import combine_turns, parse_bmoe_csv
from abbench.records.bmoe_view import digest, groups, run_summary, token_view


def v2(decodes: list[tuple[int, float, float, float]], turns: int = 1, spec: str = "mtp") -> str:
    """A v2 file of `turns` turns, each the given decodes: (tokens, wall, between, draft)."""
    text = f.lines(f.V2_PREAMBLE, (
        (), ("0.31.0",), ("m.gguf", "qwen3moe", 48, 128, 8, 4, 4096, 0, 1),
        (1, 3000, 0, 0, 0, 0, 0, 4, 1, 1, 0, 0, 0, 0, 0, 0, 0, "anon", 0.0, 1, 0),
        (0.0, 40, 0.95, 4294967295, 0, spec, 2, 0.0, 0)))
    text += f.printf(f.V2_HEADER)
    steps = sum(d[0] for d in decodes)
    for turn in range(turns):
        step = 0
        for tokens, wall, between, draft in decodes:
            for k in range(tokens):
                step += 1
                first = k == 0
                text += f.printf(f.V2_ROW, step, steps, wall if first else 0.0, 0.0, 0.0,
                                 1000 if first else 0, 80.0, 0.0, 0.0, 7 if first else 0, 0.0,
                                 1.0, turn, 0.0, 3000.0, 0.0, 0.0, 0.0, 0.0, 5000.0, 0.0, 0.0,
                                 between if first else 0.0, tokens, draft if first else 0.0,
                                 0.0, 0.0, 0.0, 0.0)
        gen = sum(d[1] for d in decodes) / 1e3
        gap = sum(d[2] for d in decodes) / 1e3 + 0.01  # and a tail no row carries
        text += f.printf(f.V2_SUMMARY, steps, gen / steps, steps / gen, 1.0, 0.0, 0.0, 0.0,
                         80.0, 30, 5.0, 3.0, 10.0, 0.0, 0.0, 0.0, 3000.0, 0, 0.0, 0, 0, 0.0,
                         0.0, 0.0, 0.0, 0, 0, gap / steps, 2 * len(decodes),
                         steps - len(decodes), len(decodes), 0.0, len(decodes), 0, 0, 97.5,
                         0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    return text


DECODES = [(1, 100.0, 2.0, 0.0), (3, 160.0, 50.0, 48.0), (2, 130.0, 40.0, 38.0)]


def test_a_group_is_its_first_row_and_the_rows_after_it() -> None:
    run = parse_bmoe_csv(v2(DECODES, turns=2))
    assert groups(run) == [(0, 1), (1, 4), (4, 6), (6, 7), (7, 10), (10, 12)]
    # cut short by the end of a turn (n_predict stopped it) or of the file
    cut = parse_bmoe_csv("step,wall_ms,turn,mtp_batch\n1,100,0,1\n2,160,0,3\n3,0,0,3\n"
                         "1,120,1,1\n2,150,1,3\n3,0,1,3\n")
    assert groups(cut) == [(0, 1), (1, 3), (3, 4), (4, 6)]


def test_the_view_spreads_each_groups_cost_and_adds_the_time_before_it() -> None:
    run = parse_bmoe_csv(v2(DECODES))
    view = token_view(run)
    assert view["decode_ms"] == [100.0, *[160.0 / 3] * 3, *[65.0] * 2]
    assert view["wall_ms"] == pytest.approx([102.0, *[210.0 / 3] * 3, *[85.0] * 2])
    assert math.fsum(view["read_bytes"]) == 3000  # a cost is spread, never made
    assert view["majflt"][1:4] == [7 / 3] * 3
    assert view["mtp_batch"] == [1, 3, 3, 3, 2, 2]  # not a cost: as written


def test_the_headline_is_what_a_user_waits_through() -> None:
    run = parse_bmoe_csv(v2(DECODES))
    s = run_summary(run)
    tokens, decode_s, gap_s = 6, 0.39, 0.092 + 0.01
    assert s["decode_tok/s"] == pytest.approx(tokens / decode_s, abs=1e-3)  # its own tok/s
    assert s["tok/s"] == pytest.approx(tokens / (decode_s + gap_s), rel=1e-3)  # tail included
    assert s["loop_overhead_s/tok"] == pytest.approx(gap_s / tokens, abs=1e-4)
    assert s["prefill_tok/s"] == 10.0  # prefill_tps, under abbench's key
    # with no trailer, the rows' own times (no tail: no row carries it)
    rows_only = parse_bmoe_csv(v2(DECODES).rsplit("# summary", 1)[0])
    assert run_summary(rows_only)["tok/s"] == pytest.approx(6 / 0.482, rel=1e-6)
    d = digest(run)
    assert (d.rows, d.walls) == (6, 6) and d.fingerprint and d.summary == s


def test_a_file_that_records_no_time_between_decodes_keeps_its_rate() -> None:
    v1 = f.v1_file([f.v1_row(k, 3, 100.0) for k in (1, 2, 3)], model="m.gguf")
    s = run_summary(parse_bmoe_csv(v1))
    assert "decode_tok/s" not in s and s["tok/s"] == pytest.approx(10.0, abs=1e-3)
    assert token_view(parse_bmoe_csv(v1))["wall_ms"] == [100.0] * 3


def test_several_trailers_are_the_turns_of_one_run() -> None:
    run = parse_bmoe_csv(v2(DECODES, turns=3))
    assert [t.rows for t in run.turns] == [6, 12, 18]
    assert run.summary["turns"] == 3 and run.summary["tokens"] == 18
    assert run.summary["n_prompt"] == 90 and run.summary["load_s"] == 5.0
    assert run.summary["prefill_tps"] == pytest.approx(90 / 9.0)
    one = combine_turns(run.turns[:1])
    assert one == run.turns[0].summary  # one trailer: as written
    assert run.summary["tok/s"] == pytest.approx(one["tok/s"], rel=1e-3)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=3,
                              max_size=3), min_size=1, max_size=20),
       summary=st.booleans(), seed=st.integers(0, 2**16))
def test_the_bulk_reading_reads_what_the_line_by_line_reading_reads(
        rows: list[list[float]], summary: bool, seed: int) -> None:
    rng = random.Random(seed)
    text = "# bmoe_metrics v2\n# model=m\nstep,wall_ms,read_bytes\n" + "".join(
        ",".join(rng.choice(("%.3f", "%g", "%.1e")) % v for v in r) + "\n" for r in rows)
    if summary:
        text += "# summary tokens=3 s/tok=0.1 tok/s=10\n"
    fast = parse_bmoe_csv(text, "a.csv")
    with mock.patch.object(bmoe_csv, "_parse_fast", lambda *a, **k: None):
        slow = parse_bmoe_csv(text, "a.csv")
    assert fast == slow
    wanted = parse_bmoe_csv(text, "a.csv", columns={"wall_ms"})
    assert wanted.columns == {"wall_ms": slow.columns["wall_ms"]}
