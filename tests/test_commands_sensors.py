"""`abbench sensors`, through the real CLI entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from abbench.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"


def test_sensors_on_a_phone_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sensors", "--root", str(FIXTURES / "android-qwen"), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert ("cpufreq        2 policies via sysfs: policy0 cap 2188800 of 3321600 kHz CAPPED; "
            "policy6 cap 1651200 of 3801600 kHz CAPPED\n") in out
    assert "reading 1/2" in out and "reading 2/2" in out
    assert re.search(r"\n  cpu\.policy6\.cap_khz +1651200\n", out)
    assert re.search(r"\n  android\.thermal_status +1\n", out)
    assert "\nmissing:" not in out and "only thermal signal" not in out
    assert "speed probe:" in out


def test_sensors_without_thermal_sensors(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "loadavg").write_text("0.10 0.20 0.30 1/100 42\n")
    assert main(["sensors", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpufreq        missing: no /sys/devices/system/cpu/cpufreq/policy*" in out
    assert "thermal zones  missing" in out
    assert "missing: cpufreq caps and CPU temperature" in out
    assert "the speed probe is the only thermal signal" in out
    assert re.search(r"\n  load\.1m +0\.1\n", out)
    assert "speed probe: " in out and " ms (fixed workload, min of 5" in out


def test_sensors_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sensors", "--root", str(FIXTURES / "linux-laptop"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["transport"] == "local" and doc["simulated"] is False
    assert doc["samples"][0]["values"]["temp.cpu_c"] == 52.0
    assert doc["thermal_gaps"] == [] and doc["speed_probe_s"] > 0
    assert doc["exposes"]["battery"] == "no temperature, Discharging, 87% (power_supply)"


@pytest.mark.parametrize("argv,message", [
    (["sensors", "--transport", "sim:nope"], "ERROR: unknown simulated device profile "
                                             "`nope`"),
    (["sensors", "--transport", "bogus"], "ERROR: unknown transport `bogus`"),
    (["sensors", "--transport", "adb:X", "--root", "/tmp"], "ERROR: --root applies to the "
                                                            "local transport only"),
])
def test_sensors_errors(argv: list[str], message: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("count", ["0", "7201", "1000000000"])
def test_sensors_bad_sample_count(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    # a billion readings was once taken at its word: hours of silence, then nothing printed
    with pytest.raises(SystemExit) as e:
        main(["sensors", "--samples", count])
    assert e.value.code == 2
    assert (f"ERROR: argument --samples: the count must be in [1, 7200], got {count}"
            in capsys.readouterr().err)


def test_sensors_prints_each_reading_as_it_is_taken(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from abbench.commands import sensors

    seen: list[str] = []  # what was printed before each sleep between readings
    monkeypatch.setattr(sensors.time, "sleep", lambda s: seen.append(capsys.readouterr().out))
    assert main(["sensors", "--root", str(FIXTURES / "android-qwen"), "--samples", "3"]) == 0
    assert ["reading 1/3" in seen[0], "reading 2/3" in seen[1]] == [True, True]
    assert "reading 3/3" in capsys.readouterr().out
