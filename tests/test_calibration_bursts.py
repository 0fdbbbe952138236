"""False verdicts, coverage and power under the noise real devices have: bursts of load
that span whole cells, and heavy-tailed cell effects (docs/method.md#bursts).

The simulated device of tests/calibration_helper.py, with its load process: from a quiet
cell a burst starts with probability 1/16, 1/8 or 1/4, lasts 1-3 cells and slows every cell
it covers by 20-40%; cell effects Student t with 3 df (or normal); the bursts invisible to
every sensor (the worst case) or seen by the host-load sensor (the foreign-load criterion).
Each design is decided by the product's own analysis — cell designs through
`analysis.campaign.decisions_at`, interleaved ones through `analysis.interleave` — in 1000
campaigns per setting at a cell-to-cell sigma of 5%. The bar, at every setting: GO or NO-GO
in at most 5% of A/A campaigns, and the reported interval holds the true ratio in at least
95% of the campaigns that report one. The power of each design for a true +10% is printed
(`-s`) for docs/method.md's table.
"""

from __future__ import annotations

import math

import pytest
from calibration_helper import DESIGNS, INTERLEAVED, Load, interleaved_rates, rates

CAMPAIGNS = 1000
SIGMA = 0.05
BAR = 0.05
COVERAGE = 0.95
LOADS = (
    Load(0.0, "t3"),
    Load(1 / 16, "t3"),
    Load(1 / 8, "t3"),
    Load(1 / 4, "t3"),
    Load(1 / 4, "normal"),
    Load(1 / 4, "t3", visible=True),
)


def _rates(design: object, effect: float, load: Load, seed: int, campaigns: int
           ) -> dict[str, float]:
    if design in INTERLEAVED:
        return interleaved_rates(design, SIGMA, effect, campaigns, seed, load)  # type: ignore[arg-type]
    return rates(design, SIGMA, effect, campaigns, seed, load=load)  # type: ignore[arg-type]


def _row(name: str, load: Load, r: dict[str, float]) -> str:
    return (f"{load.name:<32} {name:<26} GO {r.get('GO', 0):6.2%} NO-GO {r.get('NO-GO', 0):6.2%}"
            f" covered {r['covered']:7.2%} ({r['cells']:.1f} cells)")


# One load in the default run (bursts of 1 in 4, heavy-tailed: the hardest of the set); the
# others in the slow run.
@pytest.mark.parametrize("load", [
    pytest.param(ld, id=ld.name, marks=() if ld == Load(1 / 4, "t3") else pytest.mark.slow)
    for ld in LOADS])
def test_a_a_under_bursts_rarely_decides_and_its_intervals_cover(load: Load) -> None:
    failures = []
    for k, design in enumerate((*DESIGNS, *INTERLEAVED)):
        r = _rates(design, 0.0, load, 100 + k, CAMPAIGNS)
        print(_row(design.name, load, r))
        false = r.get("GO", 0.0) + r.get("NO-GO", 0.0)
        if false > BAR:
            failures.append(f"{design.name}: {false:.2%} false verdicts")
        if not math.isnan(r["covered"]) and r["covered"] < COVERAGE:
            failures.append(f"{design.name}: its interval held 1 in {r['covered']:.2%}")
    assert not failures, f"{load.name}: {'; '.join(failures)}"


def test_power_for_a_true_10_percent_under_bursts() -> None:
    # Printed for docs/method.md; held only to what the method promises: no NO-GO for a
    # true speed-up beyond the 5% bar, and the intervals still cover.
    load = Load(1 / 4, "t3")
    for k, design in enumerate((*DESIGNS, *INTERLEAVED)):
        r = _rates(design, 0.10, load, 300 + k, CAMPAIGNS)
        print("power, true +10%: " + _row(design.name, load, r))
        assert r.get("NO-GO", 0.0) <= BAR
        assert math.isnan(r["covered"]) or r["covered"] >= COVERAGE
