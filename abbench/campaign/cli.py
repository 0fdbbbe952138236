"""`abbench campaign FILE [--out DIR] [--dry-run] [--resume RUN]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from abbench.analysis.campaign import analyze
from abbench.campaign.gate import GateSpec
from abbench.campaign.plan import describe_plan, plan_campaign
from abbench.campaign.runner import (
    EXIT_INTERRUPTED,
    Interrupted,
    RunOptions,
    resume,
    start,
)
from abbench.campaign.schema import CampaignSpec, load_campaign, resolved_toml
from abbench.errors import AbbenchError, UsageError
from abbench.fsutil import WriteError
from abbench.records import read_journal
from abbench.report import print_report, write_reports


def add_campaign_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "campaign", help="run a campaign of cells (cells.toml)",
        description="Validate and plan a campaign, then run its cells in child processes "
        "with fixed spacing and, when asked, a thermal gate, sampling the device all the "
        "while. Leaves a run folder (plan, journal, samples, per-cell output).",
    )
    p.add_argument("file", nargs="?", help="the campaign file (cells.toml)")
    p.add_argument("--out", default="reports", metavar="DIR",
                   help="where run folders are created (default: reports/)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the plan, run nothing")
    p.add_argument("--resume", metavar="RUN",
                   help="continue an interrupted campaign: run only the cells its journal lacks")
    p.add_argument("--sentinels", default="sentinels", metavar="DIR",
                   help="sentinel history folder (default: sentinels/)")
    p.add_argument("--no-live", action="store_true",
                   help="plain progress lines instead of the live view")
    p.set_defaults(func=cmd_campaign)


def gate_spec(spec: CampaignSpec) -> GateSpec | None:
    return spec.gate


def _write_reports(folder: Path, interrupted: bool) -> int:
    """Write report.json/md/html (marked incomplete after Ctrl-C); the exit status is the
    decisions'. A report that cannot be written (a full disk) is an error naming the file,
    exit status 2, except after Ctrl-C, where it warns and the exit status stays
    "interrupted"; either way the journal is whole and `abbench report RUN` retries."""
    retry = f"abbench report {folder}"
    try:
        return write_reports(folder)[1]
    except WriteError as e:
        error = e
    except AbbenchError as e:
        error = AbbenchError(f"the report could not be written: {e.message}", e.tip)
    except Exception as e:  # noqa: BLE001 — a bug in the analysis must not hide the cells
        error = AbbenchError(f"the report could not be written ({type(e).__name__}: {e})",
                             f"retry with: {retry}")
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while writing the report; the journal in {folder} "
                          "is whole", tip=f"write it with: {retry}", folder=folder) from None
    if not interrupted:
        raise error
    print(f"WARNING: the report could not be written ({error.message}); retry with: {retry}",
          file=sys.stderr)
    return EXIT_INTERRUPTED


def cmd_campaign(a: argparse.Namespace) -> int:
    opts = RunOptions(out_root=Path(a.out), sentinels_dir=Path(a.sentinels),
                      live=not a.no_live)
    if a.resume:
        folder = Path(a.resume)
        if not (folder / "plan.json").is_file():
            started = (folder / "campaign.toml").is_file()
            raise UsageError(f"{folder}: not a run folder (no plan.json)",
                             tip="the campaign stopped before its plan was written: nothing "
                             "ran; start it again" if started else None)
        spec = load_campaign(folder / "campaign.toml")
        done = len(read_journal(folder))
        print(f"resuming {folder}: {done} cells already in the journal", file=sys.stderr)
        try:
            resume(folder, opts, spec.device.sample_hz, gate_spec(spec), spec.device.root)
        except Interrupted:
            _write_reports(folder, interrupted=True)
            raise
    else:
        if not a.file:
            raise UsageError("give a campaign file, or --resume RUN",
                             tip="abbench campaign cells/quickstart.toml")
        spec = load_campaign(Path(a.file))
        plan = plan_campaign(spec)
        for line in describe_plan(plan):
            print(line)
        if a.dry_run:
            return 0
        try:
            folder = start(plan, resolved_toml(spec), opts, spec.device.sample_hz,
                           gate_spec(spec), spec.device.root)[0]
        except Interrupted as e:
            if e.folder is not None:
                _write_reports(e.folder, interrupted=True)
            raise
    rc = _write_reports(folder, interrupted=False)
    records = read_journal(folder)
    ok = sum(r.status == "ok" for r in records)
    print(f"run folder: {folder}")
    print(f"cells: {ok} ok, {len(records) - ok} failed, of {len(records)} recorded")
    if (folder / "report.json").is_file():
        print_report(analyze(folder), "rich" if a.no_live is False else "plain")
        print(f"report: {folder / 'report.html'}, {folder / 'report.md'}, "
              f"{folder / 'report.json'}")
    return rc
