"""The speed probe: a fixed short CPU workload, timed.

On a device that hides its sensors (no cpufreq, no thermal zones: most VMs and CI runners,
locked-down phones) the only evidence of throttling or of a noisy neighbour is that fixed
work takes longer. The campaign probes before each cell, never during one, and reports
index = first probe / this probe: 1.0 at the start, lower when the machine got slower.

The work is an interpreter loop (integer arithmetic and branches: what a throttled core
slows most directly) plus a small elementwise numpy pass (memory and SIMD), about 25 ms on
a 2020s x86 core. Elementwise, not a matrix product, so that no BLAS thread pool joins in
and the probe measures one core. The minimum of the repetitions is the figure: noise only
ever adds time.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from abbench.errors import AbbenchError

LOOP_ITERATIONS = 200_000
# The probe of an adb or ssh device runs in its own shell (no Python there): an arithmetic
# loop of the device's `sh`, timed there by `date +%s%N` so that the connection's latency
# is not in it; about 30-60 ms a repetition in dash on a current x86 core.
SHELL_LOOP_ITERATIONS = 50_000
ARRAY_LEN = 1 << 18          # 2 MiB of float64: larger than L2 on phones, fits L3 on x86
ARRAY_PASSES = 4


def _work() -> float:
    acc = 0
    for i in range(LOOP_ITERATIONS):
        acc = (acc * 31 + i) & 0xFFFFFFFF if i & 1 else acc ^ i
    a = np.linspace(0.0, 1.0, ARRAY_LEN)
    total = 0.0
    for _ in range(ARRAY_PASSES):
        a = np.sqrt(a * a + 1.0)
        total += float(a.sum())
    return acc + total


def speed_probe(reps: int = 5, min_rep_s: float = 0.0) -> float:
    """Seconds for the fixed workload: the minimum over `reps` timed repetitions. A
    repetition runs the workload whole times until at least `min_rep_s` has passed and
    counts the mean: a process duty-cycled in periods longer than one workload (a simulated
    device's throttling) must be timed over several periods, or the minimum picks a
    repetition that ran between two stops."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        units = 0
        while True:
            _work()
            units += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_rep_s:
                break
        best = min(best, elapsed / units)
    return best


def shell_probe_script(reps: int = 3) -> str:
    """The device's shell probe: one line per repetition, its nanoseconds."""
    loop = f'i=0; while [ "$i" -lt {SHELL_LOOP_ITERATIONS} ]; do i=$((i + 1)); done'
    return (f"for r in {' '.join(str(r) for r in range(reps))}; do t0=$(date +%s%N); "
            f"{loop}; t1=$(date +%s%N); echo $((t1 - t0)); done")


def read_shell_probe(text: str) -> float | None:
    """Seconds of the fastest repetition `shell_probe_script` printed; None where the
    device's `date` has no nanoseconds (busybox without %N) or nothing sensible came back:
    the probe is then not measured on that device."""
    try:
        values = [int(line) for line in text.split()]
    except ValueError:
        return None
    good = [v for v in values if 0 < v < 60_000_000_000]
    return min(good) / 1e9 if good and len(good) == len(values) else None


class Shell(Protocol):
    """What `device_probe` needs of a device (`sensors.device.Device`)."""

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]: ...


def device_probe(device: Shell) -> float | None:
    """The shell probe's seconds on an adb/ssh device; None where it cannot be measured
    there (then nothing is matched or gated on it)."""
    try:
        done = device.run(["sh", "-c", shell_probe_script()], timeout=60)
    except (subprocess.TimeoutExpired, OSError, AbbenchError):
        return None
    return read_shell_probe(done.stdout) if done.returncode == 0 else None


class ProbeWorker:
    """The probe in a child process of its own, started once and asked for a measurement
    over a pipe, so that the process can be throttled like a cell: a simulated device
    duty-cycles it while it measures (`attach(pid)` … `detach()`), and it sees the host's
    own load as a real device's probe does. `python -m abbench.sensors.probe` is the child:
    one line in ("probe REPS MIN_REP_S"), one line out (seconds)."""

    def __init__(self, python: str) -> None:
        self._proc = subprocess.Popen(
            [python, "-m", "abbench.sensors.probe"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        if self._ask("ready") != "ready":  # numpy imported and the loop warm
            self.close()
            raise OSError("the speed probe's process did not start")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _ask(self, line: str) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline().strip()

    def measure(self, reps: int = 5, min_rep_s: float = 0.0) -> float:
        """Seconds for the fixed workload, as `speed_probe(reps, min_rep_s)` gives them, in
        the child."""
        answer = self._ask(f"probe {int(reps)} {float(min_rep_s)!r}")
        try:
            return float(answer)
        except ValueError:
            raise OSError(f"the speed probe's process answered {answer[:40]!r}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _serve() -> None:
    _work()  # warm the interpreter loop and numpy before the first measurement
    for line in sys.stdin:
        if not line.split():
            continue
        command, *args = line.split()
        if command == "ready":
            print("ready", flush=True)
        elif command == "probe":
            reps, min_rep_s = (int(args[0]), float(args[1])) if len(args) == 2 else (5, 0.0)
            print(repr(speed_probe(reps, min_rep_s)), flush=True)


if __name__ == "__main__":
    _serve()
