"""records/cell_files.py: a cell's per-token columns from its summary.json, else its
tokens.csv, read fail-soft (a cell's files may be anything an external command wrote)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from abbench.records.cell_files import read_cell_files

CSV = "# bmoe_metrics v2\nstep,wall_ms\n1,10.0\n2,12.0\n# summary tokens=2 tok/s=90.9\n"


def _cell(folder: Path, summary: Any = None, tokens_csv: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if summary is not None:
        text = summary if isinstance(summary, str) else json.dumps(summary)
        (folder / "summary.json").write_text(text, encoding="utf-8")
    if tokens_csv is not None:
        (folder / "tokens.csv").write_text(tokens_csv, encoding="utf-8")
    return folder


def test_per_token_columns_of_the_summary_come_first(tmp_path: Path) -> None:
    doc = {"summary": {"tok/s": 50.0}, "fingerprint": "sha256:x",
           "per_token": {"wall_ms": [20, 20.5], "io_ms": [1, None]}}
    cols, source, got = read_cell_files(_cell(tmp_path, doc, CSV))
    assert source == "per_token" and got == doc
    assert cols["wall_ms"] == [20.0, 20.5]
    assert cols["io_ms"][0] == 1.0 and math.isnan(cols["io_ms"][1])  # null: not measured


def test_a_column_that_is_not_a_list_of_numbers_is_left_out(tmp_path: Path) -> None:
    doc = {"per_token": {"wall_ms": [10, 11], "flags": [True, False], "names": ["a"],
                         "scalar": 3, "nested": [[1]], "huge": [1e300, 1e19]}}
    cols, source, _ = read_cell_files(_cell(tmp_path, doc))
    assert source == "per_token" and set(cols) == {"wall_ms"}


def test_without_per_token_wall_times_the_tokens_csv_is_read(tmp_path: Path) -> None:
    doc = {"summary": {"tok/s": 90.9}, "per_token": {"wall_ms": [], "io_ms": [1.0]}}
    cols, source, got = read_cell_files(_cell(tmp_path, doc, CSV))
    assert source == "tokens.csv" and got == doc
    assert cols == {"step": [1.0, 2.0], "wall_ms": [10.0, 12.0]}


def test_a_torn_tokens_csv_gives_the_rows_before_the_tear(tmp_path: Path) -> None:
    cols, source, doc = read_cell_files(_cell(tmp_path, None,
                                              "step,wall_ms\n1,10\n2,11\n3,x\n4,12\n"))
    assert source == "tokens.csv" and doc == {}
    assert cols["wall_ms"] == [10.0, 11.0]


def test_a_summary_that_is_not_json_counts_as_absent(tmp_path: Path) -> None:
    for i, text in enumerate(['{"per_token": ', "[" * 100_000, "[1, 2]", "\udcff"]):
        folder = _cell(tmp_path / str(i), None, CSV)
        (folder / "summary.json").write_text(text, encoding="utf-8", errors="surrogateescape")
        cols, source, doc = read_cell_files(folder)
        assert (source, doc) == ("tokens.csv", {}) and cols["wall_ms"] == [10.0, 12.0], text


def test_keys_of_the_wrong_type_are_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    doc = {"summary": [1], "resolved": "x", "per_token": [1], "fingerprint": 7,
           "format": "abbench-engine-run v1", "config": {"threads": 2}}
    _, source, got = read_cell_files(_cell(tmp_path, doc))
    assert source == "none"
    assert got == {"format": "abbench-engine-run v1", "config": {"threads": 2}}


def test_a_cell_with_no_files_has_no_columns(tmp_path: Path) -> None:
    assert read_cell_files(tmp_path / "cells" / "01-B") == ({}, "none", {})
    empty_csv = _cell(tmp_path / "e", None, "step,wall_ms\n")
    assert read_cell_files(empty_csv) == ({}, "none", {})
