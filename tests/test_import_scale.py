"""Imports at scale (issue 41, class 6): grouping, identity, tells and the report in
O(n log n) or better; a folder of too many files answered in bounded time and memory; and
nothing left behind on any exit.

The runs are the seed engine's v1 files (tests/bmoe_formats: csv_metrics_sink.cpp's format
strings), ten configurations taking turns, with dated names as the authors' app writes
them (`bmoe-<yyyyMMdd-HHmmss>.csv`). CPU times are compared side by side in one test, never
held against a number of seconds: this machine's speed moves from one minute to the next.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import bmoe_formats as f
import pytest

from abbench import workers
from abbench.cli import main
from abbench.records import read_journal, read_plan

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 8, 1, 9, 0, 0)


def folder(path: Path, runs: int, tokens: int = 32) -> Path:
    """`runs` v1 files: configuration k % 10 (its cache size), 90 s apart."""
    path.mkdir(parents=True)
    rows = [f.v1_row(s, tokens, 200.0) for s in range(1, tokens + 1)]
    texts = {k: f.v1_file(rows, model="Qwen3-30B-A3B-Q4_K_M.gguf", cache_mb=1000 + 250 * k)
             for k in range(10)}
    for i in range(runs):
        stamp = (T0 + timedelta(seconds=90 * i)).strftime("%Y%m%d-%H%M%S")
        (path / f"bmoe-{stamp}.csv").write_text(texts[i % 10])
    return path


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the import's worker pool)."""
    me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed_import(src: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> float:
    """The import's CPU time, not its wall time: other processes on the machine (other test
    workers) slow the one, not the other."""
    t0 = _cpu_s()
    assert main(["import", str(src), "--out", str(out), "--style", "plain"]) == 0
    elapsed = _cpu_s() - t0
    capsys.readouterr()
    return elapsed


@pytest.mark.slow  # 12-15 s of timed imports: a scaling check, run by the slow phase
def test_ten_times_the_runs_costs_about_ten_times_the_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 runs against 100, side by side (the smaller twice, its faster time): n log n
    would be 15x, a pass of every run over every run 100x."""
    monkeypatch.setattr(workers, "MIN_ITEMS", 50)  # both sizes on every core alike
    small, large = folder(tmp_path / "s", 100), folder(tmp_path / "l", 1000)
    t_small = min(timed_import(small, tmp_path / f"rs{k}", capsys) for k in range(2))
    t_large = timed_import(large, tmp_path / "rl", capsys)
    print(f"100 runs {t_small:.2f} s, 1000 runs {t_large:.2f} s: {t_large / t_small:.1f}x")
    assert t_large / t_small < 25
    plan = read_plan(tmp_path / "rl")
    assert len(plan.cells) == 1000 and len({c.name for c in plan.cells}) == 10
    assert plan.order_known  # the dated names
    md = (tmp_path / "rl" / "report.md").read_text()
    cells = md.split("\n## Cells", 1)[1].split("\n## ", 1)[0]
    assert "\n| 1000 | bmoe-" in cells  # every cell in the page's table


def test_the_terminal_lists_the_first_of_many_and_says_where_the_rest_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = folder(tmp_path / "src", 300, tokens=8)
    assert main(["import", str(src), "--out", str(tmp_path / "run"), "--style", "plain"]) == 0
    out = capsys.readouterr().out
    assert "… and 260 more runs (the report lists every one)" in out
    assert "… and 260 more cells (the first 40 of 300 here): report.md and report.html " \
        "list every one" in out
    # 299 pairs with nothing recorded read alike: said once, not 299 (or 40) times
    assert "(299 pairs in a row alike): unverified" in out
    assert out.count("– gap: the gap between the cells is unknown") == 1
    assert len(out.splitlines()) < 250


def test_a_folder_of_too_many_files_is_refused_before_any_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = folder(tmp_path / "src", 30, tokens=4)
    assert main(["import", str(src), "--out", str(tmp_path / "run"), "--max-files",
                 "20"]) == 2
    err = capsys.readouterr().err
    assert f"ERROR: {src} holds more than 20 entries: an import reads at most 20" in err
    assert "--max-files N" in err and not (tmp_path / "run").exists()


def _interrupted(src: Path, out: Path, how: signal.Signals) -> int:
    """`abbench import` killed with `how` once it writes its run folder; its exit status."""
    proc = subprocess.Popen([sys.executable, "-m", "abbench", "import", str(src), "--out",
                             str(out), "--style", "plain"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("import: writing"):
            time.sleep(0.3)
            proc.send_signal(how)
            break
    return proc.wait(timeout=120)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_an_import_stopped_leaves_nothing_behind(tmp_path: Path, how: signal.Signals) -> None:
    src = folder(tmp_path / "src", 1200, tokens=16)
    rc = _interrupted(src, tmp_path / "out" / "run", how)
    assert rc == 4  # interrupted (README, Exit status)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_killed_imports_staging_folder_goes_with_the_next_import(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = folder(tmp_path / "src", 1200, tokens=16)
    (tmp_path / "out").mkdir()
    rc = _interrupted(src, tmp_path / "out" / "run", signal.SIGKILL)
    assert rc == -signal.SIGKILL
    left = [p.name for p in (tmp_path / "out").iterdir()]
    assert len(left) == 1 and left[0].startswith(".run.") and left[0].endswith(".tmp")
    small = folder(tmp_path / "small", 3)
    assert main(["import", str(small), "--out", str(tmp_path / "out" / "run")]) == 0
    assert "the staging folder of an import to" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["run"]
    assert len(read_journal(tmp_path / "out" / "run")) == 3


@pytest.mark.slow
def test_ten_thousand_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """10,000 runs of 256 tokens against 1,000, side by side; the times are printed (the
    closing note of issue 41 quotes them), the ratio asserted."""
    small = folder(tmp_path / "s", 1000, tokens=256)
    large = folder(tmp_path / "l", 10000, tokens=256)
    t_small = timed_import(small, tmp_path / "rs", capsys)
    t_large = timed_import(large, tmp_path / "rl", capsys)
    print(f"1000 runs {t_small:.1f} s, 10000 runs {t_large:.1f} s: {t_large / t_small:.1f}x")
    assert t_large / t_small < 20
    assert len(read_journal(tmp_path / "rl")) == 10000


@pytest.mark.slow
def test_a_hundred_thousand_files_in_bounded_time_and_memory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(100_000):
        (src / f"r{i:06d}.csv").write_text("step,wall_ms\n1,100\n2,110\n")
    # The import runs under a wrapper of its own, whose children's peak is the import's
    # alone (this process's children include the workers earlier tests forked from it).
    wrapper = ("import resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:])\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
               "sys.exit(done.returncode)\n")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "abbench",
                           "import", str(src), "--out", str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - t0
    peak_mib = int(done.stderr.split()[-1]) / 1024
    print(f"100,000 files: answered in {elapsed:.1f} s, peak {peak_mib:.0f} MiB")
    assert done.returncode == 2 and "holds more than 50000 entries" in done.stderr
    assert elapsed < 60 and peak_mib < 512
    assert not (tmp_path / "run").exists()
