"""One table of exit statuses (README, "Exit status"; issue 42, class 1): the same state of
a run gives the same status and the same `ERROR:` line whichever command meets it. Each
row is walked through the real CLI, in a child process, as a user runs it.

Before: `abbench calibrate` whose every cell failed exited 3 with no `ERROR:` line; `abbench
fleet` whose one device's campaign exited 5 exited 3 ("OWED"); `abbench report` of such a
run exited 5 silently; an interrupted import exited 130 where an interrupted campaign
exits 4.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from abbench.errors import (
    EXIT_BAD,
    EXIT_INTERRUPTED,
    EXIT_NO_GO,
    EXIT_NO_MEASUREMENT,
    EXIT_OK,
    EXIT_UNDECIDED,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
NOTHING = re.compile(r"^ERROR: no (cell|device) .*produced a valid measurement", re.M)


def abbench(*args: str | Path, cwd: Path, timeout: float = 300) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "abbench", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ERROR:")]


def external_campaign(tmp: Path, baseline_exit: int, name: str = "x") -> Path:
    """Two external cells; the baseline's command exits `baseline_exit` (0: prints a rate)."""
    ok = "echo 'generation: 4 tokens, 0.5 s/token (2.000 tok/s)'"
    base = ok if baseline_exit == 0 else f"echo 'ERROR: broken build' >&2; exit {baseline_exit}"
    path = tmp / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "{name}"
        spacing_s = 0
        warmup_tokens = 0
        order = ["A", "B", "A", "B"]

        [cells.A]
        command = ["sh", "-c", {json.dumps(base)}]
        output = "stdout-summary"

        [cells.B]
        command = ["sh", "-c", {json.dumps(base)}]
        output = "stdout-summary"

        [[decision]]
        candidate = "B"
        baseline = "A"
        """))
    return path


def only_run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir() and (p / "plan.json").is_file()]
    return run


# -- 5: nothing valid measured ---------------------------------------------------------------


def test_nothing_measured_is_5_and_one_error_in_campaign_report_and_calibrate(
        tmp_path: Path) -> None:
    cells = external_campaign(tmp_path, 3)
    rc, _, err = abbench("campaign", cells, "--out", "out", "--sentinels", "s", "--no-live",
                         cwd=tmp_path)
    assert rc == EXIT_NO_MEASUREMENT and len(errors(err)) == 1 and NOTHING.search(err), err
    line = errors(err)[0]
    assert "exited with status 3" in line and "broken build" in line
    run = only_run(tmp_path / "out")
    rc, _, err = abbench("report", run, "--style", "plain", cwd=tmp_path)
    assert (rc, errors(err)) == (EXIT_NO_MEASUREMENT, [line]), err  # the same line
    rc, _, err = abbench("report", run, "--json", cwd=tmp_path)
    assert (rc, errors(err)) == (EXIT_NO_MEASUREMENT, [line])
    rc, _, err = abbench("calibrate", "--like", cells, "--cells", "2", "--out", "cal",
                         "--sentinels", "s", "--no-live", cwd=tmp_path)
    assert rc == EXIT_NO_MEASUREMENT and len(errors(err)) == 1 and NOTHING.search(err), err
    assert "exited with status 3" in errors(err)[0]


@pytest.mark.slow  # a fleet starts Ray: 8 s alone, 30 s beside the other workers
def test_a_fleet_whose_every_device_measured_nothing_is_5(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    cells = external_campaign(tmp_path, 3)
    rc, out, err = abbench("fleet", cells, "--device", "local", "--out", "out",
                           "--sentinels", "s", cwd=tmp_path, timeout=600)
    assert re.search(r"local: done( on \S+)?, exit 5", out + err), out + err
    assert rc == EXIT_NO_MEASUREMENT and len(errors(err)) == 1, out + err
    assert errors(err)[0].startswith("ERROR: no device produced a valid measurement "
                                     "(local: no cell produced a valid measurement")
    fleet = only_folder(tmp_path / "out")
    assert json.loads((fleet / "fleet-report.json").read_text())["exit_status"] == 5
    rc, _, err = abbench("fleet", "--report", fleet, cwd=tmp_path)
    assert rc == EXIT_NO_MEASUREMENT and len(errors(err)) == 1


def only_folder(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


# -- 0, 1, 3: what the decisions say -----------------------------------------------------------


def test_what_the_decisions_say_is_the_status_of_campaign_report_and_import(
        tmp_path: Path) -> None:
    cells = external_campaign(tmp_path, 0)
    rc, _, err = abbench("campaign", cells, "--out", "out", "--sentinels", "s", "--no-live",
                         cwd=tmp_path)
    assert rc in (EXIT_OK, EXIT_NO_GO, EXIT_UNDECIDED) and not errors(err), err
    run = only_run(tmp_path / "out")
    report = json.loads((run / "report.json").read_text())
    assert abbench("report", run, "--style", "plain", cwd=tmp_path)[0] == rc
    assert report["exit_status"] == rc if "exit_status" in report else True
    # an import of runs whose order nothing recorded: a decision is UNVERIFIED at best
    rc, _, err = abbench("import", FIXTURES / "imports" / "identity-confound", "--out", "imp",
                         "--decision", "prefetch=1:prefetch=0", "--style", "plain",
                         cwd=tmp_path)
    assert rc == EXIT_UNDECIDED and not errors(err), err
    rc, _, err = abbench("import", FIXTURES / "imports" / "csv-v2-spec", "--out", "spec",
                         "--decision", "spec=mtp:spec=off", "--style", "plain", cwd=tmp_path)
    assert rc == EXIT_NO_GO and not errors(err), err
    rc, _, err = abbench("import", FIXTURES / "imports" / "tells-pressure", "--out", "tp",
                         "--style", "plain", cwd=tmp_path)
    assert rc == EXIT_OK and not errors(err), err


# -- 2: bad input, one ERROR, for every command ------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["campaign", "missing.toml"],
    ["calibrate", "--like", "missing.toml"],
    ["fleet", "missing.toml", "--device", "local"],
    ["import", "missing-folder"],
    ["report", "missing-run"],
    ["replay", "missing.route.csv"],
])
def test_bad_input_is_2_and_one_error_for_every_command(tmp_path: Path,
                                                        argv: list[str]) -> None:
    rc, _, err = abbench(*argv, cwd=tmp_path)
    assert rc == EXIT_BAD and len(errors(err)) == 1 and "missing" in errors(err)[0], err


# -- 4: interrupted ------------------------------------------------------------------------


def _interrupted(argv: list[str | Path], cwd: Path, ready: str) -> tuple[int, str]:
    """The command's status after a SIGINT once its stderr or stdout says `ready`."""
    proc = subprocess.Popen([sys.executable, "-m", "abbench", *map(str, argv)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + rest


def test_interrupted_is_4_for_campaign_and_import(tmp_path: Path) -> None:
    slow = tmp_path / "slow.toml"
    slow.write_text(textwrap.dedent("""\
        [campaign]
        name = "slow"
        spacing_s = 0
        warmup_tokens = 0

        [cells.A]
        command = ["sh", "-c", "echo started >&2; sleep 60"]
        output = "stdout-summary"
        """))
    rc, out = _interrupted(["campaign", slow, "--out", "out", "--sentinels", "s",
                            "--no-live"], tmp_path, "cell 1/1")
    assert rc == EXIT_INTERRUPTED, out
    src = tmp_path / "many"
    src.mkdir()
    rows = "step,wall_ms\n" + "".join(f"{i},100\n" for i in range(1, 9))
    for i in range(1500):
        (src / f"r{i:05d}.csv").write_text(rows)
    rc, out = _interrupted(["import", src, "--out", "imp", "--style", "plain"], tmp_path,
                           "import: ")
    assert rc == EXIT_INTERRUPTED and "ERROR: interrupted" in out, out
    assert not (tmp_path / "imp").exists()
