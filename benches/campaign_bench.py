"""What the campaign benches (P9, P13) share: their first flags, the campaign file they run,
the noise floor every campaign starts from, one campaign run and read back, the designs
taken in turn, and the true effect as all their cells measure it. Each bench keeps its own
designs, defaults and summary lines."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CAMPAIGN = """\
[campaign]
name = "{name}"
spacing_s = 10
order = "abba"
warmup_tokens = 16
{extra}

[device]
transport = "sim:{device}"
sample_hz = 4

[gate]                    # {gate_note}
battery_temp_max_c = {battery_max_c}
cpu_temp_max_c = {cpu_max_c}
caps_at_max = true
poll_s = 5
timeout_s = 900

[match]
probe_tol = 0.08          # this shared VM's probe moves several % with nothing throttled

[workload]
model = "{model}"
tokens = {tokens}
cache_mib = 64
io_lanes = 4
overlap = true
threads = 1

[cells.B]
{baseline}

[cells.C]
base = "B"
{candidate}

[[decision]]
candidate = "C"
baseline = "B"
min_effect = 0.03
"""


@dataclass(frozen=True)
class Cells:
    """What every campaign of one bench holds fixed: cells B and C (C differs by
    `candidate`), their workload, and the thermal gate each cell starts behind."""

    model: str
    tokens: int
    baseline: str  # B's engine key, one TOML line
    candidate: str  # the TOML line that sets C apart from B
    battery_max_c: float
    cpu_max_c: float
    gate_note: str  # the comment beside [gate]: whose gate this is

    def text(self, name: str, extra: str, device: str) -> str:
        """The campaign file `name` on `sim:<device>`, with `extra` lines in [campaign]."""
        return CAMPAIGN.format(name=name, extra=extra, device=device,
                               gate_note=self.gate_note, battery_max_c=self.battery_max_c,
                               cpu_max_c=self.cpu_max_c, model=self.model,
                               tokens=self.tokens, baseline=self.baseline,
                               candidate=self.candidate)


@dataclass(frozen=True)
class Design:
    """One side of a bench: its printed name, its campaigns' tag prefix, and the lines it
    adds to [campaign]."""

    name: str
    tag: str
    extra: str


@dataclass(frozen=True)
class Outcome:
    """One campaign as the benches print it: its first decision and what it cost."""

    design: str  # its design's name
    tag: str
    verdict: str
    ratio: float | None  # C over B, the decision's estimate (None: no estimate)
    interval: tuple[float, float] | None  # the estimate's interval (None: none given)
    cells: int  # cells the campaign ran
    minutes: float  # device minutes (see `minutes`)
    effect: float | None  # C over B in mean log tokens/s of its cells (None: an arm missing)

    def line(self, width: int) -> str:
        """Its printed line, the tag padded to `width`."""
        ratio = math.nan if self.ratio is None else self.ratio
        ci = f"{self.interval[0]:.3f} .. {self.interval[1]:.3f}" if self.interval else "-"
        return (f"{self.tag:{width}} {self.verdict:<12} ratio {ratio:.3f} ({ci}) "
                f"{self.cells:2d} cells {self.minutes:5.2f} min")


def design_flags(ap: argparse.ArgumentParser, max_cells: int, budget: str,
                 candidate: str) -> None:
    """The flags every campaign bench takes first, with its own defaults: campaigns of each
    design, the cell budget (`budget` says whose), and the line that sets C apart."""
    ap.add_argument("--campaigns", type=int, default=3, help="of each design (default 3)")
    ap.add_argument("--max-cells", type=int, default=max_cells,
                    help=f"{budget} (default {max_cells})")
    ap.add_argument("--candidate", default=candidate,
                    help=f"the TOML line that sets C apart from B (default {candidate})")


def abbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *args], capture_output=True,
                          text=True, cwd=ROOT)


def minutes(run: Path) -> float:
    """Device minutes: the first cell's gate wait to the last cell's end (an interleaved
    pair's gate wait is recorded on its first cell)."""
    lines = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines() if x]
    start = min(r["t_start_wall"] - ((r.get("gate") or {}).get("waited_s") or 0.0)
                for r in lines)
    return (max(r["t_end_wall"] for r in lines) - start) / 60.0


def log_effect(report: dict) -> float | None:
    """C over B in log tokens/s, from the campaign's cells (None without both arms)."""
    arm = {n: [math.log(c["tokens_per_s"]["estimate"]) for c in report["cells"]
               if c["name"] == n and c["tokens_per_s"]] for n in ("B", "C")}
    if not (arm["B"] and arm["C"]):
        return None
    return sum(arm["C"]) / len(arm["C"]) - sum(arm["B"]) / len(arm["B"])


def calibrate(work: Path, text: str) -> Path:
    """The noise floor every campaign starts from a copy of: `abbench calibrate --like`
    the campaign file `text`, six cells of B under its gate. Prints its line (or its exit)
    and returns the history folder."""
    floor = work / "floor"
    base = work / "base.toml"
    base.write_text(text)
    p = abbench("calibrate", "--like", str(base), "--cells", "6", "--out",
                str(work / "calibrate"), "--sentinels", str(floor), "--no-live")
    line = [x for x in p.stdout.splitlines() if x.startswith("calibrate:")]
    print(line[0] if line else f"calibrate: exit {p.returncode}\n{p.stderr[-2000:]}")
    return floor


def run_campaign(work: Path, design: str, tag: str, text: str,
                 floor: Path) -> Outcome | None:
    """The campaign file `text` run from a copy of the history `floor` (so no campaign
    learns from another); None when it failed (its exit printed)."""
    cells = work / f"{tag}.toml"
    cells.write_text(text)
    history = work / f"s-{tag}"
    shutil.copytree(floor, history)
    p = abbench("campaign", str(cells), "--out", str(work / tag), "--sentinels",
                str(history), "--no-live")
    if p.returncode not in (0, 1, 3):
        print(f"{tag}: exit {p.returncode}\n{p.stderr[-2000:]}")
        return None
    (run,) = (work / tag).iterdir()
    report = json.loads((run / "report.json").read_text())
    d = report["decisions"][0]
    ratio = d["ratio"]
    interval = (ratio["low"], ratio["high"]) if ratio and ratio["low"] is not None else None
    return Outcome(design=design, tag=tag, verdict=d["verdict"],
                   ratio=ratio["estimate"] if ratio else None, interval=interval,
                   cells=len(report["cells"]), minutes=minutes(run), effect=log_effect(report))


def alternate(work: Path, floor: Path, designs: Sequence[Design], rounds: Iterable[int],
              text: Callable[[str, str, int], str], width: int) -> list[Outcome] | None:
    """Campaign k of each design in turn, k over `rounds`, so the host's own drift falls on
    all designs alike; `text(tag, extra, k)` is the campaign file. Prints each campaign's
    line as it ends (its tag padded to `width`) and returns them in that order; None when
    one failed."""
    done: list[Outcome] = []
    for k in rounds:
        for design in designs:
            tag = f"{design.tag}-{k}"
            got = run_campaign(work, design.name, tag, text(tag, design.extra, k), floor)
            if got is None:
                return None
            done.append(got)
            print(got.line(width), flush=True)
    return done


def by_design(designs: Sequence[Design], done: Sequence[Outcome]) -> dict[str, list[Outcome]]:
    """Each design's campaigns, in the order they ran, in the order of `designs`."""
    return {d.name: [o for o in done if o.design == d.name] for d in designs}


def print_true_effect(done: Sequence[Outcome]) -> None:
    """The true effect, C over B, as all campaigns' cells measure it together: the mean of
    their log effects, in the order they ran (nothing printed when none has both arms)."""
    logs = [o.effect for o in done if o.effect is not None]
    if logs:
        print(f"true effect, C over B, as all {len(logs)} campaigns' cells measure it: "
              f"{math.exp(sum(logs) / len(logs)):.3f}")
