"""An interleaved pair (campaign/interleave.py): two engine processes taking turns, one at a
time, each slice recorded; a failed process fails its cell and the other is stopped
cleanly; past the timeout, or on Ctrl-C, both are killed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from abbench.campaign.child import engine_argv
from abbench.campaign.interleave import Arm, ArmRun, InterleavedPair, turn_argv
from abbench.campaign.recovery import proc_start
from abbench.records import read_journal, read_plan, read_samples
from abbench.records.cell_config import EmbeddedConfig
from abbench.records.cell_doc import PER_TOKEN
from abbench.records.slices import read_slices
from abbench.records.tokens import SLICE
from abbench.sensors import open_device

# A stand-in engine: takes turns as the engine does, `paused` after each `go`, and then
# does what its argument says at turn N (`hang`: stops reading; `exit`: exits 4).
FAKE = """\
import sys, time
what, at = sys.argv[1], int(sys.argv[2])
print("abbench-turn ready 0", flush=True)
turn = 0
while sys.stdin.readline() == "go\\n":
    turn += 1
    if turn == at and what == "hang":
        time.sleep(60)
    if turn == at and what == "exit":
        print("half a token", flush=True)
        sys.exit(4)
    print(f"abbench-turn {'done' if turn == 4 else 'paused'} {turn}", flush=True)
    if turn == 4:
        break
"""


def engine_arm(tmp: Path, index: int, model: Path, tokens: int = 32,
               slice_tokens: int = 8) -> Arm:
    out = tmp / f"0{index + 1}-{'AB'[index]}"
    out.mkdir()
    cfg = EmbeddedConfig({"model": str(model), "n_tokens": tokens, "cache_mib": 0.2,
                          "ignore_eos": True, "seed": index, "timeout_s": 120})
    return Arm(index, out.name, turn_argv(engine_argv(sys.executable, cfg, out),
                                          slice_tokens), out, cfg)


def fake_arm(tmp: Path, index: int, what: str = "", at: int = 0,
             timeout_s: float = 60) -> Arm:
    out = tmp / f"0{index + 1}-{'AB'[index]}"
    out.mkdir()
    script = tmp / "fake_engine.py"
    script.write_text(FAKE)
    return Arm(index, out.name, (sys.executable, str(script), what or "-", str(at)), out,
               EmbeddedConfig({"timeout_s": timeout_s}))


def run_pair(a: Arm, b: Arm) -> tuple[tuple[ArmRun, ArmRun], list[int | None]]:
    tags: list[int | None] = []
    return InterleavedPair(open_device("local"), tags.append).run(a, b), tags


def test_two_engines_take_turns_one_at_a_time(tiny_model: Path, tmp_path: Path) -> None:
    a, b = engine_arm(tmp_path, 0, tiny_model), engine_arm(tmp_path, 1, tiny_model)
    (ra, rb), tags = run_pair(a, b)
    assert (ra.ended.status, rb.ended.status) == ("ok", "ok"), (ra.ended, rb.ended)
    for arm, ran, turns in ((a, ra, [0, 2, 4, 6]), (b, rb, [1, 3, 5, 7])):
        assert [s.slice for s in ran.slices] == [0, 1, 2, 3]
        assert [s.turn for s in ran.slices] == turns
        assert [s.tokens for s in ran.slices] == [8] * 4
        assert {(s.cell, s.partner) for s in ran.slices} == {(arm.index, 1 - arm.index)}
        assert read_slices(arm.out) == list(ran.slices)
        doc = json.loads((arm.out / "summary.json").read_text())
        assert doc[PER_TOKEN][SLICE] == [0] * 8 + [1] * 8 + [2] * 8 + [3] * 8
        assert (arm.out / "tokens.csv").is_file() and (arm.out / "child.json").is_file()
    # strictly alternating spans: no two slices overlap, in either clock
    spans = sorted(ra.slices + rb.slices, key=lambda s: s.t_start_mono)
    assert [s.cell for s in spans] == [0, 1] * 4
    for before, after in zip(spans, spans[1:]):
        assert before.t_end_mono <= after.t_start_mono
        assert before.t_end_wall <= after.t_start_wall
    # the processes' own spans hold their slices
    for ran in (ra, rb):
        assert ran.t_start_mono <= ran.slices[0].t_start_mono
        assert ran.slices[-1].t_end_mono <= ran.t_end_mono
    # the sampler's tag follows the turns: A's start, B's start, then the turns
    assert tags == [0, 1, *[0, 1] * 4, None]


def test_a_partner_that_fails_before_its_first_turn_stops_the_other_cleanly(
        tiny_model: Path, tmp_path: Path) -> None:
    a = engine_arm(tmp_path, 0, tiny_model, tokens=16)
    out = tmp_path / "02-B"
    out.mkdir()
    b = Arm(1, "02-B", (sys.executable, "-c", "import sys; sys.exit(3)"), out,
            EmbeddedConfig({"timeout_s": 60}))
    (ra, rb), _ = run_pair(a, b)
    assert (rb.ended.status, rb.ended.exit_code) == ("failed", 3)
    # A heard end of file at its first pause: it wrote its outputs, for no token, and
    # exited 0; its cell fails all the same: it could not take its turns beside B.
    assert (ra.ended.status, ra.ended.exit_code) == ("failed", 0)
    assert "stopped after 0 turns: 02-B" in (ra.ended.error or "")
    assert json.loads((a.out / "summary.json").read_text())[PER_TOKEN][SLICE] == []
    assert ra.slices == rb.slices == ()


def test_a_partner_that_dies_mid_run_fails_and_the_other_keeps_its_tokens(
        tiny_model: Path, tmp_path: Path) -> None:
    a = engine_arm(tmp_path, 0, tiny_model, tokens=16)
    b = fake_arm(tmp_path, 1, "exit", at=1)
    (ra, rb), _ = run_pair(a, b)
    assert (rb.ended.status, rb.ended.exit_code) == ("failed", 4)
    assert (b.out / "stdout.txt").read_text() == "half a token\n"  # its ordinary output
    assert ra.ended.exit_code == 0 and "stopped after 1 turns" in (ra.ended.error or "")
    assert [s.tokens for s in ra.slices] == [8]
    assert json.loads((a.out / "summary.json").read_text())[PER_TOKEN][SLICE] == [0] * 8


def test_the_pair_times_out_as_one_and_both_are_killed(tmp_path: Path) -> None:
    a = fake_arm(tmp_path, 0, timeout_s=1.5)
    b = fake_arm(tmp_path, 1, "hang", at=2, timeout_s=1.5)
    (ra, rb), _ = run_pair(a, b)
    assert (ra.ended.status, rb.ended.status) == ("timeout", "timeout")
    assert "3 s timeout" in (ra.ended.error or "")
    assert sorted(s.turn for s in ra.slices + rb.slices) == [0, 1, 2]
    for arm in (a, b):
        pid = json.loads((arm.out / "child.json").read_text())["pid"]
        assert proc_start(pid) is None  # reaped


def test_ctrl_c_kills_both(tmp_path: Path) -> None:
    a, b = fake_arm(tmp_path, 0), fake_arm(tmp_path, 1)
    calls: list[int | None] = []

    def interrupt(cell: int | None) -> None:
        calls.append(cell)
        if len(calls) == 4:  # A's second turn
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        InterleavedPair(open_device("local"), interrupt).run(a, b)
    for arm in (a, b):
        pid = json.loads((arm.out / "child.json").read_text())["pid"]
        assert proc_start(pid) is None


def test_a_finished_arm_leaves_the_other_its_remaining_turns(tmp_path: Path) -> None:
    # A process that ends early (an end-of-generation token without ignore_eos) says
    # `done` sooner: the other takes its remaining turns one after another.
    script = tmp_path / "short.py"
    script.write_text(textwrap.dedent("""\
        import sys
        print("abbench-turn ready 0", flush=True)
        sys.stdin.readline()
        print("abbench-turn done 3", flush=True)
        """))
    out = tmp_path / "02-B"
    out.mkdir()
    a = fake_arm(tmp_path, 0)
    b = Arm(1, "02-B", (sys.executable, str(script)), out, EmbeddedConfig({}))
    (ra, rb), _ = run_pair(a, b)
    assert (ra.ended.status, rb.ended.status) == ("ok", "ok")
    assert [s.turn for s in ra.slices] == [0, 2, 3, 4]
    assert [s.tokens for s in rb.slices] == [3]


# -- through the real CLI ------------------------------------------------------------------

CAMPAIGN = """\
[campaign]
name = "pairs"
spacing_s = 0.3
warmup_tokens = 2
interleave = "slices"
slice_tokens = 8

[device]
transport = "local"
sample_hz = 10

[workload]
model = "{model}"
tokens = 32
cache_mib = 0.2
timeout_s = 120

[cells.B]

[cells.C]
io_lanes = 1

[[decision]]
candidate = "C"
baseline = "B"
"""


def test_an_interleaved_campaign_runs_its_pairs_and_writes_a_report(
        tiny_model: Path, tmp_path: Path) -> None:
    cells = tmp_path / "cells.toml"
    cells.write_text(CAMPAIGN.format(model=tiny_model))
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", str(cells), "--out",
                        str(tmp_path / "reports"), "--sentinels", str(tmp_path / "sentinels"),
                        "--no-live"], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1, 3), p.stdout + p.stderr  # any verdict, but it ran
    (folder,) = (tmp_path / "reports").iterdir()
    plan = read_plan(folder)
    assert [(a.name, b.name) for a, b in plan.pairs()] == [("B", "C"), ("C", "B")]
    records = read_journal(folder)
    assert [r.index for r in records] == [0, 1, 2, 3]
    assert all(r.status == "ok" and r.tokens_per_s for r in records), records
    # the second pair took its first turn with C: ABBA blocks of invocations
    for a, b in plan.pairs():
        sa, sb = (read_slices(folder / "cells" / c.label) for c in (a, b))
        assert [s.turn for s in sa] == [0, 2, 4, 6] and [s.turn for s in sb] == [1, 3, 5, 7]
        spans = sorted(sa + sb, key=lambda s: s.t_start_mono)
        assert all(x.t_end_mono <= y.t_start_mono for x, y in zip(spans, spans[1:]))
    # the sampler tagged its ticks with the cell whose turn it was
    samples = read_samples(folder)
    assert {s.cell for s in samples} >= {0, 1, 2, 3}
    for name in ("report.md", "report.json", "report.html"):
        assert (folder / name).is_file(), name
    assert "C" in (folder / "report.md").read_text()
    # the decision rests on the run pairs, each arm's slices paired turn by turn
    (d,) = json.loads((folder / "report.json").read_text())["decisions"]
    assert d["slices"].startswith("interleaved: 2 run pairs (1 with C taking the first turn)")
    assert [(p["candidate"], p["baseline"]) for p in d["pairs"]] == [(1, 0), (2, 3)]
    # its noise is the two run pairs' spread (a fresh device history has no floor)
    assert (d["noise"]["source"], d["noise"]["df"]) == ("interleaved run pairs", 1)
