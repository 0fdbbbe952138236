"""`abbench sentinels`: history per device and configuration, cool baseline, hot openings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.cli import main
from abbench.sentinels_cmd import history, load

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
    runs = load(folder / "phone.jsonl")
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
    assert out[1] == "  config base: cache_mb=2000 engine=embedded"
    assert out[2] == "    cool baseline 4.000 tok/s (cool 01-base, 2026-05-28 20:26 UTC)"
    assert out[3] == "    2026-05-28 20:26 UTC  cool  01-base         4.000 tok/s  100.0%"
    assert out[5].startswith("    2026-05-29 21:26 UTC  hot   01-base         3.200 tok/s   80.0%"
                             "  << opened at 80% of the cool baseline")
    assert "config big: cache_mb=4000" in out[6]
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
