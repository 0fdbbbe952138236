"""A fleet's verdicts: each device's campaign decides on its own; devices are then a level
above cells (docs/fleet.md#the-fleet-report).

For one question (candidate vs baseline), every device whose campaign gave a ratio with a
standard error contributes its log ratio y_i and variance v_i = se_i^2. The devices are
combined as a random-effects meta-analysis: the devices' true effects scatter around a
mean with between-device variance tau^2 (DerSimonian-Laird), the mean is weighted by
1 / (v_i + tau^2), and its interval is the Hartung-Knapp-Sidik-Jonkman one — a Student t
with k - 1 degrees of freedom on the weighted spread of the devices, never narrower than
the weights alone give — because with a handful of devices a normal interval is far too
sure of itself. One device is its own verdict. The verdict rule is the campaign's
(`decide.verdict_of`): a GO must clear `1 + min_effect` across devices, not on average of
the lucky ones. The same combination runs per device class (model / SoC), and a NO-GO of
any class is what the report states first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from abbench.analysis.campaign import CampaignAnalysis, analyze
from abbench.analysis.decide import GO, NO_GO, OWED, Decision, verdict_of
from abbench.analysis.stats import LEVEL, Interval, Noise, t_quantile
from abbench.errors import (
    EXIT_NO_GO,
    EXIT_NO_MEASUREMENT,
    EXIT_OK,
    EXIT_UNDECIDED,
    AbbenchError,
)
from abbench.records.fleet import (
    FleetEvent,
    FleetPlan,
    device_folder,
    last_ends,
    read_fleet_journal,
    read_fleet_plan,
)


@dataclass(frozen=True)
class Pooled:
    """A random-effects mean of log ratios: the estimate, its standard error and degrees
    of freedom (t), and tau^2, the between-device variance."""

    log_ratio: float
    se: float
    df: float
    tau2: float

    def interval(self, level: float = LEVEL) -> Interval:
        q = t_quantile(0.5 + level / 2, self.df)
        return Interval(math.exp(self.log_ratio), math.exp(self.log_ratio - q * self.se),
                        math.exp(self.log_ratio + q * self.se), level)


def random_effects(estimates: Sequence[tuple[float, float, float]]) -> Pooled:
    """(log ratio, se, df) per device → their random-effects mean (see the module
    docstring). One device: its own estimate, se and df."""
    if not estimates:
        raise ValueError("no estimates to combine")
    if len(estimates) == 1:
        y, se, df = estimates[0]
        return Pooled(y, se, df, 0.0)
    ys = [y for y, _, _ in estimates]
    vs = [max(se * se, 1e-12) for _, se, _ in estimates]
    k = len(ys)
    w = [1 / v for v in vs]
    sw = sum(w)
    fixed = sum(wi * yi for wi, yi in zip(w, ys)) / sw
    q = sum(wi * (yi - fixed) ** 2 for wi, yi in zip(w, ys))
    tau2 = max(0.0, (q - (k - 1)) / (sw - sum(wi * wi for wi in w) / sw))
    ws = [1 / (v + tau2) for v in vs]
    sws = sum(ws)
    mu = sum(wi * yi for wi, yi in zip(ws, ys)) / sws
    spread = sum(wi * (yi - mu) ** 2 for wi, yi in zip(ws, ys)) / (k - 1)
    return Pooled(mu, math.sqrt(max(1.0, spread) / sws), float(k - 1), tau2)


@dataclass(frozen=True)
class DeviceOutcome:
    """One device's campaign as the fleet saw it."""

    device: str  # its transport (`sim:phone#1`, `adb:SERIAL`)
    device_class: str  # model / SoC ("" when unknown)
    status: str  # done | interrupted | failed | not run
    folder: Path | None  # its run folder, when one came back
    analysis: CampaignAnalysis | None
    host: str = ""
    note: str = ""  # why there is no analysis, or what the campaign said on failing

    @property
    def class_name(self) -> str:
        return self.device_class or "unknown class"


@dataclass(frozen=True)
class Combined:
    """One question answered over a set of devices (all of them, or one class)."""

    candidate: str
    baseline: str
    scope: str  # "all devices" or the class
    verdict: str
    reason: str
    ratio: Interval | None
    tau: float | None  # between-device sd of the log ratio
    df: float
    devices: tuple[str, ...]  # those whose estimate is in it
    verdicts: tuple[tuple[str, str], ...]  # every device of the scope: (device, its verdict)
    excluded: tuple[tuple[str, str], ...]  # (device, why it is not in the combination)


@dataclass(frozen=True)
class FleetAnalysis:
    folder: Path
    plan: FleetPlan
    devices: tuple[DeviceOutcome, ...]
    combined: tuple[Combined, ...]  # per question, across every device
    per_class: tuple[Combined, ...]  # per question and class
    exit_status: int

    @property
    def no_go_classes(self) -> list[Combined]:
        return [c for c in self.per_class if c.verdict == NO_GO]


Entry = tuple[str, Decision | None, str]  # (device, its decision of the question, why none)


def combine(candidate: str, baseline: str, scope: str, entries: Sequence[Entry],
            level: float = LEVEL) -> Combined:
    """The question over the devices of `entries` (see the module docstring): each
    device's own decision of it, or None with the reason it has none."""
    verdicts: list[tuple[str, str]] = []
    estimates: list[tuple[float, float, float]] = []
    used: list[str] = []
    excluded: list[tuple[str, str]] = []
    spec: Decision | None = None
    for device, d, note in entries:
        if d is None:
            verdicts.append((device, OWED))
            excluded.append((device, note))
            continue
        spec = spec or d
        verdicts.append((device, d.verdict))
        if d.ratio is None or not math.isfinite(d.se) or d.noise is None or not d.noise.known:
            excluded.append((device, d.reason))
            continue
        estimates.append((math.log(d.ratio.estimate), d.se, float(d.noise.df)))
        used.append(device)
    if spec is None or not estimates:
        return Combined(candidate, baseline, scope, OWED,
                        "no device gave a ratio with an interval", None, None, 0.0,
                        (), tuple(verdicts), tuple(excluded))
    pooled = random_effects(estimates)
    ratio = pooled.interval(level)
    noise = Noise(pooled.tau2, max(int(pooled.df), 1))
    verdict, reason = verdict_of(ratio, spec.expect, spec.min_effect, spec.max_regression,
                                 noise)
    if len(estimates) < len(verdicts):
        reason += f"; {len(verdicts) - len(estimates)} device(s) without a ratio not in it"
    if len(estimates) == 1:
        reason += " (one device: its own interval)"
    return Combined(candidate, baseline, scope, verdict, reason, ratio,
                    math.sqrt(pooled.tau2), pooled.df, tuple(used), tuple(verdicts),
                    tuple(excluded))


def _entry(o: DeviceOutcome, candidate: str, baseline: str) -> Entry:
    """The device's decision of the question; none from a campaign that did not finish
    (its report shows what it has; the fleet does not count a part of a campaign)."""
    if o.analysis is None or o.status != "done":
        return o.device, None, o.note or f"its campaign did not finish ({o.status})"
    d = next((d for d in o.analysis.decisions
              if d.candidate == candidate and d.baseline == baseline), None)
    return o.device, d, "" if d is not None else "its campaign did not ask this"


def outcomes(folder: Path, plan: FleetPlan, events: list[FleetEvent]) -> list[DeviceOutcome]:
    """Each planned device's campaign, from the fleet journal and its run folder."""
    ends = last_ends(events)
    starts = {e.device: e for e in events if e.event == "start"}
    out = []
    for device in plan.devices:
        end = ends.get(device)
        if end is None:
            status = "running or lost" if device in starts else "not run"
            out.append(DeviceOutcome(device, "", status, None, None,
                                     starts[device].host if device in starts else "",
                                     f"its campaign {status}"))
            continue
        run = folder / device_folder(device) / end.run if end.run else None
        analysis, note = None, end.error
        if run is not None and run.is_dir():
            try:
                analysis = analyze(run)
            except AbbenchError as e:
                note = f"its run folder cannot be read: {e.message}"
        elif not note:
            note = "no run folder came back"
        out.append(DeviceOutcome(device, end.device_class, end.status,
                                 run if analysis is not None else None, analysis, end.host,
                                 note))
    return out


def analyze_fleet(folder: Path) -> FleetAnalysis:
    """Read a fleet folder and answer its campaign's questions per device, per class and
    across devices."""
    plan = read_fleet_plan(folder)
    devices = outcomes(folder, plan, read_fleet_journal(folder))
    questions: list[tuple[str, str]] = []
    for o in devices:
        for d in o.analysis.decisions if o.analysis is not None else ():
            if (d.candidate, d.baseline) not in questions:
                questions.append((d.candidate, d.baseline))
    combined = tuple(combine(c, b, "all devices", [_entry(o, c, b) for o in devices])
                     for c, b in questions)
    classes = sorted({o.class_name for o in devices})
    per_class = tuple(combine(c, b, cls, [_entry(o, c, b) for o in devices
                                          if o.class_name == cls])
                      for c, b in questions for cls in classes)
    status = _fleet_exit(combined, devices)
    return FleetAnalysis(folder, plan, tuple(devices), combined, per_class, status)


def _fleet_exit(combined: Sequence[Combined], devices: Sequence[DeviceOutcome]) -> int:
    """As a campaign's, over the combined verdicts: 1 when any is NO-GO; 5 when no device
    measured anything valid (each device's run folder says so, or it never ran: nothing
    to decide on anywhere); 3 when any is open or a device's campaign gave nothing (a
    fleet that did not run everywhere is no GO, and a device whose worker died may have
    valid cells its `--resume` keeps); 0 when every one is GO or none is asked."""
    codes = [{GO: EXIT_OK, NO_GO: EXIT_NO_GO}.get(c.verdict, EXIT_UNDECIDED) for c in combined]
    if EXIT_NO_GO in codes:
        return EXIT_NO_GO
    if devices and all(o.status == "not run" if o.analysis is None
                       else o.analysis.exit_status == EXIT_NO_MEASUREMENT for o in devices):
        return EXIT_NO_MEASUREMENT
    if EXIT_UNDECIDED in codes or any(o.analysis is None or o.status != "done" for o in devices):
        return EXIT_UNDECIDED
    return EXIT_OK
