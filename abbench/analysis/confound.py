"""A decision's confounds in words: what else sets its two arms apart than the keys it
names (`DecisionSpec.confounds`, which `abbench import` records), with each side's value
as the plan holds it, and what would settle it (docs/import.md#confounds). `decide`
caps the verdict."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from abbench.analysis.cells import CellStats
from abbench.records import DecisionSpec


def describe(spec: DecisionSpec, cells: Sequence[CellStats], has_ratio: bool
             ) -> tuple[str, str]:
    """(what else differs, what would settle it) for a decision with confounds."""
    sides = [[c for c in cells if c.name == n] for n in (spec.candidate, spec.baseline)]
    apart = ", ".join(f"{k} ({_value(sides[0], k)} vs {_value(sides[1], k)})"
                      for k in spec.confounds)
    measures = "the ratio measures" if has_ratio else "a ratio would measure"
    if set(spec.confounds) >= _keys_apart(spec, sides[0], sides[1]):  # it named no key
        confound = (f"the arms differ in more than one key — {apart}: {measures} those "
                    "changes together, not any one of them")
    else:
        confound = (f"the arms also differ in {apart}: {measures} "
                    f"{'that change' if len(spec.confounds) == 1 else 'those changes'} as "
                    "well as the one the decision asks about")
    settle = (f"runs of the two configurations with {', '.join(spec.confounds)} alike (or a "
              "decision that names every key that differs: `--decision key=value,...`)")
    return confound, settle


def _config(cells: Sequence[CellStats]) -> dict[str, Any] | None:
    """The configuration these cells ran, as the plan records it (None: not known)."""
    cfg = next((json.loads(c.config_key) for c in cells if c.config_key), None)
    return cfg if isinstance(cfg, dict) else None


def _value(cells: Sequence[CellStats], key: str) -> str:
    cfg = _config(cells)
    if cfg is None:
        return "?"
    return str(cfg[key]) if key in cfg else "not recorded"


def _keys_apart(spec: DecisionSpec, cand: Sequence[CellStats], base: Sequence[CellStats]
                ) -> set[str]:
    """The keys the two arms' configurations differ in, but one that names each arm (an
    import's partial configuration is its own arm by its run's name)."""
    a, b = _config(cand) or {}, _config(base) or {}
    return {k for k in set(a) | set(b) if (k in a, a.get(k)) != (k in b, b.get(k))
            and (a.get(k), b.get(k)) != (spec.candidate, spec.baseline)}


__all__ = ["describe"]
