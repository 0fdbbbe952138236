"""What a run reports, checked on real runs of the tiny model: CSV, summary lines, JSON,
time accounting and the fingerprint."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from abbench.engine.config import EngineConfig
from abbench.engine.run import telemetry
from abbench.engine.run.session import Engine, RunResult
from abbench.engine.units import MIB
from abbench.records.cell_files import read_cell_files
from abbench.records.metrics_file import Pressure
from abbench.records.summary import JSON_FORMAT
from abbench.records.tokens import PER_TOKEN_COLUMNS, PREFILL_COLUMNS

N = 8
PROMPT = "Hello there"

PREAMBLE_KEYS = [
    "model", "arch", "n_layer", "n_expert", "n_expert_used", "threads", "cache_mb",
    "io_threads", "o_direct", "overlap", "prefetch", "predict_prefetch", "predict_spec_max",
    "predict_log", "dense_weights", "drop_cold_frac",
]
ROW_KEYS = [
    "step", "steps", "wall_ms", "io_ms", "compute_ms", "read_bytes", "cache_hit_pct",
    "stall_ms", "mgmt_ms", "majflt", "cpu_ms",
]
SUMMARY_KEYS = [
    "tokens", "s/tok", "tok/s", "read_MiB", "cache_hit_pct", "stall_s/tok", "majflt/tok",
    "cpu_s/tok", "experts_routed", "experts_dropped", "spec_read_MiB", "spec_experts",
    "spec_useful",
]


def run(model: Path, cache_mib: float, **kw: Any) -> RunResult:
    cfg = EngineConfig(model=str(model), prompt=PROMPT, n_tokens=N, cache_mib=cache_mib,
                       threads=2, **kw)
    with Engine(cfg, model) as engine:
        return engine.run()


@pytest.fixture(scope="module")
def result(tiny_model: Path) -> RunResult:
    return run(tiny_model, 0.05)


@pytest.fixture(scope="module")
def again(tiny_model: Path) -> RunResult:
    return run(tiny_model, 0.05)


@pytest.fixture(scope="module")
def overlapped(tiny_model: Path) -> RunResult:
    return run(tiny_model, 0.05, overlap=True)


@pytest.fixture(scope="module")
def big_cache(tiny_model: Path) -> RunResult:
    return run(tiny_model, 4.0)


def parse_csv(text: str) -> tuple[list[str], list[dict[str, str]], dict[str, str]]:
    lines = text.splitlines()
    comments = [ln for ln in lines if ln.startswith("#")]
    body = "\n".join(ln for ln in lines if not ln.startswith("#"))
    rows = list(csv.DictReader(io.StringIO(body)))
    summary = [ln for ln in comments if ln.startswith("# summary ")]
    assert len(summary) == 1
    assert lines[-1] == summary[0]
    pairs = dict(kv.split("=", 1) for kv in summary[0][len("# summary "):].split())
    return comments, rows, pairs


# -- CSV ------------------------------------------------------------------------------------


def test_csv_preamble(result: RunResult) -> None:
    text = telemetry.csv_text(result)
    lines = text.splitlines()
    assert lines[0] == "# bmoe_metrics v2"
    assert lines[1].startswith("# ")
    pairs = dict(kv.split("=", 1) for kv in lines[1][2:].split(" "))
    assert [k for k in PREAMBLE_KEYS if k not in pairs] == []
    assert pairs["arch"] == "qwen3moe"
    assert (pairs["n_layer"], pairs["n_expert"], pairs["n_expert_used"]) == ("4", "8", "2")
    assert pairs["threads"] == "2"
    assert float(pairs["cache_mb"]) == pytest.approx(0.05)
    assert pairs["io_threads"] == "4"
    assert pairs["o_direct"] == str(int(result.o_direct))
    assert pairs["overlap"] == "0"
    assert pairs["dense_weights"] == "anon"


def test_csv_header_and_one_row_per_decode_token(result: RunResult) -> None:
    comments, rows, _ = parse_csv(telemetry.csv_text(result))
    header = telemetry.csv_text(result).splitlines()[2].split(",")
    assert [k for k in ROW_KEYS if k not in header] == []
    assert len(rows) == N == len(result.decode)
    assert [int(r["step"]) for r in rows] == list(range(1, N + 1))
    assert {r["steps"] for r in rows} == {str(N)}
    expert_bytes = result.model["expert_bytes"]
    for r in rows:
        assert int(r["hits"]) + int(r["misses"]) == int(r["experts_routed"]) == 4 * 2
        assert int(r["read_bytes"]) == int(r["misses"]) * expert_bytes
        looked = int(r["hits"]) + int(r["misses"])
        assert float(r["cache_hit_pct"]) == pytest.approx(100 * int(r["hits"]) / looked, abs=0.01)


def test_csv_summary_line(result: RunResult) -> None:
    _, rows, s = parse_csv(telemetry.csv_text(result))
    assert [k for k in SUMMARY_KEYS if k not in s] == []
    assert int(s["tokens"]) == N
    wall_s = sum(float(r["wall_ms"]) for r in rows) / 1e3
    assert float(s["tok/s"]) == pytest.approx(N / wall_s, rel=0.01)
    assert float(s["s/tok"]) == pytest.approx(wall_s / N, abs=1e-4)
    read = sum(int(r["read_bytes"]) for r in rows)
    assert float(s["read_MiB"]) == pytest.approx(read / MIB, abs=1e-4)
    hits = sum(int(r["hits"]) for r in rows)
    misses = sum(int(r["misses"]) for r in rows)
    assert float(s["cache_hit_pct"]) == pytest.approx(100 * hits / (hits + misses), abs=1e-3)
    assert int(s["experts_routed"]) == N * 4 * 2
    assert int(s["experts_dropped"]) == 0
    assert float(s["stall_s/tok"]) == pytest.approx(
        sum(float(r["stall_ms"]) for r in rows) / 1e3 / N, abs=1e-4)


def test_csv_rows_keep_the_time_accounting(result: RunResult) -> None:
    _, rows, _ = parse_csv(telemetry.csv_text(result))
    for r in rows:
        parts = float(r["compute_ms"]) + float(r["mgmt_ms"]) + float(r["stall_ms"])
        assert float(r["wall_ms"]) == pytest.approx(parts, abs=0.0025)  # 3 decimals each


@pytest.mark.parametrize("which", ["result", "overlapped"])
def test_time_accounting_every_record(request: pytest.FixtureRequest, which: str) -> None:
    res: RunResult = request.getfixturevalue(which)
    assert res.prefill, "the prompt has more than one token"
    assert res.config.overlap is (which == "overlapped")
    for r in res.records:
        assert min(r.wall_ms, r.compute_ms, r.mgmt_ms, r.stall_ms, r.io_ms) >= 0.0
        assert r.wall_ms == pytest.approx(r.compute_ms + r.mgmt_ms + r.stall_ms, abs=1e-6)
        assert r.stall_ms <= r.wall_ms


def test_write_csv_writes_csv_text(result: RunResult, tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    telemetry.write_csv(str(path), result)
    assert path.read_text() == telemetry.csv_text(result)


# -- summary lines ----------------------------------------------------------------------------

NUM = r"(\d+(?:\.\d+)?)"
SHAPES = {
    "generation:": rf"generation: (\d+) tokens, {NUM} s/token \({NUM} tok/s\)$",
    "compute:": r"compute: \d+ threads, ",
    "moe-stream:": (
        rf"moe-stream: read {NUM} MiB \({NUM} MiB/token\), decode {NUM} s/token "
        rf"\(compute {NUM} \+ cache mgmt {NUM} \+ flash I/O {NUM} s/token, {NUM} MiB/s\)"
    ),
    "moe-cache:": rf"moe-cache: {NUM}% hit, resident {NUM} MiB",
}


def test_summary_lines_have_the_documented_shapes(result: RunResult) -> None:
    lines = telemetry.summary_lines(result)
    assert [ln.split(" ", 1)[0] for ln in lines] == list(SHAPES)
    found = {}
    for line, (prefix, shape) in zip(lines, SHAPES.items()):
        m = re.match(shape, line)
        assert m, f"{line!r} does not match {shape!r}"
        found[prefix] = m.groups()
    s = telemetry.summarize(result)
    assert int(found["generation:"][0]) == N
    assert float(found["generation:"][2]) == pytest.approx(s.tok_per_s, rel=1e-3, abs=1e-3)
    assert float(found["moe-stream:"][0]) == pytest.approx(s.read_mib, abs=0.05)
    assert float(found["moe-cache:"][0]) == pytest.approx(s.cache_hit_pct, abs=0.05)
    # nothing armed: no prefetch, drop or predictor lines
    assert not [ln for ln in lines if ln.startswith(("moe-prefetch:", "moe-drop:", "moe-predict:"))]


def test_summary_lines_do_not_round_a_small_budget_to_zero(result: RunResult) -> None:
    (line,) = [ln for ln in telemetry.summary_lines(result) if ln.startswith("moe-cache:")]
    assert "budget 0 MiB" not in line


# -- JSON -------------------------------------------------------------------------------------


def test_json_doc(result: RunResult, tmp_path: Path) -> None:
    doc = telemetry.json_doc(result)
    text = json.dumps(doc, allow_nan=False)  # raises on NaN/inf anywhere
    assert json.loads(text)["fingerprint"] == doc["fingerprint"]
    assert doc["format"] == JSON_FORMAT
    assert list(doc)[:12] == ["format", "config", "resolved", "model", "fingerprint",
                              "summary", "lines", "prompt_ids", "output_ids", "text",
                              "per_token", "prefill"]
    assert list(doc)[12:] == list(result.extra)  # the run's own sections, after
    assert tuple(doc["per_token"]) == PER_TOKEN_COLUMNS
    assert tuple(doc["prefill"]) == PREFILL_COLUMNS
    assert doc["config"]["model"] == result.config.model
    assert doc["config"]["n_tokens"] == N
    assert doc["config"]["cache_mib"] == pytest.approx(0.05)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", doc["fingerprint"])
    for key in ("wall_ms", "io_ms", "compute_ms", "stall_ms"):
        values = doc["per_token"][key]
        assert len(values) == N
        assert all(isinstance(v, float) and math.isfinite(v) for v in values)
    assert doc["per_token"]["wall_ms"] == [r.wall_ms for r in result.decode]
    assert doc["resolved"]["o_direct"] is result.o_direct
    # the synthetic model's sampling defaults, as the engine resolved them
    assert doc["resolved"]["repeat_penalty"] == 1.1 and doc["resolved"]["repeat_last_n"] == 64
    assert doc["summary"]["tokens"] == N
    assert doc["lines"] == telemetry.summary_lines(result)
    assert doc["output_ids"] == list(result.output_ids) and len(doc["output_ids"]) == N
    path = tmp_path / "run.json"
    telemetry.write_json(str(path), result)
    assert json.loads(path.read_text())["fingerprint"] == doc["fingerprint"]


def test_the_json_written_reads_back_as_the_cells_files(result: RunResult,
                                                      tmp_path: Path) -> None:
    telemetry.write_json(str(tmp_path / "summary.json"), result)
    got = read_cell_files(tmp_path)
    s = telemetry.summarize(result)
    assert got.source == "per_token" and tuple(got.columns) == PER_TOKEN_COLUMNS
    assert got.columns["wall_ms"] == [r.wall_ms for r in result.decode]
    assert got.columns["read_bytes"] == [float(r.read_bytes) for r in result.decode]
    assert got.summary == s and got.fingerprint == telemetry.fingerprint(result)
    assert got.threads == result.threads == 2
    assert (got.notes, got.repetitions, got.metrics) == ((), False, Pressure())


def test_json_turns_non_finite_numbers_into_null(result: RunResult) -> None:
    recs = tuple(dataclasses.replace(r, rss_mib=float("nan")) for r in result.records)
    doc = telemetry.json_doc(dataclasses.replace(result, records=recs))
    json.dumps(doc, allow_nan=False)
    assert doc["per_token"]["rss_mib"] == [None] * N


# -- fingerprint ------------------------------------------------------------------------------


def test_fingerprint_ignores_timing(result: RunResult, again: RunResult) -> None:
    assert [r.wall_ms for r in result.records] != [r.wall_ms for r in again.records]
    assert result.output_ids == again.output_ids
    assert telemetry.fingerprint(result) == telemetry.fingerprint(again)
    slow = tuple(dataclasses.replace(r, wall_ms=r.wall_ms * 10, io_ms=0.0, cpu_ms=1.0)
                 for r in result.records)
    assert telemetry.fingerprint(dataclasses.replace(result, records=slow, load_s=99.0)) == \
        telemetry.fingerprint(result)


def test_fingerprint_follows_the_work(result: RunResult, big_cache: RunResult) -> None:
    # A bigger cache does the same arithmetic (same tokens) but reads less.
    assert big_cache.output_ids == result.output_ids
    assert sum(r.read_bytes for r in big_cache.records) < sum(r.read_bytes for r in result.records)
    assert telemetry.fingerprint(big_cache) != telemetry.fingerprint(result)
    more = tuple(dataclasses.replace(r, read_bytes=r.read_bytes + 1) if i == 0 else r
                 for i, r in enumerate(result.records))
    assert telemetry.fingerprint(dataclasses.replace(result, records=more)) != \
        telemetry.fingerprint(result)


def test_time_to_first_token_is_the_prefill_batch_and_decode_step_one(result: RunResult,
                                                                       tmp_path: Path) -> None:
    s = telemetry.summarize(result)
    (batch,) = result.prefill
    assert batch.tokens == len(result.prompt_ids) - 1
    assert s.ttft_s == pytest.approx((batch.wall_ms + result.decode[0].wall_ms) / 1e3)
    assert s.prefill_tok_per_s == pytest.approx(len(result.prompt_ids) / s.ttft_s)
    assert f"TTFT {s.ttft_s:.3f} s" in telemetry.summary_lines(result, s)[1]
    out = tmp_path / "run.csv"
    telemetry.write_csv(str(out), result)
    summary = next(ln for ln in out.read_text().splitlines() if ln.startswith("# summary "))
    pairs = dict(kv.split("=", 1) for kv in summary[len("# summary "):].split())
    assert float(pairs["ttft_s"]) == pytest.approx(s.ttft_s, abs=1e-4)
    assert float(pairs["prefill_tok/s"]) == pytest.approx(s.prefill_tok_per_s, rel=1e-3)
    doc = telemetry.json_doc(result)
    assert doc["prefill"]["tokens"] == [batch.tokens]
