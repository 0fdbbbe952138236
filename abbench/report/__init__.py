"""Reports: render what `abbench.analysis` decided — report.json, report.md, report.html,
terminal. `model.build` turns an analysis into one report model (sections, tables, prose,
plotted series) that the Markdown, HTML and terminal renderers lay out; report.json is the
analysis' own document.

Imports analysis and records only; never runs anything."""

from __future__ import annotations

from pathlib import Path

from abbench.analysis.campaign import CampaignAnalysis, analyze
from abbench.errors import WriteError
from abbench.fsutil import atomic_write_text
from abbench.report import html, json_report, markdown, model
from abbench.report.terminal import print_report


def write_reports(run: Path) -> tuple[CampaignAnalysis, int]:
    """Analyze a run folder, write report.json, report.md and report.html into it (temp
    file and rename), and return the analysis and the exit status its decisions give (0 all
    GO or none asked, 1 some NO-GO, 3 some INCONCLUSIVE / OWED / UNVERIFIED).

    A file that cannot be written (a full disk) raises `WriteError` naming it; each report
    file is then the old one or none, never half of one."""
    a = analyze(run)
    try:
        report = model.build(a, model.samples_of(run))
        atomic_write_text(run / "report.json", json_report.dumps(a))
        atomic_write_text(run / "report.md", markdown.emit(report))
        atomic_write_text(run / "report.html", html.emit(report))
    except OSError as e:
        raise WriteError.from_os(e, f"retry with: abbench report {run} (the run folder's "
                                    "records are whole)") from None
    return a, a.exit_status


__all__ = ["analyze", "print_report", "write_reports"]
