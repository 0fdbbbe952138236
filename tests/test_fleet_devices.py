"""A fleet's device names: `sim:PROFILE#N` expansion, duplicates, what a worker offers,
and the `[fleet]` table of a campaign file."""

from __future__ import annotations

from pathlib import Path

import pytest

from abbench.campaign.schema import CampaignFileError, load_campaign
from abbench.errors import UsageError
from abbench.fleet.devices import attached, device_class, expand, resource
from abbench.records.history import history_file
from abbench.sim import open_device

ROOT = Path(__file__).resolve().parents[1]


def test_sim_profile_hash_n_is_n_devices() -> None:
    assert expand(["sim:phone#3", "sim:laptop", "local"]) == [
        "sim:phone#1", "sim:phone#2", "sim:phone#3", "sim:laptop", "local"]
    assert resource("sim:phone#1") == "device:sim:phone#1"


@pytest.mark.parametrize(("devices", "message"), [
    (["sim:phone#2", "sim:phone#1"], "the device `sim:phone#1` is named twice"),
    (["local", "local"], "the device `local` is named twice"),
    (["sim:phone#0"], "the number of devices after `#` must be 1 or more"),
    ([], "no devices"),
])
def test_bad_device_lists(devices: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("`", ".")):
        expand(devices)


def test_each_simulated_device_has_its_own_name_and_history(tmp_path: Path) -> None:
    one, two = open_device("sim:phone#1"), open_device("sim:phone#2")
    try:
        assert (one.name, two.name) == ("sim-phone-1", "sim-phone-2")
        assert one.transport == "sim:phone#1" and one.simulated
        assert history_file(tmp_path, one.name) != history_file(tmp_path, two.name)
    finally:
        one.close()
        two.close()
    with pytest.raises(UsageError, match="must be 1 or more"):
        open_device("sim:phone#x")
    assert device_class("sim:phone#2") == "simulated phone"


def test_a_worker_offers_what_it_is_asked_and_finds() -> None:
    assert attached(["phone#2", "sim:laptop"], [], local=True, adb=False) == [
        "local", "sim:phone#1", "sim:phone#2", "sim:laptop"]
    assert attached([], [], local=False, adb=False) == []


def test_the_fleet_table(tmp_path: Path) -> None:
    base = (ROOT / "cells" / "quickstart.toml").read_text()
    path = tmp_path / "c.toml"
    path.write_text(base + '\n[fleet]\ndevices = ["sim:phone#2", "adb:R58M"]\n')
    assert load_campaign(path).fleet.devices == ("sim:phone#2", "adb:R58M")
    path.write_text(base + '\n[fleet]\ndevices = ["a phone"]\n')
    with pytest.raises(CampaignFileError, match=r"`fleet.devices\[0\]`: \"a phone\" is not"):
        load_campaign(path)
    path.write_text(base + '\n[fleet]\ndevice = ["sim:phone"]\n')
    with pytest.raises(CampaignFileError, match="fleet.device"):
        load_campaign(path)
