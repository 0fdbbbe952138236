"""The fleet folder's records: fleet.json and fleet-journal.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.errors import BadField, RecordError
from abbench.records.fleet import (
    FleetEvent,
    FleetPlan,
    append_fleet_event,
    device_folder,
    last_ends,
    read_fleet_journal,
    read_fleet_plan,
)


def test_events_round_trip_and_the_last_end_wins(tmp_path: Path) -> None:
    (tmp_path / "fleet.json").write_text(json.dumps(
        FleetPlan("c", "c.toml", ("sim:phone#1",), 1.0).to_json()))
    assert read_fleet_plan(tmp_path).devices == ("sim:phone#1",)
    events = [FleetEvent("start", "sim:phone#1", 1.0, host="h"),
              FleetEvent("end", "sim:phone#1", 2.0, status="failed", error="lost"),
              FleetEvent("start", "sim:phone#1", 3.0),
              FleetEvent("end", "sim:phone#1", 4.0, status="done", run="r", exit=0)]
    for e in events:
        append_fleet_event(tmp_path, e)
    assert read_fleet_journal(tmp_path) == events
    assert last_ends(events)["sim:phone#1"].status == "done"


def test_bad_records_name_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(BadField, match="status"):
        FleetEvent("end", "d", 1.0, status="fine")
    with pytest.raises(RecordError, match="not a fleet folder"):
        read_fleet_plan(tmp_path)
    (tmp_path / "fleet-journal.jsonl").write_text('{"event": "begin", "device": "d", '
                                                  '"t_wall": 1}\n')
    with pytest.raises(RecordError, match=r"fleet-journal.jsonl:1: malformed fleet event"):
        read_fleet_journal(tmp_path)


def test_device_folders_are_plain_names() -> None:
    assert device_folder("sim:phone#2") == "sim_phone_2"
    assert device_folder("ssh:user@host") == "ssh_user_host"
    assert device_folder("..") == "device"
