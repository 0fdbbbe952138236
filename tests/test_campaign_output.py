"""Judging what a cell produced (campaign/output.py `read_result`): a usable tokens/s, or
the reason the cell failed; NaN in a summary kept out of the record."""

from __future__ import annotations

import json
from pathlib import Path

from abbench.campaign.output import CellResult, read_result
from abbench.records.cell_config import EmbeddedConfig, ExternalConfig
from abbench.records.summary import RunSummary
from abbench.sensors import open_device

EMBEDDED = EmbeddedConfig({"model": "synthetic:tiny"})


def result_of(tmp_path: Path, doc: object) -> CellResult:
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    return read_result(EMBEDDED, tmp_path, open_device("local"))


def test_a_usable_summary_gives_its_speed_and_fingerprint(tmp_path: Path) -> None:
    r = result_of(tmp_path, {"summary": {"tok/s": 12.5, "drift": float("nan")},
                             "fingerprint": "fp"})
    assert r == CellResult(summary=RunSummary(tok_per_s=12.5, extra={"drift": None}),
                           fingerprint="fp", tokens_per_s=12.5)
    assert r.summary.to_json() == {"tok/s": 12.5, "drift": None}


def test_a_speed_that_is_not_one_fails_the_cell(tmp_path: Path) -> None:
    for bad in (0, -1.0, True, "fast", float("inf")):
        r = result_of(tmp_path, {"summary": {"tok/s": bad}})
        assert r.tokens_per_s is None, bad
        assert r.error == f"it reported no usable throughput (tok/s = {bad!r})"
        # The record keeps what the cell reported (JSON has no infinity: null).
        assert r.summary.to_json() == {"tok/s": None if bad == float("inf") else bad}
    assert result_of(tmp_path, {"summary": {"tokens": 4}}).error is None  # no speed to judge


def test_output_that_cannot_be_read_fails_the_cell(tmp_path: Path) -> None:
    assert result_of(tmp_path, {"nothing": 1}).error == \
        "summary.json is not an engine run JSON ('summary')"
    r = read_result(EMBEDDED, tmp_path / "absent", open_device("local"))
    assert r == CellResult(error="the cell wrote no summary.json")
    stdout = ExternalConfig({"engine": "external", "command": ["x"], "output": "stdout-summary"})
    (tmp_path / "stdout.txt").write_text("no summary here\n")
    assert read_result(stdout, tmp_path, open_device("local")).error == \
        "no `generation:` line in the command's stdout"
