"""records/slices.py: the turn protocol's lines, and a cell's slices.jsonl read back as
written; the per-token `slice` column read where a cell has it and absent where not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.errors import RecordError
from abbench.records.cell_doc import PER_TOKEN
from abbench.records.cell_files import read_cell_files
from abbench.records.slices import (
    SLICES_JSONL,
    SliceRecord,
    TurnLine,
    control_word,
    read_slices,
    write_slices,
)
from abbench.records.tokens import SLICE, WALL_MS


@pytest.mark.parametrize("line", [TurnLine("ready", 0), TurnLine("paused", 16),
                                  TurnLine("done", 64)])
def test_a_turn_line_reads_back_as_written(line: TurnLine) -> None:
    assert line.text() == f"abbench-turn {line.event} {line.tokens}\n"
    assert TurnLine.parse(line.text()) == line


@pytest.mark.parametrize("text", ["", "generation: 8 tokens", "abbench-turn ready",
                                  "abbench-turn go 3", "abbench-turn paused -1",
                                  "abbench-turn paused 3 4", "xabbench-turn ready 0"])
def test_any_other_line_is_the_runs_ordinary_output(text: str) -> None:
    assert TurnLine.parse(text) is None


def test_a_turn_line_is_checked_on_construction() -> None:
    with pytest.raises(ValueError, match="turn event"):
        TurnLine("paused?", 1)
    with pytest.raises(ValueError, match=">= 0"):
        TurnLine("paused", -1)


@pytest.mark.parametrize(("line", "word"), [("go\n", "go"), (" go \n", "go"),
                                            ("stop\n", "stop"), ("", "stop"),
                                            ("\n", None), ("gone\n", None)])
def test_the_drivers_words(line: str, word: str | None) -> None:
    assert control_word(line) == word


def _slice(i: int, turn: int) -> SliceRecord:
    return SliceRecord(cell=0, partner=1, slice=i, turn=turn, tokens=8,
                       t_start_mono=10.0 + turn, t_end_mono=10.5 + turn,
                       t_start_wall=1e9 + turn, t_end_wall=1e9 + turn + 0.5)


def test_slices_read_back_as_written(tmp_path: Path) -> None:
    slices = [_slice(0, 0), _slice(1, 2), _slice(2, 4)]
    write_slices(tmp_path, slices)
    assert read_slices(tmp_path) == slices
    assert json.loads((tmp_path / SLICES_JSONL).read_text().splitlines()[1])["turn"] == 2


def test_a_cell_that_took_no_turns_has_no_slices(tmp_path: Path) -> None:
    assert read_slices(tmp_path) == []


def test_a_malformed_slice_names_the_file_and_line(tmp_path: Path) -> None:
    write_slices(tmp_path, [_slice(0, 0)])
    with open(tmp_path / SLICES_JSONL, "a") as f:
        f.write('{"cell": 0, "slice": "two"}\n')
    with pytest.raises(RecordError, match=rf"{SLICES_JSONL}:2: malformed slice"):
        read_slices(tmp_path)


def test_the_slice_column_reads_where_a_cell_has_it_and_is_absent_where_not(
        tmp_path: Path) -> None:
    turns, alone = tmp_path / "turns", tmp_path / "alone"
    for folder, columns in ((turns, {WALL_MS: [1.0, 2.0], SLICE: [0, 1]}),
                            (alone, {WALL_MS: [1.0, 2.0]})):
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({PER_TOKEN: columns}))
    assert read_cell_files(turns).columns[SLICE] == [0.0, 1.0]
    assert SLICE not in read_cell_files(alone).columns
