"""Reader for the engine's own `.log` beside a headerless CSV: its summary lines
(docs/formats.md#console-summary-lines).

```
generation: 256 tokens, 0.423 s/token (2.366 tok/s)
prefill: 34 tokens, 7.324 s (4.6 tok/s) | model load 18.554 s | TTFT 25.877 s
moe-cache: 53.0% hit, resident 1999.2 MiB
```

Only `generation:` is required of a run's summary; the rest fill what they can.

What the log says of the run's configuration (`engine_log_config`): every option of its
command line, the settings its banner lines state (`moe-topk: override 6 (model 8)`,
`moe-NAME:` switches, thread and lane counts) and, under them, the model's own parameters
from the loader's lines (docs/import.md#what-identifies-a-configuration).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abbench.records.bmoe_csv import CACHE_BUDGET
from abbench.records.summary import GENERATION, NUMBER, RunSummary
from abbench.records.text import number, read_text

NUM = NUMBER
PREFILL = re.compile(rf"prefill:\s*{NUM}\s+tokens,\s*{NUM}\s*s\b.*?model load\s*{NUM}\s*s")
CACHE = re.compile(rf"moe-cache:\s*{NUM}%\s*hit")


def parse_engine_log(text: str, source: str | Path = "<text>") -> RunSummary | None:
    """The summary a `.log` gives, its figures in the order the log gives them; None when
    it has no `generation:`."""
    out = RunSummary()
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        if m := GENERATION.search(line):
            out = out.with_values(tokens=number(m[1], source, n, "generation tokens"),
                                  s_per_tok=number(m[2], source, n, "generation s/token"),
                                  tok_per_s=number(m[3], source, n, "generation tok/s"))
        elif m := PREFILL.search(line):
            out = out.with_values(n_prompt=number(m[1], source, n, "prefill tokens"),
                                  prefill_s=number(m[2], source, n, "prefill s"),
                                  load_s=number(m[3], source, n, "model load s"))
        elif m := CACHE.search(line):
            out = out.with_values(cache_hit_pct=number(m[1], source, n, "moe-cache hit"))
    return out if out.tok_per_s is not None else None


def read_engine_log(path: Path) -> RunSummary | None:
    return parse_engine_log(read_text(path), path)


# What an engine log says of the run's configuration, in the CSV preamble's key names
# (docs/import.md#configuration-identity-arms).
LOADER_FILE = re.compile(r"llama_model_loader:.*?\bfrom\s+(\S+\.gguf)\b")
GGUF_ARG = re.compile(r"(?:^|\s)(?:-m|--model)\s+(\S+\.gguf)\b")
COMMAND = re.compile(r"\s*(?:args|command|cmdline):")
PRINT_INFO = re.compile(r"print_info:\s*(n_expert_used|n_expert|n_layer|arch)\s*=\s*(\S+)")
KV = re.compile(r"-\s*kv\s+\d+:\s+(\S+)\s+\S+\s*=\s*(.+?)\s*$")
FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*$")
NEGATIVE = re.compile(r"-\d")
BUDGET = re.compile(rf"moe-cache:.*?budget\s*{NUM}\s*MiB\s*\((auto)?")
# The engine's banner lines that state a setting: `moe-topk: override 6 (model 8)` (the
# model's default beside it), `compute: 4 threads`, llama.cpp's `system_info: n_threads =
# 4`, `moe-io: 4 lanes`, `moe-stream: ... o_direct=1`.
TOPK = re.compile(r"moe-topk:\s*(?:override\s*)?(\d+)(?:\s*\(model\s*(\d+)\))?")
THREADS = re.compile(r"(?:^compute:\s*(\d+)\s*threads|system_info:\s*n_threads\s*=\s*(\d+))")
IO_LANES = re.compile(r"moe-io:\s*(\d+)\s*(?:io\s*)?(?:lanes|threads)")
O_DIRECT = re.compile(r"moe-stream:.*\bo_direct=([01])\b")
BANNER = re.compile(r"moe-([a-z][a-z0-9-]*):")
# `moe-NAME:` lines printed only with a setting on: that setting as a switch. `stream` and
# `cache` are summaries every streaming run prints; an unknown NAME is a switch of its own.
SWITCH_BANNERS = {"overlap": "overlap", "prefetch": "prefetch_reads", "spec-gate": "spec_gate",
                  "drop": "drops", "predict": "predict_log"}
SUMMARY_BANNERS = frozenset({"stream", "cache", "topk", "io"})
# Command-line flags of the seed engine (and llama.cpp's) -> preamble keys; True: a switch.
# Any other flag is kept under its own name (`--expert-sidecar` -> `expert_sidecar`).
FLAGS: dict[str, tuple[str, bool]] = {
    "--cache-mb": (CACHE_BUDGET, False), "--io-threads": ("io_threads", False),
    "-t": ("threads", False), "--threads": ("threads", False),
    "--overlap": ("overlap", True), "--prefetch": ("prefetch", False),
    "--spec-gate": ("spec_gate", True), "--predict-prefetch": ("predict_prefetch", True),
    "--predict-spec-max": ("predict_spec_max", False), "--predict-log": ("predict_log", True),
    "--n-expert-used": ("n_expert_used", False), "--dense-weights": ("dense_weights", False),
    "--drop-cold-experts": ("drop_cold_frac", False), "--no-o-direct": ("o_direct", True),
    "--moe-stream": ("moe_stream", True), "-n": ("n_predict", False),
    "-p": ("prompt", False), "--prompt": ("prompt", False), "-f": ("prompt_file", False),
    "--file": ("prompt_file", False), "-c": ("n_ctx", False), "--ctx-size": ("n_ctx", False),
    "-s": ("seed", False), "--seed": ("seed", False),
}
# Flags that name the model (read as `model`) or where the run wrote (`-o`, `--log-file`,
# `--metrics-out`, `--route-trace`: a path per run, not what ran): not options.
MODEL_FLAGS = frozenset({"-m", "--model"})
OUTPUT_FLAG = re.compile(r"(?:^|_)(?:o|out|output|log|logs|csv|metrics|trace|dump|save)(?:_|$)")


def command_options(line: str) -> list[tuple[str, Any]]:
    """Every option a command line sets, as (key, value): a known flag under its preamble
    key, any other under its own name (`--no-NAME`: NAME = 0), a bare switch = 1."""
    try:
        words = shlex.split(line)
    except ValueError:  # an unbalanced quote: the words as they stand
        words = line.split()
    out: list[tuple[str, Any]] = []
    for i, word in enumerate(words):
        flag, eq, given = word.partition("=")
        if not FLAG.match(flag) or flag in MODEL_FLAGS:
            continue
        after = words[i + 1] if i + 1 < len(words) else None
        value: Any = given if eq else after if after is not None and (
            not after.startswith("-") or NEGATIVE.match(after)) else None
        if flag == "--no-o-direct":
            out.append(("o_direct", 0))
        elif flag in FLAGS:
            key, switch = FLAGS[flag]
            out.append((key, 1 if switch or value is None else value))
        elif flag.startswith("--no-") and value is None:
            out.append((flag[5:].replace("-", "_"), 0))
        elif not OUTPUT_FLAG.search(key := flag.lstrip("-").replace("-", "_")):
            out.append((key, 1 if value is None else value))
    return out


def banner_options(line: str) -> list[tuple[str, Any]]:
    """The settings one engine banner line states, as (key, value)."""
    out: list[tuple[str, Any]] = []
    if m := BUDGET.search(line):
        out.append((CACHE_BUDGET, "auto" if m[2] else m[1]))
    if m := TOPK.search(line):
        out.append(("n_expert_used", m[1]))
    if m := THREADS.search(line):
        out.append(("threads", m[1] or m[2]))
    if m := IO_LANES.search(line):
        out.append(("io_threads", m[1]))
    if m := O_DIRECT.search(line):
        out.append(("o_direct", m[1]))
    if (m := BANNER.match(line.lstrip())) and m[1] not in SUMMARY_BANNERS:
        out.append((SWITCH_BANNERS.get(m[1], m[1].replace("-", "_")), 1))
    return out


def loader_values(line: str) -> list[tuple[str, Any]]:
    """The model's own parameters as the loader prints them (its defaults: a command line
    or banner line may override them)."""
    if m := PRINT_INFO.search(line):
        return [(m[1], m[2])]
    if m := KV.search(line):
        key, value = m[1], m[2].strip()
        for suffix, name in ((".expert_used_count", "n_expert_used"),
                             (".expert_count", "n_expert"), (".block_count", "n_layer")):
            if key.endswith(suffix):
                return [(name, value)]
        if key == "general.architecture":
            return [("arch", value)]
    if m := TOPK.search(line):  # the banner names the model's value beside its override
        return [("n_expert_used", m[2])] if m[2] else []
    return []


@dataclass(frozen=True)
class LogConfig:
    """What an engine log states of the run's configuration: each option with the line it
    came from, whether a command line was found (then the flags are the whole
    configuration), and each model parameter the run overrode, with the model's own value
    and its line."""

    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    command: bool = False
    defaults: dict[str, tuple[Any, int]] = field(default_factory=dict)


def engine_log_config(text: str) -> LogConfig:
    """The configuration an engine log states: its command line's flags and the engine's
    banner lines (what the run was told and ran with: measured), over the loader's lines
    (the model's defaults: its file, architecture, expert counts). The first line to give
    a key gives it."""
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    command = False
    model: dict[str, tuple[Any, int]] = {}
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        found = banner_options(line)
        if m := LOADER_FILE.search(line) or GGUF_ARG.search(line):
            found.append(("model", m[1].replace("\\", "/").rsplit("/", 1)[-1]))
        if GGUF_ARG.search(line) or " --moe-stream" in line or COMMAND.match(line):
            command = True
            found += command_options(line)
        for key, value in found:
            if key not in values:
                values[key], lines[key] = value, n
        for key, value in loader_values(line):
            model.setdefault(key, (value, n))
    defaults = {}
    for key, (value, n) in model.items():
        if key not in values:
            values[key], lines[key] = value, n
        elif str(values[key]) != str(value):
            defaults[key] = (value, n)
    return LogConfig(values, lines, command, defaults)
