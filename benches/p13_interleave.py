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
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import campaign_bench as bench  # noqa: E402  (P9's and P13's campaign runs)

PROFILE = bench.ROOT / "abbench" / "sim" / "profiles" / "phone-bursts.toml"

CORRECT = {"faster": "GO", "slower": "NO-GO"}


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


def summarize(results: dict[str, list[bench.Outcome]], want: str) -> dict[str, float]:
    """Per design: its line, and its minutes per correct verdict (inf: none correct)."""
    per: dict[str, float] = {}
    for design, rows in results.items():
        correct = sum(o.verdict == want for o in rows)
        total = sum(o.minutes for o in rows)
        per[design] = total / correct if correct else math.inf
        verdicts = ", ".join(o.verdict for o in rows)
        rate = (f"{per[design]:.2f} min per correct verdict" if correct
                else "no correct verdict: no minutes per correct verdict")
        print(f"{design}: {correct}/{len(rows)} correct ({want}; {verdicts}), "
              f"{total:.1f} min, {rate}")
    return per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.design_flags(ap, 12, "each campaign's budget, both designs", 'dense = "pinned"')
    ap.add_argument("--truth", choices=sorted(CORRECT), default="faster",
                    help="the candidate's true direction (default faster: GO is correct)")
    ap.add_argument("--visible", action="store_true",
                    help="bursts the host-load sensor sees (default: invisible)")
    ap.add_argument("--slice-tokens", type=int, default=64)
    ap.add_argument("--model", default="synthetic:small")
    ap.add_argument("--tokens", type=int, default=768)
    args = ap.parse_args()
    want = CORRECT[args.truth]

    pair = bench.Cells(model=args.model, tokens=args.tokens, baseline='dense = "mmap"',
                       candidate=args.candidate, battery_max_c=27.0, cpu_max_c=32.0,
                       gate_note="thermal-demo-gated's, a little warmer (see above)")

    def campaign_text(name: str, extra: str, seed: int) -> str:
        return pair.text(name, extra, str(profile(work, seed, args.visible)))

    work = Path(tempfile.mkdtemp(prefix="abbench-p13-"))
    try:
        floor = bench.calibrate(work, campaign_text("p13", "", 0))
        budget = f'until = "decided"\nmax_cells = {args.max_cells}'
        designs = [
            bench.Design("interleaved slices", "slices",
                         f'interleave = "slices"\nslice_tokens = {args.slice_tokens}\n{budget}'),
            bench.Design("ABBA cells", "cells", budget),
        ]
        done = bench.alternate(work, floor, designs, range(1, args.campaigns + 1), campaign_text,
                               width=9)
        if done is None:
            return 2
        results = bench.by_design(designs, done)
        per = summarize(results, want)
        bench.print_true_effect(done)
        slices, cells = per.values()
        if math.isfinite(slices) and math.isfinite(cells):
            print(f"P13 interleaved / cells, minutes per correct verdict: "
                  f"{slices / cells:.3f} (bar <= 0.5)")
        else:
            counts = "; ".join(f"{d} {sum(o.verdict == want for o in rows)}/{len(rows)} correct"
                               for d, rows in results.items())
            print(f"P13 interleaved / cells: no ratio ({counts}; bar <= 0.5)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
