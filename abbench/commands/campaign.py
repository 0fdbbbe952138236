"""`abbench campaign FILE [--out DIR] [--dry-run] [--resume RUN]`: the one place that
composes a campaign's run, its analysis (each look of a sequential campaign, the device
history's noise floor and repeats) and its report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from abbench.analysis.campaign import CampaignAnalysis, analyze
from abbench.analysis.noise import history_floor, repeat_records
from abbench.analysis.sequential import look_alpha
from abbench.campaign.gate import GateSpec
from abbench.campaign.plan import describe_plan, plan_campaign
from abbench.campaign.runner import RunOptions, resume, start
from abbench.campaign.schema import CampaignSpec, load_campaign, resolved_toml
from abbench.campaign.sequential import LookOutcome
from abbench.commands.outcome import ended
from abbench.errors import (
    EXIT_INTERRUPTED,
    AbbenchError,
    Interrupted,
    RecordError,
    UsageError,
    WriteError,
)
from abbench.fsutil import atomic_write_text, check_own_file
from abbench.records import (
    NOISE_FLOOR_FILE,
    Look,
    NoiseFloor,
    Plan,
    append_repeats,
    history_file,
    read_journal,
    read_repeats,
)
from abbench.report import print_report, write_reports
from abbench.report.text import interval_text
from abbench.sensors import Device
from abbench.textsafe import shown

HELP = "run a campaign of cells (cells.toml)"
DESCRIPTION = ("Validate and plan a campaign, then run its cells in child processes "
               "with fixed spacing and, when asked, a thermal gate, sampling the device all the "
               "while. Leaves a run folder (plan, journal, samples, per-cell output).")


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.set_defaults(func=run)


def gate_spec(spec: CampaignSpec) -> GateSpec | None:
    return spec.gate


def snapshot_floor(sentinels: Path) -> Callable[[Path, Device], None]:
    """Write the device's noise floor, as its history gives it now, into a new run folder
    (`noise-floor.json`): the run's reports are re-rendered from it, whatever the history
    holds later, and the run's own repeats are never counted twice."""

    def prepare(folder: Path, device: Device) -> None:
        path = history_file(sentinels, device.name)
        check_own_file(path)  # a link or a device there is refused before the first cell
        try:
            floor = history_floor(read_repeats(path), str(path), time.time())
        except RecordError as e:
            print(f"WARNING: the device history cannot be read ({shown(e.message)}): no noise "
                  "floor from it", file=sys.stderr)
            floor = NoiseFloor(history=str(path), t_wall=time.time())
        floor = dataclasses.replace(floor, device=device.name, simulated=device.simulated)
        atomic_write_text(folder / NOISE_FLOOR_FILE, json.dumps(floor.to_json()) + "\n")

    return prepare


def take_look(folder: Path, plan: Plan, fraction: float, final: bool) -> LookOutcome:
    """A sequential campaign's look: the decisions on the cells so far, at the alpha of
    this look's boundary (analysis.sequential), and the ones still open."""
    fractions = [*(lk.fraction for lk in plan.looks), fraction]
    look = Look(len(plan.cells), fraction, look_alpha(fractions, final), final)
    a = analyze(folder, dataclasses.replace(plan, looks=plan.looks + (look,)))
    lines = [f"look {len(plan.looks) + 1} after {look.cells} cells (alpha {look.alpha:.4f}"
             f"{', the last the budget allows' if final else ''}; cell-to-cell noise "
             + (f"±{a.noise.sd:.1%}, {a.noise.df} df" if a.noise.known else "unknown") + ")"]
    for d in a.decisions:
        lines.append(f"  {d.candidate} vs {d.baseline}: {d.verdict}, "
                     f"{interval_text(d.ratio)}")
    return LookOutcome(look, tuple((d.candidate, d.baseline) for d in a.decisions
                                   if not d.decided), tuple(lines))


def record_repeats(folder: Path, a: CampaignAnalysis | None = None) -> int:
    """Append the run's repeats to the device history its noise-floor snapshot names
    (none without a snapshot); a history that cannot be written is a warning: the run
    folder has everything."""
    floor = a.floor if a is not None else None
    try:
        a = a or analyze(folder)
        floor = a.floor
        if floor is None or not floor.history:
            return 0
        by = {c.index: c for c in a.cells}
        groups = [[by[i] for i in g] for g in a.groups]
        starts = {r.index: r.t_start_wall for r in a.records}
        records = repeat_records(a.cells, a.matches, groups, device=floor.device,
                                 run=folder.name, campaign=a.plan.campaign,
                                 simulated=floor.simulated, t_start=starts)
        return append_repeats(Path(floor.history), records)
    except (OSError, AbbenchError) as e:
        where = floor.history if floor is not None else "the device history"
        print(f"WARNING: the run's repeats could not be added to {shown(where)} "
              f"({shown(e)})",
              file=sys.stderr)
        return 0


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
    print(f"WARNING: the report could not be written ({shown(error.message)}); retry with: "
          f"{shown(retry)}",
          file=sys.stderr)
    return EXIT_INTERRUPTED


def run(a: argparse.Namespace) -> int:
    opts = RunOptions(out_root=Path(a.out), sentinels_dir=Path(a.sentinels),
                      live=not a.no_live, look=take_look)
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
        # killed between its plan and its noise-floor snapshot: taken now, as the first
        # cell had not run (else the run would have no floor and add nothing to the history)
        snapshot = (None if (folder / NOISE_FLOOR_FILE).is_file()
                    else snapshot_floor(opts.sentinels_dir))
        try:
            resume(folder, opts, spec.device.sample_hz, gate_spec(spec), spec.device.root,
                   snapshot)
        except Interrupted:
            _write_reports(folder, interrupted=True)
            record_repeats(folder)
            raise
    else:
        if not a.file:
            raise UsageError("give a campaign file, or --resume RUN",
                             tip="abbench campaign cells/quickstart.toml")
        spec = load_campaign(Path(a.file))
        folder = run_new(spec, opts, a.dry_run)
        if folder is None:
            return 0
    rc, analysis = finish(folder, "rich" if a.no_live is False else "plain")
    return ended(analysis, rc)


def run_new(spec: CampaignSpec, opts: RunOptions, dry_run: bool = False) -> Path | None:
    """Plan and print a campaign, then run it (None for a dry run); after Ctrl-C the
    partial report is written and the run's repeats recorded before `Interrupted` goes on."""
    plan = plan_campaign(spec)
    for line in describe_plan(plan):
        print(line)
    if dry_run:
        return None
    try:
        return start(plan, resolved_toml(spec), opts, spec.device.sample_hz, gate_spec(spec),
                     spec.device.root, prepare=snapshot_floor(opts.sentinels_dir))[0]
    except Interrupted as e:
        if e.folder is not None:
            _write_reports(e.folder, interrupted=True)
            record_repeats(e.folder)
        raise


def finish(folder: Path, style: str) -> tuple[int, CampaignAnalysis | None]:
    """Write the reports, record the repeats in the device history, print the report;
    the decisions' exit status and the analysis (None when no report could be read)."""
    rc = _write_reports(folder, interrupted=False)
    records = read_journal(folder)
    ok = sum(r.status == "ok" for r in records)
    print(f"run folder: {folder}")
    print(f"cells: {ok} ok, {len(records) - ok} failed, of {len(records)} recorded")
    if not (folder / "report.json").is_file():
        return rc, None
    a = analyze(folder)
    record_repeats(folder, a)
    print_report(a, style)
    print(f"report: {folder / 'report.html'}, {folder / 'report.md'}, "
          f"{folder / 'report.json'}")
    return rc, a
