"""A fleet folder: one campaign run on many devices by `abbench fleet`
(docs/fleet.md#what-comes-back-where).

```
FLEET/
  fleet.json             FleetPlan: the campaign, its devices, where Ray ran
  campaign.toml          the campaign as resolved (absolute paths; each device's run folder
                         holds its own, with its device)
  fleet-journal.jsonl    one FleetEvent per device campaign started or ended (appended)
  DEVICE/RUN/            each device's run folder, an ordinary campaign's (`device_folder`)
  fleet-report.md|json   rendered by `abbench fleet --report FLEET`
```
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from abbench.errors import BadField, RecordError
from abbench.records.jsonl import append_jsonl, read_jsonl_records, read_record
from abbench.records.schema import from_dict

FLEET_PLAN_FILE = "fleet.json"
FLEET_JOURNAL_FILE = "fleet-journal.jsonl"
FLEET_CAMPAIGN_FILE = "campaign.toml"
FLEET_REPORT_STEM = "fleet-report"
EVENTS = ("start", "end")
# How a device's campaign ended: its run folder came back whole (`done`: the campaign
# finished, whatever its verdicts), or it stopped early with its folder (`interrupted`:
# resumable), or nothing usable came back (`failed`: the device or its host was lost).
STATUSES = ("done", "interrupted", "failed")


@dataclass(frozen=True)
class FleetPlan:
    """`fleet.json`: what `abbench fleet` was asked to run."""

    campaign: str  # the campaign's name
    source: str  # the campaign file as given on the command line
    devices: tuple[str, ...]  # transports, in order (`sim:PROFILE#N` expanded)
    t_wall: float  # when the fleet started
    ray_address: str = ""  # "" when Ray ran embedded in the `abbench fleet` process
    sentinels: str = ""  # the device history folder the campaigns used (each host's)

    def __post_init__(self) -> None:
        if not self.devices:
            raise BadField(("devices",), "none")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FleetPlan:
        return from_dict(cls, d)


@dataclass(frozen=True)
class FleetEvent:
    """One line of `fleet-journal.jsonl`: a device's campaign started (on `host`) or
    ended (`status`, its run folder `run` under the device's folder, the campaign's
    `exit` status, the device's class as its own properties give it)."""

    event: str  # start | end
    device: str
    t_wall: float
    host: str = ""
    node: str = ""  # the Ray node that ran it
    status: str = ""  # for "end": done | interrupted | failed
    run: str = ""  # for "end": the run folder's name ("" when none came back)
    exit: int | None = None  # the device campaign's exit status
    device_class: str = ""  # model / SoC, from the device itself ("" when unknown)
    error: str = ""  # why a failed campaign failed (its stderr's tail)

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise BadField(("event",), f"{self.event!r} is not one of {', '.join(EVENTS)}")
        if self.event == "end" and self.status not in STATUSES:
            raise BadField(("status",),
                           f"{self.status!r} is not one of {', '.join(STATUSES)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FleetEvent:
        return from_dict(cls, d)


def device_folder(device: str) -> str:
    """The folder a device's run folder comes back into (what a name cannot hold → `_`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", device).strip("._") or "device"


def read_fleet_plan(fleet: Path) -> FleetPlan:
    plan = read_record(fleet / FLEET_PLAN_FILE, FleetPlan, "fleet plan")
    if plan is None:
        raise RecordError(f"{fleet}: not a fleet folder (no {FLEET_PLAN_FILE})")
    return plan


def read_fleet_journal(fleet: Path) -> list[FleetEvent]:
    return read_jsonl_records(fleet / FLEET_JOURNAL_FILE, FleetEvent.from_json,
                              "fleet event")


def append_fleet_event(fleet: Path, event: FleetEvent) -> None:
    append_jsonl(fleet / FLEET_JOURNAL_FILE, event.to_json())


def last_ends(events: list[FleetEvent]) -> dict[str, FleetEvent]:
    """Each device's latest "end" event (a resumed campaign ends more than once)."""
    return {e.device: e for e in events if e.event == "end"}
