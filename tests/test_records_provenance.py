"""records/provenance.py: import.json, where every imported fact came from, read back as
written; a run folder a campaign made has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.errors import RecordError
from abbench.records.provenance import (
    FROM_FILE_NAME,
    IMPORT_FILE,
    IMPORT_FORMAT,
    Fact,
    ImportedCell,
    ImportInfo,
    NotImported,
    read_import_info,
)

INFO = ImportInfo(
    source="/archive/pr23-2026-07-12",
    order=Fact("unknown", "no --order, no driver log: cells in file-name order"),
    notes=("gemma_base.metrics: 3 lines skipped",),
    cells=(ImportedCell(label="01-gemma_base",
                        files=("gemma_base.csv", "gemma_base.log"),
                        config={"model": "gemma", "overlap": "1"},
                        facts={"t_start": Fact("measured", "gemma_base.log:1"),
                               "entry.caps_khz": Fact("unknown", "not recorded"),
                               "tokens_per_s": Fact("derived", "from the rows' wall_ms")}),),
)


def _write(run: Path, text: str) -> Path:
    path = run / IMPORT_FILE
    path.write_text(text, encoding="utf-8")
    return path


def test_import_info_reads_back_as_written(tmp_path: Path) -> None:
    doc = INFO.to_json()
    assert doc["format"] == IMPORT_FORMAT and doc["cells"][0]["files"] == list(INFO.cells[0].files)
    assert doc["cells"][0]["facts"]["t_start"] == {"kind": "measured",
                                                   "source": "gemma_base.log:1"}
    _write(tmp_path, json.dumps(doc, indent=1))
    got = read_import_info(tmp_path)
    assert got == INFO
    assert got is not None and isinstance(got.cells[0].facts["t_start"], Fact)


def test_a_campaigns_run_folder_has_no_import_info(tmp_path: Path) -> None:
    assert read_import_info(tmp_path) is None


def test_an_early_import_json_takes_the_defaults(tmp_path: Path) -> None:
    _write(tmp_path, json.dumps({"source": "/a", "order": {"kind": "measured"},
                                 "cells": [{"label": "01-x"}], "added_later": 1}))
    assert read_import_info(tmp_path) == ImportInfo(
        source="/a", order=Fact("measured"), cells=(ImportedCell("01-x"),))


@pytest.mark.parametrize(("doc", "problem"), [
    ({"source": "/a"}, "missing key `order`"),
    ({"source": "/a", "order": "unknown"}, "`order`: expected an object, got a string"),
    ({"source": "/a", "order": {"kind": "derived"}, "notes": "x"},
     "`notes`: expected an array of strings"),
    ({"source": "/a", "order": {"kind": "derived"},
      "cells": [{"label": "01-x", "facts": {"t_start": {"kind": 3}}}]},
     "`cells[0].facts.t_start.kind`: expected a string, got an integer (3)"),
    ({"source": "/a", "order": {"kind": "derived"}, "cells": [{"label": "01-x", "files": [1]}]},
     "`cells[0].files[0]`: expected a string, got an integer (1)"),
])
def test_a_bad_import_json_names_the_file_and_key(tmp_path: Path, doc: dict,
                                                  problem: str) -> None:
    path = _write(tmp_path, json.dumps(doc))
    with pytest.raises(RecordError) as e:
        read_import_info(tmp_path)
    assert str(e.value).startswith(f"{path}: malformed import provenance: {problem}")


def test_an_import_json_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"source": ')
    with pytest.raises(RecordError) as e:
        read_import_info(tmp_path)
    assert str(e.value).startswith(f"{path}: malformed import provenance (")


def test_what_was_not_imported_reads_back_and_an_older_file_has_none(tmp_path: Path) -> None:
    info = ImportInfo(source="/a", order=Fact("unknown"), not_imported=(
        NotImported("warmup/", "a folder: subfolders are not read; import it on its own"),
        NotImported("qwen_a.csv", "column `overlap`: 'on' is not a number", 5)))
    doc = info.to_json()
    assert doc["not_imported"][1] == {"path": "qwen_a.csv",
                                      "reason": "column `overlap`: 'on' is not a number",
                                      "line": 5}
    assert info.not_imported[1].shown() == "qwen_a.csv:5: column `overlap`: 'on' is not a number"
    _write(tmp_path, json.dumps(doc))
    assert read_import_info(tmp_path) == info
    _write(tmp_path, json.dumps({"source": "/a", "order": {"kind": "unknown"},
                                 "notes": ["x.csv: bad: x.csv left out"]}))
    old = read_import_info(tmp_path)
    assert old is not None and old.not_imported == () and old.notes == (
        "x.csv: bad: x.csv left out",)


def test_a_not_imported_entry_names_what_and_why(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps({"source": "/a", "order": {"kind": "unknown"},
                                        "not_imported": [{"path": "a.csv", "reason": ""}]}))
    with pytest.raises(RecordError) as e:
        read_import_info(tmp_path)
    assert str(e.value).startswith(f"{path}: malformed import provenance: `reason`: must not "
                                   "be empty")


def test_a_model_from_the_file_name_is_said_from_the_facts() -> None:
    """Read from the facts, so an import.json older than the question answers it too."""
    cell = ImportedCell("01-gemma_sg", facts={
        "config.model": Fact("derived", f"{FROM_FILE_NAME}'s first word"),
        "config.top_k": Fact("derived", "the model's default"),
        "config.threads": Fact("measured", "gemma_sg.csv preamble")})
    assert cell.from_file_name == ("model",)
    assert cell.to_json()["from_file_name"] == ["model"]
    info = ImportInfo(source="/a", order=Fact("unknown"), cells=(cell,))
    assert ImportInfo.from_json(info.to_json()) == info  # the list is said, not read back
