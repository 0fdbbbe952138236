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
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import campaign_bench as bench  # noqa: E402  (P9's and P13's campaign runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.design_flags(ap, 16, "the sequential campaign's budget", 'dense = "mmap"')
    ap.add_argument("--model", default="synthetic:small")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    pair = bench.Cells(model=args.model, tokens=args.tokens, baseline='dense = "pinned"',
                       candidate=args.candidate, battery_max_c=26.6, cpu_max_c=30.7,
                       gate_note="cells/thermal-demo-gated.toml's gate")

    work = Path(tempfile.mkdtemp(prefix="abbench-p9-"))
    try:
        floor = bench.calibrate(work, pair.text("p9", "", "phone"))
        designs = [
            bench.Design("fixed ABBA x 3", "fixed", "repeat = 3"),
            bench.Design(f"sequential (<= {args.max_cells} cells)", "seq",
                         f'until = "decided"\nmax_cells = {args.max_cells}'),
        ]
        done = bench.alternate(work, floor, designs, range(args.campaigns),
                               lambda tag, extra, _k: pair.text(tag, extra, "phone"), width=8)
        if done is None:
            return 2
        per: dict[str, float] = {}
        for design, rows in bench.by_design(designs, done).items():
            decided = sum(o.verdict in ("GO", "NO-GO") for o in rows)
            total = sum(o.minutes for o in rows)
            per[design] = total / decided if decided else math.inf
            verdicts = ", ".join(o.verdict for o in rows)
            print(f"{design}: {decided}/{len(rows)} decided ({verdicts}), {total:.1f} min, "
                  f"{per[design]:.2f} min per decided verdict")
        bench.print_true_effect(done)
        fixed, seq = per.values()
        print(f"P9 sequential / fixed, minutes per decided verdict: "
              f"{seq / fixed if math.isfinite(fixed) else math.nan:.3f} (bar <= 0.7)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
