"""`abbench sentinels`: history per device and configuration, cool baseline, hot openings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.cli import main
from abbench.commands.sentinels import history
from abbench.records import RepeatRecord, read_sentinels

KEY_A = json.dumps({"cache_mb": 2000, "engine": "embedded"}, sort_keys=True)
KEY_B = json.dumps({"cache_mb": 4000, "engine": "embedded"}, sort_keys=True)


def _line(campaign: str, cell: str, key: str, t: float, tps: float | None) -> str:
    return json.dumps({
        "device": "phone", "simulated": False, "campaign": campaign, "run": f"reports/{campaign}",
        "cell": cell, "name": cell.split("-", 1)[1], "config_key": key, "t_wall": t,
        "tokens_per_s": tps, "fingerprint": "sha256:00", "entry": {"t_wall": t}})


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "sentinels"
    d.mkdir()
    (d / "phone.jsonl").write_text("\n".join([
        _line("cool", "01-base", KEY_A, 1_780_000_000, 4.0),
        _line("cool", "05-base", KEY_A, 1_780_000_600, 3.8),
        _line("cool", "02-big", KEY_B, 1_780_000_100, 5.0),
        _line("hot", "01-base", KEY_A, 1_780_090_000, 3.2),
        _line("hot", "05-base", KEY_A, 1_780_090_600, None),  # a failed cell: no speed
    ]) + "\n")
    (d / "laptop.jsonl").write_text(_line("x", "01-base", KEY_A, 1_780_000_000, 9.0)
                                    .replace('"phone"', '"laptop"') + "\n")
    return d


def test_history_baseline_fraction_and_flag(folder: Path) -> None:
    runs = read_sentinels(folder / "phone.jsonl")
    assert len(runs) == 4  # the line without a speed is skipped
    rows = history(runs, 0.9)[KEY_A]
    assert [(h.run.campaign, round(h.fraction, 3), h.opens_campaign, h.flagged)
            for h in rows] == [("cool", 1.0, True, False), ("cool", 0.95, False, False),
                               ("hot", 0.8, True, True)]
    assert [h.flagged for h in history(runs, 0.75)[KEY_A]] == [False, False, False]


def test_cli_renders_one_device(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sentinels", "phone", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "device phone"
    assert out[1].startswith("  noise floor unknown: no repeats recorded yet")
    # configurations are named by the keys that set them apart, not every key
    assert out[2] == "  config base: cache_mb=2000"
    assert out[3] == "    cool baseline 4.000 tok/s (cool 01-base, 2026-05-28 20:26 UTC)"
    assert out[4] == "    2026-05-28 20:26 UTC  cool  01-base         4.000 tok/s  100.0%"
    assert out[6].startswith("    2026-05-29 21:26 UTC  hot   01-base         3.200 tok/s   80.0%"
                             "  << opened at 80% of the cool baseline")
    assert out[7] == "  config big: cache_mb=4000"
    assert "laptop" not in "\n".join(out)


def test_cli_every_device(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sentinels", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.index("device laptop") < out.index("device phone")


def test_cli_errors(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sentinels", "tablet", "--dir", str(folder)]) == 2
    assert "no sentinel history for `tablet`" in capsys.readouterr().err
    assert main(["sentinels", "--dir", str(tmp_path / "none")]) == 2
    assert "ERROR: no sentinel history in" in capsys.readouterr().err
    (folder / "phone.jsonl").write_text("{oops\n" + _line("a", "01-b", KEY_A, 1, 1.0) + "\n")
    assert main(["sentinels", "phone", "--dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "phone.jsonl:1: not a JSON line" in err and "Traceback" not in err


def _repeat(run: str, first: str, second: str, ratio: float, t: float, group: int | None = 0,
            comparable: bool = True) -> str:
    return json.dumps(RepeatRecord(
        device="phone", run=run, campaign=run, t_wall=t, config_key=KEY_A, name="base",
        first=first, second=second, log_ratio=ratio, token_variance_first=0.0,
        token_variance_second=0.0, fingerprints_equal=True, matched=False,
        comparable=comparable, group=group).to_json())


def test_cli_shows_the_noise_floor_and_its_trend(folder: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with (folder / "phone.jsonl").open("a") as f:
        f.write(_repeat("cal-1", "01-B", "02-B", 0.04, 1_780_000_000) + "\n")
        f.write(_repeat("cal-1", "02-B", "03-B", -0.04, 1_780_000_100) + "\n")
        f.write(_repeat("hot-1", "01-B", "03-B", -0.3, 1_780_090_000, None, False) + "\n")
    assert main(["sentinels", "phone", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    # cells 0, +0.04, 0: variance 0.0016 * 2/3 / 2 ... sd of (0, .04, 0) = 0.0231
    assert out[1] == ("  noise floor ±2.3% per cell (2 df from 1 campaign, the newest up to "
                      "30 df); per campaign:")
    assert out[2] == "    2026-05-28 20:28 UTC  cal-1  ±2.3% (3 cells, 2 df)"
    assert out[3].endswith("hot-1  no countable repeat (1 not comparable or unequal work)")


def test_a_sentinel_line_round_trips_and_older_lines_still_read(tmp_path: Path) -> None:
    from abbench.records import SentinelLine, append_jsonl

    path = tmp_path / "phone.jsonl"
    line = SentinelLine(device="phone", simulated=False, campaign="c", run="reports/c",
                        cell="01-base", name="base", config_key=KEY_A, t_wall=5.0,
                        tokens_per_s=4.0, fingerprint="sha256:00", entry={"t_wall": 5.0})
    append_jsonl(path, line.to_json())
    # an early campaign's line: no device, entry or fingerprint; the history names the device
    append_jsonl(path, {"config_key": KEY_A, "tokens_per_s": 3.0})
    assert read_sentinels(path) == [line, SentinelLine(
        device="phone", simulated=False, campaign="?", run="", cell="?", name="?",
        config_key=KEY_A, t_wall=0.0, tokens_per_s=3.0)]


def test_a_malformed_sentinel_line_names_its_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "s"
    d.mkdir()
    (d / "phone.jsonl").write_text(_line("c", "01-base", KEY_A, 1.0, 4.0) + "\n"
                                   + json.dumps({"tokens_per_s": 4.0}) + "\n")
    assert main(["sentinels", "--dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"{d / 'phone.jsonl'}:2: sentinel line is malformed (no `config_key`)" in err
