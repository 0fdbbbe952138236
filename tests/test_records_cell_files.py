"""records/cell_files.py: what a cell's own files say (`CellFiles`) — its per-token columns
from its summary.json, else its tokens.csv, and the document's summary, fingerprint,
threads, notes, samples kind and metrics — read fail-soft (a cell's files may be anything
an external command wrote), from run folders written before the document was typed too."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from abbench.records.cell_files import CellFiles, read_cell_files
from abbench.records.metrics_file import Pressure
from abbench.records.summary import RunSummary
from abbench.records.tokens import PER_TOKEN_COLUMNS

CSV = "# bmoe_metrics v2\nstep,wall_ms\n1,10.0\n2,12.0\n# summary tokens=2 tok/s=90.9\n"
FIXTURES = Path(__file__).parent / "fixtures"
RUNS = FIXTURES / "runs"


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
    got = read_cell_files(_cell(tmp_path, doc, CSV))
    assert got.source == "per_token" and got.fingerprint == "sha256:x"
    assert got.summary == RunSummary(tok_per_s=50.0)
    assert got.columns["wall_ms"] == [20.0, 20.5]
    assert got.columns["io_ms"][0] == 1.0 and math.isnan(got.columns["io_ms"][1])  # null


def test_a_column_that_is_not_a_list_of_numbers_is_left_out(tmp_path: Path) -> None:
    doc = {"per_token": {"wall_ms": [10, 11], "flags": [True, False], "names": ["a"],
                         "scalar": 3, "nested": [[1]], "huge": [1e300, 1e19]}}
    got = read_cell_files(_cell(tmp_path, doc))
    assert got.source == "per_token" and set(got.columns) == {"wall_ms"}


def test_without_per_token_wall_times_the_tokens_csv_is_read(tmp_path: Path) -> None:
    doc = {"summary": {"tok/s": 90.9}, "per_token": {"wall_ms": [], "io_ms": [1.0]}}
    got = read_cell_files(_cell(tmp_path, doc, CSV))
    assert got.source == "tokens.csv" and got.summary.tok_per_s == 90.9
    assert got.columns == {"step": [1.0, 2.0], "wall_ms": [10.0, 12.0]}


def test_a_torn_tokens_csv_gives_the_rows_before_the_tear(tmp_path: Path) -> None:
    got = read_cell_files(_cell(tmp_path, None, "step,wall_ms\n1,10\n2,11\n3,x\n4,12\n"))
    assert got.source == "tokens.csv" and got.summary == RunSummary()
    assert got.columns["wall_ms"] == [10.0, 11.0]


def test_a_summary_that_is_not_json_counts_as_absent(tmp_path: Path) -> None:
    for i, text in enumerate(['{"per_token": ', "[" * 100_000, "[1, 2]", "\udcff"]):
        folder = _cell(tmp_path / str(i), None, CSV)
        (folder / "summary.json").write_text(text, encoding="utf-8", errors="surrogateescape")
        got = read_cell_files(folder)
        assert got == CellFiles(columns=got.columns, source="tokens.csv"), text
        assert got.columns["wall_ms"] == [10.0, 12.0]


def test_sections_of_the_wrong_type_read_as_absent(tmp_path: Path) -> None:
    doc = {"summary": [1], "resolved": "x", "per_token": [1], "fingerprint": 7,
           "notes": "a note", "samples": ["repetitions"], "metrics": [1],
           "format": "abbench-engine-run v1", "config": {"threads": 2}}
    assert read_cell_files(_cell(tmp_path, doc)) == CellFiles()
    doc = {"resolved": {"threads": "2"}, "notes": ["kept", 3, None],
           "metrics": {"a_kb": 1, "b": True, "c": "x", "d": 2.5, "huge": 10**400}}
    got = read_cell_files(_cell(tmp_path / "b", json.dumps(doc)))
    assert (got.threads, got.notes, got.metrics) == (None, ("kept",),
                                                Pressure(extra={"a_kb": 1.0, "d": 2.5}))


def test_a_cell_with_no_files_has_no_columns(tmp_path: Path) -> None:
    assert read_cell_files(tmp_path / "cells" / "01-B") == CellFiles()
    empty_csv = _cell(tmp_path / "e", None, "step,wall_ms\n")
    assert read_cell_files(empty_csv) == CellFiles()


# -- documents written before `CellFiles` ---------------------------------------------------


def test_an_engine_cells_document_from_before_reads_typed() -> None:
    folder = RUNS / "embedded-sim" / "cells" / "01-B"
    doc = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    got = read_cell_files(folder)
    assert got.source == "per_token" and tuple(got.columns) == PER_TOKEN_COLUMNS
    assert got.columns["wall_ms"] == doc["per_token"]["wall_ms"]
    assert len(got.columns["wall_ms"]) == 24 and got.columns["read_bytes"][0] == 49152.0
    assert got.summary == RunSummary.from_json(doc["summary"]) and got.summary.tokens == 24
    assert got.fingerprint == doc["fingerprint"] and got.fingerprint.startswith("sha256:")
    assert got.threads == 2
    assert (got.notes, got.repetitions, got.metrics) == ((), False, Pressure())


def test_an_imported_cells_document_from_before_reads_typed() -> None:
    got = read_cell_files(RUNS / "imported-pr23" / "cells" / "01-gemma_base")
    assert got.source == "per_token" and got.columns["wall_ms"][:2] == [663.72, 488.762]
    assert got.summary.tok_per_s == 3.152 and got.summary.tokens == 256.0
    assert got.fingerprint == \
        "sha256:f6f8b54ae352b017d449b1ca1da27f98b5b3d782edaae357ac5daec045fd2914"
    assert got.threads is None  # `resolved` is {}: neither preamble nor command line said
    assert got.metrics.peak_rss_kb == 5949324.0
    assert got.metrics.cpu_temp_max_mC == 74100.0 and len(got.metrics) == 9


def test_llama_cells_documents_from_before_read_typed(tmp_path: Path) -> None:
    bench = read_cell_files(FIXTURES / "cell_files" / "llama-bench")
    assert bench.repetitions and bench.source == "per_token"
    assert bench.columns == {"wall_ms": [0.0645381875, 0.0571365, 0.055884625]}
    assert bench.summary.engine == "llama-bench" and bench.summary.repetitions == 3
    assert bench.fingerprint is not None and bench.notes == ()
    completion = read_cell_files(FIXTURES / "cell_files" / "llama-completion")
    assert not completion.repetitions and completion.source == "none"
    assert completion.summary.engine == "llama-completion" and completion.notes == ()
    noted = shutil.copytree(FIXTURES / "cell_files" / "llama-completion", tmp_path / "n")
    doc = json.loads((noted / "summary.json").read_text(encoding="utf-8"))
    (noted / "summary.json").write_text(json.dumps({**doc, "notes": ["no eval time"]}))
    assert read_cell_files(noted).notes == ("no eval time",)
