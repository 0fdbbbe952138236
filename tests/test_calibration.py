"""The verdicts' false-verdict rate and power, by simulation with known truth
(docs/method.md#measured-false-verdicts-and-power).

A/A campaigns — no true effect, a lognormal cell effect of sigma per cell, AR(1) token noise
(tests/calibration_helper.py) — decided by the product's own analysis: GO or NO-GO in at most
5% of 2000 campaigns at every sigma, for the designs B,C,B, ABBA, ABABAB and a sequential
campaign (`until = "decided"`, ABBA rounds, at most 16 cells). A true 15% effect at sigma 3%
is found (GO) in at least 80% of ABBA x 2 campaigns. P9's cost, sequential over fixed
cells per decided verdict, at the noise its bar was set at and at this VM's
(docs/method.md#what-a-sequential-campaign-can-save-p9). Every rate is printed (`-s`);
docs/method.md quotes them.
"""

from __future__ import annotations

import math

import calibration_helper
import pytest
from calibration_helper import DESIGNS, Campaigns, Design, rates

SIGMAS = (0.0, 0.02, 0.05, 0.10, 0.15)
CAMPAIGNS = 2000
BAR = 0.05
ABBA_X2 = Design("ABBA x 2", ("B", "C", "C", "B", "C", "C", "B"))


def _table(decision: dict | None, designs=DESIGNS, campaigns: int = CAMPAIGNS, seed: int = 0
           ) -> dict[tuple[str, float], float]:
    out = {}
    for k, design in enumerate(designs):
        for j, sigma in enumerate(SIGMAS):
            r = rates(design, sigma, 0.0, campaigns, seed=seed + 1000 * k + j,
                      decision=decision)
            false = r.get("GO", 0.0) + r.get("NO-GO", 0.0)
            out[(design.name, sigma)] = false
            print(f"A/A {design.name:<14} sigma {sigma:4.0%}: GO {r.get('GO', 0):.2%} "
                  f"NO-GO {r.get('NO-GO', 0):.2%} (false {false:.2%}; {r['cells']:.1f} cells)")
    return out


@pytest.mark.parametrize("campaigns", [
    pytest.param(CAMPAIGNS // 4, id="500 campaigns"),
    pytest.param(CAMPAIGNS, id="2000 campaigns", marks=pytest.mark.slow),
])
def test_a_a_campaigns_give_a_verdict_at_most_5_percent_of_the_time(campaigns: int) -> None:
    # The default run draws a quarter of the campaigns (other seeds than the full run's),
    # held to the bar within two binomial standard errors; the slow run holds all 2000 to
    # the bar itself, the figures docs/method.md quotes.
    table = _table(None, campaigns=campaigns, seed=0 if campaigns == CAMPAIGNS else 50_000)
    worst = max(table.items(), key=lambda kv: kv[1])
    slack = 0.0 if campaigns == CAMPAIGNS else 2 * math.sqrt(BAR * (1 - BAR) / campaigns)
    assert worst[1] <= BAR + slack, f"{worst[0]}: {worst[1]:.2%} false verdicts"


def test_a_true_15_percent_at_3_percent_noise_is_found_in_abba_x2() -> None:
    r = rates(ABBA_X2, 0.03, 0.15, CAMPAIGNS, seed=77)
    print(f"power: ABBA x 2, true +15%, sigma 3%: GO {r.get('GO', 0):.2%}, "
          f"INCONCLUSIVE {r.get('INCONCLUSIVE', 0):.2%}, NO-GO {r.get('NO-GO', 0):.2%}")
    assert r.get("GO", 0.0) >= 0.80
    assert r.get("NO-GO", 0.0) == 0.0


@pytest.mark.slow
def test_a_a_rates_at_min_effect_0_and_one_configuration() -> None:
    # The harsher question (GO above 1, not 1.03) is a two-sided test at exactly 5%: a
    # calibrated interval then lands on the bar itself, so its rates are held to 5% within
    # two binomial standard errors of 2000 campaigns. The A/A of one configuration under
    # two names (its repeats pool both arms) is held to the bar itself.
    nominal = _table({"candidate": "C", "baseline": "B", "min_effect": 0.0})
    worst = max(nominal.items(), key=lambda kv: kv[1])
    assert worst[1] <= BAR + 2 * math.sqrt(BAR * (1 - BAR) / CAMPAIGNS), worst
    same = [Design(d.name + " (one config)", d.order, d.max_cells, True) for d in DESIGNS]
    worst = max(_table(None, same).items(), key=lambda kv: kv[1])
    assert worst[1] <= BAR, f"{worst[0]}: {worst[1]:.2%} false verdicts"


# P9 (docs/benches.md): a sequential campaign's cost per decided verdict against the fixed
# ABBA x 3 that bench runs, each campaign starting from its own `abbench calibrate` floor
# (six cells of B), for the bench's true effect (C about 15% slower: NO-GO).
P9_FIXED = Design("ABBA x 3", ("B", "C", "C", "B", "C", "C", "B", "C", "C", "B"))
P9_SEQUENTIAL = DESIGNS[-1]  # ABBA, then ABBA rounds, at most 16 cells
P9_EFFECT = -0.15


def _cells_per_decided(design: Design, sigma: float, campaigns: int = 400,
                       seed: int = 9000) -> tuple[float, float]:
    """Cells run per GO or NO-GO, and the share of campaigns decided."""
    cells = decided = 0
    for i in range(campaigns):
        sim = Campaigns(sigma, P9_EFFECT, seed + i)
        sim.floor = sim.calibrated()
        verdict, n = sim.run(design)
        cells += n
        decided += verdict in ("GO", "NO-GO")
    return cells / max(decided, 1), decided / campaigns


def test_p9_a_quiet_device_decides_at_the_first_look_that_can() -> None:
    """At the noise P9's bar was set at (±2.2% here on 2026-12-01), the sequential
    campaigns stop at 7 cells (7.01 on average). That is their floor: after the planned
    B C C B, no verdict may rest on C's one span (docs/method.md#bursts), so 7/10 of the
    fixed design's cells is the least P9 can read, and reads."""
    fixed, fixed_share = _cells_per_decided(P9_FIXED, 0.022)
    seq, seq_share = _cells_per_decided(P9_SEQUENTIAL, 0.022)
    print(f"P9 sim, sigma 2.2%: fixed {fixed:.2f} cells/decided ({fixed_share:.0%}), "
          f"sequential {seq:.2f} ({seq_share:.0%}): {seq / fixed:.3f}")
    assert fixed_share == seq_share == 1.0
    assert seq / fixed <= 0.71


def test_p9_at_8_percent_noise_no_valid_rule_reaches_its_bar() -> None:
    """At this VM's ±8.4% (P9's runs on 2026-12-07), even testing every look at the full
    5% — a rule that spends more than any valid one — costs more than 0.7 of the fixed
    design per decided verdict; the product's boundaries cost no more than the fixed
    design itself."""
    fixed, _ = _cells_per_decided(P9_FIXED, 0.084)
    seq, share = _cells_per_decided(P9_SEQUENTIAL, 0.084)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibration_helper, "look_alpha", lambda fractions, final: 0.05)
        loose, _ = _cells_per_decided(P9_SEQUENTIAL, 0.084)
    print(f"P9 sim, sigma 8.4%: sequential / fixed {seq / fixed:.3f} (decided {share:.0%}); "
          f"every look at 5%: {loose / fixed:.3f}")
    assert loose / fixed > 0.7
    assert seq / fixed <= 1.0
