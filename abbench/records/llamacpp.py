"""What llama.cpp's own tools print, read into a cell's summary (docs/cells.md#llamacpp-cells).

`llama-bench -o jsonl` prints one JSON object per test on stdout, for example (fields
abridged; ggml-org/llama.cpp tools/llama-bench, `jsonl_printer`):

    {"build_commit": "0c1e570", "model_filename": "m.gguf", "model_size": 1610612736,
     "n_threads": 2, "type_k": "f16", "flash_attn": false, "n_prompt": 64, "n_gen": 0,
     "n_depth": 0, "avg_ns": 80312000, "avg_ts": 796.9, "samples_ns": [ 80012000, ... ],
     "samples_ts": [ 799.8, ... ]}

A prompt-processing test has `n_gen` 0, a generation test `n_prompt` 0; each repetition
is one entry of `samples_ns` (the whole test: n_prompt + n_gen tokens). Other lines (the
build's own log, when it goes to stdout) are skipped.

`llama-completion` (and `llama-cli -no-cnv` of older builds) prints the prompt and the
generated text on stdout and, at exit, its timings on stderr, behind the logger's prefix
(`common_perf_print` at the pinned version, `llama_perf_context_print` before it):

    0.00.011.900 I common_perf_print: prompt eval time =       0.63 ms /    17 tokens (    0.04 ms per token, 27027.03 tokens per second)
    0.00.011.914 I common_perf_print:        eval time =       1.03 ms /    15 runs   (    0.07 ms per token, 14548.98 tokens per second)

"eval" counts the decode steps after the first token, which the prompt's evaluation gives.

Its logger is asynchronous and never joined, so a loaded machine can lose the tail of
stdout at exit (exit status 0); the last thing it writes is "\\n\\n", so text ending in it
is whole, and only whole text is a fingerprint.
"""  # noqa: E501

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from abbench.errors import CellOutputError

# The fields of a llama-bench test that define the work it did (not how fast or on how
# many threads): two cells whose tests agree on them did the same work.
BENCH_WORK_FIELDS = ("model_filename", "model_size", "model_n_params", "n_prompt", "n_gen",
                     "n_depth", "type_k", "type_v")


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test: its fields and each repetition's nanoseconds."""

    fields: dict[str, Any]
    samples_ns: tuple[int, ...]

    @property
    def n_prompt(self) -> int:
        return int(self.fields.get("n_prompt") or 0)

    @property
    def n_gen(self) -> int:
        return int(self.fields.get("n_gen") or 0)

    @property
    def kind(self) -> str:
        """"tg" (generation), "pp" (prompt processing) or "pg" (both in one test)."""
        return "pp" if not self.n_gen else "tg" if not self.n_prompt else "pg"

    def ms_per_token(self) -> list[float]:
        """Each repetition's milliseconds per token of the test."""
        tokens = self.n_prompt + self.n_gen
        return [ns / 1e6 / tokens for ns in self.samples_ns]

    def tokens_per_s(self) -> float:
        """Tokens over summed time (not llama-bench's mean of per-repetition rates)."""
        return (self.n_prompt + self.n_gen) * len(self.samples_ns) * 1e9 / sum(self.samples_ns)


def _count(value: Any) -> int | None:
    """A token count as llama-bench writes it (an integer >= 0), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
        return None
    return value


def parse_bench_jsonl(text: str) -> list[BenchTest]:
    """Every test line of `llama-bench -o jsonl` output, in order; a line that is not a
    test (the build's log, a torn line, a test without positive samples) is skipped."""
    tests = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(d, dict) or not isinstance(d.get("samples_ns"), list):
            continue
        n_prompt, n_gen = _count(d.get("n_prompt", 0)), _count(d.get("n_gen", 0))
        ns = tuple(int(x) for x in d["samples_ns"] if isinstance(x, (int, float))
                   and not isinstance(x, bool) and 1 <= x < 1e18)
        if n_prompt is None or n_gen is None or n_prompt + n_gen == 0 or not ns:
            continue
        fields = {k: v for k, v in d.items() if k not in ("samples_ns", "samples_ts")}
        tests.append(BenchTest({**fields, "n_prompt": n_prompt, "n_gen": n_gen}, ns))
    return tests


def bench_summary(tests: list[BenchTest]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(summary, per-token columns, fingerprint) of a llama-bench cell: the generation test
    is the cell's tok/s (each repetition one sample of its ms per token), the prompt test
    its prefill tok/s; the fingerprint hashes the tests' work fields."""
    gen = [t for t in tests if t.kind in ("tg", "pg")]
    prompt = [t for t in tests if t.kind == "pp"]
    if not gen:
        raise CellOutputError("llama-bench printed no generation test (`-n` > 0) with "
                              "samples: nothing to time the cell by")
    if len(gen) > 1 or len(prompt) > 1:
        raise CellOutputError(f"llama-bench printed {len(gen)} generation and {len(prompt)} "
                              "prompt tests: one cell runs one of each (a list in an option "
                              "sweeps inside llama-bench; use [[sweep]] instead)")
    tg = gen[0]
    f = tg.fields
    summary: dict[str, Any] = {
        "tok/s": tg.tokens_per_s(), "n_tokens": tg.n_gen * len(tg.samples_ns),
        "repetitions": len(tg.samples_ns), "tokens_per_repetition": tg.n_gen,
        "threads": f.get("n_threads"), "engine": "llama-bench",
        "build": f.get("build_commit"), "llama_bench_avg_ts": f.get("avg_ts"),
    }
    if prompt:
        summary["prefill_tok/s"] = prompt[0].tokens_per_s()
        summary["n_prompt"] = prompt[0].n_prompt
    columns = {"wall_ms": tg.ms_per_token()}
    work = [{k: t.fields.get(k) for k in BENCH_WORK_FIELDS} for t in prompt + gen]
    digest = hashlib.sha256(json.dumps(work, sort_keys=True).encode()).hexdigest()
    return summary, columns, f"sha256:{digest}"


_PERF = re.compile(
    r"(?:common|llama)_perf(?:_context)?_print:\s+(?P<what>prompt eval|eval) time =\s*"
    r"(?P<ms>\d+(?:\.\d+)?) ms /"
    r"\s*(?P<n>\d+) (?:tokens|runs)")
WHOLE_END = b"\n\n"


def parse_perf(stderr: str) -> dict[str, tuple[float, int]]:
    """{"prompt eval" | "eval": (milliseconds, tokens)} from the perf lines (the last of
    each, should a tool print them twice)."""
    return {m["what"]: (float(m["ms"]), int(m["n"])) for m in _PERF.finditer(stderr)}


def completion_summary(stdout: bytes, stderr: str) -> tuple[dict[str, Any], str | None,
                                                             str | None]:
    """(summary, fingerprint, note) of a llama-completion cell: decode tok/s from its
    `eval time` line, prefill from `prompt eval time`; the fingerprint hashes the printed
    bytes (a model's tokens need not be UTF-8) when they are whole, else None with the
    note saying why."""
    perf = parse_perf(stderr)
    if "eval" not in perf:
        raise CellOutputError("no `eval time` perf line on stderr: "
                              "llama.cpp printed no timings (its tail may have been lost "
                              "at exit)")
    ms, runs = perf["eval"]
    if runs < 1 or not ms > 0 or not math.isfinite(ms):
        raise CellOutputError(f"llama.cpp timed {runs} decode runs in {ms} ms: no throughput")
    summary: dict[str, Any] = {"tok/s": runs * 1000.0 / ms, "n_tokens": runs,
                               "engine": "llama-completion"}
    if "prompt eval" in perf and 0 < perf["prompt eval"][0] < math.inf:
        p_ms, p_n = perf["prompt eval"]
        summary["prefill_tok/s"] = p_n * 1000.0 / p_ms
        summary["n_prompt"] = p_n
    if not stdout.endswith(WHOLE_END):
        return summary, None, ("llama.cpp's text was cut short at exit (its asynchronous "
                               "logger lost the tail): no fingerprint for this cell")
    text = stdout.removesuffix(WHOLE_END)
    return summary, f"sha256:{hashlib.sha256(text).hexdigest()}", None
