"""Fleet verdicts: the random-effects combination of devices, by simulation with known
truth, and the verdict rules across devices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abbench.analysis.decide import GO, INCONCLUSIVE, NO_GO, OWED, Decision
from abbench.analysis.fleet import combine, random_effects
from abbench.analysis.stats import Interval, Noise, t_quantile


def _decision(ratio: float, se: float, df: int = 8, min_effect: float = 0.0,
              verdict: str = INCONCLUSIVE) -> Decision:
    q = t_quantile(0.975, df)
    iv = Interval(ratio, ratio * math.exp(-q * se), ratio * math.exp(q * se))
    return Decision("B", "A", min_effect, verdict, None, iv, (), (), "its own reason", None,
                    None, noise=Noise(se * se, df), se=se)


def test_one_device_is_its_own_estimate() -> None:
    p = random_effects([(0.1, 0.02, 7.0)])
    assert (p.log_ratio, p.se, p.df, p.tau2) == (0.1, 0.02, 7.0, 0.0)


@pytest.mark.parametrize("tau", [0.0, 0.06])
def test_the_interval_covers_the_fleet_mean_as_often_as_it_says(tau: float) -> None:
    """Known truth: 5 devices whose true effects scatter around log(1.05) with sd `tau`,
    each measured with its own standard error. The 95% interval must cover the mean in at
    least about 95% of fleets (with few devices it is conservative by design: never
    narrower than the weights alone give); an interval that ignores the devices' scatter
    (fixed effect, normal) covers far less once they do scatter — why devices are a level
    above cells."""
    rng = np.random.default_rng(17)
    mu, k, n = math.log(1.05), 5, 600
    covered = fixed_covered = 0
    for _ in range(n):
        se = rng.uniform(0.015, 0.05, k)
        y = mu + rng.normal(0, tau, k) + rng.normal(0, se)
        p = random_effects([(float(a), float(b), math.inf) for a, b in zip(y, se)])
        iv = p.interval()
        covered += iv.low <= math.exp(mu) <= iv.high
        w = 1 / se**2
        fixed, fse = float((w * y).sum() / w.sum()), float(1 / math.sqrt(w.sum()))
        fixed_covered += abs(fixed - mu) <= 1.96 * fse
    assert covered / n >= 0.93, covered / n
    if tau > 0:
        assert fixed_covered / n < 0.8, fixed_covered / n
        assert covered / n - fixed_covered / n > 0.15


def test_a_go_must_hold_across_devices() -> None:
    same = [(f"sim:phone#{i}", _decision(1.10 + 0.005 * i, 0.01), "") for i in range(3)]
    c = combine("B", "A", "all devices", same)
    assert c.verdict == GO and c.ratio is not None and c.ratio.low > 1.0
    assert c.devices == ("sim:phone#0", "sim:phone#1", "sim:phone#2")
    # one device much slower: the devices disagree, the interval widens past 1
    split = [*same, ("sim:laptop", _decision(0.85, 0.01), "")]
    c = combine("B", "A", "all devices", split)
    assert c.verdict == INCONCLUSIVE and c.tau is not None and c.tau > 0.05
    # every device slower: NO-GO
    slow = [(f"d{i}", _decision(0.90, 0.01), "") for i in range(3)]
    assert combine("B", "A", "all devices", slow).verdict == NO_GO


def test_a_device_without_a_ratio_is_named_not_counted() -> None:
    entries = [("d1", _decision(1.2, 0.01), ""), ("d2", _decision(1.21, 0.01), ""),
               ("d3", None, "its campaign failed: the device disappeared")]
    c = combine("B", "A", "all devices", entries)
    assert c.devices == ("d1", "d2")
    assert ("d3", "its campaign failed: the device disappeared") in c.excluded
    assert ("d3", OWED) in c.verdicts
    assert "1 device(s) without a ratio not in it" in c.reason
    nothing = combine("B", "A", "all devices", [("d3", None, "lost")])
    assert nothing.verdict == OWED and nothing.ratio is None
    one = combine("B", "A", "phone", [("d1", _decision(1.2, 0.01, min_effect=0.05), "")])
    assert one.verdict == GO and "one device: its own interval" in one.reason


def test_a_campaign_that_did_not_finish_is_shown_not_counted() -> None:
    from types import SimpleNamespace

    from abbench.analysis.fleet import DeviceOutcome, _entry, _fleet_exit

    part = SimpleNamespace(decisions=[_decision(1.3, 0.01)], exit_status=0)
    done = DeviceOutcome("d1", "c", "done", None, part, note="")  # type: ignore[arg-type]
    cut = DeviceOutcome("d2", "c", "interrupted", None, part, note="")  # type: ignore[arg-type]
    assert _entry(done, "B", "A")[1] is not None
    assert _entry(cut, "B", "A") == ("d2", None, "its campaign did not finish (interrupted)")
    go = combine("B", "A", "all devices", [_entry(done, "B", "A")])
    assert go.verdict == GO
    assert _fleet_exit([go], [done]) == 0 and _fleet_exit([go], [done, cut]) == 3


def test_nothing_measured_needs_every_device_to_say_so() -> None:
    """5 where each device's run says it measured nothing (or it never ran); a device whose
    worker died has no analysis but may hold valid cells: owed (3), not nothing."""
    from types import SimpleNamespace

    from abbench.analysis.fleet import DeviceOutcome, _fleet_exit

    empty = SimpleNamespace(decisions=[], exit_status=5)
    nothing = DeviceOutcome("d1", "c", "done", None, empty, note="")  # type: ignore[arg-type]
    unrun = DeviceOutcome("d2", "", "not run", None, None, note="")
    crashed = DeviceOutcome("d3", "c", "failed", None, None, note="WorkerCrashedError")
    assert _fleet_exit([], [nothing]) == 5 and _fleet_exit([], [nothing, unrun]) == 5
    assert _fleet_exit([], [crashed]) == 3 and _fleet_exit([], [nothing, crashed]) == 3
