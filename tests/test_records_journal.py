"""records/journal.py: journal.jsonl's cell records and samples.jsonl's ticks — round trips,
older journals, and every bad line an error naming the file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abbench.errors import BadField, RecordError
from abbench.records.journal import (
    CellRecord,
    EntryState,
    GateWait,
    Sample,
    check_label,
    read_journal,
    read_samples,
)
from abbench.records.jsonl import append_jsonl

ENTRY = EntryState(t_wall=1000.0, caps_khz={"policy0": 1_800_000, "policy4": 2_400_000},
                   hw_max_khz={"policy0": 2_000_000, "policy4": 2_400_000}, cpu_temp_c=41.5,
                   battery_temp_c=30.0, mem_available_mib=7900.0, probe_index=0.98,
                   thermal_status=1)

# One journal line as a campaign writes it.
RECORD: dict[str, Any] = {
    "index": 0, "name": "B", "label": "01-B", "status": "ok", "t_start_wall": 1000.0,
    "t_end_wall": 1010.0, "t_start_mono": 5.0, "t_end_mono": 15.0, "entry": ENTRY.to_json(),
    "gate": {"waited_s": 12.5, "polls": 3, "reasons": ["cpu 47.1 C > 45.0 C"],
             "gave_up": False},
    "summary": {"tokens": 64, "tok/s": 10.0, "threads": 2}, "fingerprint": "sha256:B",
    "tokens_per_s": 10.0, "exit_code": None, "error": None, "stderr_tail": ""}


def _line(index: int = 0, label: str = "01-B", **changes: Any) -> dict[str, Any]:
    return {**RECORD, "index": index, "label": label, **changes}


def _journal(run: Path, *lines: dict[str, Any] | str) -> Path:
    path = run / "journal.jsonl"
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line) + "\n")
    return path


def test_cell_records_round_trip_through_the_journal(tmp_path: Path) -> None:
    lines = [_line(), _line(1, "02-C", status="failed", summary={}, tokens_per_s=None,
                            exit_code=3, error="the engine exited 3", stderr_tail="boom\n")]
    for line in lines:
        append_jsonl(tmp_path / "journal.jsonl", CellRecord.from_json(line).to_json(),
                     fsync=False)
    got = read_journal(tmp_path)
    assert [json.dumps(r.to_json()) for r in got] == [json.dumps(line) for line in lines]
    assert got[0].entry == ENTRY
    assert got[0].gate == GateWait(12.5, 3, ("cpu 47.1 C > 45.0 C",))
    assert (got[1].status, got[1].exit_code, got[1].error) == ("failed", 3,
                                                               "the engine exited 3")


def test_a_journal_from_before_entry_states_and_gates_still_reads(tmp_path: Path) -> None:
    old = {k: v for k, v in RECORD.items() if k not in ("entry", "gate")}
    _journal(tmp_path, old, {**old, "index": 1, "label": "02-B", "entry": None, "gate": None})
    first, second = read_journal(tmp_path)
    assert first.entry == EntryState(t_wall=0.0) and first.gate == GateWait()
    assert second.entry == EntryState(t_wall=0.0) and second.gate == GateWait()
    assert first.tokens_per_s == 10.0


def test_keys_from_a_newer_writer_are_ignored(tmp_path: Path) -> None:
    _journal(tmp_path, {**RECORD, "added_later": [1],
                        "entry": {**RECORD["entry"], "gpu_temp_c": 50}})
    assert read_journal(tmp_path) == [CellRecord.from_json(RECORD)]


def test_a_torn_last_record_is_left_out(tmp_path: Path) -> None:
    line = json.dumps(RECORD) + "\n"
    _journal(tmp_path, line, line[:-40])
    assert read_journal(tmp_path) == [CellRecord.from_json(RECORD)]


def test_a_run_without_a_journal_has_no_cells(tmp_path: Path) -> None:
    assert read_journal(tmp_path) == [] and read_samples(tmp_path) == []


@pytest.mark.parametrize(("change", "where"), [
    ({"tokens_per_s": "fast"}, '`tokens_per_s`: expected a number, got a string ("fast")'),
    ({"index": True}, "`index`: expected an integer, got a boolean (true)"),
    ({"entry": {"t_wall": 1.0, "caps_khz": {"policy0": 1.5}}},
     "`entry.caps_khz.policy0`: expected an integer, got a float (1.5)"),
    ({"gate": {"reasons": "hot"}}, "`gate.reasons`: expected an array of strings"),
    ({"label": "../../etc"}, '`label`: is "../../etc", not a folder name (cells/NN-NAME)'),
    ({"label": ".."}, '`label`: is "..", not a folder name'),
    ({"label": "a\\b"}, "`label`: is "),
])
def test_a_bad_record_names_the_file_line_and_key(tmp_path: Path, change: dict[str, Any],
                                                  where: str) -> None:
    path = _journal(tmp_path, _line(), "\n", {**_line(1, "02-B"), **change})
    with pytest.raises(RecordError) as e:
        read_journal(tmp_path)
    assert str(e.value).startswith(f"{path}:3: malformed cell record: {where}")


def test_a_record_missing_a_key_is_named(tmp_path: Path) -> None:
    d = dict(RECORD)
    del d["t_end_mono"]
    path = _journal(tmp_path, d)
    with pytest.raises(RecordError) as e:
        read_journal(tmp_path)
    assert str(e.value) == f"{path}:1: malformed cell record: missing key `t_end_mono`"


@pytest.mark.parametrize("label", ["01-B", "07-spec 2 (v1.2)", "", "..x", "é"])
def test_check_label_takes_one_folder_name(label: str) -> None:
    check_label(label, "label")


@pytest.mark.parametrize("label", [".", "..", "a/b", "/abs", "a\\b", "a\x00b"])
def test_check_label_refuses_what_leaves_the_cells_folder(label: str) -> None:
    with pytest.raises(BadField) as e:
        check_label(label, "cells[3].label")
    assert e.value.where == "cells[3].label" and "not a folder name" in e.value.problem


def test_entry_state_names_the_capped_policies() -> None:
    assert ENTRY.capped() == ["policy0"]
    odd = EntryState(t_wall=0.0, caps_khz={"policy0": 1, "policy9": 1}, hw_max_khz={"policy0": 1})
    assert odd.capped() == []  # at its maximum, or no maximum known


def test_samples_round_trip_and_take_any_reading(tmp_path: Path) -> None:
    samples = [Sample(1.0, 1000.0, {"temp.cpu_c": 40.5, "cpu.policy0.cap_khz": 1_800_000,
                                    "android.thermal_status": "none", "charging": True,
                                    "cpu.policy4.cap_khz": None}, cell=0),
               Sample(1.5, 1000.5, {})]
    for s in samples:
        append_jsonl(tmp_path / "samples.jsonl", s.to_json(), fsync=False)
    assert read_samples(tmp_path) == samples
    assert read_samples(tmp_path)[1].cell is None


@pytest.mark.parametrize(("line", "where"), [
    ('{"t_mono":1,"t_wall":2,"values":{"cpu.policy0.cap_khz":"max"}}',
     '`values."cpu.policy0.cap_khz"`: expected a number, got a string ("max")'),
    ('{"t_mono":1,"t_wall":2,"values":{"cpu.policy0.cap_khz":true}}',
     '`values."cpu.policy0.cap_khz"`: expected a number, got a boolean'),
    ('{"t_mono":1,"t_wall":2,"values":{"temp.cpu_c":NaN}}',
     '`values."temp.cpu_c"`: must be a finite number (got nan)'),
    ('{"t_mono":1,"t_wall":2,"values":{"mem.available_mib":1e30}}',
     '`values."mem.available_mib"`: 1e+30 is too large'),
    ('{"t_mono":1,"t_wall":2,"values":[]}', "`values`: expected an object, got an array"),
    ('{"t_mono":1,"values":{}}', "missing key `t_wall`"),
])
def test_a_bad_sample_names_the_file_line_and_key(tmp_path: Path, line: str, where: str) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text('{"t_mono":0,"t_wall":1,"values":{}}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(RecordError) as e:
        read_samples(tmp_path)
    assert str(e.value).startswith(f"{path}:2: malformed sample: {where}")
