"""P6 — engine peak RSS against dense bytes + cache budget (docs/benches.md: <= 1.10x + 100 MiB).

Each configuration runs the real engine in a child process (`python -m abbench engine run
... --json`), exactly as a campaign cell does, and reads the child's own peak RSS
(`getrusage` high-water mark) from its JSON summary. The figure of merit is
(peak RSS - 100 MiB) / (dense bytes + cache budget), which must stay <= 1.10.

    python benches/p6_memory.py [--cache-mib 128 384 1024] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from abbench.engine.run.models import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:default")
    ap.add_argument("--cache-mib", type=float, nargs="+", default=[128, 384, 1024])
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    resolve_model(a.model)  # build once, outside the measured children
    worst = 0.0
    print(f"model: {a.model}, {a.tokens} tokens, dense pinned, overlap, 4 lanes")
    print(f"{'cache MiB':>10} {'dense MiB':>10} {'peak RSS MiB':>13} {'bound MiB':>10} "
          f"{'(peak-100)/(dense+cache)':>26}")
    for cache in a.cache_mib:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.json"
            cmd = [sys.executable, "-m", "abbench", "engine", "run", "--ignore-eos", "-m", a.model,
                   "-n", str(a.tokens), "--cache-mib", f"{cache:g}", "--dense", "pinned",
                   "--overlap", "--io-lanes", "4", "--json", str(out), "-q"]
            subprocess.run(cmd, check=True)
            s = json.loads(out.read_text())["summary"]
        dense, peak = s["dense_MiB"], s["peak_rss_MiB"]
        ratio = (peak - 100) / (dense + cache)
        worst = max(worst, ratio)
        bound = 1.10 * (dense + cache) + 100
        print(f"{cache:>10g} {dense:>10.1f} {peak:>13.1f} {bound:>10.1f} {ratio:>26.3f}")
    print(f"P6 worst (peak - 100 MiB) / (dense + cache): {worst:.3f}  bar <= 1.10")


if __name__ == "__main__":
    main()
