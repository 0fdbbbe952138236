"""P9 (docs/benches.md): device minutes per decided verdict, a sequential campaign
(`until = "decided"`) against a fixed ABBA x 3, on `sim:phone`, side by side.

Both designs run the same two cells behind the same thermal gate on the simulated phone:
B (the small synthetic model) and C, which differs by one engine key chosen to make C about
10% slower (`--candidate`, default `dense = "mmap"`: the dense weights left to the page
cache instead of pinned, measured 12-14% slower here in engine runs). Before the campaigns,
`abbench calibrate --like` measures the device's noise floor once (six cells of B under the
campaigns' gate); every campaign starts from a copy of that history, so both designs have
the same floor and none learns from another. The designs alternate (fixed, sequential,
fixed, ...), so the host's drift falls on both alike.

Prints, per campaign, the verdict and its device minutes (wall time from the first cell's
gate to the last cell's end: the time the device was occupied); then, per design, minutes per
decided verdict (total minutes / GO-or-NO-GO count) and the ratio sequential / fixed (bar
<= 0.7), and the true effect as every campaign's cells measure it together.

    .venv/bin/python benches/p9_sequential.py            # 3 campaigns of each design
    .venv/bin/python benches/p9_sequential.py --campaigns 5 --max-cells 16
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

CAMPAIGN = """\
[campaign]
name = "{name}"
spacing_s = 10
order = "abba"
warmup_tokens = 16
{extra}

[device]
transport = "sim:phone"
sample_hz = 4

[gate]                    # cells/thermal-demo-gated.toml's gate
battery_temp_max_c = 26.6
cpu_temp_max_c = 30.7
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
dense = "pinned"

[cells.C]
base = "B"
{candidate}

[[decision]]
candidate = "C"
baseline = "B"
min_effect = 0.03
"""


def abbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *args], capture_output=True,
                          text=True, cwd=ROOT)


def minutes(run: Path) -> float:
    lines = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines() if x]
    start = min(r["t_start_wall"] - r["gate"]["waited_s"] for r in lines)
    return (max(r["t_end_wall"] for r in lines) - start) / 60.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaigns", type=int, default=3, help="of each design (default 3)")
    ap.add_argument("--max-cells", type=int, default=16,
                    help="the sequential campaign's budget (default 16)")
    ap.add_argument("--candidate", default='dense = "mmap"',
                    help='the TOML line that sets C apart from B (default dense = "mmap")')
    ap.add_argument("--model", default="synthetic:small")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="abbench-p9-"))
    try:
        floor = work / "floor"
        base = work / "base.toml"
        base.write_text(CAMPAIGN.format(name="p9", extra="", model=args.model,
                                        tokens=args.tokens, candidate=args.candidate))
        p = abbench("calibrate", "--like", str(base), "--cells", "6", "--out",
                    str(work / "calibrate"), "--sentinels", str(floor), "--no-live")
        line = [x for x in p.stdout.splitlines() if x.startswith("calibrate:")]
        print(line[0] if line else f"calibrate: exit {p.returncode}\n{p.stderr[-2000:]}")
        designs = {
            "fixed ABBA x 3": "repeat = 3",
            f"sequential (<= {args.max_cells} cells)":
                f'until = "decided"\nmax_cells = {args.max_cells}',
        }
        results: dict[str, list[tuple[str, float, int, float]]] = {d: [] for d in designs}
        logs: list[float] = []
        for k in range(args.campaigns):
            for design, extra in designs.items():
                tag = f"{'seq' if 'sequential' in design else 'fixed'}-{k}"
                cells = work / f"{tag}.toml"
                cells.write_text(CAMPAIGN.format(name=tag, extra=extra, model=args.model,
                                                 tokens=args.tokens,
                                                 candidate=args.candidate))
                history = work / f"s-{tag}"
                shutil.copytree(floor, history)
                p = abbench("campaign", str(cells), "--out", str(work / tag), "--sentinels",
                            str(history), "--no-live")
                if p.returncode not in (0, 1, 3):
                    print(f"{tag}: exit {p.returncode}\n{p.stderr[-2000:]}")
                    return 2
                (run,) = (work / tag).iterdir()
                r = json.loads((run / "report.json").read_text())
                d = r["decisions"][0]
                ratio = d["ratio"]["estimate"] if d["ratio"] else math.nan
                results[design].append((d["verdict"], minutes(run), len(r["cells"]), ratio))
                arm = {n: [math.log(c["tokens_per_s"]["estimate"]) for c in r["cells"]
                           if c["name"] == n and c["tokens_per_s"]] for n in ("B", "C")}
                if arm["B"] and arm["C"]:
                    logs.append(sum(arm["C"]) / len(arm["C"]) - sum(arm["B"]) / len(arm["B"]))
                ci = (f"{d['ratio']['low']:.3f} .. {d['ratio']['high']:.3f}"
                      if d["ratio"] and d["ratio"]["low"] is not None else "-")
                print(f"{tag:8} {d['verdict']:<12} ratio {ratio:.3f} ({ci}) "
                      f"{len(r['cells']):2d} cells {minutes(run):5.2f} min", flush=True)
        per: dict[str, float] = {}
        for design, rows in results.items():
            decided = sum(v in ("GO", "NO-GO") for v, *_ in rows)
            total = sum(m for _, m, _, _ in rows)
            per[design] = total / decided if decided else math.inf
            verdicts = ", ".join(v for v, *_ in rows)
            print(f"{design}: {decided}/{len(rows)} decided ({verdicts}), {total:.1f} min, "
                  f"{per[design]:.2f} min per decided verdict")
        if logs:
            print(f"true effect, C over B, as all {len(logs)} campaigns' cells measure it: "
                  f"{math.exp(sum(logs) / len(logs)):.3f}")
        fixed, seq = per.values()
        print(f"P9 sequential / fixed, minutes per decided verdict: "
              f"{seq / fixed if math.isfinite(fixed) else math.nan:.3f} (bar <= 0.7)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
