"""How every command that reads a run ends: one table of exit statuses (README, "Exit
status"), so that the same state gives the same status, and the same `ERROR:` line,
whichever command met it — `campaign`, `calibrate`, `report`, `import` and `fleet`.

A run that measured nothing valid (no cell, or no cell of a decision's arm) ends with
`NoMeasurement`: its report is written and printed first, then one `ERROR:` line names
what could not be measured and the first failed cell's reason, exit status 5.
"""

from __future__ import annotations

from abbench.analysis.campaign import CampaignAnalysis, measured_nothing, unmeasured_arms
from abbench.errors import EXIT_NO_MEASUREMENT, NoMeasurement


def ended(a: CampaignAnalysis | None, rc: int) -> int:
    """`rc`, the run's exit status, once its report is out; nothing measured raises the one
    error that says so."""
    if rc == EXIT_NO_MEASUREMENT and a is not None:
        raise nothing_measured(a)
    return rc


def nothing_measured(a: CampaignAnalysis) -> NoMeasurement:
    """The error after the report of a run that measured nothing a decision could rest on:
    what could not be measured, and the first failed cell's reason (the report has each)."""
    return NoMeasurement(why_nothing(a), tip=f"{a.run / 'report.md'} says why each cell failed")


def why_nothing(a: CampaignAnalysis) -> str:
    """`no cell [of `B`] produced a valid measurement (N failed; cell 2 (B): REASON)`."""
    arms = [] if measured_nothing(a.cells) else unmeasured_arms(a.decisions, a.cells)
    failed = [c for c in a.cells if (not arms or c.name in arms) and not c.ok
              and c.status != "not run"]
    why = ""
    if failed:
        c = failed[0]
        why = f"; cell {c.index + 1} ({c.name}): " + (
            c.error or (c.notes[-1] if c.notes else c.status))
    subject = "no cell of " + ", ".join(f"`{n}`" for n in arms) if arms else "no cell"
    return f"{subject} produced a valid measurement ({len(failed)} failed{why})"
