"""Resolving `synthetic:PRESET[@SEED]`: built once into the cache, errors as one message."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from abbench.engine import synth
from abbench.engine.run import models
from abbench.errors import UsageError


def test_prepare_builds_each_synthetic_model_once_and_leaves_paths_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABBENCH_CACHE", str(tmp_path / "cache"))
    built: list[str] = []
    real = synth.write_model

    def counting(spec: synth.SynthSpec, path: str | Path, name: str = "synthetic") -> None:
        built.append(name)
        real(spec, path, name)

    monkeypatch.setattr(synth, "write_model", counting)
    paths = models.prepare_models(["synthetic:tiny@5", "/some/model.gguf", "synthetic:tiny@5"])
    assert built == ["abbench-synthetic-tiny"]
    assert [p.name for p in paths] == [f"synthetic-tiny-s5-v{synth.FORMAT_VERSION}.gguf"]
    assert models.prepare_models(["synthetic:tiny@5"]) == paths and len(built) == 1


def test_a_build_that_fails_to_write_is_one_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ABBENCH_CACHE", str(cache))

    def full(spec: synth.SynthSpec, path: str | Path, name: str = "synthetic") -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(synth, "write_model", full)
    with pytest.raises(UsageError) as e:
        models.resolve_model("synthetic:tiny", quiet=True)
    assert "cannot build synthetic:tiny into" in e.value.message
    assert "No space left on device" in e.value.message
    assert e.value.exit_status == 2
    assert not list(cache.glob("*.gguf"))
