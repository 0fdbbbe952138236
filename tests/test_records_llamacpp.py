"""records/llamacpp.py on real outputs of the pinned llama.cpp (tests/fixtures/llamacpp,
captured from its llama-bench and llama-completion) and on what a cell may print instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.errors import CellOutputError
from abbench.records.llamacpp import (
    bench_summary,
    completion_summary,
    parse_bench_jsonl,
    parse_perf,
)

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"
BENCH = (FIXTURES / "bench-tiny.jsonl").read_text()
STDOUT = (FIXTURES / "completion-tiny.stdout").read_bytes()
STDERR = (FIXTURES / "completion-tiny.stderr").read_text()


def test_llama_bench_jsonl_gives_a_prompt_and_a_generation_test() -> None:
    pp, tg = parse_bench_jsonl(BENCH)
    assert (pp.kind, pp.n_prompt, pp.n_gen) == ("pp", 16, 0)
    assert (tg.kind, tg.n_prompt, tg.n_gen) == ("tg", 0, 16)
    assert len(tg.samples_ns) == 3 and tg.fields["n_threads"] == 1
    raw = json.loads(BENCH.splitlines()[1])
    # tokens over summed time: within a few percent of llama-bench's mean of rates
    assert tg.tokens_per_s() == pytest.approx(16 * 3 * 1e9 / sum(raw["samples_ns"]))
    assert tg.tokens_per_s() == pytest.approx(raw["avg_ts"], rel=0.1)


def test_bench_summary_samples_are_the_repetitions() -> None:
    summary, columns, fingerprint = bench_summary(parse_bench_jsonl(BENCH))
    raw = json.loads(BENCH.splitlines()[1])
    assert columns["wall_ms"] == pytest.approx([ns / 1e6 / 16 for ns in raw["samples_ns"]])
    assert summary["repetitions"] == 3 and summary["tokens_per_repetition"] == 16
    assert summary["n_tokens"] == 48 and summary["n_prompt"] == 16
    assert summary["prefill_tok/s"] == pytest.approx(
        16 * 3 * 1e9 / sum(json.loads(BENCH.splitlines()[0])["samples_ns"]))
    assert fingerprint.startswith("sha256:")
    # The fingerprint is the work: other threads and speeds, the same tests, the same hash.
    faster = BENCH.replace('"n_threads": 1', '"n_threads": 2').replace("679453", "600000")
    assert bench_summary(parse_bench_jsonl(faster))[2] == fingerprint
    longer = BENCH.replace('"n_gen": 16', '"n_gen": 32')
    assert bench_summary(parse_bench_jsonl(longer))[2] != fingerprint


def test_bench_output_without_a_generation_test_or_with_several_fails_the_cell() -> None:
    pp = BENCH.splitlines()[0]
    with pytest.raises(CellOutputError, match="no generation test"):
        bench_summary(parse_bench_jsonl(pp))
    with pytest.raises(CellOutputError, match="one cell runs one of each"):
        bench_summary(parse_bench_jsonl(BENCH + BENCH))
    assert parse_bench_jsonl("") == []
    assert parse_bench_jsonl("build: 1 (abc)\n{not json\n" + BENCH)[0].kind == "pp"
    assert parse_bench_jsonl('{"n_gen": 8, "samples_ns": []}\n') == []


def test_completion_timings_and_the_text_as_fingerprint() -> None:
    assert parse_perf(STDERR) == {"prompt eval": (0.63, 17), "eval": (1.03, 15)}
    summary, fingerprint, note = completion_summary(STDOUT, STDERR)
    assert summary["tok/s"] == pytest.approx(15 / 1.03e-3)
    assert summary["prefill_tok/s"] == pytest.approx(17 / 0.63e-3)
    assert summary["n_tokens"] == 15 and summary["n_prompt"] == 17
    assert note is None and fingerprint.startswith("sha256:")
    assert completion_summary(STDOUT + b"", STDERR)[1] == fingerprint
    assert completion_summary(STDOUT.replace(b"world", b"World"), STDERR)[1] != fingerprint


def test_older_perf_lines_are_read_too() -> None:
    old = ("llama_perf_context_print: prompt eval time =      95.43 ms /    75 tokens "
           "(    1.27 ms per token,   785.92 tokens per second)\n"
           "llama_perf_context_print:        eval time =     609.71 ms /    63 runs   "
           "(    9.68 ms per token,   103.33 tokens per second)\n")
    assert parse_perf(old) == {"prompt eval": (95.43, 75), "eval": (609.71, 63)}


def test_text_cut_short_keeps_the_timing_but_no_fingerprint() -> None:
    summary, fingerprint, note = completion_summary(STDOUT[:-1], STDERR)
    assert summary["tok/s"] > 0 and fingerprint is None
    assert note is not None and "cut short" in note


def test_no_timings_or_no_decode_fails_the_cell() -> None:
    with pytest.raises(CellOutputError, match="no `eval time`"):
        completion_summary(STDOUT, "")
    zero = STDERR.replace("eval time =       1.03 ms /    15 runs",
                          "eval time =       0.00 ms /     0 runs")
    with pytest.raises(CellOutputError, match="no throughput"):
        completion_summary(STDOUT, zero)


@pytest.mark.parametrize("name", ["bench-bad-option.stderr", "completion-bad-option.stderr"])
def test_the_pinned_tools_name_an_unknown_option(name: str) -> None:
    # What a cell's stderr tail shows when the llama table holds an option the binary lacks.
    assert "--bogus" in (FIXTURES / name).read_text()
