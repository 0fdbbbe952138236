"""Repeats are the same work, in the same session (issue 29, class 4).

`tests/fixtures/imports/sessions-two-days/`: made-up runs in the seed engine's v1 CSV
format, one configuration of Qwen (`spec_gate=0`) and its spec-gate variant, each run's
start in one of two driver logs a day apart. On 2026-07-12: qwen_base_r1, qwen_sg_r1,
qwen_base_r2, qwen_sg_r2 (24 tokens each) and qwen_base_n48 (48 tokens); on 2026-07-13,
26 h later: qwen_base_r3, qwen_base_r4, 39% faster with the same entry state. Before the
fix the baseline's five runs were one arm: the day-2 runs were sentinels of the first
("device drift +38.8%") and repeats of it (noise ±16%), the 48-token run a "not
deterministic" sentinel of it, and the decision's pairs were named only by their arms.

`tests/fixtures/imports/sessions-dated-names/`: the two configurations on two days, the
day only in the file names (no times, no order).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from abbench.cli import main
from abbench.errors import OrderWarning
from abbench.importers import import_folder
from abbench.records import read_import_info, read_plan
from abbench.report.sessions import duration

FIXTURES = Path(__file__).parent / "fixtures" / "imports"
TWO_DAYS = FIXTURES / "sessions-two-days"
DATED = FIXTURES / "sessions-dated-names"
DAY_2 = {"qwen_base_r3", "qwen_base_r4"}
ACROSS = ("qwen_base_r1 in 2 sessions 1 day 2 h apart: 5.09 → 7.07 tok/s (+38.8%) — a "
          "comparison across sessions, not cell-to-cell noise")


def _import(src: Path, out: Path, capsys: pytest.CaptureFixture[str], *argv: str
            ) -> tuple[int, str, str, dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderWarning)
        rc = main(["import", str(src), "--out", str(out), "--style", "plain", *argv])
    stdout = capsys.readouterr().out
    md = (out / "report.md").read_text(encoding="utf-8")
    return rc, stdout, md, json.loads((out / "report.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def two_days(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("sessions") / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderWarning)
        rc = main(["import", str(TWO_DAYS), "--out", str(out), "--style", "plain",
                   "--decision", "qwen_sg_r1:qwen_base_r1"])
    md = (out / "report.md").read_text(encoding="utf-8")
    return rc, str(out), md, json.loads((out / "report.json").read_text(encoding="utf-8"))


def _runs(report: dict[str, Any]) -> list[str]:
    """Each cell's run (its file stem), by cell index."""
    return [re.sub(r"^\d+-", "", c["label"]) for c in report["cells"]]


def test_the_two_days_are_not_repeats(two_days) -> None:
    _, _, _, r = two_days
    runs = _runs(r)
    day = {i: runs[i] in DAY_2 for i in range(len(runs))}
    # no repeat group, and so no part of the noise, holds runs of both days
    assert r["repeat_groups"], "each day's own repeats still give the noise"
    for group in r["repeat_groups"]:
        assert len({day[i] for i in group}) == 1, group
    assert r["noise"]["sd"] < 0.05  # the 39% between the days is not in it
    # no sentinel verdict ("stable", "drift") across the days
    for d in r["drift"]:
        assert day[d["twin"]] == day[d["sentinel"]], d
    assert not [d for d in r["drift"] if d["verdict"] == "drift"]
    # the day-2 runs are an arm of their own, its configuration naming its session
    names = {runs[i]: c["name"] for i, c in enumerate(r["cells"])}
    assert names["qwen_base_r3"] == names["qwen_base_r4"] != names["qwen_base_r1"]
    assert names["qwen_base_r1"] == names["qwen_base_r2"]


def test_a_configuration_in_two_sessions_is_a_comparison_across_them(
        two_days, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, md, r = two_days
    assert ACROSS in md
    (x,) = r["import"]["sessions"]
    assert [s["cells"] for s in x["sides"]] == [["01-qwen_base_r1", "03-qwen_base_r2"],
                                               ["06-qwen_base_r3", "07-qwen_base_r4"]]
    assert x["sides"][1]["start"] - x["sides"][0]["start"] == 26 * 3600
    assert x["how"]["kind"] == "derived"
    # the terminal says it too, re-rendered from the run folder
    assert main(["report", out, "--style", "plain"]) in (0, 1, 3)
    stdout = capsys.readouterr().out
    assert "+38.8%" in stdout and "a comparison across sessions" in stdout
    # each run's session is in import.json with how it was told: derived, never measured
    info = read_import_info(Path(out))
    assert info is not None
    sessions = {c.label: c.config.get("session") for c in info.cells}
    assert sessions["06-qwen_base_r3"] == sessions["07-qwen_base_r4"] == 2
    assert sessions["01-qwen_base_r1"] == sessions["05-qwen_base_n48"] == 1
    assert {c.facts["config.session"].kind for c in info.cells} == {"derived"}


def test_runs_of_different_length_are_different_arms(two_days) -> None:
    _, out, md, r = two_days
    runs = _runs(r)
    names = {runs[i]: c["name"] for i, c in enumerate(r["cells"])}
    assert names["qwen_base_n48"] == "qwen_base_n48" != names["qwen_base_r1"]
    assert not [d for d in r["drift"] if d["fingerprints"] == "different"]
    config = {c.label: c.config.resolved for c in read_plan(Path(out)).cells}
    assert config["05-qwen_base_n48"]["tokens"] == 48
    assert config["01-qwen_base_r1"]["tokens"] == 24
    assert config["01-qwen_base_r1"]["n_prompt"] == 34
    # the cells table names what sets the 48-token run apart
    row = next(line for line in md.splitlines() if line.startswith("| 5 | qwen_base_n48"))
    assert "tokens=48" in row


def test_a_decision_names_the_runs_of_its_pairs(two_days) -> None:
    rc, _, md, r = two_days
    (d,) = r["decisions"]
    assert {(p["candidate"], p["baseline"]) for p in d["pairs"]} == {(1, 0), (1, 2), (3, 2)}
    block = md.split("**qwen_sg_r1 vs qwen_base_r1", 1)[1].split("\n\n", 1)[0]
    # cell 4 and cell 3 are the arms' second runs: the pair names them, not the arms
    assert "04-qwen_sg_r2 vs 03-qwen_base_r2" in block
    assert "cell 4 (qwen_sg_r2, arm qwen_sg_r1)" in block


def test_dates_in_the_file_names_tell_the_sessions(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, _, md, r = _import(DATED, tmp_path / "run", capsys)
    assert len({c["name"] for c in r["cells"]}) == 4  # two configurations, two days each
    lines = [x for x in md.splitlines() if "sessions 1 day apart by the dates" in x]
    assert len(lines) == 2 and "5.09 → 7.07 tok/s (+38.8%)" in lines[0]
    assert "dates in the file names" in r["import"]["sessions"][0]["how"]["source"]


def test_one_session_leaves_configurations_and_labels_as_they_were(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only the first day: one session, no `session` key, no Sessions section; the
    session is said to be derived from the start times."""
    src = tmp_path / "day1"
    src.mkdir()
    for f in TWO_DAYS.iterdir():
        if not any(n in f.name for n in (*DAY_2, "2026-07-13")):
            (src / f.name).write_bytes(f.read_bytes())
    _, _, md, r = _import(src, tmp_path / "run", capsys)
    assert "## Sessions" not in md and "sessions" not in r["import"]
    info = read_import_info(tmp_path / "run")
    assert info is not None
    assert all("session" not in c.config for c in info.cells)
    assert {c.facts["session"].kind for c in info.cells} == {"derived"}


# -- what starts a session -------------------------------------------------------------


def _two_runs(root: Path, logs: dict[str, str]) -> Path:
    """qwen_base_r1 and qwen_base_r2 (one configuration, equal work) with driver logs."""
    src = root / "src"
    src.mkdir()
    for name in ("qwen_base_r1", "qwen_base_r2"):
        (src / f"{name}.csv").write_bytes((TWO_DAYS / f"{name}.csv").read_bytes())
    for name, text in logs.items():
        (src / name).write_text(text, encoding="utf-8")
    return src


def _sessions(src: Path) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderWarning)
        run = import_folder(src, src.parent / "run")
    info = read_import_info(run)
    assert info is not None
    return {c.label: (c.config.get("session"), c.facts["session"]) for c in info.cells}


@pytest.mark.parametrize(("pause_s", "apart"), [(3590, False), (3610, True)])
def test_a_pause_over_an_hour_starts_a_session(tmp_path: Path, pause_s: int,
                                               apart: bool) -> None:
    # qwen_base_r1 runs 24 tokens at 5.093 tok/s plus 12.5 s load and 5.2 s prefill: 22.4 s
    t0, run_s = 1783846800, 24 / 5.093 + 12.5 + 5.2
    log = (f"ENTRY STATE: cell=qwen_base_r1 t_wall={t0}\n"
           f"ENTRY STATE: cell=qwen_base_r2 t_wall={t0 + run_s + pause_s:.0f}\n")
    got = _sessions(_two_runs(tmp_path, {"driver.log": log}))
    assert [s for s, _ in got.values()] == ([1, 2] if apart else [None, None])
    assert {f.kind for _, f in got.values()} == {"derived"}


def test_separate_driver_logs_without_times_are_separate_sessions(tmp_path: Path) -> None:
    got = _sessions(_two_runs(tmp_path, {"a.log": "ENTRY STATE: cell=qwen_base_r1\n",
                                         "b.log": "ENTRY STATE: cell=qwen_base_r2\n"}))
    assert [s for s, _ in got.values()] == [1, 2]
    assert "separate driver logs" in next(iter(got.values()))[1].source


def test_with_no_evidence_one_session_is_assumed_never_measured(tmp_path: Path) -> None:
    got = _sessions(_two_runs(tmp_path, {}))
    assert [s for s, _ in got.values()] == [None, None]
    assert {f.kind for _, f in got.values()} == {"unknown"}


@pytest.mark.parametrize(("seconds", "words"), [
    (26 * 3600, "1 day 2 h"), (3 * 3600 + 20 * 60, "3 h 20 min"), (45 * 60, "45 min"),
    (2 * 86400 + 59, "2 days"), (20, "0 min")])
def test_the_time_between_sessions_reads_as_people_say_it(seconds: float, words: str) -> None:
    assert duration(seconds) == words
