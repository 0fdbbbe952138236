"""Looking again without raising the false-verdict rate: alpha spending.

A sequential campaign (`[campaign] until = "decided"`) reads its decisions after the planned
order and after every appended round. Each look k spends part of the campaign's two-sided
`ALPHA`: `spent(f)` is a power-family spending function (Kim & DeMets 1987) of the budget
fraction f used so far, and look k tests at `alpha_k = spent(f_k) - spent(f_{k-1})`; the
look after which no round fits the budget spends what is left, `ALPHA - spent(f_{k-1})`.
The looks' alphas sum to at most `ALPHA`, so by the union bound the chance that any look of
an A/A campaign gives GO or NO-GO is at most `ALPHA`, however the looks are correlated and
whatever the number of looks turns out to be. (Exact group-sequential boundaries would
spend the same alpha a little less conservatively, but need the looks' correlation, which
an estimated cell-level variance with few degrees of freedom does not give.) docs/method.md
gives the choice of `RHO` and the measured rates.
"""

from __future__ import annotations

ALPHA = 0.05  # two-sided: a 95% interval for a campaign with one look
RHO = 2.0  # spending exponent: 2 keeps most of the alpha for the later, better-informed looks


def spent(fraction: float, alpha: float = ALPHA, rho: float = RHO) -> float:
    """The alpha spent once `fraction` of the budget is used (0 at 0, `alpha` at 1)."""
    return alpha * min(1.0, max(0.0, fraction)) ** rho


def look_alpha(previous: float, fraction: float, final: bool, alpha: float = ALPHA,
               rho: float = RHO) -> float:
    """The two-sided alpha of a look at budget `fraction`, the one before at `previous`;
    a final look spends the rest. At least 1e-6, so a look is always a valid test."""
    upto = alpha if final else spent(fraction, alpha, rho)
    return max(upto - spent(previous, alpha, rho), 1e-6)
