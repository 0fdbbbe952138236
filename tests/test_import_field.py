"""Imports, third round (issue 41): what the field's tools print today, through the real
CLI. Each fixture is built by `tests/fixtures/imports/build.py` from the engine's and its
drivers' own format strings (`tests/bmoe_formats.py`, each cited), and each folder's README
says which lines it mirrors; the identity classes (1, 2) are in test_import_identity.py.

- class 3, `folder-mixed/`: runs beside a replay curve, notes, a driver log of two runs
  that have CSVs and a stdout log of three that do not;
- class 4, `tells-pressure/`: two runs of one model, both deep in memory pressure, and the
  driver script that ran them;
- class 5, `csv-v2-spec/`: today's CSV, a self-speculative arm whose decode is 1.2x faster
  while what its user waits through is slower, two turns a file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abbench.cli import main
from abbench.records import read_cell_files, read_journal, read_plan

FIXTURES = Path(__file__).parent / "fixtures" / "imports"
KINDS = "not a kind abbench reads (.csv, .metrics, .log, .out, .state, .sh)"


def run_import(src: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str
               ) -> tuple[int, str, str, dict[str, Any], dict[str, Any]]:
    """Exit status, stdout, stderr, report.json and import.json of `abbench import`."""
    rc = main(["import", str(src), "--out", str(out), "--style", "plain", *args])
    printed = capsys.readouterr()
    if rc == 2:
        return rc, printed.out, printed.err, {}, {}
    return (rc, printed.out, printed.err, json.loads((out / "report.json").read_text()),
            json.loads((out / "import.json").read_text()))


# -- class 3: a folder that is not only runs -------------------------------------------


def test_a_folder_with_curves_notes_and_logs_imports_its_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err, report, info = run_import(FIXTURES / "folder-mixed", tmp_path / "run", capsys)
    assert rc == 0, err
    assert info["not_imported"] == [
        {"path": "README.md", "reason": KINDS, "line": None},
        {"path": "findings.md", "reason": KINDS, "line": None},
        {"path": "qwen-curve.csv", "line": None, "reason":
         "a CSV that is not a per-token table (its columns: budget_mib, policy, hit_pct_cum, "
         "hit_pct_decode, read_mib; a bmoe_metrics CSV has `wall_ms` or `step`)"}]
    # five runs: two CSVs joined to their driver log's sections, three only a log records
    labels = [c.label for c in read_plan(tmp_path / "run").cells]
    assert labels == ["01-k2_io4_pf0", "02-k2_io4_pf4", "03-k2_io8_pf0", "04-qwen-lru_a",
                      "05-qwen-lfu_a"]
    assert info["order"]["kind"] == "measured"
    cells = {c["label"]: c for c in info["cells"]}
    log_only = cells["01-k2_io4_pf0"]
    assert log_only["files"] == ["gptoss-matrix.out"]
    assert log_only["facts"]["tok/s"]["source"].startswith(
        "gptoss-matrix.out:2-10 (section `k2_io4_pf0`)")
    journal = {r.label: r for r in read_journal(tmp_path / "run")}
    assert journal["01-k2_io4_pf0"].tokens_per_s == 0.687  # its `generation:` line
    assert journal["02-k2_io4_pf4"].summary.read_mib == pytest.approx(150.0 * 24, rel=1e-3)
    # the driver log's section `lru_a` is run `qwen-lru_a`: its entry and exit readings
    lru = journal["04-qwen-lru_a"]
    assert (lru.entry.cpu_temp_c, lru.entry.caps_khz) == (42.0, {"cpu": 2265600})
    assert lru.entry.mem_available_mib == pytest.approx(6044032 / 1024)
    assert cells["04-qwen-lru_a"]["facts"]["entry"]["source"] == \
        "qwen-ab-run1.log:2 (named by banner line 1)"
    # its exit line has no time (the driver printed none): said, and kept off the timeline
    assert "qwen-ab-run1.log:4 (exit): a reading of run qwen-lru_a with no time" in \
        " ".join(info["notes"])
    # the `3%` a line break left on the next line is said, not read
    assert "qwen-ab-run1.log:2: `ENTRY:` '3%' is not key=value: left out" in err


def test_a_folder_of_curves_alone_is_refused_naming_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "qwen-curve.csv").write_text((FIXTURES / "folder-mixed" / "qwen-curve.csv")
                                        .read_text())
    rc, _, err, _, _ = run_import(src, tmp_path / "run", capsys)
    assert rc == 2
    (line,) = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert "qwen-curve.csv: a CSV that is not a per-token table" in line
    assert not (tmp_path / "run").exists()


# -- class 4: contamination without order ---------------------------------------------


def test_two_runs_deep_in_memory_pressure_are_both_flagged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err, report, info = run_import(FIXTURES / "tells-pressure", tmp_path / "run",
                                            capsys)
    assert rc == 0, err
    floors = {t["cell"]: t["detail"] for t in report["tells"] if t["kind"] == "memory_floor"}
    assert sorted(floors) == [0, 1]
    assert floors[0].startswith("free memory fell to 648 MiB during the cell, 9.6% of the "
                                "device's RAM (at least 6714 MiB (the most MemAvailable any "
                                "cell recorded; MemTotal not recorded)), below 12.5%")
    # the order is the driver script's, its run lines in the order it ran them
    assert info["order"] == {"kind": "measured", "source": "the runs in sequence in "
                             "driver-matrix.sh (file order)"}
    assert [c.label for c in read_plan(tmp_path / "run").cells] == ["01-gemma_kdef",
                                                                     "02-gemma_k6"]
    # the run line is part of what the configuration rests on; the preamble's effective
    # top-k (6, and 8 where the line said `--n-expert-used 0`: the model's) beats the flag
    assert info["cells"][1]["facts"]["config"]["source"] == (
        "whole: gemma_k6.csv preamble and driver-matrix.sh:16 (run line)")
    assert [c["config"]["n_expert_used"] for c in info["cells"]] == ["8", "6"]
    assert "entry" not in info["cells"][1]["facts"]  # a run line reads no device state
    assert "[memory_floor]" in out


def test_a_memory_floor_is_flagged_whatever_order_the_runs_ran_in(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for f in (FIXTURES / "tells-pressure").glob("gemma_*"):
        (src / f.name).write_text(f.read_text())  # no script: no order
    rc, _, _, report, info = run_import(src, tmp_path / "run", capsys)
    assert info["order"]["kind"] == "unknown"
    assert sorted(t["cell"] for t in report["tells"] if t["kind"] == "memory_floor") == [0, 1]


# -- class 5: today's CSV -----------------------------------------------------------------


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict, dict, Path]:
    out = tmp_path_factory.mktemp("spec") / "run"
    rc = main(["import", str(FIXTURES / "csv-v2-spec"), "--out", str(out), "--style", "plain",
               "--decision", "spec=mtp:spec=off"])
    return (rc, (out / "report.md").read_text(), json.loads((out / "report.json").read_text()),
            json.loads((out / "import.json").read_text()), out)


def test_the_speculative_arm_is_read_as_its_user_waits_through_it(spec: tuple) -> None:
    rc, md, report, info, out = spec
    (d,) = report["decisions"]
    # the decode alone is about 1.2x faster; what a user waits through is slower: NO-GO
    assert (d["candidate"], d["baseline"], d["verdict"]) == ("bmoe-20260801-102130",
                                                             "bmoe-20260801-101500", "NO-GO")
    assert 0.85 < d["ratio"]["estimate"] < 0.95 and d["ratio"]["high"] < 1.0
    cells = report["cells"]
    decode = [c["decode_tok_s"] / c["tokens_per_s"]["estimate"] for c in cells]
    spec_cells = [c for c in cells if c["accepted_pct"] is not None]
    plain = [c for c in cells if c["accepted_pct"] is None]
    assert len(spec_cells) == len(plain) == 3
    assert all(1.015 < r < 1.03 for r, c in zip(decode, cells) if c in plain)  # 2 ms a token
    assert all(1.30 < r < 1.45 for r, c in zip(decode, cells) if c in spec_cells)  # drafting
    mean = sum(c["decode_tok_s"] for c in spec_cells) / sum(c["decode_tok_s"] for c in plain)
    assert 1.18 < mean < 1.28  # what the engine's own tok/s would have said
    fact = info["cells"][1]["facts"]["tok/s"]
    assert fact["kind"] == "derived" and fact["source"].startswith(
        "bmoe-20260801-102130.csv:")
    assert "what a user waits through; the decode alone" in fact["source"]
    assert "(2 turns)" in fact["source"]


def test_speculation_is_quoted_next_to_its_speed(spec: tuple) -> None:
    _, md, report, _, _ = spec
    spec_cell = report["cells"][1]
    assert spec_cell["accepted_pct"] == pytest.approx(48.4, abs=1.0)
    assert spec_cell["tokens_per_decode"] == pytest.approx(1.97, abs=0.05)
    assert "% accepted, 1.9" in md and "decode-only tok/s" in md


def test_a_group_is_one_decode_in_the_per_token_times(spec: tuple) -> None:
    """A group's cost sits on its first row in the file; the cell reads it spread over the
    group's tokens, the time before it included."""
    *_, out = spec
    files = read_cell_files(out / "cells" / "02-bmoe-20260801-102130")
    wall, decode = files.columns["wall_ms"], files.columns["decode_ms"]
    assert 0.0 not in decode  # no free tokens
    batch = files.columns["mtp_batch"]
    first = 0
    while first < len(batch) and batch[first] == 1:
        first += 1
    size = int(batch[first])
    assert len(set(decode[first:first + size])) == 1  # one decode, its cost shared
    assert all(w > d for w, d in zip(wall, decode, strict=True))  # the drafting between


def test_turns_and_prefill_are_read_from_every_trailer(spec: tuple) -> None:
    *_, report, _, out = spec[0], spec[1], spec[2], spec[3], spec[4]
    journal = read_journal(out)
    s = journal[0].summary
    assert s.turns == 2 and s.tokens == 128 and s.n_prompt == 68
    assert s.prefill_tok_per_s == pytest.approx(68 / 9.8, rel=1e-3)
    assert report["cells"][0]["prefill_tok_s"] == pytest.approx(68 / 9.8, rel=1e-3)
