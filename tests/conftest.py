"""Shared fixtures: synthetic models built once per session into a private cache; and,
when the suite runs in parallel workers (the README's `pytest -n 4 --dist loadfile
--no-loadscope-reorder`, pytest-xdist), the longest modules first and the tests marked
`alone` with no other test beside them."""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from abbench.engine import synth
from abbench.engine.run.models import resolve_model

# Where the environment says PYTHONDONTWRITEBYTECODE (this machine's does), every test
# module's asserts would be rewritten and every `abbench` child process (a campaign cell,
# an engine run) would compile the package anew, each time: 9.5 s of a worker's collection
# and about 0.15 s of every child's start, measured. The tests keep bytecode where Python
# keeps it (`__pycache__/`, ignored by git), for this process and the children it starts.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def _shared() -> Path:
    """`../shared` beside the repository (as CI lays it), else the workplace's copy."""
    for candidate in (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")):
        if (candidate / "reference").is_dir():
            return candidate
    return Path(__file__).resolve().parents[2] / "shared"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`abbench.cli.main(argv)` in-process: (exit status, stdout, stderr)."""
    from abbench.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


SHARED = _shared()
REFERENCE = SHARED / "reference" / "bmoe"


@pytest.fixture(scope="module", autouse=True)
def _alone_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist (`-n 4 --dist loadfile`: a module runs whole on one worker),
    every test module holds one lock file shared, and a module with a test marked `alone`
    among those selected holds it exclusively, its module fixtures included: a test that
    measures this machine (a CPU share, a time ratio) never runs beside another worker's
    tests. Without workers: nothing."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    alone = any(item.get_closest_marker("alone") is not None
                for item in request.session.items if item.path == request.node.path)
    folder = Path(tempfile.gettempdir())
    with open(folder / f"abbench-tests-{run}.lock", "a") as lock, \
            open(folder / f"abbench-tests-{run}.gate", "a") as gate:
        # Every module passes the gate to take the lock, and an `alone` one holds the gate
        # while it waits: modules that come after it wait behind it, instead of taking the
        # shared lock over and over while the `alone` one starves (flock favours no one).
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


# The longest modules of the default run, longest first (measured serially: 13-68 s each,
# test_faults's 68 before it was split in two), after the longest chains of the slow run
# (.ci/run's second phase, measured serially: test_llamacpp 170 s after llama.cpp's build,
# which CI pays too, about 5 minutes on 2 cores; test_fuzz 280 s, one test of it 199 s):
# under pytest-xdist (with `--no-loadscope-reorder`, which keeps this order) they start
# first, so that none of them is left running on one worker at the end while the others
# are idle. A module not named runs after them, in file order; a module with an `alone`
# test, last: it waits only for the modules still running then, not for those that would
# start beside it. A name a run does not select (test_llamacpp in the default run) is
# passed over.
LONGEST = ("test_llamacpp", "test_fuzz", "test_faults", "test_faults_cells_and_io",
           "test_exit_statuses", "test_calibration", "test_remote_ssh",
           "test_calibration_bursts", "test_campaign_bmoe", "test_gates", "test_campaign_run",
           "test_import_scale", "test_campaign_llamacpp", "test_report_html", "test_bad_input")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `LONGEST` modules first, the modules with an `alone` test last (the order is the
    same on every worker, as xdist requires)."""
    alone = {item.path for item in items if item.get_closest_marker("alone") is not None}

    def rank(item: pytest.Item) -> tuple[bool, int]:
        stem = item.path.stem
        return item.path in alone, LONGEST.index(stem) if stem in LONGEST else len(LONGEST)

    items.sort(key=rank)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keep tests off the user's ~/.cache/abbench (CLI runs inherit the variable)."""
    folder = tmp_path_factory.mktemp("abbench-cache")
    os.environ["ABBENCH_CACHE"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    synth.write_model(synth.preset("tiny"), path)
    return path


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The ~1.5 GiB default preset, built once per session into the session's cache."""
    return Path(resolve_model("synthetic:default"))


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "small.gguf"
    synth.write_model(synth.preset("small"), path)
    return path
