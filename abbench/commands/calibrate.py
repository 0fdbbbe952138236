"""`abbench calibrate`: an A/A campaign whose repeats record the device's cell-to-cell noise
floor in its history, on the quickstart's B or under a campaign file's conditions (`--like`):
docs/method.md#the-cell-is-the-unit-of-evidence."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from abbench.analysis.noise import history_floor
from abbench.campaign.runner import RunOptions
from abbench.campaign.schema import CampaignSpec, load_campaign
from abbench.commands.campaign import finish, run_new
from abbench.commands.outcome import ended
from abbench.errors import EXIT_UNDECIDED, AbbenchError, UsageError
from abbench.records import read_repeats
from abbench.records.plan import CELLS
from abbench.records.toml import dump_table

# The quickstart's B (cells/quickstart.toml): the configuration a device's noise floor is
# measured on unless another model is given.
CALIBRATION_CELL = {"drop_cold_experts": 0.75, "dense": "pinned"}
CALIBRATION_WORKLOAD = {"tokens": 64, "cache_mib": 256, "io_lanes": 4, "overlap": True}


def calibration_toml(device: str, cells: int, model: str, spacing_s: float,
                     probe_tol: float, warmup: int) -> str:
    """An A/A campaign: `cells` runs of the quickstart's B on `device`."""
    lines = ["# abbench calibrate: an A/A campaign whose repeats measure the device's",
             "# cell-to-cell noise (docs/method.md). Every cell is the same configuration.", ""]
    lines += dump_table(["campaign"], {"name": "calibrate", "spacing_s": spacing_s,
                                       "order": ["B"] * cells, "warmup_tokens": warmup})
    lines += ["", *dump_table(["device"], {"transport": device})]
    lines += ["", *dump_table(["match"], {"probe_tol": probe_tol})]
    lines += ["", *dump_table(["workload"], {"model": model, **CALIBRATION_WORKLOAD})]
    lines += ["", *dump_table(["cells", "B"], CALIBRATION_CELL), ""]
    return "\n".join(lines)


def calibration_like(path: Path, cells: int, device: str | None) -> CampaignSpec:
    """A campaign file's conditions, A/A: its baseline cell `cells` times under its
    device, gate, match and workload, no decisions, one cell at a time (the floor is of
    cells: an interleaved campaign reads it as the noise of a difference of two)."""
    spec = load_campaign(path)
    name = spec.baseline
    c = spec.campaign
    table = dataclasses.replace(c, name=f"calibrate-{c.name}"[:100], order=(name,) * cells,
                                sentinel_every=None, repeat=1, until=None, max_cells=None,
                                max_minutes=None, interleave=CELLS, slice_tokens=None)
    try:
        return dataclasses.replace(spec if device is None else spec.on(device),
                                   campaign=table, cells={name: spec.cells[name]},
                                   decisions=(), sweeps=())
    except AbbenchError as e:
        raise UsageError(f"--like {path}: {e.message}", e.tip) from None


HELP = "measure this device's cell-to-cell noise (an A/A campaign)"
DESCRIPTION = ("Run an A/A campaign — the same configuration N times — on a device, "
               "record its repeats in the device history (sentinels/DEVICE.jsonl) and print the "
               "device's noise floor. Later campaigns on the device use the floor as their "
               "cell-to-cell noise when they have no repeats of their own.")


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    """0: a noise floor was recorded; 3: no repeat could be counted (the report says why);
    5: no cell was a valid measurement (one ERROR line); 2: the campaign could not run;
    4: interrupted."""
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
    rc, analysis = finish(folder, "rich" if not a.no_live else "plain")
    ended(analysis, rc)  # every cell failed: one ERROR, exit 5, as a campaign's
    if analysis is None or analysis.floor is None:
        return EXIT_UNDECIDED
    own = analysis.own_noise
    history = Path(analysis.floor.history)
    floor = history_floor(read_repeats(history), str(history), time.time())
    if not own.known:
        print(f"calibrate: no repeat could be counted ({len(analysis.records)} cells): the "
              "report's pairs and drift say why (failed cells, unequal work, or entry states "
              "that differ)", file=sys.stderr)
        return EXIT_UNDECIDED
    print(f"calibrate: this campaign's cell-to-cell noise ±{own.sd:.1%} ({own.repeats} cells,"
          f" {own.df} df); the device's noise floor is now ±{math.sqrt(floor.variance):.1%} "
          f"({floor.df} df from {len(floor.campaigns)} campaign"
          f"{'s' if len(floor.campaigns) != 1 else ''}) in {history}")
    return 0
