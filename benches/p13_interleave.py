"""P13 (docs/benches.md): device minutes per correct verdict under bursts, interleaved
slices (`interleave = "slices"`) against ABBA cells, both `until = "decided"`, on
`sim:phone-bursts`, side by side.

Both designs run the same two cells under the same gate, spacing, match tolerances and
cell budget (`--max-cells`) on the simulated phone with bursts (abbench/sim/bursts.py:
foreign load that comes and goes, slowing whatever runs by 20-40% for one to three cells'
length, about once per four cells, invisible to the host-load sensor unless `--visible`):
B (the small synthetic model, 768 tokens, one thread, its dense weights left to the page
cache, `dense = "mmap"`) and C, which differs by one engine key chosen to make C about 10%
faster (`--candidate`, default `dense = "pinned"`: the dense weights pinned in memory,
measured 10-13% faster than mmap in engine runs here and 5-16% in campaign cells on
sim:phone-bursts; `--truth slower` for a candidate that is slower). The correct verdict is
the true direction's: GO for a speed-up (at min_effect 0.03), NO-GO for a slow-down.

The gate is P9's (cells/thermal-demo-gated.toml's) a little warmer, 27.0 °C battery and
32 °C CPU instead of 26.6 and 30.7, still below the phone's first trip: every cell starts
within the match tolerances, at half P9's wait. Interleaved pairs take turns every
`--slice-tokens` 64 tokens (about 0.15 s of this model's decode: several of the
simulated device's 20 ms duty periods per turn).

Before the campaigns, `abbench calibrate --like` measures the device's noise floor once
(six cells of B under the campaigns' gate, bursts included); every campaign starts from a
copy of that history, so both designs have the same floor and none learns from another.
Campaign k of each design meets the same burst schedule (its profile's seed is k: a copy
of phone-bursts with that seed), and the designs alternate (interleaved, cells,
interleaved, ...), so the host's own drift falls on both alike.

Prints, per campaign, the verdict and its device minutes (wall time from the first cell's
gate to the last cell's end: the time the device was occupied); then, per design, minutes
per correct verdict (total minutes / correct count; with no correct verdict in a design,
the counts instead) and the ratio interleaved / cells (bar <= 0.5), and the true effect
as every campaign's cells measure it together.

    .venv/bin/python benches/p13_interleave.py     # 3 campaigns of each design, ~15-20 min
    .venv/bin/python benches/p13_interleave.py --campaigns 1 --max-cells 16
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "abbench" / "sim" / "profiles" / "phone-bursts.toml"

CAMPAIGN = """\
[campaign]
name = "{name}"
spacing_s = 10
order = "abba"
warmup_tokens = 16
{extra}

[device]
transport = "sim:{profile}"
sample_hz = 4

[gate]                    # thermal-demo-gated's, a little warmer (see above)
battery_temp_max_c = 27.0
cpu_temp_max_c = 32.0
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
dense = "mmap"

[cells.C]
base = "B"
{candidate}

[[decision]]
candidate = "C"
baseline = "B"
min_effect = 0.03
"""

CORRECT = {"faster": "GO", "slower": "NO-GO"}


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


def profile(work: Path, seed: int, visible: bool) -> Path:
    """phone-bursts with its schedule's seed set to `seed` (same device name, so the
    same device history)."""
    lines = []
    for line in PROFILE.read_text().splitlines():
        if line.startswith("seed ="):
            line = f"seed = {seed}"
        elif line.startswith("visible ="):
            line = f"visible = {'true' if visible else 'false'}"
        lines.append(line)
    path = work / f"phone-bursts-{seed}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def log_effect(report: dict) -> float | None:
    """C over B in log tokens/s, from the campaign's cells (None without both arms)."""
    arm = {n: [math.log(c["tokens_per_s"]["estimate"]) for c in report["cells"]
               if c["name"] == n and c["tokens_per_s"]] for n in ("B", "C")}
    if not (arm["B"] and arm["C"]):
        return None
    return sum(arm["C"]) / len(arm["C"]) - sum(arm["B"]) / len(arm["B"])


def run_campaign(work: Path, tag: str, text: str, floor: Path) -> tuple[dict, Path] | None:
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
    return json.loads((run / "report.json").read_text()), run


def summarize(results: dict[str, list[tuple[str, float]]], want: str) -> dict[str, float]:
    """Per design: its line, and its minutes per correct verdict (inf: none correct)."""
    per: dict[str, float] = {}
    for design, rows in results.items():
        correct = sum(v == want for v, _ in rows)
        total = sum(m for _, m in rows)
        per[design] = total / correct if correct else math.inf
        verdicts = ", ".join(v for v, _ in rows)
        rate = (f"{per[design]:.2f} min per correct verdict" if correct
                else "no correct verdict: no minutes per correct verdict")
        print(f"{design}: {correct}/{len(rows)} correct ({want}; {verdicts}), "
              f"{total:.1f} min, {rate}")
    return per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaigns", type=int, default=3, help="of each design (default 3)")
    ap.add_argument("--max-cells", type=int, default=12,
                    help="each campaign's budget, both designs (default 12)")
    ap.add_argument("--candidate", default='dense = "pinned"',
                    help='the TOML line that sets C apart from B (default dense = "pinned")')
    ap.add_argument("--truth", choices=sorted(CORRECT), default="faster",
                    help="the candidate's true direction (default faster: GO is correct)")
    ap.add_argument("--visible", action="store_true",
                    help="bursts the host-load sensor sees (default: invisible)")
    ap.add_argument("--slice-tokens", type=int, default=64)
    ap.add_argument("--model", default="synthetic:small")
    ap.add_argument("--tokens", type=int, default=768)
    args = ap.parse_args()
    want = CORRECT[args.truth]

    def campaign_text(name: str, extra: str, seed: int) -> str:
        return CAMPAIGN.format(name=name, extra=extra, model=args.model, tokens=args.tokens,
                               candidate=args.candidate,
                               profile=profile(work, seed, args.visible))

    work = Path(tempfile.mkdtemp(prefix="abbench-p13-"))
    try:
        floor = work / "floor"
        base = work / "base.toml"
        base.write_text(campaign_text("p13", "", 0))
        p = abbench("calibrate", "--like", str(base), "--cells", "6", "--out",
                    str(work / "calibrate"), "--sentinels", str(floor), "--no-live")
        line = [x for x in p.stdout.splitlines() if x.startswith("calibrate:")]
        print(line[0] if line else f"calibrate: exit {p.returncode}\n{p.stderr[-2000:]}")
        budget = f'until = "decided"\nmax_cells = {args.max_cells}'
        designs = {
            "interleaved slices": f'interleave = "slices"\nslice_tokens = '
                                  f"{args.slice_tokens}\n{budget}",
            "ABBA cells": budget,
        }
        results: dict[str, list[tuple[str, float]]] = {d: [] for d in designs}
        logs: list[float] = []
        for k in range(1, args.campaigns + 1):
            for design, extra in designs.items():
                tag = f"{'slices' if 'interleaved' in design else 'cells'}-{k}"
                got = run_campaign(work, tag, campaign_text(tag, extra, k), floor)
                if got is None:
                    return 2
                r, run = got
                d = r["decisions"][0]
                ratio = d["ratio"]["estimate"] if d["ratio"] else math.nan
                results[design].append((d["verdict"], minutes(run)))
                effect = log_effect(r)
                if effect is not None:
                    logs.append(effect)
                ci = (f"{d['ratio']['low']:.3f} .. {d['ratio']['high']:.3f}"
                      if d["ratio"] and d["ratio"]["low"] is not None else "-")
                print(f"{tag:9} {d['verdict']:<12} ratio {ratio:.3f} ({ci}) "
                      f"{len(r['cells']):2d} cells {minutes(run):5.2f} min", flush=True)
        per = summarize(results, want)
        if logs:
            print(f"true effect, C over B, as all {len(logs)} campaigns' cells measure it: "
                  f"{math.exp(sum(logs) / len(logs)):.3f}")
        slices, cells = per.values()
        if math.isfinite(slices) and math.isfinite(cells):
            print(f"P13 interleaved / cells, minutes per correct verdict: "
                  f"{slices / cells:.3f} (bar <= 0.5)")
        else:
            counts = "; ".join(f"{d} {sum(v == want for v, _ in rows)}/{len(rows)} correct"
                               for d, rows in results.items())
            print(f"P13 interleaved / cells: no ratio ({counts}; bar <= 0.5)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
