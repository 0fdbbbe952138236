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

import time

import numpy as np

LOOP_ITERATIONS = 200_000
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


def speed_probe(reps: int = 5) -> float:
    """Seconds for the fixed workload: the minimum over `reps` timed repetitions."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        _work()
        best = min(best, time.perf_counter() - t0)
    return best
