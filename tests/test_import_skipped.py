"""Nothing is skipped in silence (issue 29, class 6).

`tests/fixtures/imports/skipped-warmup/` (its README says where each line comes from): two
runs beside what is not a run of this folder — a `warmup/` subfolder holding a run,
`bench.out` (llama-bench's output, a log of no run here), notes, a route trace
(`qwen.route.csv`) — and a run, `gemma_sg`, whose CSV has no preamble, so that only its
file name says its model. The import lists each left-out file or folder with the reason
(stderr, report.md, the terminal report, report.json, import.json) and shows the model
taken from the file name as such."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from abbench.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "imports" / "skipped-warmup"
# import.json's `not_imported` (records.NotImported), by path
KINDS = "not a kind abbench reads (.csv, .metrics, .log, .out, .state, .sh)"
NOT_IMPORTED = [
    {"path": "README.md", "reason": KINDS, "line": None},
    {"path": "bench.out", "reason": "a log of no run here: no run `bench`, no `=== NAME ===` "
     "sections, and no `generation:` line", "line": None},
    {"path": "notes.md", "reason": KINDS, "line": None},
    {"path": "qwen.route.csv", "reason": "a route trace: `abbench replay` reads it",
     "line": None},
    {"path": "warmup/", "reason": "a folder: subfolders are not read; import it on its own",
     "line": None},
]
LISTED = [f"{x['path']}: {x['reason']}" for x in NOT_IMPORTED]


def _import_json(out: Path) -> dict:
    return json.loads((out / "import.json").read_text())


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The fixture imported once through the CLI: the run folder, stdout, stderr."""
    out = tmp_path_factory.mktemp("skipped") / "run"
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = main(["import", str(FIXTURE), "--out", str(out), "--style", "plain"])
    assert rc == 0, se.getvalue()
    return out, so.getvalue(), se.getvalue()


def test_the_runs_are_imported_and_nothing_else(imported: tuple[Path, str, str]) -> None:
    out, _, _ = imported
    info = _import_json(out)
    assert [c["label"] for c in info["cells"]] == ["01-gemma_sg", "02-qwen_base"]  # no warmup
    assert info.get("not_imported") == NOT_IMPORTED
    assert not any("bench.out" in n or "warmup" in n for n in info["notes"])


def test_every_left_out_file_is_listed_with_its_reason(imported: tuple[Path, str, str]
                                                       ) -> None:
    out, stdout, stderr = imported
    md = (out / "report.md").read_text()
    section = md.split("## Not imported\n\n", 1)[1].split("\n\n", 1)[0]
    assert section.splitlines() == [f"- {x}" for x in LISTED]
    terminal = stdout.split("  not imported:\n", 1)[1].splitlines()[:len(LISTED)]
    assert terminal == [f"    {x}" for x in LISTED]
    for x in NOT_IMPORTED:  # a warning each, with the file's whole path
        folder = "/" if x["path"].endswith("/") else ""
        assert f"WARNING: not imported: {FIXTURE / x['path']}{folder}: {x['reason']}" in stderr
    doc = json.loads((out / "report.json").read_text())
    assert doc["import"].get("not_imported") == NOT_IMPORTED


def test_a_model_named_only_by_the_file_name_says_so(imported: tuple[Path, str, str]) -> None:
    out, stdout, _ = imported
    md = (out / "report.md").read_text()
    cells = md.split("## Cells\n\n", 1)[1]
    row = next(r for r in cells.splitlines() if r.startswith("| 1 | gemma_sg |"))
    assert "| model=gemma (from the file name) run=gemma_sg |" in row
    qwen = next(r for r in cells.splitlines() if r.startswith("| 2 | qwen_base |"))
    assert "from the file name" not in qwen
    info = _import_json(out)
    assert info["cells"][1]["config"]["model"] == "Qwen3-30B-A3B-Q4_K_M.gguf"
    assert "model=gemma (from the file name)" in stdout  # the terminal's cells table
    doc = json.loads((out / "report.json").read_text())
    assert [c["from_file_name"] for c in doc["import"]["cells"]] == [["model"], []]


def test_a_folder_of_nothing_importable_says_what_it_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused with exit 2, the error naming what was there and why none of it is a run."""
    src = tmp_path / "src"
    (src / "warmup").mkdir(parents=True)
    (src / "warmup" / "a.csv").write_text("step,wall_ms\n1,200\n")
    (src / "run.txt").write_text("tg32 4.91\n")
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ERROR:")]
    assert f"{src / 'run.txt'}: not a kind abbench reads" in line
    assert f"{src / 'warmup'}/: a folder: subfolders are not read" in line


def test_hidden_files_stay_silent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A name starting with a dot is a tool's own (.DS_Store, .git/): not listed."""
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True)
    (src / ".DS_Store").write_bytes(b"\0\1")
    (src / "a.csv").write_text("step,wall_ms\n1,200\n2,210\n")
    assert main(["import", str(src), "--out", str(tmp_path / "run"), "--style", "plain"]) == 0
    assert _import_json(tmp_path / "run").get("not_imported") == []
    assert "not imported" not in capsys.readouterr().err
