"""Units every replay answer shares: the MiB the budgets are stated in, and percentages
that are undefined (None) on an empty denominator."""

from __future__ import annotations

MIB = 1 << 20


def percent(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole else None
