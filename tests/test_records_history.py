"""records/history.py: the device history's repeat lines (appended once each, a bad one
skipped) and a run's noise-floor snapshot."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from abbench.errors import RecordError
from abbench.records.history import (
    NOISE_FLOOR_FILE,
    NoiseFloor,
    RepeatRecord,
    append_repeats,
    history_file,
    read_noise_floor,
    read_repeats,
)
from abbench.records.jsonl import append_jsonl


def _repeat(run: str = "run-1", first: str = "01-B", second: str = "03-B",
            **changes: object) -> RepeatRecord:
    r = RepeatRecord(device="sim:phone", run=run, campaign="t", t_wall=1000.0,
                     config_key='{"arm":"B"}', name="B", first=first, second=second,
                     log_ratio=-0.01, token_variance_first=1e-4, token_variance_second=2e-4,
                     fingerprints_equal=True, matched=True, comparable=True, group=0)
    return dataclasses.replace(r, **changes)


def test_history_file_is_one_safe_file_name_per_device(tmp_path: Path) -> None:
    assert history_file(tmp_path, "adb:R5CT 1/x") == tmp_path / "adb_R5CT_1_x.jsonl"
    assert history_file(tmp_path, "sim:phone#2") == tmp_path / "sim_phone_2.jsonl"
    assert history_file(tmp_path, "local.host-1") == tmp_path / "local.host-1.jsonl"
    assert history_file(tmp_path, "") == tmp_path / "device.jsonl"


def test_a_repeat_round_trips_through_its_json() -> None:
    r = _repeat(group=None, simulated=True)
    assert RepeatRecord.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert r.to_json()["kind"] == "repeat"


def test_appended_repeats_read_back_and_none_is_added_twice(tmp_path: Path) -> None:
    path = tmp_path / "sentinels" / "sim_phone.jsonl"  # the folder is made on first write
    records = [_repeat(), _repeat(first="03-B", second="05-B", log_ratio=0.02)]
    assert append_repeats(path, records) == 2
    assert read_repeats(path) == records
    # a resumed campaign reports the same pairs again, and one new one
    again = [*records, _repeat(run="run-2")]
    assert append_repeats(path, again) == 1
    assert [(r.run, r.first) for r in read_repeats(path)] == [
        ("run-1", "01-B"), ("run-1", "03-B"), ("run-2", "01-B")]
    assert append_repeats(path, []) == 0


def test_nothing_to_append_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sentinels" / "d.jsonl"
    assert append_repeats(path, []) == 0
    assert not path.parent.exists()


def test_other_lines_and_a_repeat_that_does_not_parse_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    append_jsonl(path, {"run": "r", "cell": "01-B", "tok/s": 9.5}, fsync=False)  # a sentinel
    append_jsonl(path, {**_repeat().to_json(), "log_ratio": "x"}, fsync=False)  # bad
    append_jsonl(path, {"kind": "repeat", "run": "r"}, fsync=False)  # keys missing
    append_jsonl(path, {**_repeat(run="ok").to_json(), "newer_key": 1}, fsync=False)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"kind":"repeat","run":')  # a crash mid-line
    assert [r.run for r in read_repeats(path)] == ["ok"]


def test_an_older_repeat_line_takes_the_defaults(tmp_path: Path) -> None:
    old = _repeat().to_json()
    for key in ("group", "simulated"):
        del old[key]
    path = tmp_path / "d.jsonl"
    append_jsonl(path, old, fsync=False)
    (got,) = read_repeats(path)
    assert got.group is None and got.simulated is False


def test_an_absent_history_has_no_repeats(tmp_path: Path) -> None:
    assert read_repeats(tmp_path / "absent.jsonl") == []


def test_the_noise_floor_snapshot_round_trips(tmp_path: Path) -> None:
    floor = NoiseFloor(variance=4e-4, df=6, token_variance=1e-5, repeats=9,
                       campaigns=("run-2", "run-1"), history="/s/sim_phone.jsonl",
                       t_wall=1.5e9, device="sim:phone", simulated=True)
    assert floor.to_json()["campaigns"] == ["run-2", "run-1"]
    (tmp_path / NOISE_FLOOR_FILE).write_text(json.dumps(floor.to_json()), encoding="utf-8")
    assert read_noise_floor(tmp_path) == floor


def test_a_run_without_a_snapshot_has_none(tmp_path: Path) -> None:
    assert read_noise_floor(tmp_path) is None


def test_an_older_snapshot_takes_the_defaults(tmp_path: Path) -> None:
    (tmp_path / NOISE_FLOOR_FILE).write_text('{"variance": 0.001, "df": 3}', encoding="utf-8")
    floor = read_noise_floor(tmp_path)
    assert floor == NoiseFloor(variance=0.001, df=3)
    assert floor is not None and floor.campaigns == () and floor.device == ""


@pytest.mark.parametrize(("text", "problem"), [
    ('{"variance": 0.001, "df": 2.5}', "`df`: expected an integer, got a float (2.5)"),
    ('{"campaigns": "run-1"}', '`campaigns`: expected an array of strings, got a string'),
    ('{"variance": NaN}', "`variance`: must be a finite number (got nan)"),
    ('{"variance": ', "("),
])
def test_a_snapshot_that_does_not_parse_names_the_file(tmp_path: Path, text: str,
                                                       problem: str) -> None:
    path = tmp_path / NOISE_FLOOR_FILE
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecordError) as e:
        read_noise_floor(tmp_path)
    assert str(e.value).startswith(f"{path}: malformed noise floor")
    assert problem in str(e.value)
