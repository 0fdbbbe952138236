"""The expert-side policies through the CLI and the engine
(docs/engine.md#policies-all-off-by-default-each-prints-its-own-summary-line;
their CSV counters and summary lines: docs/formats.md).

Validation: every inconsistent combination of policy flags is a usage error (exit 2) naming
the flag, before any work. Reporting: each policy prints its own summary line exactly when
it is armed, and the CSV preamble records what was configured. Dropping: `--drop-cold-experts`
drops in decode only unless `--drop-in-prefill`, and a dropped expert is never read.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main

from abbench.cli import main
from abbench.engine.config import EngineConfig
from abbench.engine.experts.policies import (
    Policies,
    Speculation,
    cold_keep,
    kept_weights,
    prev_token_prefetch,
    stale_gate_prefetch,
)
from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.experts.speculation import Speculator
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine, RunResult, model_info
from abbench.engine.streaming.streamer import expert_layout
from abbench.engine.units import MIB
from abbench.errors import ConfigError

CliRun = tuple[list[str], str, dict[str, str], dict[str, str]]  # stdout, stderr, preamble, summary
DropRuns = dict[str, tuple[RunResult, Path]]  # name → (result, its route trace)


def engine_run(model: Path | str, *flags: str) -> list[str]:
    return ["engine", "run", "-m", str(model), "-p", "Policies", *flags]


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "named"), [
    (["--drop-cold-experts", "0"], ["--drop-cold-experts"]),
    (["--drop-cold-experts", "1.5"], ["--drop-cold-experts"]),
    (["--drop-cold-experts", "-0.5"], ["--drop-cold-experts"]),
    (["--drop-cold-experts", "nan"], ["--drop-cold-experts"]),
    (["--drop-cold-experts", "0.5", "--cache-mib", "0"], ["--drop-cold-experts", "--cache-mib"]),
    (["--prefetch", "1", "--predict-prefetch"], ["--prefetch", "--predict-prefetch"]),
    (["--predict-spec-max", "9"], ["--predict-spec-max"]),
    (["--predict-spec-max", "-1"], ["--predict-spec-max"]),
    (["--drop-in-prefill"], ["--drop-in-prefill", "--drop-cold-experts"]),
    (["--drop-no-renorm"], ["--drop-no-renorm", "--drop-cold-experts"]),
    (["--prefetch-sync"], ["--prefetch-sync"]),
    (["--prefetch", "1", "--cache-mib", "0"], ["--prefetch", "--cache-mib"]),
    (["--predict-prefetch", "--cache-mib", "0"], ["--predict-prefetch", "--cache-mib"]),
    (["--prefetch", "65"], ["--prefetch"]),
])
def test_policy_flags_are_validated(flags: list[str], named: list[str], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Before any work: the model does not even exist."""
    rc, out, err = run_main(engine_run(tmp_path / "absent.gguf", *flags), capsys)
    assert rc == 2
    assert out == ""
    errors = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    for flag in named:
        assert re.search(rf"`{flag}[` ]", errors[0]), errors[0]


@pytest.mark.parametrize("fields", [
    {"drop_cold_experts": 1.0}, {"drop_cold_experts": 1e-9, "drop_in_prefill": True},
    {"drop_cold_experts": 0.5, "resident": True, "cache_mib": 0},
    {"predict_prefetch": True, "predict_spec_max": 0},
    {"predict_prefetch": True, "predict_spec_max": 8, "prefetch_sync": True},
    {"prefetch": 64, "prefetch_sync": True}, {"predict_spec_max": 8},
])
def test_valid_policy_settings(fields: dict[str, object]) -> None:
    EngineConfig(model="m.gguf", **fields)  # type: ignore[arg-type]  # a table of fields


def test_config_error_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"`--predict-prefetch` and `--prefetch`"):
        EngineConfig(model="m.gguf", prefetch=2, predict_prefetch=True)


# -- the policy functions, on their own -------------------------------------------------------


def f32(*w: float) -> np.ndarray:
    return np.array(w, np.float32)


@pytest.mark.parametrize(("weights", "resident", "frac", "keep"), [
    ((0.12, 0.55, 0.25, 0.08), (False,) * 4, 0.75, [False, True, True, False]),  # F/k 0.1875
    ((0.12, 0.55, 0.25, 0.08), (True, False, False, False), 0.75, [True, True, True, False]),
    ((0.15, 0.15, 0.15, 0.15), (False,) * 4, 0.75, [True, False, False, False]),  # top: first
    ((0.05, 0.15, 0.1, 0.05), (False, False, False, True), 0.75, [False, True, False, True]),
    ((0.5, 0.125, 0.25, 0.125), (False,) * 4, 0.5, [True] * 4),  # exactly F/k is kept
    ((1.0,), (False,), 1.0, [True]),
])
def test_cold_keep(weights: tuple[float, ...], resident: tuple[bool, ...], frac: float,
                   keep: list[bool]) -> None:
    got = cold_keep(f32(*weights), resident, frac)
    assert got == keep and all(type(b) is bool for b in got)


@pytest.mark.parametrize(("renorm", "expected"), [(True, [0.625, 0.375]), (False, [0.5, 0.3])])
def test_kept_weights(renorm: bool, expected: list[float]) -> None:
    w = f32(0.5, 0.1, 0.3, 0.1)
    got = kept_weights(w, [True, False, True, False], renorm)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_array_equal(w, f32(0.5, 0.1, 0.3, 0.1))  # the routing is not touched


def test_policies_say_when_they_apply() -> None:
    assert Policies().drop_frac_in(1) is None and not Policies().speculates
    decode_only = Policies(drop_frac=0.5)
    assert (decode_only.drop_frac_in(0), decode_only.drop_frac_in(1)) == (None, 0.5)
    assert Policies(drop_frac=0.5, drop_in_prefill=True).drop_frac_in(0) == 0.5
    assert Policies(prefetch=1).speculates and Policies(predict_prefetch=True).speculates


@pytest.mark.parametrize(("layer", "depth", "read"), [
    (0, 2, [(1, 3), (1, 4), (2, 5)]),
    (1, 1, [(2, 5)]),
    (2, 5, [(3, 6), (3, 7)]),  # as far as the model goes
    (3, 1, []),  # the last layer has no next one
])
def test_prev_token_prefetch(layer: int, depth: int, read: list[tuple[int, int]]) -> None:
    prev = [[1, 2], [3, 4], [5], [6, 7]]
    assert prev_token_prefetch(layer, prev, depth) == Speculation(read, [])


@pytest.mark.parametrize(("spec_max", "drop", "weights", "read"), [
    (2, None, (0.4, 0.3, 0.2, 0.1), [4, 7]),  # 2 is resident: retained, not a slot of the cap
    (8, None, (0.4, 0.3, 0.2, 0.1), [4, 7, 0]),
    (1, None, (0.4, 0.3, 0.2, 0.1), [4]),
    (0, None, None, []),  # retention only: no weights needed
    (8, None, None, [4, 7, 0]),
    (8, 0.75, (0.6, 0.25, 0.1, 0.05), [4]),  # 7 and 0 below F/k = 0.1875
    (8, 0.75, (0.15, 0.15, 0.15, 0.15), [4]),  # the top prediction is always read
    (8, 0.5, (0.4, 0.3, 0.2, 0.1), [4, 7]),  # F/k = 0.125
    (8, 0.75, None, [4, 7, 0]),  # no predicted weights: nothing to drop by
])
def test_stale_gate_prefetch(spec_max: int, drop: float | None,
                             weights: tuple[float, ...] | None, read: list[int]) -> None:
    resident = {(1, 2), (1, 5), (2, 4)}
    pw = None if weights is None else f32(*weights)
    got = stale_gate_prefetch(1, np.array([4, 2, 7, 0]), pw, resident, spec_max, drop)
    assert got == Speculation([(1, e) for e in read], [(1, 2)])


# -- the k <= 4 warning ------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "warned"), [(None, True), (5, False), (2, True)])
def test_dropping_at_small_k_warns_once(small_model: Path, capsys: pytest.CaptureFixture[str],
                                        k: int | None, warned: bool) -> None:
    flags = ["-n", "2", "--cache-mib", "2", "--drop-cold-experts", "0.75", "-q"]
    if k is not None:
        flags += ["--n-expert-used", str(k)]
    rc, _, err = run_main(engine_run(small_model, *flags), capsys)
    assert rc == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("WARNING:")]
    if warned:
        assert len(warnings) == 1, err
        assert f"top-{k or 4}" in warnings[0] and "--drop-cold-experts" in warnings[0]
    else:
        assert warnings == [], err


# -- summary lines and the CSV preamble ----------------------------------------------------------

# Speculation is synchronous here so that what each run read does not depend on timing.
ARMED = {
    "plain": [],
    "drop+predict": ["--drop-cold-experts", "0.5", "--predict-prefetch", "--predict-spec-max",
                     "1", "--prefetch-sync", "--predict-log"],
    "prefetch": ["--prefetch", "2", "--prefetch-sync"],
    "predict-prefetch": ["--predict-prefetch", "--prefetch-sync"],
    "predict-log": ["--predict-log"],
}


@pytest.fixture(scope="module")
def cli_runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CliRun]:
    """name → (stdout lines, stderr, CSV preamble, CSV summary) of a tiny run per setting."""
    folder = tmp_path_factory.mktemp("cli")
    out = {}
    for name, flags in ARMED.items():
        csv_path = folder / f"{name}.csv"
        stdout, stderr = io.StringIO(), io.StringIO()
        argv = engine_run(tiny_model, "-n", "8", "--cache-mib", "0.1", "--csv", str(csv_path),
                          *flags)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(argv)
        assert rc == 0, stderr.getvalue()
        lines = csv_path.read_text().splitlines()
        assert lines[0] == "# bmoe_metrics v2"
        summary = next(ln for ln in lines if ln.startswith("# summary "))
        out[name] = (stdout.getvalue().splitlines(), stderr.getvalue(),
                     dict(kv.split("=", 1) for kv in lines[1][2:].split()),
                     dict(kv.split("=", 1) for kv in summary[len("# summary "):].split()))
    return out


@pytest.mark.parametrize("name", list(ARMED))
def test_policy_lines_appear_iff_armed(cli_runs: dict[str, CliRun], name: str) -> None:
    lines, _, _, summary = cli_runs[name]
    flags = ARMED[name]
    drop = [ln for ln in lines if ln.startswith("moe-drop:")]
    prefetch = [ln for ln in lines if ln.startswith("moe-prefetch:")]
    predict = [ln for ln in lines if ln.startswith("moe-predict:")]
    assert len(drop) == ("--drop-cold-experts" in flags)
    speculates = "--prefetch" in flags or "--predict-prefetch" in flags
    assert len(prefetch) == speculates
    assert len(predict) == 2 * ("--predict-log" in flags)
    assert any(ln.startswith("moe-cache:") for ln in lines)
    if prefetch:
        m = re.fullmatch(r"moe-prefetch: ([\d.]+) MiB speculative, (\d+)/(\d+) experts useful "
                         r"\((\d+%|-)\).*", prefetch[0])
        assert m, prefetch[0]
        assert (m[2], m[3]) == (summary["spec_useful"], summary["spec_experts"])
        assert int(m[3]) > 0, "a tiny run with a 4-expert cache should speculate"
        if "--predict-prefetch" in flags:
            assert prefetch[0].endswith("[stale-gate]"), prefetch[0]
        else:
            assert "stale-gate" not in prefetch[0] and prefetch[0].endswith("[prev-token]")
    if predict:
        at = lines.index(predict[1])
        assert lines[at + 1].split() == ["layer", "stale", "prev", "ctrl", "routings"]
        assert "fresh-gate control 100.0% (100.0%)" in predict[0]


def test_drop_line(cli_runs: dict[str, CliRun]) -> None:
    lines, _, _, summary = cli_runs["drop+predict"]
    line = next(ln for ln in lines if ln.startswith("moe-drop:"))
    m = re.fullmatch(r"moe-drop: (\d+)/(\d+) routed experts dropped \((\d+\.\d)%\), "
                     r"threshold (\S+) x uniform", line)
    assert m, line
    dropped, routed = int(m[1]), int(m[2])
    assert (m[1], m[2]) == (summary["experts_dropped"], summary["experts_routed"])
    assert 0 < dropped < routed
    assert m[3] == f"{100 * dropped / routed:.1f}" and m[4] == "0.5"


@pytest.mark.parametrize(("name", "expected"), [
    ("plain", {"prefetch": "0", "predict_prefetch": "0", "predict_spec_max": "0",
               "predict_log": "0", "drop_cold_frac": "0"}),
    ("drop+predict", {"prefetch": "0", "predict_prefetch": "1", "predict_spec_max": "1",
                      "predict_log": "1", "drop_cold_frac": "0.5"}),
    ("prefetch", {"prefetch": "2", "predict_prefetch": "0", "predict_spec_max": "0",
                  "predict_log": "0", "drop_cold_frac": "0"}),
    ("predict-prefetch", {"prefetch": "0", "predict_prefetch": "1", "predict_spec_max": "2",
                          "predict_log": "0", "drop_cold_frac": "0"}),
])
def test_csv_preamble_records_the_policies(cli_runs: dict[str, CliRun], name: str,
                                           expected: dict[str, str]) -> None:
    preamble = cli_runs[name][2]
    assert {k: preamble.get(k) for k in expected} == expected


def test_json_of_a_dropping_run(small_model: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    rc, _, err = run_main(engine_run(small_model, "-n", "4", "--cache-mib", "3",
                                     "--drop-cold-experts", "0.75", "--json", str(out)), capsys)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert doc["summary"]["experts_dropped"] > 0


# -- dropping in the engine ----------------------------------------------------------------------


def small_cache_mib(r: RunResult, n_experts: float) -> float:
    return n_experts * int(r.model["expert_f32_bytes"]) / MIB


@pytest.fixture(scope="module")
def drop_runs(small_model: Path, tmp_path_factory: pytest.TempPathFactory) -> DropRuns:
    folder = tmp_path_factory.mktemp("drop")
    info = model_info(ModelFile(small_model))
    k = int(info["n_expert_used"])
    cache = (2 * k + 0.5) * int(info["expert_f32_bytes"]) / MIB  # two layers' routing
    out = {}
    for name in ("decode", "prefill"):
        trace = folder / f"{name}.csv"
        cfg = EngineConfig(model=str(small_model), prompt="Drop me", n_tokens=16, seed=2,
                           cache_mib=cache, drop_cold_experts=0.75, route_trace=str(trace),
                           drop_in_prefill=name == "prefill")
        with pytest.warns(RuntimeWarning, match="top-4"), Engine(cfg, small_model) as engine:
            out[name] = (engine.run(), trace)
    return out


def test_drops_in_decode_only_by_default(drop_runs: DropRuns) -> None:
    r, _ = drop_runs["decode"]
    k, n_layer = int(r.model["n_expert_used"]), int(r.model["n_layer"])
    assert small_cache_mib(r, 2 * k) < r.cache_budget_mib < small_cache_mib(r, 2 * k + 1)
    assert sum(rec.experts_dropped for rec in r.decode) > 0
    assert len(r.prefill) > 0 and all(rec.experts_dropped == 0 for rec in r.prefill)
    assert all(rec.experts_routed == n_layer * k * rec.tokens for rec in r.records)


def test_drops_in_prefill_when_asked(drop_runs: DropRuns) -> None:
    r, _ = drop_runs["prefill"]
    assert sum(rec.experts_dropped for rec in r.prefill) > 0
    assert sum(rec.experts_dropped for rec in r.decode) > 0


@pytest.mark.parametrize("name", ["decode", "prefill"])
def test_dropped_experts_are_never_read(drop_runs: DropRuns, name: str) -> None:
    """Per pass: bytes read == (misses that were not dropped) x the expert's file bytes."""
    r, trace = drop_runs[name]
    rows = [ln.split(",") for ln in trace.read_text().splitlines() if not ln.startswith("#")]
    header, body = rows[0], rows[1:]
    col = {c: i for i, c in enumerate(header)}
    read: dict[tuple[int, int], int] = defaultdict(int)
    dropped: dict[tuple[int, int], int] = defaultdict(int)
    assert len(r.prefill) == 1  # one batch: its rows are every prompt token's
    for row in body:
        phase = int(row[col["phase"]])
        key = (phase, int(row[col["step"]]) if phase else 0)
        if row[col["dropped"]] == "1":
            dropped[key] += 1
        elif row[col["residency"]] == "0":
            read[key] += int(row[col["expert_bytes"]])
    assert sum(dropped.values()) > 0
    for rec in r.records:
        key = (rec.phase, rec.step - 1 if rec.phase else 0)
        assert rec.read_bytes == read[key], (name, rec)
        assert rec.experts_dropped == dropped[key], (name, rec)


# -- the drop rule, expert by expert --------------------------------------------------------------


def moe(runner: ExpertRunner, layer: int, x: np.ndarray, ids: list[int] | np.ndarray,
        weights: np.ndarray, phase: int) -> np.ndarray:
    """What `SparseMoE` does with a routing: the drop policy, the experts, the weighted sum."""
    chosen = runner.select(layer, np.asarray(ids), weights, phase)
    return chosen.weights @ runner(layer, x, chosen, phase)  # (k',) @ (k', d) → (d,)


class Experts:
    """`ExpertRunner`s over `tiny`'s layer 0: a resident reference and a dropping one."""

    def __init__(self, path: Path, renorm: bool) -> None:
        mf = ModelFile(path)
        info = model_info(mf)
        layout = expert_layout(mf, int(info["n_layer"]), int(info["n_expert"]))
        self.expert_bytes = int(info["expert_bytes"])
        self.d = int(info["d_model"])
        self.ref = ExpertRunner(mf, layout, cache_mib=0, resident=True, io_lanes=2,
                                o_direct=True, overlap=False, threads=1, max_k=4)
        self.drop = ExpertRunner(mf, layout, cache_mib=64, resident=False, io_lanes=2,
                                 o_direct=True, overlap=False, threads=1, max_k=4,
                                 policies=Policies(drop_frac=0.75, drop_renorm=renorm))

    def expert(self, e: int, x: np.ndarray) -> np.ndarray:
        return moe(self.ref, 0, x, [e], np.array([1.0], np.float32), 1)

    def close(self) -> None:
        self.ref.close()
        self.drop.close()


@pytest.mark.filterwarnings("ignore:--drop-cold-experts with top-:RuntimeWarning")
@pytest.mark.parametrize("renorm", [True, False])
def test_drop_rule_by_hand(tiny_model: Path, renorm: bool) -> None:
    """Below F/k and not resident: skipped unread; the top expert and residents are kept;
    survivors carry the routing's original mass unless --drop-no-renorm."""
    ex = Experts(tiny_model, renorm)
    x = np.random.default_rng(0).standard_normal(ex.d).astype(np.float32)
    threshold = 0.75 / 4
    # (ids, weights, experts kept): the cache starts empty.
    steps = [
        ([3, 5, 1, 6], [0.12, 0.55, 0.25, 0.08], [5, 1]),  # 3 and 6 below the threshold
        ([1, 3, 5, 6], [0.5, 0.1, 0.3, 0.1], [1, 5]),  # 1, 5 resident; 3, 6 cold and light
        ([2, 4, 1, 7], [0.15, 0.1, 0.05, 0.05], [2, 1]),  # 2 is the top, though light; 1 hot
    ]
    try:
        for ids, weights, kept in steps:
            w = np.array(weights, np.float32)
            tok = ex.drop.tok
            tok.reset()
            resident_before = {e for e in ids if ex.drop.cache.peek((0, e))}
            got = moe(ex.drop, 0, x, ids, w, 1)
            keep = [j for j, e in enumerate(ids) if e in kept]
            scale = w.sum() / w[keep].sum() if renorm else 1.0
            expected = sum(w[j] * scale * ex.expert(ids[j], x) for j in keep)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
            assert all(w[j] < threshold for j, e in enumerate(ids) if e not in kept)
            assert tok.experts_routed == 4 and tok.experts_dropped == 4 - len(kept)
            read = [e for e in kept if e not in resident_before]
            assert tok.read_bytes == len(read) * ex.expert_bytes, (ids, read)
            for e in ids:
                assert ex.drop.cache.peek((0, e)) == (e in kept or e in resident_before), e
    finally:
        ex.close()


# -- what `--predict-prefetch` speculates ----------------------------------------------------------


@dataclass
class FakePrediction:
    """Stands in for `RoutePredictor`: a fixed stale-gate prediction for layer 1."""

    pred_ids: list[np.ndarray | None]
    pred_weights: list[np.ndarray | None]


@pytest.mark.filterwarnings("ignore:--drop-cold-experts with top-:RuntimeWarning")
@pytest.mark.parametrize(("spec_max", "drop", "weights", "read"), [
    (2, None, [0.4, 0.3, 0.2, 0.1], [4, 7]),  # 2 is resident: retained, not a slot of the cap
    (8, None, [0.4, 0.3, 0.2, 0.1], [4, 7, 0]),
    (1, None, [0.4, 0.3, 0.2, 0.1], [4]),
    (0, None, [0.4, 0.3, 0.2, 0.1], []),  # retention only
    (8, 0.75, [0.6, 0.25, 0.1, 0.05], [4]),  # 7 and 0 below F/k = 0.1875: dropping skips them
    (8, 0.75, [0.15, 0.15, 0.15, 0.15], [4]),  # the top prediction is always kept
    (8, 0.5, [0.4, 0.3, 0.2, 0.1], [4, 7]),  # F/k = 0.125
])
def test_predict_prefetch_speculates(tiny_model: Path, spec_max: int, drop: float | None,
                                     weights: list[float], read: list[int]) -> None:
    mf = ModelFile(tiny_model)
    info = model_info(mf)
    layout = expert_layout(mf, int(info["n_layer"]), int(info["n_expert"]))
    runner = ExpertRunner(
        mf, layout, cache_mib=64, resident=False, io_lanes=2, o_direct=True, overlap=False,
        threads=1, max_k=4, policies=Policies(drop_frac=drop, predict_prefetch=True,
                                              spec_max=spec_max, prefetch_sync=True))
    runner.predictor = FakePrediction(  # type: ignore[assignment]
        [None, np.array([4, 2, 7, 0]), None, None],
        [None, np.array(weights, np.float32), None, None])
    x = np.ones(int(info["d_model"]), np.float32)
    one = np.array([1.0], np.float32)
    try:
        for e in (2, 5):  # layer 1's experts 2 then 5 resident, 2 the older
            moe(runner, 1, x, [e], one, 0)
        runner.begin_pass(1, 0)
        moe(runner, 0, x, [1], one, 1)  # layer 0's load, then speculation
        tok = runner.tok
        if spec_max == 0:  # retention only waits for layer 1's lookups (`_speculate`)
            assert tok.retained == 0
            moe(runner, 1, x, [3], one, 1)  # a miss: 2 is refreshed before it is read
            assert tok.retained == 1 and tok.spec_experts == 0
            assert [e for layer, e in runner.cache.entries if layer == 1] == [5, 2, 3]
            return
        assert tok.retained == 1
        assert tok.spec_experts == len(read) and tok.spec_cancelled == 0
        assert tok.spec_read_bytes == len(read) * int(info["expert_bytes"])
        assert tok.misses == 1 and tok.read_bytes == int(info["expert_bytes"])
        layer1 = [e for layer, e in runner.cache.entries if layer == 1]
        assert layer1 == [5, 2, *read], "retention refreshes 2 before the speculative reads"
        assert runner.cache.speculative == {(1, e) for e in read}
        moe(runner, 1, x, [4, 2, 7, 0], np.full(4, 0.25, np.float32), 1)
        assert tok.spec_useful == len(read)
    finally:
        runner.close()


def _lru_after_each_load(path: Path, deferred: bool, monkeypatch: pytest.MonkeyPatch,
                         ) -> list[tuple[object, ...]]:
    """The cache's LRU order and counters after every layer's lookups of a streaming
    retention-only run, with the refresh deferred to the next layer's lookups (the
    engine's way) or made at once (the policy's answer applied where it is given)."""
    if not deferred:
        def at_once(self: Speculator, layer: int, in_use: object) -> None:
            host = self.host
            pred = self.predictor.pred_ids[layer + 1] if layer + 1 < len(host.layout) else None
            if pred is not None:
                plan = stale_gate_prefetch(layer + 1, pred, None, host.cache.entries, 0, None)
                host.tok.retained += host.cache.retain(plan.retain)

        monkeypatch.setattr(Speculator, "speculate", at_once)
    states: list[tuple[object, ...]] = []
    load = ExpertRunner.load

    def recording(self: ExpertRunner, layer: int, experts: list[int]) -> object:
        out = load(self, layer, experts)
        c = self.cache.counters
        states.append((layer, tuple(self.cache.entries), c.hits, c.misses, c.evictions,
                       self.tok.retained))
        return out

    monkeypatch.setattr(ExpertRunner, "load", recording)
    cfg = EngineConfig(model=str(path), prompt="Retain me", n_tokens=12, seed=3,
                       cache_mib=0.3, predict_prefetch=True, predict_spec_max=0)
    with Engine(cfg, path) as engine:
        engine.run()
    monkeypatch.undo()
    return states


def test_deferred_retention_leaves_the_lru_as_retention_at_once(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deferred = _lru_after_each_load(tiny_model, True, monkeypatch)
    at_once = _lru_after_each_load(tiny_model, False, monkeypatch)
    assert deferred == at_once
    evictions = deferred[-1][4]
    assert isinstance(evictions, int) and evictions > 0, "a cache too large tests nothing"
    assert any(state[5] for state in deferred), "nothing predicted was resident"


def test_a_resident_run_retains_every_prediction(tiny_model: Path) -> None:
    """Every expert is resident, so each decode step retains all k predictions of every
    layer but the first (the shortcut of a complete cache counts what it would refresh)."""
    cfg = EngineConfig(model=str(tiny_model), prompt="Retain me", n_tokens=5, seed=3,
                       resident=True, predict_prefetch=True, predict_spec_max=0)
    with Engine(cfg, tiny_model) as engine:
        assert engine.runner.cache.complete
        result = engine.run()
        n_layer, k = len(engine.model.layers), engine.model.k
    decode = [r for r in result.records if r.phase == 1]
    assert decode and all(r.retained == (n_layer - 1) * k for r in decode)
