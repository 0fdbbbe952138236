"""The campaign files under cells/ are valid as shipped (`--dry-run`: every key, every
cell's resolved configuration, the models' headers), and the two-architectures campaign
runs through the real CLI to a verdict on each architecture, and the past-memory campaign
inside its memory limits (slow)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from abbench.campaign import cgroup

CELLS = Path(__file__).resolve().parents[1] / "cells"
# what a file needs that a clean machine lacks: its dry run says so, naming the key
NEEDS = {"llama-cpp.toml": "no `llama-bench` on PATH",
         "past-memory.toml": "memory_limit_mib`: cannot be set here"}


def abbench(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("name", sorted(p.name for p in CELLS.glob("*.toml")))
def test_every_shipped_campaign_file_validates(name: str) -> None:
    p = abbench("campaign", CELLS / name, "--dry-run")
    if name in NEEDS and p.returncode == 2:
        assert NEEDS[name] in p.stderr
        return
    assert p.returncode == 0, p.stderr
    assert "plan " in p.stdout


@pytest.mark.slow
def test_the_same_policy_decided_on_two_architectures(tmp_path: Path) -> None:
    """drop-cold-experts 0.75 against none, on qwen3moe and on gpt-oss: every cell runs,
    and each decision compares its own architecture's matched pairs, whose cells did the
    work their configuration asks: the drop cells dropped experts and read fewer MiB per
    token than the cells that did not.

    The shipped file is run with `[match]` widened for what this shared machine moves
    (the speed probe, the foreign load), as the other campaign tests do: even with no
    other test beside it the probe here moved between 0.65 and 1.0 from cell to cell and
    left one decision with no matched pair, a correct OWED but not what this test checks.
    Which arm is faster is the machine's to say, and is not asserted."""
    shipped = (CELLS / "two-architectures.toml").read_text()
    assert "[match]\nprobe_tol = 0.08" in shipped
    cells = tmp_path / "two-architectures.toml"
    cells.write_text(shipped.replace("[match]\nprobe_tol = 0.08",
                                     "[match]\nprobe_tol = 1\nforeign_load_tol = 64"))
    out = tmp_path / "runs"  # the device's sentinel history too: never the checkout's
    p = abbench("campaign", cells, "--out", out, "--no-live",
                "--sentinels", tmp_path / "sentinels")
    assert p.returncode in (0, 3), p.stderr[-2000:]
    (run,) = [d for d in out.iterdir() if d.is_dir()]
    report = json.loads((run / "report.json").read_text())
    assert all(c["status"] == "ok" for c in report["cells"])
    decisions = {(d["candidate"], d["baseline"]): d for d in report["decisions"]}
    assert set(decisions) == {("qwen-drop", "qwen-off"), ("oss-drop", "oss-off")}
    for (drop, off), d in decisions.items():
        assert d["pairs"] and math.isfinite(d["ratio"]["estimate"])
        dropped = [c for c in report["cells"] if c["name"] == drop]
        kept = [c for c in report["cells"] if c["name"] == off]
        assert all(c["drop_rate"] > 0 for c in dropped) and all(c["drop_rate"] == 0 for c in kept)
        assert max(c["read_mib_per_token"] for c in dropped) < \
            min(c["read_mib_per_token"] for c in kept)


@pytest.mark.slow
@pytest.mark.skipif(cgroup.unavailable() is not None,
                    reason=f"no memory cgroup here: {cgroup.unavailable()}")
def test_the_past_memory_campaign_runs_each_cell_inside_a_limit_below_its_file(
        tmp_path: Path, default_model: Path) -> None:
    """cells/past-memory.toml on a smaller file than it ships with (the default synthetic
    model, 1.5 GiB, in 1 GiB with a 256 MiB cache) to a report: every cell ran in its own
    memory cgroup, streamed its experts within the limit and was not OOM-killed."""
    shipped = (CELLS / "past-memory.toml").read_text()
    small = {'model = "synthetic:qwen3-30b-a3b-12L-Q4_K_M"': f'model = "{default_model}"',
             "memory_limit_mib = 2048": "memory_limit_mib = 1024",
             "cache_mib = 1024": "cache_mib = 256", "tokens = 128": "tokens = 48",
             "spacing_s = 30": "spacing_s = 1",
             "[match]\nprobe_tol = 0.08": "[match]\nprobe_tol = 1\nforeign_load_tol = 64"}
    for old, new in small.items():
        assert old in shipped
        shipped = shipped.replace(old, new)
    assert default_model.stat().st_size > 1024 * 2**20  # the file does not fit the limit
    cells = tmp_path / "past-memory.toml"
    cells.write_text(shipped)
    out = tmp_path / "runs"
    p = abbench("campaign", cells, "--out", out, "--no-live",
                "--sentinels", tmp_path / "sentinels")
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    (run,) = [d for d in out.iterdir() if d.is_dir()]
    report = json.loads((run / "report.json").read_text())
    assert [c["name"] for c in report["cells"]] == ["B", "retention-only", "spec-2", "B"]
    for c in report["cells"]:
        assert c["status"] == "ok", c["error"]
        m = c["memory"]
        assert m["limit_mib"] == 1024 and m["oom_kills"] == 0
        assert 256 < m["peak_mib"] <= 1024
    assert "/ 1024 MiB |" in (run / "report.md").read_text()
    assert report["decisions"][0]["candidate"] == "spec-2"
