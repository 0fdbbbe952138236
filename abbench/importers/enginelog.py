"""Reader for an engine's log: the seed engine's `bmoe-cli` stdout and stderr (kept as
`NAME.log` / `NAME.out` by its drivers, or inside a driver log's section), and the
llama.cpp loader lines it embeds.

The summary lines (`cli/main.cpp:787-870` of github.com/Helldez/BigMoeOnEdge, and abbench's
own engine's, docs/formats.md#console-summary-lines):

```
generation: 256 tokens, 0.423 s/token (2.366 tok/s)
prefill: 34 tokens, 7.324 s (4.6 tok/s) | model load 18.554 s | TTFT 25.877 s
moe-cache: 53.0% hit, resident 1999.2 MiB
```

Only `generation:` is required of a run's summary; the rest fill what they can.

What the log says of the run's configuration (`engine_log_config`), best first: what the
run ran with — the engine's stderr banners (`bmoe: expert streaming ON  n_expert=...`,
`bmoe: expert sidecar ON  (...)`, `bmoe: dense-weights=anon — ...`), the `moe-NAME:`
summary lines printed only with a feature on, and llama.cpp's `print_info:`,
`validate_override:` and `llama_context:` lines; then what it was told — its command
line's flags, as `cli/main.cpp:544-690` reads them; then the model's own metadata (the
loader's kv dump: its defaults) (docs/import.md#what-identifies-a-configuration).
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
# cli/main.cpp:838: the decode's reads and the split of its time
STREAM = re.compile(rf"moe-stream:\s*read\s*{NUM}\s*MiB\s*\(\s*{NUM}\s*MiB/token\),.*?"
                    rf"\(compute\s*{NUM}\s*\+\s*cache mgmt\s*{NUM}\s*\+\s*flash I/O\s*{NUM}"
                    r"\s*s/token")
# cli/main.cpp:795: the decode's CPU time and major faults
COMPUTE = re.compile(rf"^compute:\s*{NUM}%\s*CPU occupancy\s*\(\s*{NUM}\s*cpu-s/token over\s*"
                     rf"(\d+)\s*threads\),\s*{NUM}\s*major faults/token")
STALL = re.compile(rf"moe-overlap:\s*stall\s*{NUM}\s*s/token")  # cli/main.cpp:861


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
        elif m := STREAM.search(line):
            out = out.with_values(**{name: number(v, source, n, f"moe-stream {name}")
                                     for name, v in zip(("read_mib", "read_mib_per_tok",
                                                         "compute_s_per_tok", "mgmt_s_per_tok",
                                                         "io_s_per_tok"), m.groups())})
        elif m := COMPUTE.match(line):
            out = out.with_values(
                cpu_occupancy=number(m[1], source, n, "compute occupancy") / 100.0,
                cpu_s_per_tok=number(m[2], source, n, "compute cpu-s/token"),
                threads=int(number(m[3], source, n, "compute threads")),
                majflt_per_tok=number(m[4], source, n, "compute major faults/token"))
        elif m := STALL.search(line):
            out = out.with_values(stall_s_per_tok=number(m[1], source, n, "moe-overlap stall"))
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
# llama.cpp's loader applying `--override-kv` (llama-model-loader.cpp, validate_override):
# `validate_override: Using metadata override (  int) 'qwen3moe.expert_used_count' = 6`
OVERRIDE = re.compile(r"validate_override:\s*Using metadata override\s*\(\s*\w+\)\s*"
                      r"'([^']+)'\s*=\s*(.+?)\s*$")
# llama.cpp's context as built (llama-context.cpp): `llama_context: n_ubatch = 512`
CONTEXT = re.compile(r"llama_context:\s*(n_ctx|n_batch|n_ubatch|n_seq_max|flash_attn)\s*="
                     r"\s*(\S+)")
# The model's own parameters by the suffix of their GGUF key.
GGUF_KEYS = ((".expert_used_count", "n_expert_used"), (".expert_count", "n_expert"),
             (".block_count", "n_layer"))
# The seed engine's stderr banners: `bmoe: expert streaming ON  n_expert=32 o_direct=1
# io_threads=4 cache=0 MiB shards=1` (core/src/moe/expert_stream_source.cpp), `bmoe: expert
# sidecar ON  (PATH, o_direct=1)` (the same file at de99a4c, the sidecar's A/B), `bmoe:
# dense-weights=anon — 512 MiB in 190 anon buffers` (core/src/moe/dense_weights.cpp):
# `ENGINE: FEATURE ON|OFF` is the switch FEATURE; its `key=value` items are settings.
SWITCH = re.compile(r"^\s*[A-Za-z][A-Za-z0-9_.-]*:\s+([a-z][a-z0-9 -]*?[a-z0-9])\s+(ON|OFF)\b(.*)$")
SETTING = re.compile(r"^\s*[A-Za-z][A-Za-z0-9_.-]*:\s+(dense-weights)=([A-Za-z0-9_]+)")
SWITCH_ITEMS = re.compile(r"\b(o_direct|io_threads)=(\d+)")
# A switch's name in the preamble's keys, where the preamble has one.
SWITCH_KEYS = {"expert_streaming": "moe_stream"}
FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*$")
NEGATIVE = re.compile(r"-\d")
BUDGET = re.compile(rf"moe-cache:.*?budget\s*{NUM}\s*MiB\s*\((auto)?")
# Lines that state a setting: abbench's engine's `compute: 4 threads, ...` (its telemetry)
# and llama.cpp's `system_info: n_threads = 4`; abbench's engine's `moe-stream: ...
# o_direct=1`.
THREADS = re.compile(r"(?:^compute:\s*(\d+)\s*threads|system_info:\s*n_threads\s*=\s*(\d+))")
O_DIRECT = re.compile(r"moe-stream:.*\bo_direct=([01])\b")
BANNER = re.compile(r"moe-([a-z][a-z0-9-]*):")
# `moe-NAME:` lines printed only with a setting on (cli/main.cpp:861-894): that setting as a
# switch. `stream`, `cache` and `waits` are summaries a run prints whatever it ran with; an
# unknown NAME is a switch of its own (`moe-spec-gate:`, from the engine's 2026-07 builds).
SWITCH_BANNERS = {"overlap": "overlap", "prefetch": "prefetch_reads", "spec-gate": "spec_gate",
                  "drop": "drops", "predict": "predict_log"}
SUMMARY_BANNERS = frozenset({"stream", "cache", "waits", "route-ahead"})
# Their settings: `moe-route-ahead: 2 layers early — ...` (cli/main.cpp:887), `moe-drop:
# .../... routed experts dropped (...), threshold 0.75 x uniform` (:880).
ROUTE_AHEAD = re.compile(r"moe-route-ahead:\s*(\d+)\s+layers early")
DROP = re.compile(rf"moe-drop:.*threshold\s*{NUM}\s*x uniform")
# The seed engine's command-line flags (cli/main.cpp:544-690) -> its preamble's keys
# (csv_metrics_sink.cpp), True: a switch; `--no-odirect`, `--drop-no-renorm` turn one off.
# Any other flag is kept under its own name (`--expert-sidecar` -> `expert_sidecar`).
FLAGS: dict[str, tuple[str, bool]] = {
    "--cache-mb": (CACHE_BUDGET, False), "--io-threads": ("io_threads", False),
    "-t": ("threads", False), "--threads": ("threads", False),
    "--overlap": ("overlap", True), "--prefetch": ("prefetch", False),
    "--spec-gate": ("spec_gate", True), "--predict-prefetch": ("predict_prefetch", True),
    "--predict-spec-max": ("predict_spec_max", False), "--predict-log": ("predict_log", True),
    "--n-expert-used": ("n_expert_used", False), "--dense-weights": ("dense_weights", False),
    "--drop-cold-experts": ("drop_cold_frac", False), "--moe-stream": ("moe_stream", True),
    "--cache-floor-mb": ("cache_floor_mb", False), "--cache-ceil-mb": ("cache_ceil_mb", False),
    "--force-cache": ("force_cache", True), "--load-all": ("load_all", True),
    "--io-two-wave": ("io_two_wave", True), "--prefetch-sync": ("prefetch_sync", True),
    "--drop-in-prefill": ("drop_prefill", True), "--route-ahead": ("route_ahead", False),
    "--ubatch": ("n_ubatch", False), "--chatml": ("chatml", True),
    "--draft": ("spec_draft_max", False), "--mtp-p-min": ("mtp_p_min", False),
    "--ngram-min-match": ("ngram_min_match", False), "--temp": ("temp", False),
    "--top-k": ("top_k", False), "--top-p": ("top_p", False),
    "-n": ("n_predict", False), "--n-predict": ("n_predict", False),
    "-p": ("prompt", False), "--prompt": ("prompt", False), "-f": ("prompt_file", False),
    "--file": ("prompt_file", False), "-c": ("n_ctx", False), "--ctx-size": ("n_ctx", False),
    "-s": ("seed", False), "--seed": ("seed", False),
}
# Flags whose meaning is another key's value: (key, value).
FLAG_VALUES: dict[str, tuple[str, Any]] = {
    "--no-odirect": ("o_direct", 0), "--drop-no-renorm": ("drop_renorm", 0),
    "--mtp": ("spec", "mtp"), "--ngram": ("spec", "ngram"),
    "--no-warm-dense": ("dense_weights", "mmap"), "--dense-odirect": ("dense_weights", "anon"),
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
        if flag in FLAG_VALUES:
            out.append(FLAG_VALUES[flag])
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
    if m := SWITCH.match(line):
        name = m[1].replace(" ", "_").replace("-", "_")
        out.append((SWITCH_KEYS.get(name, name), 1 if m[2] == "ON" else 0))
        out += SWITCH_ITEMS.findall(m[3])
    if m := SETTING.match(line):
        out.append((m[1].replace("-", "_"), m[2]))
    if m := BUDGET.search(line):
        out.append((CACHE_BUDGET, "auto" if m[2] else m[1]))
    if m := THREADS.search(line):
        out.append(("threads", m[1] or m[2]))
    if m := ROUTE_AHEAD.search(line):
        out.append(("route_ahead", m[1]))
    if m := DROP.search(line):
        out.append(("drop_cold_frac", m[1]))
    if m := O_DIRECT.search(line):
        out.append(("o_direct", m[1]))
    if (m := BANNER.match(line.lstrip())) and m[1] not in SUMMARY_BANNERS:
        out.append((SWITCH_BANNERS.get(m[1], m[1].replace("-", "_")), 1))
    return out


def loader_values(line: str) -> list[tuple[str, Any]]:
    """The model's own parameters as the loader's metadata dump prints them (its defaults:
    what the run ran with may differ, `effective_values`)."""
    if m := KV.search(line):
        key, value = m[1], m[2].strip()
        for suffix, name in GGUF_KEYS:
            if key.endswith(suffix):
                return [(name, value)]
        if key == "general.architecture":
            return [("arch", value)]
    return []


def effective_values(line: str) -> list[tuple[str, Any]]:
    """What llama.cpp ran with, as it prints it once the model is loaded: `print_info:`
    (after any override), `validate_override:` (an override applied, any key: a GGUF key
    the engine's table does not name is kept under its own name) and `llama_context:`."""
    if m := PRINT_INFO.search(line):
        return [(m[1], m[2])]
    if m := OVERRIDE.search(line):
        key, value = m[1], m[2]
        name = next((n for suffix, n in GGUF_KEYS if key.endswith(suffix)), key)
        return [(name, value)]
    if m := CONTEXT.search(line):
        return [(m[1], m[2])]
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


def engine_log_config(text: str, first_line: int = 1) -> LogConfig:
    """The configuration an engine log states, each key from the first line that gives it
    in the best kind of line: what the run ran with — the engine's banner lines and
    llama.cpp's `print_info:`, `validate_override:` and `llama_context:` lines — over what
    it was told (its command line's flags), over the model's own metadata (the loader's
    kv dump: its defaults, each kept where the run's value differs). `first_line`: the
    number of the text's first line in its file (a driver log's section)."""
    ran: dict[str, tuple[Any, int]] = {}
    told: dict[str, tuple[Any, int]] = {}
    model: dict[str, tuple[Any, int]] = {}
    command = False
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), first_line):
        for key, value in (*banner_options(line), *effective_values(line)):
            ran.setdefault(key, (value, n))
        if m := LOADER_FILE.search(line) or GGUF_ARG.search(line):
            ran.setdefault("model", (m[1].replace("\\", "/").rsplit("/", 1)[-1], n))
        if GGUF_ARG.search(line) or " --moe-stream" in line or COMMAND.match(line):
            command = True
            for key, value in command_options(line):
                told.setdefault(key, (value, n))
        for key, value in loader_values(line):
            model.setdefault(key, (value, n))
    chosen = {**model, **told, **ran}
    defaults = {k: model[k] for k, (v, _) in chosen.items()
                if k in model and str(model[k][0]) != str(v)}
    return LogConfig({k: v for k, (v, _) in chosen.items()},
                     {k: n for k, (_, n) in chosen.items()}, command, defaults)
