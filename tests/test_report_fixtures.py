"""Every kind of run folder re-renders to the report it had when it was built.

tests/fixtures/runs/ holds one run folder per kind (embedded-engine campaign on the
simulated phone, external-command cells, two imports of the reference archives, a run
written directly with repeats, a noise floor and both decision questions) together with the
report.json and report.md `abbench report` wrote for it (tests/fixtures/runs/build.py
rebuilds them). Re-rendering must give the same documents: only the run folder's own path
differs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from abbench.cli import main

RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
KINDS = sorted(p.name for p in RUNS.iterdir() if p.is_dir())


def _without_run(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "run"}


def test_every_kind_of_run_folder_is_a_fixture() -> None:
    assert KINDS == ["embedded-sim", "external", "imported-headerless", "imported-pr23",
                     "synthetic"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_folder_renders_to_the_report_it_had(kind: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    src = RUNS / kind
    expected_json = json.loads((src / "report.json").read_text(encoding="utf-8"))
    expected_md = (src / "report.md").read_text(encoding="utf-8")
    run = tmp_path / kind
    shutil.copytree(src, run)
    for name in ("report.json", "report.md"):
        (run / name).unlink()
    rc = main(["report", str(run), "--style", "plain"])
    capsys.readouterr()
    assert rc in (0, 1, 3)
    got = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert _without_run(got) == _without_run(expected_json)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert md.replace(str(run), "RUN") == expected_md.replace(expected_json["run"], "RUN")


def test_a_number_no_json_holds_in_a_record_renders_as_null(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """Found by the slow run-folder fuzzer: import.json with `1e400` (inf once read) in a
    cell's free-form configuration made report.json unwritable."""
    run = tmp_path / "run"
    shutil.copytree(RUNS / "imported-headerless", run)
    text = (run / "import.json").read_text(encoding="utf-8")
    assert '"model": "qwen"' in text
    (run / "import.json").write_text(text.replace('"model": "qwen"', '"model": 1e400', 1),
                                     encoding="utf-8")
    assert main(["report", str(run), "--style", "plain"]) in (0, 1, 3)
    capsys.readouterr()
    got = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert got["import"]["cells"][0]["config"]["model"] is None
