"""End-to-end campaigns through the real CLI: run folder, journal, samples, gate, external
cells, failures, kill -9 and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REFERENCE

from abbench.analysis.campaign import analyze
from abbench.engine import synth
from abbench.records import keys, read_journal, read_plan, read_samples

REF = REFERENCE


def abbench(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def write_campaign(tmp: Path, model: Path, body: str, head: str = "") -> Path:
    text = textwrap.dedent(f"""\
        [campaign]
        name = "t"
        spacing_s = 0.3
        warmup_tokens = 2
        {head}

        [device]
        transport = "local"
        sample_hz = 10

        [workload]
        model = "{model}"
        tokens = 6
        cache_mib = 0.2
        timeout_s = 120
        """) + textwrap.dedent(body)
    path = tmp / "cells.toml"
    path.write_text(text)
    return path


def run_folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


@pytest.fixture(scope="module")
def three_cell_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("campaign")
    cells = write_campaign(tmp, tiny_model, """
        [cells.B]
        overlap = true

        [cells.C]
        base = "B"
        io_lanes = 1

        # The probe, the other processes' load and the free memory measure this shared
        # machine (other test workers beside it), whose swings are not what is tested here.
        [match]
        probe_tol = 1
        foreign_load_tol = 64
        mem_available_tol_frac = 1
        """, head='order = ["B", "C", "B"]')
    p = abbench("campaign", cells, "--out", tmp / "reports", "--sentinels", tmp / "sentinels",
                "--no-live")
    return p, tmp


def test_campaign_runs_every_cell_and_leaves_the_run_folder(three_cell_run) -> None:
    p, tmp = three_cell_run
    assert p.returncode == 0, p.stdout + p.stderr
    folder = run_folder(tmp / "reports")
    for name in ("campaign.toml", "plan.json", "journal.jsonl", "samples.jsonl", "status.json"):
        assert (folder / name).is_file(), name
    plan = read_plan(folder)
    assert [c.name for c in plan.cells] == ["B", "C", "B"]
    assert plan.cells[2].sentinel_of == 0
    records = read_journal(folder)
    assert [r.index for r in records] == [0, 1, 2]
    assert all(r.status == "ok" and r.tokens_per_s and r.tokens_per_s > 0 for r in records)
    for c in plan.cells:
        for f in ("tokens.csv", "summary.json", "stderr.txt"):
            assert (folder / "cells" / c.label / f).is_file(), (c.label, f)
    assert json.loads((folder / "status.json").read_text())["state"] == "complete"


def test_sentinel_repeats_the_work_exactly(three_cell_run) -> None:
    _, tmp = three_cell_run
    records = read_journal(run_folder(tmp / "reports"))
    assert records[0].fingerprint and records[0].fingerprint == records[2].fingerprint
    (history,) = list((tmp / "sentinels").glob("*.jsonl"))
    lines = [json.loads(x) for x in history.read_text().splitlines()]
    assert [x["cell"] for x in lines if "kind" not in x] == ["01-B", "03-B"]
    # ... and the repeat, for the device's noise floor
    # (docs/formats.md#device-history-sentinelsdevicejsonl)
    (repeat,) = [x for x in lines if x.get("kind") == "repeat"]
    assert (repeat["first"], repeat["second"]) == ("01-B", "03-B")
    assert repeat["fingerprints_equal"] and repeat["matched"] is False


def test_entry_state_and_samples_cover_the_campaign(three_cell_run) -> None:
    _, tmp = three_cell_run
    folder = run_folder(tmp / "reports")
    records = read_journal(folder)
    samples = read_samples(folder)
    assert samples, "no samples"
    assert samples[0].t_wall <= records[0].t_start_wall
    assert samples[-1].t_wall >= records[-1].t_end_wall
    gaps = [b.t_mono - a.t_mono for a, b in zip(samples, samples[1:])]
    assert max(gaps) < 1.0, max(gaps)
    assert any(s.cell == 1 for s in samples)  # samples know which cell was running
    for r in records:
        assert r.entry.probe_index is not None and r.entry.probe_index > 0
        assert r.entry.mem_available_mib is not None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_samples_carry_the_foreign_load_of_each_cell(three_cell_run) -> None:
    """The cells' own CPU is told apart from other processes' (docs/sensors.md#foreign-load):
    every cell has readings of the foreign load, and its pairs a criterion on it."""
    _, tmp = three_cell_run
    folder = run_folder(tmp / "reports")
    assert read_plan(folder).match.foreign_load_tol == 64  # the file's, as it said
    samples = read_samples(folder)
    for index in (0, 1, 2):
        mine = [s.values for s in samples if s.cell == index]
        assert any(keys.FOREIGN_CORES in v for v in mine), index
        assert all(0 <= v[keys.FOREIGN_CORES] < (os.cpu_count() or 1) + 1
                   for v in mine if keys.FOREIGN_CORES in v)
        assert all(keys.RUNNABLE_TASKS in v for v in mine)
    a = analyze(folder)
    assert all(c.during.foreign_cores is not None for c in a.cells)
    assert all(any(c.name == "foreign_load" and c.status != "not measured" for c in p.criteria)
               for p in a.pairs)


def test_gate_waits_and_gives_up(tiny_model: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, """
        [gate]
        mem_available_min_mib = 1e12
        poll_s = 0.2
        timeout_s = 0.6

        [cells.A]
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stderr
    (rec,) = read_journal(run_folder(tmp_path / "r"))
    assert rec.gate.gave_up and rec.gate.polls >= 2 and rec.gate.waited_s >= 0.5
    assert any("MemAvailable" in r for r in rec.gate.reasons)
    assert "gate: waiting" in p.stderr


def test_gate_that_holds_does_not_wait(tiny_model: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, """
        [gate]
        mem_available_min_mib = 1
        timeout_s = 5

        [cells.A]
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stderr
    (rec,) = read_journal(run_folder(tmp_path / "r"))
    assert not rec.gate.gave_up and rec.gate.polls == 1


def test_external_cell_reads_a_bmoe_csv(tiny_model: Path, tmp_path: Path) -> None:
    src = REF / "v1-desktop-2026-07-24" / "pc-E-c5000-io4t4.csv"
    out = tmp_path / "out.csv"
    script = tmp_path / "run.py"
    script.write_text(f"import shutil\nshutil.copy({str(src)!r}, {str(out)!r})\n")
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.ext]
        command = ["{sys.executable}", "{script}"]
        output = "bmoe-csv:{out}"
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stderr
    (rec,) = read_journal(run_folder(tmp_path / "r"))
    assert rec.status == "ok", rec.error
    assert rec.tokens_per_s == pytest.approx(4.718)  # the file's own `# summary` tok/s
    assert (run_folder(tmp_path / "r") / "cells" / "01-ext" / "tokens.csv").is_file()


def test_each_external_cell_reads_its_own_output_file(tiny_model: Path, tmp_path: Path) -> None:
    """`{cell}` gives each cell a path of its own; a fixed path is removed before each
    cell, so a cell that writes nothing fails instead of reading the previous one's."""
    src = REF / "v1-desktop-2026-07-24" / "pc-E-c5000-io4t4.csv"
    fixed, own = tmp_path / "out.csv", tmp_path / "{cell}.csv"
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.writes]
        command = ["cp", "{src}", "{fixed}"]
        output = "bmoe-csv:{fixed}"

        [cells.silent]
        command = ["true"]
        output = "bmoe-csv:{fixed}"

        [cells.own]
        command = ["cp", "{src}", "{own}"]
        output = "bmoe-csv:{own}"
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    writes, silent, own_rec = read_journal(run_folder(tmp_path / "r"))
    assert writes.status == "ok" and own_rec.status == "ok", p.stderr
    assert silent.status == "failed" and f"cannot read the cell's output {fixed}" in (
        silent.error or "")
    assert (tmp_path / "03-own.csv").is_file() and not (tmp_path / "{cell}.csv").exists()


def test_failing_and_hanging_cells_are_recorded_and_the_campaign_goes_on(
    tiny_model: Path, tmp_path: Path
) -> None:
    crash = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.crash]
        command = ["{sys.executable}", "-c", "{crash}"]
        output = "stdout-summary"

        [cells.hang]
        command = ["{sys.executable}", "-c", "import time; time.sleep(60)"]
        output = "stdout-summary"
        timeout_s = 1

        [cells.ok]
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stderr
    crash, hang, ok = read_journal(run_folder(tmp_path / "r"))
    assert crash.status == "failed" and crash.exit_code == 3 and "boom" in crash.stderr_tail
    assert hang.status == "timeout" and hang.t_end_mono - hang.t_start_mono < 10
    assert ok.status == "ok"


def test_bad_campaign_file_runs_nothing(tiny_model: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, """
        [cells.A]
        cache_mibb = 3
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--no-live")
    assert p.returncode == 2
    assert p.stderr.startswith("ERROR:") and "cache_mib" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "r").exists()


def start_campaign(cells: Path, tmp: Path, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "abbench", "campaign", str(cells), "--out", str(tmp / "r"),
         "--sentinels", str(tmp / "s"), "--no-live"], text=True, **popen,  # type: ignore[call-overload]
    )


def wait_for_cell(out: Path, label: str, journaled: int) -> Path:
    """The run folder, once cell `label` has started with `journaled` cells finished."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and any(out.iterdir()):
            folder = run_folder(out)
            if (folder / "cells" / label).exists() and len(read_journal(folder)) == journaled:
                time.sleep(0.3)
                return folder
        time.sleep(0.05)
    pytest.fail(f"cell {label} never started")


def test_kill_9_mid_cell_then_resume_reruns_only_that_cell(
    tiny_model: Path, tmp_path: Path
) -> None:
    slow = "import time; time.sleep(3); print('generation: 4 tokens, 0.5 s/token (2.0 tok/s)')"
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.A]

        [cells.slow]
        command = ["{sys.executable}", "-c", "{slow}"]
        output = "stdout-summary"

        [cells.C]
        """)
    proc = start_campaign(cells, tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        folder = wait_for_cell(tmp_path / "r", "02-slow", journaled=1)
        os.killpg(proc.pid, signal.SIGKILL)  # the campaign and its cell, as a crash would
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [r.index for r in read_journal(folder)] == [0]
    p = abbench("campaign", "--resume", folder, "--sentinels", tmp_path / "s", "--no-live")
    assert p.returncode == 0, p.stderr
    records = read_journal(folder)
    assert [r.index for r in records] == [0, 1, 2]
    assert all(r.status == "ok" for r in records)


def test_ctrl_c_leaves_the_finished_cells_and_says_interrupted(
    tiny_model: Path, tmp_path: Path
) -> None:
    slow = "import time; time.sleep(30)"
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.A]

        [cells.slow]
        command = ["{sys.executable}", "-c", "{slow}"]
        output = "stdout-summary"
        """)
    proc = start_campaign(cells, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    folder = wait_for_cell(tmp_path / "r", "02-slow", journaled=1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    assert json.loads((folder / "status.json").read_text())["state"] == "interrupted"
    assert [r.name for r in read_journal(folder)] == ["A"]
    assert "INCOMPLETE" in (folder / "report.md").read_text()  # the partial report


def test_a_synthetic_model_is_built_before_the_first_cell(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No cell's time, memory or heat includes building its model: the campaign builds it
    first, and says so."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ABBENCH_CACHE", str(cache))
    cells = write_campaign(tmp_path, "synthetic:tiny@3", """
        [cells.A]
        """, head='order = ["A", "A"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "building synthetic:tiny@3" in p.stderr
    assert [f.name for f in cache.glob("*.gguf")] == [
        f"synthetic-tiny-s3-v{synth.FORMAT_VERSION}.gguf"]
    folder = run_folder(tmp_path / "r")
    for cell in ("01-A", "02-A"):
        assert "building" not in (folder / "cells" / cell / "stderr.txt").read_text()


def test_the_report_shows_each_cells_prefill_and_time_to_first_token(three_cell_run) -> None:
    _, tmp = three_cell_run
    folder = run_folder(tmp / "reports")
    doc = json.loads((folder / "report.json").read_text())
    for c in doc["cells"]:
        summary = json.loads((folder / "cells" / c["label"] / "summary.json").read_text())
        assert c["ttft_s"] == summary["summary"]["ttft_s"] > 0
        assert c["prefill_tok_s"] == pytest.approx(summary["summary"]["n_prompt"] / c["ttft_s"])
    assert "| prefill tok/s | TTFT s |" in (folder / "report.md").read_text()
