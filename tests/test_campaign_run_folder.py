"""The run folder's own files (campaign/run_folder.py): a unique folder per start, the
files a campaign starts with, status.json, and the first probe a resume measures against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.campaign.run_folder import (
    PROFILE_FILE,
    create_run_folder,
    new_run_folder,
    read_first_probe,
    write_first_probe,
    write_status,
)
from abbench.errors import WriteError
from abbench.records import Plan, PlannedCell, read_plan
from abbench.records.cell_config import cell_config

PLAN = Plan(campaign="t", cells=(PlannedCell(0, "A", cell_config({"model": "m"}), label="01-A"),),
            spacing_s=0.0, warmup_tokens=0, device="local")


class ProfiledDevice:
    """What create_run_folder asks of a device: the profile a simulated one runs on."""

    def __init__(self, profile: str | None) -> None:
        self.profile_toml = profile


def test_folders_started_in_the_same_second_are_numbered(tmp_path: Path) -> None:
    first, second = new_run_folder(tmp_path / "r", "t"), new_run_folder(tmp_path / "r", "t")
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name.startswith(first.name) and second.name.endswith("-1")


def test_a_root_that_cannot_be_made_is_a_write_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(WriteError):
        new_run_folder(tmp_path / "file" / "r", "t")


def test_a_new_folder_holds_the_campaign_the_plan_and_the_profile(tmp_path: Path) -> None:
    prepared: list[Path] = []
    folder = create_run_folder(tmp_path, PLAN, "[campaign]\n", ProfiledDevice("[sim]\n"),  # type: ignore[arg-type]
                               lambda f, d: prepared.append(f))
    assert (folder / "campaign.toml").read_text() == "[campaign]\n"
    assert read_plan(folder) == PLAN
    assert (folder / PROFILE_FILE).read_text() == "[sim]\n"
    assert prepared == [folder]
    real = create_run_folder(tmp_path, PLAN, "", ProfiledDevice(None))  # type: ignore[arg-type]
    assert not (real / PROFILE_FILE).exists()  # a real device has no profile to keep


def test_status_says_the_state_and_why(tmp_path: Path) -> None:
    write_status(tmp_path, "running")
    assert set(json.loads((tmp_path / "status.json").read_text())) == {"state", "t_wall"}
    write_status(tmp_path, "failed", "disk full")
    doc = json.loads((tmp_path / "status.json").read_text())
    assert (doc["state"], doc["error"]) == ("failed", "disk full")


def test_the_first_probe_is_kept_for_a_resume(tmp_path: Path) -> None:
    assert read_first_probe(tmp_path) is None
    write_first_probe(tmp_path, 0.25)
    assert read_first_probe(tmp_path) == 0.25
