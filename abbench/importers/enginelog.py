"""Reader for the engine's own `.log` beside a headerless CSV: its summary lines
(docs/formats.md#console-summary-lines).

```
generation: 256 tokens, 0.423 s/token (2.366 tok/s)
prefill: 34 tokens, 7.324 s (4.6 tok/s) | model load 18.554 s | TTFT 25.877 s
moe-cache: 53.0% hit, resident 1999.2 MiB
```

Only `generation:` is required of a run's summary; the rest fill what they can.
"""

from __future__ import annotations

import re
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


# What an engine log says of the run's configuration, in the CSV preamble's key names.
LOADER_FILE = re.compile(r"llama_model_loader:.*?\bfrom\s+(\S+\.gguf)\b")
GGUF_ARG = re.compile(r"(?:^|\s)(?:-m|--model)\s+(\S+\.gguf)\b")
PRINT_INFO = re.compile(r"print_info:\s*(n_expert_used|n_expert|n_layer|arch)\s*=\s*(\S+)")
KV = re.compile(r"-\s*kv\s+\d+:\s+(\S+)\s+\S+\s*=\s*(.+?)\s*$")
FLAG = re.compile(r"(?:^|\s)(--?[A-Za-z][A-Za-z0-9-]*)(?:[ =]([^\s-][^\s]*))?")
BUDGET = re.compile(rf"moe-cache:.*?budget\s*{NUM}\s*MiB\s*\((auto)?")
# Command-line flags of the seed engine (and llama.cpp's) -> preamble keys; True: a switch.
FLAGS: dict[str, tuple[str, bool]] = {
    "--cache-mb": (CACHE_BUDGET, False), "--io-threads": ("io_threads", False),
    "-t": ("threads", False), "--threads": ("threads", False),
    "--overlap": ("overlap", True), "--prefetch": ("prefetch", False),
    "--spec-gate": ("spec_gate", True), "--predict-prefetch": ("predict_prefetch", True),
    "--predict-spec-max": ("predict_spec_max", False), "--predict-log": ("predict_log", True),
    "--n-expert-used": ("n_expert_used", False), "--dense-weights": ("dense_weights", False),
    "--drop-cold-experts": ("drop_cold_frac", False), "--no-o-direct": ("o_direct", True),
    "--moe-stream": ("moe_stream", True), "-n": ("n_predict", False),
}


def engine_log_config(text: str) -> tuple[dict[str, Any], dict[str, int], bool]:
    """The configuration an engine log states — its command line's flags, the loader's
    lines (model file, architecture, expert counts) and which optional summary lines it
    printed — as preamble keys, the line each came from, and whether a command line was
    found (then the flags are the whole configuration)."""
    out: dict[str, Any] = {}
    lines: dict[str, int] = {}
    command = False

    def put(key: str, value: Any, n: int) -> None:
        if key not in out:
            out[key], lines[key] = value, n

    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        if m := LOADER_FILE.search(line) or GGUF_ARG.search(line):
            put("model", m[1].replace("\\", "/").rsplit("/", 1)[-1], n)
        if GGUF_ARG.search(line) or " --moe-stream" in line or line.startswith("args:"):
            command = True
            for flag, value in FLAG.findall(line):
                if flag in FLAGS:
                    key, switch = FLAGS[flag]
                    put(key, 0 if flag == "--no-o-direct" else 1 if switch else value, n)
        if m := PRINT_INFO.search(line):
            put(m[1], m[2], n)
        elif m := KV.search(line):
            key, value = m[1], m[2].strip()
            if key == "general.architecture":
                put("arch", value, n)
            elif key.endswith(".expert_used_count"):
                put("n_expert_used", value, n)
            elif key.endswith(".expert_count"):
                put("n_expert", value, n)
            elif key.endswith(".block_count"):
                put("n_layer", value, n)
        if m := BUDGET.search(line):
            put(CACHE_BUDGET, "auto" if m[2] else m[1], n)
        for prefix, key in (("moe-overlap:", "overlap"), ("moe-prefetch:", "prefetch_reads"),
                            ("moe-spec-gate:", "spec_gate"), ("moe-drop:", "drops")):
            if line.lstrip().startswith(prefix):
                put(key, 1, n)
    return out, lines, command
