"""Shared fixtures: synthetic models built once per session into a private cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from abbench.engine import synth
from abbench.engine.models import resolve_model


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
