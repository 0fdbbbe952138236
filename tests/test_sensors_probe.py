"""The speed probe: a fixed workload, min of repetitions."""

from __future__ import annotations

import pytest

from abbench.sensors import probe, speed_probe


def test_probe_is_short_and_positive() -> None:
    t = speed_probe(reps=2)
    assert 0.001 < t < 1.0


def test_probe_is_the_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([0.0, 0.05, 1.0, 1.03, 2.0, 2.04])
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(probe, "_work", lambda: 0.0)
    assert speed_probe(reps=3) == pytest.approx(0.03)


def test_work_is_deterministic() -> None:
    assert probe._work() == probe._work()


def test_reps_must_be_positive() -> None:
    with pytest.raises(ValueError):
        speed_probe(reps=0)
