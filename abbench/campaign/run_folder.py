"""The run folder a campaign fills, apart from its journal and samples: creating it,
the files it starts with, `status.json`, and the speed probe's reference.

A new folder is `ROOT/NAME-YYYYmmdd-HHMMSS` (with `-N` when that exists) made with one
mkdir, so two campaigns started in the same second never share one. It starts with the
campaign file as resolved (`campaign.toml`), the plan (`plan.json`, rewritten whole when
a sequential campaign appends a round) and a simulated device's profile; `status.json`
says whether the campaign is running, complete, interrupted or failed (and why).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from abbench.errors import UsageError, WriteError
from abbench.fsutil import atomic_write_text
from abbench.records import Plan
from abbench.sensors import Device

PROFILE_FILE = "device-profile.toml"  # a simulated device's profile, as the run used it
PROBE_FILE = "probe.json"  # the campaign's first speed probe: a resume's reference too
STATUS_FILE = "status.json"

# Writes what a command adds to a new run folder (its noise-floor snapshot).
Prepare = Callable[[Path, Device], None]


def new_run_folder(root: Path, name: str) -> Path:
    """A new, empty folder under `root` for campaign `name`."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            folder = root / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
            try:
                folder.mkdir()  # atomic: two campaigns never share a folder
                return folder
            except FileExistsError:
                continue
    except OSError as e:
        raise WriteError.from_os(e) from None
    raise UsageError(f"{root}: cannot create a unique run folder for `{name}`")


def create_run_folder(root: Path, plan: Plan, resolved_toml: str, device: Device,
                      prepare: Prepare | None = None) -> Path:
    """A new run folder holding campaign.toml, plan.json, a simulated device's profile
    and what `prepare` writes."""
    folder = new_run_folder(root, plan.campaign)
    try:
        atomic_write_text(folder / "campaign.toml", resolved_toml)
        write_plan(folder, plan)
        profile = device.profile_toml
        if profile is not None:  # a simulated device: the run keeps the model it ran on
            atomic_write_text(folder / PROFILE_FILE, profile)
        if prepare is not None:
            prepare(folder, device)
    except OSError as e:
        # nothing ran: a folder that is not a run would only be in the user's way
        shutil.rmtree(folder, ignore_errors=True)
        raise WriteError.from_os(e, "run the campaign again") from None
    return folder


def write_plan(folder: Path, plan: Plan) -> None:
    """plan.json, in one replace: a crash leaves the old plan or the new one, whole."""
    atomic_write_text(folder / "plan.json", json.dumps(plan.to_json(), indent=1) + "\n")


def write_status(folder: Path, state: str, error: str | None = None) -> None:
    doc: dict[str, Any] = {"state": state, "t_wall": time.time()}
    if error is not None:
        doc["error"] = error
    atomic_write_text(folder / STATUS_FILE, json.dumps(doc) + "\n")


def read_first_probe(folder: Path) -> float | None:
    """The seconds the campaign's first speed probe took (None: no probe has run yet)."""
    path = folder / PROBE_FILE
    if not path.exists():
        return None
    return float(json.loads(path.read_text())["first_probe_s"])


def write_first_probe(folder: Path, seconds: float) -> None:
    atomic_write_text(folder / PROBE_FILE, json.dumps({"first_probe_s": seconds}) + "\n")
