"""`abbench campaign FILE [--out DIR] [--dry-run] [--resume RUN]`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from abbench.analysis.campaign import CampaignAnalysis, analyze
from abbench.analysis.noise import history_floor, repeat_records
from abbench.analysis.sequential import look_alpha
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
from abbench.campaign.sequential import LookOutcome
from abbench.errors import AbbenchError, UsageError
from abbench.fsutil import WriteError, atomic_write_text
from abbench.records import (
    NOISE_FLOOR_FILE,
    Look,
    NoiseFloor,
    Plan,
    RecordError,
    append_repeats,
    history_file,
    read_journal,
    read_repeats,
)
from abbench.report import print_report, write_reports
from abbench.report.text import interval_text
from abbench.sensors import Device


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


def snapshot_floor(sentinels: Path) -> Callable[[Path, Device], None]:
    """Write the device's noise floor, as its history gives it now, into a new run folder
    (`noise-floor.json`): the run's reports are re-rendered from it, whatever the history
    holds later, and the run's own repeats are never counted twice."""

    def prepare(folder: Path, device: Device) -> None:
        path = history_file(sentinels, device.name)
        try:
            floor = history_floor(read_repeats(path), str(path), time.time())
        except RecordError as e:
            print(f"WARNING: the device history cannot be read ({e.message}): no noise "
                  "floor from it", file=sys.stderr)
            floor = NoiseFloor(history=str(path), t_wall=time.time())
        floor = dataclasses.replace(floor, device=device.name, simulated=device.simulated)
        atomic_write_text(folder / NOISE_FLOOR_FILE, json.dumps(floor.to_json()) + "\n")

    return prepare


def take_look(folder: Path, plan: Plan, fraction: float, final: bool) -> LookOutcome:
    """A sequential campaign's look: the decisions on the cells so far, at the alpha this
    look spends (analysis.sequential), and the ones still open."""
    previous = plan.looks[-1].fraction if plan.looks else 0.0
    look = Look(len(plan.cells), fraction, look_alpha(previous, fraction, final), final)
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
        print(f"WARNING: the run's repeats could not be added to {where} ({e})",
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
    print(f"WARNING: the report could not be written ({error.message}); retry with: {retry}",
          file=sys.stderr)
    return EXIT_INTERRUPTED


def cmd_campaign(a: argparse.Namespace) -> int:
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
        try:
            resume(folder, opts, spec.device.sample_hz, gate_spec(spec), spec.device.root)
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
    return finish(folder, "rich" if a.no_live is False else "plain")[0]


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


# -- abbench calibrate -------------------------------------------------------------------

# The quickstart's B (cells/quickstart.toml): the configuration a device's noise floor is
# measured on unless another model is given.
CALIBRATION_CELL = {"drop_cold_experts": 0.75, "dense": "pinned"}
CALIBRATION_WORKLOAD = {"tokens": 64, "cache_mib": 256, "io_lanes": 4, "overlap": True}


def calibration_toml(device: str, cells: int, model: str, spacing_s: float,
                     probe_tol: float, warmup: int) -> str:
    """An A/A campaign: `cells` runs of the quickstart's B on `device`."""
    from abbench.campaign._toml import dump_table

    lines = ["# abbench calibrate: an A/A campaign whose repeats measure the device's",
             "# cell-to-cell noise (DESIGN 7). Every cell is the same configuration.", ""]
    lines += dump_table(["campaign"], {"name": "calibrate", "spacing_s": spacing_s,
                                       "order": ["B"] * cells, "warmup_tokens": warmup})
    lines += ["", *dump_table(["device"], {"transport": device})]
    lines += ["", *dump_table(["match"], {"probe_tol": probe_tol})]
    lines += ["", *dump_table(["workload"], {"model": model, **CALIBRATION_WORKLOAD})]
    lines += ["", *dump_table(["cells", "B"], CALIBRATION_CELL), ""]
    return "\n".join(lines)


def calibration_like(path: Path, cells: int, device: str | None) -> CampaignSpec:
    """A campaign file's conditions, A/A: its baseline cell `cells` times under its
    device, gate, match and workload, no decisions."""
    spec = load_campaign(path)
    name = spec.baseline
    c = spec.campaign
    table = dataclasses.replace(c, name=f"calibrate-{c.name}"[:100], order=(name,) * cells,
                                sentinel_every=None, repeat=1, until=None, max_cells=None,
                                max_minutes=None)
    devices = spec.device if device is None else dataclasses.replace(spec.device,
                                                                     transport=device)
    try:
        return dataclasses.replace(spec, campaign=table, device=devices,
                                   cells={name: spec.cells[name]}, decisions=(), sweeps=())
    except AbbenchError as e:
        raise UsageError(f"--like {path}: {e.message}", e.tip) from None


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "calibrate", help="measure this device's cell-to-cell noise (an A/A campaign)",
        description="Run an A/A campaign — the same configuration N times — on a device, "
        "record its repeats in the device history (sentinels/DEVICE.jsonl) and print the "
        "device's noise floor. Later campaigns on the device use the floor as their "
        "cell-to-cell noise when they have no repeats of their own.")
    p.add_argument("--like", metavar="FILE",
                   help="calibrate under a campaign file's conditions: its [device], [gate], "
                   "[match] and [workload], and its baseline cell (the first decision's, "
                   "else the first cell) as the configuration repeated")
    p.add_argument("--device", default=None, metavar="TRANSPORT",
                   help="local (the default), adb:SERIAL, ssh:HOST or sim:PROFILE; with "
                   "--like, instead of the file's")
    p.add_argument("--cells", type=int, default=6, metavar="N",
                   help="cells to run, at least 2 (default 6: 5 degrees of freedom)")
    p.add_argument("--model", default="synthetic:default", metavar="MODEL",
                   help="the model of the cells (default synthetic:default, the "
                   "quickstart's); a .gguf path or synthetic:PRESET[@SEED]")
    p.add_argument("--spacing", type=float, default=10.0, metavar="S",
                   help="seconds between cells (default 10, the quickstart's)")
    p.add_argument("--probe-tol", type=float, default=0.03, metavar="F",
                   help="[match] probe_tol: repeats whose speed probes differ by more are "
                   "not counted (default 0.03)")
    p.add_argument("--warmup", type=int, default=8, metavar="N",
                   help="warm-up tokens per cell (default 8, the quickstart's)")
    p.add_argument("--out", default="reports", metavar="DIR",
                   help="where the run folder is created (default: reports/)")
    p.add_argument("--sentinels", default="sentinels", metavar="DIR",
                   help="the device history folder (default: sentinels/)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--no-live", action="store_true",
                   help="plain progress lines instead of the live view")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(a: argparse.Namespace) -> int:
    """0: a noise floor was recorded; 3: no repeat could be counted (the report says why);
    2: the campaign could not run; 4: interrupted."""
    import os
    import tempfile

    if not 2 <= a.cells <= 1000:
        raise UsageError(f"--cells {a.cells}: expected 2 .. 1000 (repeats need two cells)")
    opts = RunOptions(out_root=Path(a.out), sentinels_dir=Path(a.sentinels),
                      live=not a.no_live)
    if a.like:
        folder = run_new(calibration_like(Path(a.like), a.cells, a.device), opts, a.dry_run)
    else:
        model = a.model
        if not model.startswith("synthetic:"):
            model = os.path.abspath(os.path.expanduser(model))
        text = calibration_toml(a.device or "local", a.cells, model, a.spacing, a.probe_tol,
                                a.warmup)
        with tempfile.TemporaryDirectory(prefix="abbench-calibrate-") as tmp:
            path = Path(tmp) / "calibrate.toml"
            path.write_text(text, encoding="utf-8")
            try:
                spec = load_campaign(path)
            except AbbenchError as e:  # a flag the campaign rejects: say it of the flag
                raise UsageError(e.message.replace(str(path), "abbench calibrate"),
                                 e.tip) from None
            folder = run_new(spec, opts, a.dry_run)
    if folder is None:
        return 0
    _, analysis = finish(folder, "rich" if not a.no_live else "plain")
    if analysis is None or analysis.floor is None:
        return 3
    own = analysis.own_noise
    history = Path(analysis.floor.history)
    floor = history_floor(read_repeats(history), str(history), time.time())
    if not own.known:
        print(f"calibrate: no repeat could be counted ({len(analysis.records)} cells): the "
              "report's pairs and drift say why (failed cells, unequal work, or entry states "
              "that differ)", file=sys.stderr)
        return 3
    print(f"calibrate: this campaign's cell-to-cell noise ±{own.sd:.1%} ({own.repeats} cells,"
          f" {own.df} df); the device's noise floor is now ±{math.sqrt(floor.variance):.1%} "
          f"({floor.df} df from {len(floor.campaigns)} campaign"
          f"{'s' if len(floor.campaigns) != 1 else ''}) in {history}")
    return 0
