"""`abbench sim fit`: a simulated device's profile fitted to a recorded run.

From a run folder: the SoC as `temp.cpu_c`, the case as `battery.temp_c`, the clock
fraction as the mean over policies of `cap_khz / hw_max_khz` (each policy with a cap and a
hardware max is a cluster, at the largest hardware max seen), and the load as 1 between each
journal record's `t_start_mono` and `t_end_mono`, `idle_load` otherwise. Those feed the
thermal fit (abbench/sim/thermal.py, which documents the model and the method) and
the trip reading (abbench/sim/trips.py).

Time scale: a run recorded on `sim:PROFILE` ran in simulated seconds, so its timeline is
stretched by that profile's time scale; a real device's by 1; `--time-scale` overrides both
and becomes the profile's.

`idle_load` is fitted when at least `MIN_IDLE_SHARE` of the timeline is idle (the idle
equilibrium SoC − case = heat · idle_load · soc_tau separates it from the heat); otherwise,
or when the caller fixes it, it is the source profile's (a `sim:` run) or
`DEFAULT_IDLE_LOAD`. Trips are read on the node (`trip_sensor`) whose engagements agree: on
a device whose thermal service reads the skin, the caps drop at one case temperature but
at SoC temperatures degrees apart. With no cap lifted, the hysteresis is the source
profile's or `DEFAULT_HYSTERESIS_C`.

A gap in the timeline longer than `GAP_MIN_S` (and `GAP_FACTOR` sampling intervals), such
as a resumed campaign's, starts a new segment from that sample's measured temperatures: what
the device did in between is unknown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from abbench.errors import AbbenchError, FitError
from abbench.records import Sample, keys, read_journal, read_plan, read_samples
from abbench.sim.profile import Cluster, Profile, Trip, load_profile, profile_from_text
from abbench.sim.thermal import (
    THERMAL,
    Estimate,
    Segment,
    Series,
    fit_thermal,
)
from abbench.sim.trips import TripFit, find_trips

__all__ = ["THERMAL", "Estimate", "FitError", "SimFit", "fit_run"]

DEFAULT_IDLE_LOAD = 0.1      # load between cells when the run cannot tell (background work)
DEFAULT_HYSTERESIS_C = 3.0   # °C, when no cap was lifted during the run
MIN_SAMPLES = 40             # samples with both temperatures: 20 s at the default 2 Hz
MIN_RANGE_C = 0.5            # °C the SoC must move; less is sensor noise, not heat
MIN_IDLE_SHARE = 0.1         # share of the timeline idle before idle_load is fitted
GAP_MIN_S = 5.0              # s (wall): a longer pause in sampling starts a new segment...
GAP_FACTOR = 10.0            # ...when it is also this many median sampling intervals
TRIP_TOL_C = 0.15            # °C engagements may disagree by on the trips' node (0.1 steps)
# Constant readings a profile needs, for a run that did not record them: they only decide
# what a gate on memory sees, never the heat.
DEFAULT_READINGS = {"mem_total_mib": 8192, "mem_available_mib": 4096,
                    "battery_capacity_pct": 80}

SOC_KEY, CASE_KEY = keys.CPU_TEMP_C, keys.BATTERY_TEMP_C


@dataclass(frozen=True)
class Timeline:
    """What the fit needs from a run folder."""

    t: np.ndarray         # (N,) s, monotonic wall clock
    soc: np.ndarray       # (N,) °C, NaN where the sample lacks it
    case: np.ndarray      # (N,) °C, NaN where the sample lacks it
    caps: list[tuple[int, ...]]   # (N,) caps per cluster (kHz), carried over gaps
    clusters: tuple[Cluster, ...]
    segments: tuple[Segment, ...]
    idle_share: float     # idle time / timeline
    extras: dict[str, float]      # median mem.* / battery.capacity_pct readings


@dataclass(frozen=True)
class SimFit:
    run: Path
    device: str                         # plan.device, e.g. "sim:phone", "adb:R5CT..."
    time_scale: float
    samples: int
    span_s: float                       # wall s covered
    params: dict[str, Estimate]         # THERMAL keys
    idle_load_how: str                  # "fitted" or why it was fixed
    rms_soc_c: float
    rms_case_c: float
    at_bound: tuple[str, ...]           # fitted keys that ended on their search bound
    clusters: tuple[Cluster, ...]       # a placeholder `policy0` when the run had no caps
    has_caps: bool
    trips: tuple[Trip, ...]
    trip_sensor: str                    # "soc" or "case": the node the trips read
    hysteresis_c: float
    hysteresis_how: str
    extras: dict[str, float]
    template: Profile | None            # the source profile of a `sim:` run

    def profile_dict(self, name: str) -> dict[str, Any]:
        """The profile as `Profile.from_dict` takes it. No start temperatures: a profile
        without them starts at its idle equilibrium (cool), as a planned campaign should."""
        d: dict[str, Any] = {}
        if self.template is not None:  # keys this fit knows nothing about keep their value
            d.update({k: x for k, x in asdict(self.template).items()
                      if x is not None and k not in ("start_soc_c", "start_case_c")})
        d.update({
            "name": name,
            "clusters": [{"policy": c.policy, "hw_max_khz": c.hw_max_khz}
                         for c in self.clusters],
            "trips": [{"temp_c": t.temp_c, "caps_khz": dict(t.caps_khz)} for t in self.trips],
            "time_scale": self.time_scale,
            **{k: _round(e.value) for k, e in self.params.items()},
            "hysteresis_c": round(self.hysteresis_c, 2), "trip_sensor": self.trip_sensor,
        })
        for key, default in DEFAULT_READINGS.items():  # measured, else the source's
            d[key] = int(self.extras.get(key, d.get(key, default)))
        d["mem_available_mib"] = min(d["mem_available_mib"], d["mem_total_mib"])
        return d


def _round(x: float) -> float:
    return float(f"{x:.5g}")


# -- reading the run -------------------------------------------------------------------------


def _num(values: dict[str, Any], key: str) -> float | None:
    v = values.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_timeline(run: Path, time_scale: float) -> Timeline:
    """The run's samples and cell spans as the fit's inputs; FitError if they cannot be."""
    samples = sorted(read_samples(run), key=lambda s: s.t_mono)
    if not samples:
        raise FitError(f"{run}: no samples (samples.jsonl is missing or empty)")
    for key, what in ((SOC_KEY, "CPU"), (CASE_KEY, "battery")):
        if all(_num(s.values, key) is None for s in samples):
            raise FitError(f"{run}: none of its {len(samples)} samples has a {what} "
                           f"temperature (`{key}`): nothing to fit",
                           tip="record on a device with sensors (`abbench sensors` lists "
                           "what a device exposes)")
    clusters = _clusters(samples)
    t = [s.t_mono for s in samples]
    soc = [_num(s.values, SOC_KEY) for s in samples]
    case = [_num(s.values, CASE_KEY) for s in samples]
    caps = _caps(samples, clusters)
    ta = np.asarray(t, dtype=float)
    soc_a = np.array([math.nan if x is None else x for x in soc])
    case_a = np.array([math.nan if x is None else x for x in case])
    both = ~np.isnan(soc_a) & ~np.isnan(case_a)
    if both.sum() < MIN_SAMPLES:
        raise FitError(f"{run}: {int(both.sum())} samples with both temperatures; the fit "
                       f"needs at least {MIN_SAMPLES}",
                       tip="record a longer campaign (at 2 Hz, 20 s gives 40 samples)")
    if np.nanmax(soc_a) - np.nanmin(soc_a) < MIN_RANGE_C:
        raise FitError(f"{run}: the CPU temperature moved only "
                       f"{np.nanmax(soc_a) - np.nanmin(soc_a):.2f} °C: no heating to fit",
                       tip="record cells long enough to heat the device")
    spans = sorted((r.t_start_mono, r.t_end_mono) for r in read_journal(run)
                   if r.t_end_mono > r.t_start_mono)
    cf = np.array([sum(c / k.hw_max_khz for c, k in zip(cap, clusters)) / len(clusters)
                   if clusters else 1.0 for cap in caps])
    segments = _segments(ta, both, cf, spans, time_scale)
    if not segments:
        raise FitError(f"{run}: no stretch of the timeline has {MIN_SAMPLES // 4} or more "
                       "samples without a gap")
    busy_s = sum(float((s.h_s * s.busy).sum()) for s in segments)
    total_s = sum(float(s.h_s.sum()) for s in segments)
    if busy_s == 0.0:
        raise FitError(f"{run}: no cell ran while the sampler recorded (journal.jsonl has "
                       f"{len(spans)} cell spans): the load never changed, so heat cannot "
                       "be told from ambient")
    return Timeline(ta, soc_a, case_a, caps, clusters, tuple(segments),
                    1.0 - busy_s / total_s, _extras(samples))


def _clusters(samples: list[Sample]) -> tuple[Cluster, ...]:
    """The cpufreq policies with a cap in the samples, each at its highest hardware max."""
    hw: dict[str, int] = {}
    for s in samples:
        for p, v in keys.policies(s.values, "hw_max_khz").items():
            if keys.cap_khz(p) in s.values and isinstance(v, int):
                hw[p] = max(hw.get(p, 0), v)
    return tuple(Cluster(p, hw[p]) for p in sorted(hw, key=_policy_order))


def _caps(samples: list[Sample], clusters: tuple[Cluster, ...]) -> list[tuple[int, ...]]:
    """Each sample's cap per cluster; a policy missing from a sample keeps its last cap."""
    last = [c.hw_max_khz for c in clusters]
    out = []
    for s in samples:
        for i, c in enumerate(clusters):
            cap = s.values.get(keys.cap_khz(c.policy))
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                last[i] = min(cap, c.hw_max_khz)
        out.append(tuple(last))
    return out


def _extras(samples: list[Sample]) -> dict[str, float]:
    """The memory and battery figures the profile keeps: each one's median over the run."""
    extras = {}
    for key, name in ((keys.MEM_TOTAL_MIB, "mem_total_mib"),
                      (keys.MEM_AVAILABLE_MIB, "mem_available_mib"),
                      (keys.BATTERY_CAPACITY_PCT, "battery_capacity_pct")):
        vals = [x for s in samples if (x := _num(s.values, key)) is not None]
        if vals:
            extras[name] = float(np.median(vals))
    return extras


def series(tl: Timeline) -> list[Series]:
    """Each segment with its samples' measured temperatures."""
    return [(seg, tl.soc[seg.first:seg.first + len(seg.at)],
             tl.case[seg.first:seg.first + len(seg.at)]) for seg in tl.segments]


def _policy_order(policy: str) -> tuple[int, str]:
    digits = policy.removeprefix("policy")
    return (int(digits), policy) if digits.isdigit() else (1 << 30, policy)


def _segments(t: np.ndarray, both: np.ndarray, cf: np.ndarray,
              spans: list[tuple[float, float]], time_scale: float) -> list[Segment]:
    dt = np.diff(t)
    gap = max(GAP_MIN_S, GAP_FACTOR * float(np.median(dt))) if len(dt) else GAP_MIN_S
    breaks = [0, *(np.nonzero(dt > gap)[0] + 1).tolist(), len(t)]
    starts = np.array([a for a, _ in spans])
    ends = np.array([b for _, b in spans])
    out = []
    for lo, hi in zip(breaks[:-1], breaks[1:]):
        usable = np.nonzero(both[lo:hi])[0]
        if len(usable) == 0:
            continue
        lo += int(usable[0])  # the state starts where both temperatures were measured
        if hi - lo < MIN_SAMPLES // 4:
            continue
        ts = t[lo:hi]
        inner = [x for x in (*starts, *ends) if ts[0] < x < ts[-1]]
        grid = np.unique(np.concatenate([ts, np.asarray(inner, dtype=float)]))
        mid = (grid[:-1] + grid[1:]) / 2
        busy = np.zeros(len(mid), dtype=bool)
        if len(starts):  # the span that started last before each interval, if still running
            k = np.searchsorted(starts, mid, side="right") - 1
            busy = (k >= 0) & (mid < ends[np.maximum(k, 0)])
        near = np.searchsorted((ts[:-1] + ts[1:]) / 2, mid)  # caps switch halfway
        out.append(Segment(np.diff(grid) * time_scale, busy.astype(float),
                           cf[lo:hi][near], np.searchsorted(grid, ts), lo))
    return out


# -- the whole run ---------------------------------------------------------------------------


def trip_sensor(tl: Timeline, preferred: str) -> tuple[str, TripFit]:
    """The node whose engagements agree (within TRIP_TOL_C), and its trips; `preferred`
    (the source profile's) when both or neither do."""
    nodes = ("soc", "case")
    breaks = {s.first for s in tl.segments}
    fits = {n: find_trips(tl.caps, tl.clusters, tl.soc if n == "soc" else tl.case, breaks)
            for n in nodes}
    best = min(nodes, key=lambda n: (max(0.0, fits[n].violation_c - TRIP_TOL_C),
                                     n != preferred, n != "soc"))
    return best, fits[best]


def source_profile(run: Path, device: str, required: bool = True) -> Profile | None:
    """The profile a `sim:` run was recorded on; None for a real device, or when it cannot
    be loaded and is not `required` (the caller gave the time scale)."""
    kind, _, arg = device.partition(":")
    if kind != "sim":
        return None
    kept = run / "device-profile.toml"  # written by the campaign: the profile as it ran
    try:
        if kept.is_file():
            return profile_from_text(kept.read_text(encoding="utf-8"), str(kept))
        return load_profile(arg)
    except AbbenchError as e:
        if not required:
            return None
        raise FitError(f"{run}: recorded on `{device}`, whose profile cannot be loaded to "
                       f"learn its time scale ({e.message})",
                       tip="give it with --time-scale X (simulated s per wall s)") from None


def fit_run(run: Path, time_scale: float | None = None,
            idle_load: float | None = None) -> SimFit:
    """Fit a profile to the run folder `run` (see the module docstring)."""
    if not run.is_dir():
        raise FitError(f"{run}: no such run folder")
    plan = read_plan(run)
    template = source_profile(run, plan.device, required=time_scale is None)
    scale = time_scale or (template.time_scale if template is not None else 1.0)
    tl = read_timeline(run, scale)
    fallback = template.idle_load if template is not None else DEFAULT_IDLE_LOAD
    if idle_load is not None:
        fix: float | None = idle_load
        how = "fixed by --idle-load"
    elif tl.idle_share < MIN_IDLE_SHARE:
        fix = fallback
        how = (f"fixed: the run is idle {tl.idle_share:.0%} of the time (fitted from "
               f"{MIN_IDLE_SHARE:.0%}); " + ("the source profile's" if template else "default"))
    else:
        fix, how = None, "fitted"
    th = fit_thermal(series(tl), fix, str(run))
    sensor, tf = trip_sensor(tl, template.trip_sensor if template is not None else "soc")
    hyst = tf.hysteresis_c
    if hyst is not None:
        hyst_how = (f"from the {'SoC' if sensor == 'soc' else 'case'} temperature where "
                    "caps were lifted")
    elif template is not None:
        hyst, hyst_how = template.hysteresis_c, "no caps lifted: the source profile's"
    else:
        hyst, hyst_how = DEFAULT_HYSTERESIS_C, "no caps lifted: default"
    clusters = tl.clusters or (Cluster("policy0", 1_000_000),)  # no cpufreq: never capped
    used = sum(len(s.at) for s in tl.segments)
    return SimFit(run, plan.device, scale, used, float(tl.t[-1] - tl.t[0]), th.params, how,
                  th.rms_soc_c, th.rms_case_c, th.at_bound, clusters, bool(tl.clusters),
                  tf.trips, sensor, hyst, hyst_how, tl.extras, template)
