"""`abbench sentinels [DEVICE]`: each device's noise floor and sentinel speeds over time
(docs/import.md#sentinel-history-abbench-sentinels-device---dir-sentinels---threshold-09).

The campaign runner appends every sentinel run (and the run it repeats) to
`sentinels/DEVICE.jsonl`, one JSON object a line: device, simulated, campaign, run, cell,
name, config_key, t_wall, tokens_per_s, fingerprint, entry; after each campaign it appends
the campaign's repeats (`records.RepeatRecord`, `kind` "repeat"). Per device this prints
the *noise floor* — the cell-to-cell noise the newest campaigns' repeats show, which a
campaign without repeats of its own uses — and its trend, one line per campaign. Per
configuration (named by the keys that set it apart from the device's other configurations)
it prints the history, the device's *cool baseline* for that configuration (the best speed
it ever reached: the least throttled run) and each run's fraction of it, and flags a
campaign whose first sentinel opened below `--threshold` of the baseline: its cells ran on
a device that was already hot.
"""

from __future__ import annotations

import argparse
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from abbench.analysis.noise import HISTORY_MAX_DF, history_floor
from abbench.errors import UsageError
from abbench.records import RepeatRecord, SentinelLine, read_repeats, read_sentinels
from abbench.report.text import describe_configs
from abbench.textsafe import shown


@dataclass(frozen=True)
class HistoryRow:
    run: SentinelLine
    fraction: float  # of the configuration's cool baseline
    opens_campaign: bool  # the campaign's first sentinel of this configuration
    flagged: bool  # opens the campaign below the threshold


def history(runs: list[SentinelLine], threshold: float) -> dict[str, list[HistoryRow]]:
    """Rows per configuration key, oldest first."""
    by_config: dict[str, list[SentinelLine]] = defaultdict(list)
    for r in runs:
        by_config[r.config_key].append(r)
    out = {}
    for key, rs in by_config.items():
        rs.sort(key=lambda r: r.t_wall)
        baseline = max(r.tokens_per_s for r in rs)
        seen: set[str] = set()
        rows = []
        for r in rs:
            opens = r.campaign not in seen
            seen.add(r.campaign)
            frac = r.tokens_per_s / baseline
            rows.append(HistoryRow(r, frac, opens, opens and frac < threshold))
        out[key] = rows
    return out


def _when(t: float) -> str:
    if t <= 0:
        return "time unknown"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def floor_lines(repeats: list[RepeatRecord]) -> list[str]:
    """The device's noise floor and its trend: each campaign's own repeats, newest last."""
    floor = history_floor(repeats, "", 0.0)
    if floor.df < 1:
        return ["  noise floor unknown: no repeats recorded yet (`abbench calibrate` runs an "
                "A/A campaign that records them)"]
    lines = [f"  noise floor ±{math.sqrt(floor.variance):.1%} per cell ({floor.df} df from "
             f"{len(floor.campaigns)} campaign{'s' if len(floor.campaigns) != 1 else ''}, "
             f"the newest up to {HISTORY_MAX_DF} df); per campaign:"]
    runs: dict[str, list[RepeatRecord]] = defaultdict(list)
    for r in repeats:
        runs[r.run].append(r)
    for run, rs in sorted(runs.items(), key=lambda kv: max(r.t_wall for r in kv[1])):
        own = history_floor(rs, "", 0.0, max_df=10**9)
        when = _when(max(r.t_wall for r in rs))
        if own.df < 1:
            lines.append(f"    {when}  {run}  no countable repeat ({len(rs)} not comparable "
                         "or unequal work)")
        else:
            lines.append(f"    {when}  {run}  ±{math.sqrt(own.variance):.1%} "
                         f"({own.repeats} cells, {own.df} df)")
    return lines


def render(device: str, runs: list[SentinelLine], threshold: float,
           repeats: list[RepeatRecord] | None = None) -> list[str]:
    simulated = " (simulated)" if any(r.simulated for r in runs) else ""
    lines = [f"device {device}{simulated}"]
    if repeats is not None:
        lines += floor_lines(repeats)
    rows_by = history(runs, threshold)
    names_of = describe_configs(list(rows_by))
    for key, rows in rows_by.items():
        best = max(rows, key=lambda h: h.run.tokens_per_s).run
        names = ", ".join(sorted({h.run.name for h in rows}))
        lines.append(f"  config {names}: {names_of[key]}")
        lines.append(f"    cool baseline {best.tokens_per_s:.3f} tok/s "
                     f"({best.campaign} {best.cell}, {_when(best.t_wall)})")
        width = max(len(h.run.campaign) for h in rows)
        for h in rows:
            r = h.run
            flag = (f"  << opened at {h.fraction:.0%} of the cool baseline: the device was "
                    "already hot (gate the campaign, or let it cool)") if h.flagged else ""
            lines.append(f"    {_when(r.t_wall)}  {r.campaign:<{width}}  {r.cell:<12} "
                         f"{r.tokens_per_s:8.3f} tok/s  {h.fraction:6.1%}{flag}")
    return lines


HELP = "history of sentinel speeds per device and configuration"
DESCRIPTION = ("Show each device's sentinel speeds over time against its cool baseline, "
               "so a campaign that opened on a hot device is visible.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("device", nargs="?", default=None, metavar="DEVICE",
                   help="one device (default: every device with a history)")
    p.add_argument("--dir", type=Path, default=Path("sentinels"),
                   help="the sentinel history folder (default: sentinels)")
    p.add_argument("--threshold", type=float, default=0.9,
                   help="flag campaigns opening below this fraction of the baseline (0.9)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    folder: Path = args.dir
    if not 0 < args.threshold <= 1:
        raise UsageError(f"--threshold {args.threshold}: expected a fraction in (0, 1]")
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if args.device is not None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", args.device) or "device"
        wanted = [f for f in files if f.stem == name]
        if not wanted:
            known = ", ".join(f.stem for f in files) or "none"
            raise UsageError(f"no sentinel history for `{args.device}` in {folder}/ "
                             f"(devices: {known})")
        files = wanted
    if not files:
        raise UsageError(f"no sentinel history in {folder}/",
                         tip="campaigns with sentinels write one; or point --dir at it")
    out: list[str] = []
    for f in files:
        runs = read_sentinels(f)
        repeats = read_repeats(f)
        if not runs and not repeats:
            out.append(f"device {f.stem}: no sentinel with a speed yet")
            continue
        device = runs[0].device if runs else repeats[0].device
        out.extend(render(device, runs, args.threshold, repeats))
    print("\n".join(map(shown, out)))  # a history holds what other campaigns wrote
    return 0
