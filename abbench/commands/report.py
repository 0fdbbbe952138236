"""`abbench report RUN [--json] [--style rich|plain]`: re-render a run folder's report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from abbench.commands.outcome import ended
from abbench.report import json_report, write_reports
from abbench.report.terminal import print_report

HELP = "re-render a run folder's report (runs nothing)"
DESCRIPTION = ("Analyze a run folder (plan, journal, samples, per-cell output), write "
               "report.json, report.md and report.html into it and print the report. Exit status "
               "(README, Exit status): 0 all decisions GO (or none asked), 1 some NO-GO, 3 some "
               "INCONCLUSIVE, OWED or UNVERIFIED, 5 no valid measurement (one ERROR line), 2 not a "
               "readable run folder.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run folder (reports/NAME-YYYYmmdd-HHMMSS)")
    p.add_argument("--json", action="store_true", help="print report.json to stdout instead")
    p.add_argument("--style", choices=("rich", "plain"), default="rich",
                   help="terminal output style (default: rich)")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    analysis, rc = write_reports(Path(a.run))
    if a.json:
        sys.stdout.write(json_report.dumps(analysis))
    else:
        print_report(analysis, a.style)
    return ended(analysis, rc)
