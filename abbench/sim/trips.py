"""Trip points and hysteresis read off a run's caps, for `abbench sim fit`.

A trip engages when its sensor's temperature reaches `temp_c` and lifts once it is
`hysteresis_c` below (abbench/sim/device.py). Sampled, an engagement shows as the caps
dropping to a new set between two samples, so the trip lies in (temperature before,
temperature at]; every engagement of the same cap set narrows that interval, and the trip
is its midpoint. A lift brackets trip − hysteresis the same way, from above. A cap set that
was never seen engaging (the run started with it) gets the lowest temperature it was seen
at: an underestimate by up to the hysteresis, but the best the run offers.

Which sensor the trips read (the SoC, or the case where a profile has `trip_sensor`): the
one whose engagements agree. On the wrong node the same trip engages at temperatures that
differ by degrees, so its intervals do not overlap; `violation_c` measures by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from abbench.sim.profile import Cluster, Trip

CapSet = tuple[int, ...]  # kHz per cluster, in the clusters' order


@dataclass(frozen=True)
class TripFit:
    trips: tuple[Trip, ...]       # ascending
    hysteresis_c: float | None    # None: no cap was lifted during the run
    violation_c: float            # °C by which engagements disagree (0: a consistent node)


def find_trips(caps: Sequence[CapSet], clusters: Sequence[Cluster], temps: np.ndarray,
               breaks: set[int]) -> TripFit:
    """Trips from per-sample cap sets and one node's temperatures (NaN: not measured);
    `breaks` are the samples that start a segment (no transition is read across a gap)."""
    hw = tuple(c.hw_max_khz for c in clusters)

    def frac(cs: CapSet) -> float:
        return sum(c / h for c, h in zip(cs, hw)) / max(1, len(hw))

    seen: dict[CapSet, float] = {}                        # lowest temperature seen at
    up: dict[CapSet, list[tuple[float, float]]] = {}      # engagements: (before, at)
    down: dict[CapSet, list[tuple[float, float]]] = {}    # lifts of the set: (at, before)
    prev: tuple[CapSet, float] | None = None
    for i, (cs, temp) in enumerate(zip(caps, temps.tolist())):
        if i in breaks:
            prev = None
        if math.isnan(temp):
            continue
        if cs != hw:
            seen[cs] = min(seen.get(cs, math.inf), temp)
        if prev is not None and prev[0] != cs:
            if frac(cs) < frac(prev[0]):
                up.setdefault(cs, []).append((prev[1], temp))
            else:
                down.setdefault(prev[0], []).append((temp, prev[1]))
        prev = (cs, temp)
    at = {cs: _between(up[cs]) if cs in up else low for cs, low in seen.items()}
    hyst = [at[cs] - _between(down[cs]) for cs in down if cs in at]
    violation = sum(_disagreement(ev) for ev in (*up.values(), *down.values()))
    trips: list[Trip] = []
    for cs in sorted(at, key=lambda c: (at[c], -frac(c))):
        t = round(at[cs], 2)
        if trips and t <= trips[-1].temp_c:  # a profile's trips are strictly ascending
            t = round(trips[-1].temp_c + 0.01, 2)
        trips.append(Trip(t, {c.policy: cap for c, cap in zip(clusters, cs)
                              if cap < c.hw_max_khz}))
    return TripFit(tuple(trips), max(0.0, float(np.median(hyst))) if hyst else None,
                   violation)


def _between(events: list[tuple[float, float]]) -> float:
    """The threshold every event brackets in (lo, hi]: the tightest interval's midpoint, or
    the lowest `hi` when the events disagree (a noisy or quantized sensor)."""
    lo = max(e[0] for e in events)
    hi = min(e[1] for e in events)
    return (lo + hi) / 2 if lo < hi else hi


def _disagreement(events: list[tuple[float, float]]) -> float:
    return max(0.0, max(e[0] for e in events) - min(e[1] for e in events))
