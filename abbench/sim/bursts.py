"""Bursts of foreign load on the simulated device: a profile's optional `[bursts]` table and
the schedule it draws (docs/sensors.md#bursts).

A two-state load process in simulated time: the device is quiet, a burst starts (quiet
spells are exponential, `rate_per_min` bursts per simulated minute of quiet), lasts a
duration drawn uniformly from `duration_s`, and slows whatever runs during it by a depth
drawn uniformly from `depth`; then the device is quiet again. Every draw comes from one
`random.Random(seed)` in a fixed order (gap, duration, depth per burst), so a device
opened on the same profile meets the same bursts at the same simulated times.

The device applies a burst where it already slows the cell: the attached process runs
clock fraction × (1 − depth) of each duty period, whichever process is attached (a cell,
the arm whose turn it is in an interleaved pair, the speed probe). A `visible` burst is
CPU load the host-load sensor sees: the device adds depth × this machine's cores to
`load.foreign_cores` for the time it covers (a burst that slows the cell by a share of the
machine took that share of every core); an invisible one (memory bandwidth, a storage
flush) leaves the sensor reading what this machine really ran.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from abbench.records.schema import fail

MAX_DEPTH = 0.95  # a burst that stops the cell outright would never let a cell end


@dataclass(frozen=True)
class Bursts:
    """A profile's `[bursts]` table (units in the names; simulated time)."""

    rate_per_min: float                 # bursts started per simulated minute of quiet
    duration_s: tuple[float, float]     # s (simulated): [shortest, longest], uniform
    depth: tuple[float, float]          # fraction the run slows by: [least, most], uniform
    visible: bool = True                # the host-load sensor sees it (load.foreign_cores)
    seed: int = 0                       # the schedule's random seed

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate_per_min <= 600.0:
            fail(("bursts", "rate_per_min"), f"= {self.rate_per_min} is out of range "
                 "(0 .. 600 bursts per simulated minute)")
        _check_range("duration_s", self.duration_s, 0.1, 86_400.0, "simulated seconds")
        _check_range("depth", self.depth, 0.0, MAX_DEPTH, "of the run, e.g. [0.2, 0.4]")
        if self.seed < 0:
            fail(("bursts", "seed"), f"= {self.seed} must be 0 or more")


def _check_range(key: str, pair: tuple[float, float], lo: float, hi: float,
                 unit: str) -> None:
    if len(pair) != 2:
        fail(("bursts", key), f"must be two numbers [low, high], got {len(pair)}")
    low, high = pair
    if not lo <= low <= high <= hi:
        fail(("bursts", key), f"= [{low}, {high}] must satisfy {lo} <= low <= high <= {hi} "
             f"({unit})")


@dataclass(frozen=True)
class Burst:
    start_s: float   # s (simulated since the device opened)
    end_s: float     # s (simulated)
    depth: float     # fraction the run slows by


class BurstSchedule:
    """The bursts of one device, drawn from the seed as simulated time reaches them (not
    thread-safe: the device asks under its lock)."""

    def __init__(self, spec: Bursts) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._bursts: list[Burst] = []
        self._quiet_from = 0.0  # where the next quiet spell starts (the last burst's end)

    def _draw_until(self, t_s: float) -> None:
        """Draw bursts until one ends after `t_s` (none at rate 0)."""
        rate_per_s = self.spec.rate_per_min / 60.0
        while rate_per_s > 0 and self._quiet_from <= t_s:
            start = self._quiet_from + self._rng.expovariate(rate_per_s)
            end = start + self._rng.uniform(*self.spec.duration_s)
            self._bursts.append(Burst(start, end, self._rng.uniform(*self.spec.depth)))
            self._quiet_from = end

    def until(self, t_s: float) -> list[Burst]:
        """Every burst that starts before `t_s`."""
        self._draw_until(t_s)
        return [b for b in self._bursts if b.start_s < t_s]

    def depth_at(self, t_s: float) -> float:
        """How much slower whatever runs at `t_s` runs (0 outside a burst)."""
        self._draw_until(t_s)
        for b in reversed(self._bursts):
            if b.start_s <= t_s < b.end_s:
                return b.depth
            if b.end_s <= t_s:
                break
        return 0.0

    def mean_depth(self, t0_s: float, t1_s: float) -> float:
        """The depth averaged over [t0_s, t1_s] (0 for an empty span)."""
        if t1_s <= t0_s:
            return 0.0
        self._draw_until(t1_s)
        covered = sum(b.depth * (min(b.end_s, t1_s) - max(b.start_s, t0_s))
                      for b in self._bursts if b.start_s < t1_s and b.end_s > t0_s)
        return covered / (t1_s - t0_s)


__all__ = ["Burst", "BurstSchedule", "Bursts"]
