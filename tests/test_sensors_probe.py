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


def test_the_device_shell_probe_is_timed_there_or_not_measured() -> None:
    import subprocess

    from abbench.sensors.probe import read_shell_probe, shell_probe_script

    done = subprocess.run(["sh", "-c", shell_probe_script(3)], capture_output=True, text=True,
                          check=True)
    lines = done.stdout.split()
    assert len(lines) == 3 and all(int(x) > 0 for x in lines)
    assert read_shell_probe(done.stdout) == min(int(x) for x in lines) / 1e9
    assert read_shell_probe("41000000\n39000000\n") == 0.039
    # busybox's `date` without %N: the arithmetic fails, or prints what is not a time
    assert read_shell_probe("1733480000%N\n") is None
    assert read_shell_probe("") is None
    assert read_shell_probe("41000000\n0\n") is None
