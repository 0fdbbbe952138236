"""records/keys.py: every key a reader produces is in the table, families included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.records import keys
from abbench.sensors.device import open_device

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("tree", ["android-qwen", "linux-laptop"])
def test_every_key_a_device_tree_gives_is_described(tree: str) -> None:
    device = open_device("local", root=FIXTURES / "sensors" / tree)
    values = {**device.sample(), **device.sample()}  # the foreign load needs two readings
    assert values and keys.FOREIGN_CORES in values
    unknown = [k for k in values if keys.describe(k) is None]
    assert not unknown, unknown


def test_every_key_of_a_simulated_campaign_is_described() -> None:
    lines = (FIXTURES / "runs" / "embedded-sim" / "samples.jsonl").read_text().splitlines()
    seen = {k for line in lines for k in json.loads(line)["values"]}
    assert keys.CPU_TEMP_C in seen and keys.cap_khz("policy0") in seen
    assert [k for k in seen if keys.describe(k) is None] == []


@pytest.mark.parametrize(("key", "label"), [
    ("temp.cpu_c", "CPU temperature (hottest CPU zone)"),
    ("temp.skin-therm_c", "thermal zone"),
    ("cpu.policy4.cap_khz", "frequency cap"),
    ("cpu.all.hw_max_khz", "hardware maximum (psutil)"),
    ("android.temp.VIRTUAL-SKIN_c", "thermal HAL sensor"),
    ("psi.memory.full_avg10", "pressure stall"),
    ("load.foreign_cores", "foreign CPU load (other processes)"),
    ("load.runnable_tasks", "runnable tasks (run queue)"),
    ("gpu.1.temp_c", "a later GPU's reading (as gpu.<name>)"),
])
def test_describe_knows_each_family(key: str, label: str) -> None:
    entry = keys.describe(key)
    assert entry is not None and entry.label == label


def test_an_unknown_key_is_not_described() -> None:
    assert keys.describe("cpu.policy0.volts") is None
    assert keys.describe("temperature") is None


def test_policies_reads_one_field_per_policy() -> None:
    values = {"cpu.policy0.cap_khz": 1, "cpu.policy0.hw_max_khz": 2, "cpu.policy6.cap_khz": 3,
              "temp.cpu_c": 40.0, "cpu.all.cur_khz": 5}
    assert keys.policies(values, "cap_khz") == {"policy0": 1, "policy6": 3}
    assert keys.policies(values, "hw_max_khz") == {"policy0": 2}
    assert keys.policy_of(keys.cap_khz("policy6"), "cap_khz") == "policy6"
    assert keys.policy_of("temp.cpu_c", "cap_khz") is None
