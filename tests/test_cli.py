"""The `abbench` command's boundary: usage errors and user mistakes become one `ERROR:` line
(and maybe a `TIP:`) with exit status 2, checked before any work; a good run prints its
summary on stdout and writes what it was asked to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_main

from abbench import __version__
from abbench.engine import synth
from abbench.engine.run import session


def abbench(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "abbench", *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )


def error_and_tip(err: str) -> tuple[str, str | None]:
    """The one `ERROR:` line and the `TIP:` line right after it, if any; nothing else
    may follow, and only argparse's usage may come before."""
    assert "Traceback" not in err
    lines = err.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("ERROR:")]
    assert len(at) == 1, err
    before, after = lines[: at[0]], lines[at[0] + 1 :]
    assert not before or before[0].startswith("usage:"), err
    assert len(after) <= 1 and all(ln.startswith("TIP: ") for ln in after), err
    return lines[at[0]], after[0] if after else None


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache that stays empty unless something builds a synthetic model."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ABBENCH_CACHE", str(cache))
    return cache


# -- usage errors --------------------------------------------------------------------------


def test_unknown_flag_real_process(tiny_model: Path) -> None:
    p = abbench("engine", "run", "-m", tiny_model, "--bogus-flag", "3")
    assert p.returncode == 2
    assert p.stdout == ""
    error, _ = error_and_tip(p.stderr)
    assert "--bogus-flag" in error


@pytest.mark.parametrize("argv", [
    [], ["engine"], ["model"], ["frobnicate"], ["engine", "run"], ["model", "synth"],
    ["engine", "run", "-m", "x.gguf", "--prompt-tokens", "1,x"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(argv, capsys)
    assert rc == 2
    assert out == ""
    error_and_tip(err)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(["--version"], capsys)
    assert rc == 0
    assert out.strip() == f"abbench {__version__}"


# -- what a command imports ----------------------------------------------------------------


LOADED = ("import sys; from abbench.cli import build_parser; build_parser(sys.argv[1:]); "
          "print(' '.join(sorted(m for m in sys.modules if m.startswith('abbench.commands.'))))")


def test_a_command_loads_only_its_own_module() -> None:
    """`abbench engine run`, every campaign cell's child process, imports no other
    command's module (the report's plots, Ray): 0.4 s of start instead of 1.2 s."""
    def loaded(*argv: str) -> list[str]:
        p = subprocess.run([sys.executable, "-c", LOADED, *argv], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    assert loaded("engine", "run", "-m", "x.gguf") == ["abbench.commands.engine"]
    assert {f"abbench.commands.{m}" for m in (
        "calibrate", "campaign", "engine", "fleet", "imports", "model", "replay", "report",
        "sensors", "sentinels", "sim")} <= set(loaded("--version"))  # `--help` lists all


# -- synthetic model names -----------------------------------------------------------------


def test_unknown_synthetic_preset_real_process(empty_cache: Path) -> None:
    p = abbench("engine", "run", "-m", "synthetic:NOPE", "-n", "2")
    assert p.returncode == 2
    assert p.stdout == ""
    error, tip = error_and_tip(p.stderr)
    assert "NOPE" in error
    assert tip is not None
    for name in synth.PRESETS:
        assert name in tip
    assert list(empty_cache.iterdir()) == []


@pytest.mark.parametrize(("spec", "needle"), [
    ("synthetic:NOPE", "`NOPE`"), ("synthetic:", "preset ``"),
    ("synthetic:tiny@x", "synthetic:tiny@x"), ("synthetic:tiny@-1", "synthetic:tiny@-1"),
])
def test_bad_synthetic_spec_for_model_info(
    spec: str, needle: str, empty_cache: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run_main(["model", "info", spec], capsys)
    assert rc == 2
    assert out == ""
    error, _ = error_and_tip(err)
    assert needle in error
    assert list(empty_cache.iterdir()) == []


# -- output paths are checked before any work ---------------------------------------------


@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_output_into_missing_folder_fails_before_running(
    flag: str, tmp_path: Path, empty_cache: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = []
    monkeypatch.setattr(session.Engine, "__init__", lambda *a, **k: started.append(1))
    target = tmp_path / "no-such-folder" / "out.file"
    rc, out, err = run_main(
        ["engine", "run", "-m", "synthetic:tiny", "-n", "2", flag, str(target)], capsys)
    assert rc == 2
    error, _ = error_and_tip(err)
    assert flag in error and "no-such-folder" in error
    assert out == ""
    assert not started  # no engine was built
    assert list(empty_cache.iterdir()) == []  # nor the synthetic model
    assert not target.parent.exists()


def test_csv_into_missing_folder_real_process(tmp_path: Path, empty_cache: Path) -> None:
    target = tmp_path / "nope" / "run.csv"
    p = abbench("engine", "run", "-m", "synthetic:tiny", "-n", "2", "--csv", target)
    assert p.returncode == 2
    assert p.stdout == ""
    error, _ = error_and_tip(p.stderr)
    assert "--csv" in error
    assert list(empty_cache.iterdir()) == []  # it never got as far as building the model


def test_synth_into_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(["model", "synth", "-o", str(tmp_path / "nope" / "m.gguf")], capsys)
    assert rc == 2
    assert "-o" in error_and_tip(err)[0]
    assert not (tmp_path / "nope").exists()


# -- a good run, and the rest of the boundary ---------------------------------------------


def test_good_run_prints_summary_and_writes_files(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    csv, js = tmp_path / "run.csv", tmp_path / "run.json"
    rc, out, err = run_main(["engine", "run", "-m", str(tiny_model), "-n", "3", "--cache-mib",
                             "0.1", "--csv", str(csv), "--json", str(js)], capsys)
    assert rc == 0, err
    assert "ERROR" not in err
    lines = out.splitlines()
    for prefix in ("generation:", "compute:", "moe-stream:", "moe-cache:"):
        assert any(ln.startswith(prefix) for ln in lines), out
    assert lines[0].startswith("generation: 3 tokens")
    doc = json.loads(js.read_text())
    assert len(doc["output_ids"]) == 3
    assert doc["config"]["n_tokens"] == 3 and doc["config"]["cache_mib"] == 0.1
    assert len(csv.read_text().splitlines()) >= 4  # a header and a row per decoded token
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]  # no temps


def test_quiet_run_prints_nothing(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(["engine", "run", "-m", str(tiny_model), "-n", "2", "-q"], capsys)
    assert rc == 0
    assert out == ""


def test_interrupt_is_one_line_and_status_4(
    tiny_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def interrupted(self: session.Engine, *a: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(session.Engine, "run", interrupted)
    rc, out, err = run_main(["engine", "run", "-m", str(tiny_model), "-n", "2"], capsys)
    assert rc == 4  # as an interrupted campaign's (README, Exit status)
    assert err.splitlines() == ["ERROR: interrupted"]
