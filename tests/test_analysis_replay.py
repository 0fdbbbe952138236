"""`abbench replay`: the published figures of the reference trace, hand-computed answers on
small traces, and the command's report, JSON and errors through the real CLI."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import REFERENCE as BMOE
from hypothesis import given, settings
from hypothesis import strategies as st

import abbench.analysis
from abbench.analysis.replay import (
    MIB,
    Replay,
    default_budgets,
    drop_trade,
    lookups,
    predictors,
    recorded,
    replay,
    replay_cache,
)
from abbench.records.route_trace import parse_route_trace, read_route_trace
from abbench.report.replay import render, to_json

REFERENCE = BMOE / "route-trace-2026-07-15" / "qwen.route.csv"
needs_reference = pytest.mark.skipif(not REFERENCE.exists(), reason="reference trace absent")

Routing = tuple[int, int, int, Sequence[tuple[int, float, int]]]  # phase, step, layer, slots


def trace_text(routings: Sequence[Routing], *, n_layer: int = 1, n_expert: int = 8,
               k: int = 1, expert_bytes: int = MIB, extra: str = "") -> str:
    """A route trace of `routings` in run order; each slot is (expert, weight, residency)."""
    out = ["# route_trace v1",
           f"# model=hand.gguf arch=qwen3moe n_layer={n_layer} n_expert={n_expert} "
           f"n_expert_used={k}{extra}"]
    out += [f"# layer={la} expert_bytes={expert_bytes} dense_bytes=0" for la in range(n_layer)]
    out.append("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped")
    for phase, step, layer, slots in routings:
        for slot, (e, w, res) in enumerate(slots):
            out.append(f"0,{phase},{step},{layer},{slot},{e},{w},{res},"
                       f"{0 if res else expert_bytes},0")
    return "\n".join(out) + "\n"


def decode_steps(experts: Sequence[Sequence[int]], first_step: int = 0) -> list[Routing]:
    """One decode routing per step at layer 0, equal weights, residency unknown (0)."""
    return [(1, first_step + i, 0, [(e, 1 / len(es), 0) for e in es])
            for i, es in enumerate(experts)]


def hits(text: str, budget_mib: float, policy: str) -> tuple[int, int]:
    r = replay_cache(lookups(parse_route_trace(text)), budget_mib, policy)
    return r.hits, r.lookups


# -- the published figures (reference/bmoe/README.md) --------------------------------------


@pytest.fixture(scope="module")
def reference() -> Replay:
    return replay(read_route_trace(REFERENCE), budgets_mib=[500, 4000])


@needs_reference
def test_cache_figures(reference: Replay) -> None:
    assert round(reference.at(4000, "lru").hit_pct, 1) == 74.9
    assert round(reference.recorded.hit_pct, 1) == 74.9      # the run's own cache_hit_pct
    assert reference.at(500, "lru").hits == 0                 # 0.0 %: below one token's cycle
    # Belady's 45.3 % counts decode lookups (prefill still warms the cache); over prefill +
    # decode lookups the same replay reads 42.2 %: prefill lookups are all first touches.
    assert round(reference.at(500, "belady").decode_hit_pct, 1) == 45.3
    assert round(reference.at(500, "belady").hit_pct, 1) == 42.2
    assert reference.lookups.batches == 48 + 128 * 48           # one prefill batch per layer
    assert len(reference.lookups) == 39526


@needs_reference
def test_belady_bounds_the_online_policies(reference: Replay) -> None:
    for m in reference.budgets_mib:
        best = reference.at(m, "belady").hits
        assert best >= reference.at(m, "lru").hits and best >= reference.at(m, "lfu").hits


@needs_reference
def test_predictor_figures(reference: Replay) -> None:
    assert round(reference.predictor("prev_token", 1).pct, 1) == 38.0
    assert round(reference.predictor("run_hottest").pct, 1) == 37.6
    assert round(reference.predictor("prompt_hottest").pct, 1) == 17.9
    assert round(reference.predictor("random").pct, 1) == 4.7
    # All scored on the same 127 decode tokens (the first has no previous token).
    assert reference.predictor("run_hottest").slots == 127 * 48 * 6
    assert reference.predictor("prev_token", 1).slots == 127 * 48 * 6


@needs_reference
def test_drop_figures(reference: Replay) -> None:
    full, three_quarters = reference.drop(1.0), reference.drop(0.75)
    assert round(full.reads_avoided_pct) == 66 and round(full.weight_discarded_pct, 1) == 9.5
    assert round(three_quarters.reads_avoided_pct) == 37
    assert round(three_quarters.weight_discarded_pct, 1) == 4.4


@needs_reference
def test_default_budgets_span_a_token_cycle_to_every_expert() -> None:
    trace = read_route_trace(REFERENCE)
    assert default_budgets(trace) == [250, 500, 1000, 2000, 4000, 8000, 16000, 32000]


@pytest.mark.parametrize(("extra", "own"), [
    (" cache_mib=3", 3.0),
    (" cache_mb=5", 5.0),  # the seed engine's name (and its preamble's): MiB all the same
    (" cache_mib=3 cache_mb=5", 3.0),
    (" cache_mb=auto", None),
    (" cache_mib=0", None),
    ("", None),
])
def test_the_runs_own_budget_is_read_under_either_name(extra: str, own: float | None) -> None:
    trace = parse_route_trace(trace_text(decode_steps([[0], [1]]), extra=extra), "t.csv")
    assert trace.cache_budget_mib == own
    if own is not None:
        assert own in default_budgets(trace)


# -- cache policies on hand-made traces ----------------------------------------------------


def test_lru_cycling_a_working_set_larger_than_the_cache_never_hits() -> None:
    text = trace_text(decode_steps([[e] for e in [0, 1, 2, 3] * 5]))
    assert hits(text, 3, "lru") == (0, 20)
    assert hits(text, 4, "lru") == (16, 20)       # the set fits: only first touches miss


def test_belady_by_hand() -> None:
    # a b c d a b c d through 3 slots. d misses: evict the farthest next use among a (4),
    # b (5), c (6): c. a, b hit. c misses: evict a or b (never used again). d hits.
    text = trace_text(decode_steps([[e] for e in [0, 1, 2, 3, 0, 1, 2, 3]]))
    assert hits(text, 3, "belady") == (3, 8)
    assert hits(text, 3, "lru") == (0, 8)


def test_lfu_by_hand() -> None:
    # a a b c a through 2 slots: c misses with a (2 lookups) and b (1) resident: b goes;
    # a hits. LRU would have evicted a (older than b) and missed it.
    text = trace_text(decode_steps([[e] for e in [0, 0, 1, 2, 0]]))
    assert hits(text, 2, "lfu") == (2, 5)
    assert hits(text, 2, "lru") == (1, 5)


def test_a_batch_never_evicts_its_own_entries() -> None:
    # Prefill: 3 prompt tokens through layer 0 route 0, 1, 0, 2: one batch, 3 lookups (the
    # duplicate 0 only refreshes). A 1-expert cache keeps all three past the batch, so
    # decode's 2 hits; that batch then evicts 0 and 1, and the next 0 misses.
    prefill = [(0, s, 0, [(e, 1.0, 0)]) for s, e in enumerate([0, 1, 0, 2])]
    text = trace_text(prefill + decode_steps([[2], [0]], first_step=4))
    lk = lookups(parse_route_trace(text))
    assert (lk.batches, len(lk)) == (3, 5)
    for policy in ("lru", "lfu", "belady"):
        r = replay_cache(lk, 1, policy)
        assert (r.hits, r.decode_hits, r.decode_lookups) == (1, 1, 2), policy


def test_prefill_batches_are_layer_major_runs() -> None:
    # Two layers, two prompt tokens, layer-major as the engine runs prefill: 2 batches.
    prefill = [(0, s, la, [(e, 1.0, 0)]) for la in range(2) for s, e in enumerate([3, 3])]
    lk = lookups(parse_route_trace(trace_text(prefill, n_layer=2)))
    assert (lk.batches, len(lk)) == (2, 2)


def test_a_miss_costs_its_layers_expert_bytes() -> None:
    text = trace_text(decode_steps([[0], [1], [0]]), expert_bytes=3 * MIB)
    r = replay_cache(lookups(parse_route_trace(text)), 3, "lru")
    assert (r.hits, r.read_bytes) == (0, 9 * MIB)      # one 3 MiB expert fits, not two
    r = replay_cache(lookups(parse_route_trace(text)), 6, "lru")
    assert (r.hits, r.read_bytes) == (1, 6 * MIB)


def test_rows_the_run_dropped_are_not_looked_up() -> None:
    text = trace_text(decode_steps([[0, 1], [0, 1]]), k=2)
    lines = text.splitlines()
    lines[-3] = lines[-3][:-1] + "1"                  # step 0, slot 1 (expert 1) dropped
    lk = lookups(parse_route_trace("\n".join(lines)))
    assert len(lk) == 3


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=40),
       st.integers(1, 6))
def test_belady_never_loses_to_lru_or_lfu(steps: list[list[int]], slots: int) -> None:
    """With equal-sized experts, farthest-next-use is optimal under the batch rule."""
    text = trace_text(decode_steps([sorted(set(s)) for s in steps]), n_expert=6, k=3)
    lk = lookups(parse_route_trace(text))
    best = replay_cache(lk, slots, "belady").hits
    assert best >= replay_cache(lk, slots, "lru").hits
    assert best >= replay_cache(lk, slots, "lfu").hits


# -- predictors and drop on hand-made traces -----------------------------------------------


def test_predictors_by_hand() -> None:
    prompt = [(0, 0, 0, [(4, 0.5, 0), (5, 0.5, 0)]), (0, 1, 0, [(4, 0.5, 0), (6, 0.5, 0)])]
    text = trace_text(prompt + decode_steps([[0, 1], [1, 2], [2, 3], [0, 1]], first_step=2),
                      k=2)
    scores = {(p.name, p.lag): p for p in predictors(parse_route_trace(text))}
    lag1, lag2 = scores["prev_token", 1], scores["prev_token", 2]
    assert (lag1.named, lag1.slots) == (2, 6)         # {1,2}∩{0,1}, {2,3}∩{1,2}, {0,1}∩{2,3}
    assert (lag2.named, lag2.slots) == (1, 4)         # {2,3}∩{0,1}, {0,1}∩{1,2}
    assert scores["prev_token", 8].slots == 0 and scores["prev_token", 8].pct is None
    # Decode counts 0:2 1:3 2:2 3:1 → {1, 0} (0 and 2 tie; lowest id): 1 + 0 + 2 of 6.
    run = scores["run_hottest", None]
    assert (run.named, run.slots, run.tie_layers) == (3, 6, 1)
    assert run.tie_span == pytest.approx((50.0, 400 / 6))   # {1, 2} would name 4
    # The prompt routed 4 twice, then 5 (tie with 6, lowest id): none of it is decoded.
    assert scores["prompt_hottest", None].named == 0
    assert scores["random", None].pct == 25.0


def test_prompt_predictor_without_prefill_is_undefined() -> None:
    scores = predictors(parse_route_trace(trace_text(decode_steps([[0], [1]]))))
    prompt = next(p for p in scores if p.name == "prompt_hottest")
    assert prompt.pct is None


def test_drop_trade_by_hand() -> None:
    text = trace_text([
        (1, 0, 0, [(0, 0.6, 0), (1, 0.3, 0), (2, 0.1, 0)]),     # all misses
        (1, 1, 0, [(0, 0.5, 1), (1, 0.3, 0), (3, 0.2, 1)]),     # 1 misses, 0 and 3 hit
        (1, 2, 0, [(4, 0.1, 0), (5, 0.1, 0), (6, 0.1, 0)]),     # top below the threshold
    ], k=3)
    one, half = drop_trade(parse_route_trace(text), [1.0, 0.5])
    # F = 1 (below 1/3): 0.3 and 0.1 of the first, 0.3 of the second, 5 and 6 of the third
    # (4 is its routing's top, first of a tie, never dropped); hits are never candidates.
    assert (one.dropped, one.candidates) == (5, 5)
    assert (one.avoided_bytes, one.miss_bytes) == (5 * MIB, 7 * MIB)
    assert one.weight_discarded == pytest.approx(0.9)
    assert one.weight_total == pytest.approx(2.3)
    # F = 0.5 (below 1/6): 0.1 of the first, 5 and 6 of the third.
    assert half.dropped == 3 and half.reads_avoided_pct == pytest.approx(300 / 7)


# -- the command ---------------------------------------------------------------------------


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@needs_reference
def test_report_on_the_reference_trace() -> None:
    proc = run_cli("replay", REFERENCE, "--cache-mib", "500", "4000")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert "         500             0.0     0.0     24.8    26.6     42.2    45.3" in lines
    assert "        4000            74.9    80.3     75.4    80.8     86.5    92.7" in lines
    assert any(ln.startswith("  prev-token, lag 1     38.0%    13881 / 36576 slots")
               for ln in lines)
    assert "      1.00      0.1667      4818           66.1%               9.5%" in lines
    assert "      0.75      0.1250      2675           36.8%               4.4%" in lines
    assert any("recorded   74.9% hit (29597/39526 lookups)" in ln for ln in lines)


@needs_reference
def test_json_document_has_stable_keys() -> None:
    proc = run_cli("replay", REFERENCE, "--json", "--cache-mib", "500",
                   "--drop-factors", "1", "0.75")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc) == ["format", "trace", "lookups", "recorded", "cache", "predictors",
                         "drop", "definitions"]
    assert doc["format"] == "abbench-replay v1"
    cache = doc["cache"][0]
    assert list(cache) == ["budget_mib", "budget_bytes", "lru", "lfu", "belady"]
    assert list(cache["belady"]) == ["hits", "lookups", "hit_pct", "decode_hits",
                                     "decode_lookups", "decode_hit_pct", "read_bytes"]
    assert round(cache["belady"]["decode_hit_pct"], 1) == 45.3
    assert [(p["name"], p["lag"]) for p in doc["predictors"]] == [
        ("prev_token", 1), ("prev_token", 2), ("prev_token", 4), ("prev_token", 8),
        ("run_hottest", None), ("prompt_hottest", None), ("random", None)]
    assert doc["predictors"][-1]["named"] is None
    assert [d["factor"] for d in doc["drop"]] == [0.75, 1.0]
    assert round(doc["drop"][1]["reads_avoided_pct"]) == 66


def test_report_renders_a_small_trace_and_marks_the_runs_budget(tmp_path: Path) -> None:
    text = trace_text(decode_steps([[e] for e in [0, 1, 2, 3] * 3]), extra=" cache_mib=3")
    rp = replay(parse_route_trace(text, "small.csv"))
    assert 3.0 in rp.budgets_mib
    report = render(rp)
    assert "           3             0.0     0.0      0.0     0.0     50.0    50.0   " \
           "the run's budget" in report.splitlines()
    assert "  prompt hottest-k         -    no prefill rows in the trace" in report.splitlines()
    assert to_json(rp)["trace"]["path"] == "small.csv"


@pytest.mark.parametrize(("content", "says"), [
    ("", "bad.csv:1: empty file"),
    ("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n0,1,0,0,0,1,1,0,9\n",
     "bad.csv:1: expected `# route_trace v1`"),
    ("# route_trace v1\n# model=m n_layer=1 n_expert=2 n_expert_used=1\n"
     "# layer=0 expert_bytes=9\n0,1,0,0,0,1,1,0,9\n", "bad.csv:4: expected the CSV header"),
    ("# route_trace v1\n# model=m n_layer=1 n_expert=2 n_expert_used=1\n"
     "# layer=0 expert_bytes=9\nturn,phase,step,layer,slot,expert,weight,residency,"
     "expert_bytes\n0,1,0,0,0,x,1,0,9\n", "bad.csv:5: `expert` is `x`"),
    ("# route_trace v1\n# model=m n_layer=1 n_expert=2 n_expert_used=1\n"
     "# layer=0 expert_bytes=9\nturn,phase,step,layer,slot,expert,weight,residency,"
     "expert_bytes\n0,1,0,0,0,1,1,0\n", "bad.csv:5: 8 fields, the header has 9"),
])
def test_malformed_trace_exits_2_with_one_error_line(tmp_path: Path, content: str,
                                                     says: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    line = one_error(run_cli("replay", path))
    assert line.startswith(f"ERROR: {tmp_path}/") and says in line, line


def test_missing_trace_and_bad_flags_exit_2(tmp_path: Path) -> None:
    assert "cannot read route trace" in one_error(run_cli("replay", tmp_path / "absent.csv"))
    good = tmp_path / "good.csv"
    good.write_text(trace_text(decode_steps([[0]])))
    assert "cache size" in one_error(run_cli("replay", good, "--cache-mib", "-1"))
    assert "drop factor" in one_error(run_cli("replay", good, "--drop-factors", "0"))
    assert run_cli("replay", good).returncode == 0


def test_lru_replay_reproduces_the_engines_own_trace(tmp_path: Path) -> None:
    """The engine writes the trace, analysis reads it: at the run's own budget, LRU replay
    must find exactly the hits the engine's cache recorded (the accounting is the same)."""
    path = tmp_path / "tiny.route.csv"
    proc = run_cli("engine", "run", "-m", "synthetic:tiny", "-n", "16", "--cache-mib", "0.25",
                   "--route-trace", path)
    assert proc.returncode == 0, proc.stderr
    lk = lookups(read_route_trace(path))
    ours, theirs = replay_cache(lk, 0.25, "lru"), recorded(lk)
    assert 0 < theirs.hits < theirs.lookups
    assert (ours.hits, ours.decode_hits, ours.read_bytes) == (
        theirs.hits, theirs.decode_hits, theirs.read_bytes)
    assert run_cli("replay", path).returncode == 0


def test_analysis_never_imports_the_engine_or_campaigns() -> None:
    package = Path(abbench.analysis.__file__).parent
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("abbench.engine", "abbench.campaign")), module
