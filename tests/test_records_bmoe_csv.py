"""records/bmoe_csv.py: every generation of the per-token CSV read by column name, written
back as version 2, each bad row an error naming the file and line — or, for a cell's own
torn file, the end of the table."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from abbench.errors import ForeignRunError
from abbench.records.bmoe_csv import (
    WRITTEN_VERSION,
    DroppedColumn,
    format_bmoe_csv,
    looks_like_bmoe_csv,
    parse_bmoe_csv,
    read_bmoe_csv,
    token_columns,
    work_fingerprint,
)
from abbench.records.bmoe_view import run_summary

# The seed engine's oldest files: 8 columns, no preamble, no summary (as in
# reference/bmoe/headerless-2026-07-12/qwen_c2000_l4.csv, first rows).
HEADERLESS = """\
step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms
1,256,664.200,431.883,232.317,945930240,1.53,0.000
2,256,457.955,275.582,182.373,592687104,6.18,0.000
"""

# Version 1: a version line, key=value preamble lines, columns in another order, a trailer.
V1 = """\
# bmoe_metrics v1
# model=Qwen3.6-35B-A3B.gguf arch=qwen35moe n_layer=40
# moe_stream=1 cache_mb=5000
wall_ms,step,read_bytes
200.0,1,100
250.0,2,300
# summary tokens=2 s/tok=0.225 tok/s=4.444 note=warm
"""


def test_the_oldest_format_reads_by_column_name() -> None:
    run = parse_bmoe_csv(HEADERLESS, "a.csv")
    assert run.version is None and run.preamble == {} and run.summary == {}
    assert run.n_rows == 2 and list(run.columns)[:3] == ["step", "steps", "wall_ms"]
    assert run.column("wall_ms") == [664.2, 457.955]
    assert run.column("read_bytes") == [945930240.0, 592687104.0]
    assert run.column("tokens_j") is None


def test_the_oldest_format_gets_its_summary_from_its_wall_times() -> None:
    s = run_summary(parse_bmoe_csv(HEADERLESS))
    assert s["tokens"] == 2
    assert s["s/tok"] == pytest.approx((0.6642 + 0.457955) / 2)
    assert s["tok/s"] == pytest.approx(2 / (0.6642 + 0.457955))


def test_version_1_reads_its_preamble_and_its_own_summary() -> None:
    run = parse_bmoe_csv(V1, "v1.csv")
    assert run.version == "v1"
    assert run.preamble == {"model": "Qwen3.6-35B-A3B.gguf", "arch": "qwen35moe",
                            "n_layer": "40", "moe_stream": "1", "cache_mb": "5000"}
    assert run.column("step") == [1.0, 2.0] and run.column("wall_ms") == [200.0, 250.0]
    assert run.summary == {"tokens": 2.0, "s/tok": 0.225, "tok/s": 4.444, "note": "warm"}
    assert run.summary_line == 7
    assert run_summary(run)["tok/s"] == 4.444  # its own line, not the rows' 4.44...


def test_what_abbench_writes_reads_back() -> None:
    text = format_bmoe_csv({"model": "my model.gguf", "threads": 4},
                           ["step", "wall_ms", "read_bytes"],
                           [{"step": 1, "wall_ms": "10.500", "read_bytes": 7},
                            {"step": 2, "wall_ms": 9.25, "read_bytes": 8}],
                           {"tokens": "2", "tok/s": "101.2"})
    assert text.startswith(f"# bmoe_metrics {WRITTEN_VERSION}\n") and text.endswith("\n")
    run = parse_bmoe_csv(text)
    assert run.version == WRITTEN_VERSION
    assert run.preamble == {"model": "my_model.gguf", "threads": "4"}  # one field each
    assert run.columns == {"step": [1.0, 2.0], "wall_ms": [10.5, 9.25], "read_bytes": [7.0, 8.0]}
    assert run.summary == {"tokens": 2.0, "tok/s": 101.2}


def test_an_empty_field_is_a_gap() -> None:
    run = parse_bmoe_csv("\ufeffwall_ms,energy_j\n10,\n12,0.5\n")  # a BOM before the header
    assert run.columns == {"wall_ms": [10.0, 12.0], "energy_j": [None, 0.5]}
    assert run.column("energy_j") == [0.5]
    cols = token_columns(run)
    assert math.isnan(cols["energy_j"][0]) and cols["energy_j"][1] == 0.5


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("step,wall_ms\n1,2\n3\n", 3, "1 fields, the header has 2"),
    ("step,wall_ms\n1,fast\n", 2, "column `wall_ms`: 'fast' is not a number (the per-token "
     "columns are numbers, an empty field a gap)"),
    ("step,wall_ms,overlap\n1,2,off\n", 2, "column `overlap`: 'off' is not a number (the "
     "per-token columns are numbers, an empty field a gap; a switch as 1 or 0)"),
    ("step,wall_ms\n1,nan\n", 2, "column `wall_ms`: 'nan' is not a finite number (the "
     "per-token columns are numbers, an empty field a gap)"),
    ("step,wall_ms,step\n", 1, "header: column `step` appears twice"),
    ("# c\n1,2\n", 2, "header: '1' is not a column name (a bmoe_metrics CSV starts with a "
     "header row)"),
    ("wall_ms\n1\n# summary tok/s=fast\n", 3, "`# summary` tok/s: 'fast' is not a number"),
    ("wall_ms\n1\n# summary tokens=1 junk\n", 3, "`# summary`: 'junk' is not key=value"),
])
def test_a_bad_line_names_the_file_and_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(ForeignRunError) as e:
        parse_bmoe_csv(text, "runs/a.csv")
    assert str(e.value) == f"runs/a.csv:{line}: {problem}"
    assert e.value.line == line


def test_an_empty_file_is_an_error_without_a_line() -> None:
    with pytest.raises(ForeignRunError) as e:
        parse_bmoe_csv("\n# just a comment\n", "a.csv")
    assert e.value.line is None and "no header row" in str(e.value)


def test_an_import_leaves_a_bad_column_out_and_reads_the_rest() -> None:
    """`drop_bad_columns` (an archive being imported): the column with a value that is not a
    number goes, with its first bad line; the other columns and rows are read."""
    run = parse_bmoe_csv("step,wall_ms,overlap,hit\n1,10,on,5\n2,12,off,\n3,11,0,7\n",
                         "a.csv", drop_bad_columns=True)
    assert run.columns == {"step": [1.0, 2.0, 3.0], "wall_ms": [10.0, 12.0, 11.0],
                           "hit": [5.0, None, 7.0]}
    assert run.dropped == (DroppedColumn(
        "overlap", 2, "column `overlap`: 'on' is not a number (the per-token columns are "
        "numbers, an empty field a gap; a switch as 1 or 0): the column is left out, the "
        "rest of the file is read"),)
    assert parse_bmoe_csv("wall_ms\n1\n").dropped == ()


def test_an_import_still_refuses_a_bad_wall_time() -> None:
    """`wall_ms` is what the run's tokens/s rests on: the file, not the column, goes."""
    with pytest.raises(ForeignRunError) as e:
        parse_bmoe_csv("step,wall_ms\n1,2\n2,n/a\n", "a.csv", drop_bad_columns=True)
    assert str(e.value) == ("a.csv:3: column `wall_ms`: 'n/a' is not a number (the per-token "
                            "columns are numbers, an empty field a gap; the run's tokens/s "
                            "rests on `wall_ms`: the file is not imported)")


def test_a_summary_alone_is_a_run() -> None:
    run = parse_bmoe_csv("# summary tokens=3 tok/s=2.5\n")
    assert run.n_rows == 0 and run_summary(run) == {"tokens": 3.0, "tok/s": 2.5}


def test_a_cells_own_torn_file_ends_at_the_row_that_does_not_read() -> None:
    torn = "step,wall_ms\n1,10\n2,11\n3,1"  # the crash cut the last row
    run = parse_bmoe_csv(torn, "tokens.csv", torn_ok=True)
    assert run.columns == {"step": [1.0, 2.0, 3.0], "wall_ms": [10.0, 11.0, 1.0]}
    cut = parse_bmoe_csv("step,wall_ms\n1,10\n2,1", "tokens.csv", torn_ok=True)
    assert cut.column("wall_ms") == [10.0, 1.0]
    half = parse_bmoe_csv("step,wall_ms\n1,10\n2,", "tokens.csv", torn_ok=True)
    assert half.columns["wall_ms"] == [10.0, None]
    short = parse_bmoe_csv("step,wall_ms\n1,10\n2\n", "tokens.csv", torn_ok=True)
    assert short.column("wall_ms") == [10.0]
    with pytest.raises(ForeignRunError):
        parse_bmoe_csv("step,wall_ms\n1,10\n2\n", "tokens.csv")


def test_a_torn_file_without_a_header_is_an_empty_run() -> None:
    # the crash came before the header row
    run = parse_bmoe_csv("# bmoe_metrics v2\n# model=x\n", "tokens.csv", torn_ok=True)
    assert run.columns == {} and run.n_rows == 0 and run_summary(run) == {}
    assert run.source == "tokens.csv"


def test_read_bmoe_csv_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    path.write_text(HEADERLESS + "3,256,x,1,1,1,1,1\n", encoding="utf-8")
    with pytest.raises(ForeignRunError) as e:
        read_bmoe_csv(path)
    assert str(e.value).startswith(f"{path}:4: column `wall_ms`:")
    path.write_text(V1, encoding="utf-8")
    assert read_bmoe_csv(path).source == str(path)


@pytest.mark.parametrize(("text", "is_csv"), [
    (HEADERLESS, True), (V1, True), ("\ufeff# x\n\nstep,steps\n", True),
    ("batt_temp_before_dC=301\npeak_rss_kb=10\n", False), ("# only comments\n", False),
    ("wall_msx,stepper\n", False),
])
def test_looks_like_bmoe_csv(text: str, is_csv: bool) -> None:
    assert looks_like_bmoe_csv(text) is is_csv


def test_run_summary_fills_tokens_and_leaves_no_rate_from_zero_times() -> None:
    assert run_summary(parse_bmoe_csv("wall_ms\n0\n0\n")) == {}
    got = run_summary(parse_bmoe_csv("wall_ms\n5\n5\n# summary note=x\n"))
    assert got["note"] == "x" and got["tokens"] == 2 and got["tok/s"] == pytest.approx(200.0)
    assert run_summary(parse_bmoe_csv("step\n1\n# summary load_s=3\n")) == {"load_s": 3.0,
                                                                         "tokens": 0}


def test_work_fingerprint_is_the_hash_of_the_bytes_read_per_token() -> None:
    run = parse_bmoe_csv(V1)
    expected = "sha256:" + hashlib.sha256(json.dumps([100, 300]).encode()).hexdigest()
    assert work_fingerprint(run) == expected
    other = parse_bmoe_csv(V1.replace("250.0,2,300", "250.0,2,301"))
    assert work_fingerprint(other) != expected
    faster = parse_bmoe_csv(V1.replace("250.0,2,300", "150.0,2,300"))
    assert work_fingerprint(faster) == expected  # the same work at another speed
    assert work_fingerprint(parse_bmoe_csv(HEADERLESS.replace("read_bytes", "reads"))) is None
