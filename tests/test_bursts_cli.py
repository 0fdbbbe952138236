"""Through the real CLI under bursts of load (docs/method.md#bursts): an A/A campaign while
the test starts and stops a CPU load twice never says GO or NO-GO, in either design; an
interleaved campaign with a true difference decides it (slow: real engine processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CAMPAIGN = """\
[campaign]
name = "{name}"
spacing_s = 1
order = "abba"
interleave = "{interleave}"
warmup_tokens = 8
until = "decided"
max_cells = 12

[device]
transport = "local"
sample_hz = 4

[match]
probe_tol = 0.08

[workload]
model = "{model}"
tokens = 96
timeout_s = 300

[cells.B]

[cells.C]
{candidate}

[[decision]]
candidate = "C"
baseline = "B"
min_effect = 0.03
"""
# C is B under another name in the A/A; the true difference is C streaming every expert
# from disk (no cache) where B holds them all.
SAME = "base = \"B\""
SLOWER = "cache_mib = 0"
BURN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\n" \
       "while time.monotonic() < end: pass\n"


class Bursts(threading.Thread):
    """A CPU load on every core, started and stopped at the given (start, seconds) after
    the thread starts: a background app coming and going."""

    def __init__(self, bursts: list[tuple[float, float]]) -> None:
        super().__init__(daemon=True)
        self.bursts = bursts
        self.started_at: list[float] = []

    def run(self) -> None:
        t0 = time.monotonic()
        for start, seconds in self.bursts:
            time.sleep(max(0.0, t0 + start - time.monotonic()))
            self.started_at.append(time.monotonic() - t0)
            procs = [subprocess.Popen([sys.executable, "-c", BURN, str(seconds)])
                     for _ in range(os.cpu_count() or 2)]
            for p in procs:
                p.wait()


def _campaign(tmp: Path, name: str, interleave: str, model: Path, candidate: str,
              bursts: list[tuple[float, float]]) -> tuple[int, dict, str]:
    cells = tmp / f"{name}.toml"
    cells.write_text(CAMPAIGN.format(name=name, interleave=interleave, model=model,
                                     candidate=candidate))
    load = Bursts(bursts)
    load.start()
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", str(cells), "--out",
                        str(tmp / name), "--sentinels", str(tmp / f"{name}-history"),
                        "--no-live"], capture_output=True, text=True, timeout=900)
    load.join()
    (folder,) = (tmp / name).iterdir()
    report = json.loads((folder / "report.json").read_text())
    return p.returncode, report, p.stdout + p.stderr


@pytest.mark.parametrize("interleave", ["slices", "cells"])
def test_an_a_a_under_bursts_of_load_never_says_go_or_no_go(
        interleave: str, small_model: Path, tmp_path: Path) -> None:
    status, report, out = _campaign(tmp_path, f"aa-{interleave}", interleave, small_model,
                                    SAME, [(2.0, 6.0), (16.0, 6.0)])
    (d,) = report["decisions"]
    assert d["verdict"] not in ("GO", "NO-GO"), out
    assert status == 3, out


def test_an_interleaved_campaign_decides_a_true_difference_under_bursts(
        small_model: Path, tmp_path: Path) -> None:
    status, report, out = _campaign(tmp_path, "true", "slices", small_model, SLOWER,
                                    [(2.0, 6.0), (16.0, 6.0)])
    (d,) = report["decisions"]
    assert d["verdict"] == "NO-GO", out
    assert status == 1, out
