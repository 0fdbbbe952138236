"""Reader for driver scripts: the shell script that ran the runs, one line per run.

The authors' drivers (`docs/bench-data/2026-07-17/driver-matrix.sh`, `driver-lanes.sh`,
`2026-07-15-route-trace/route-trace-bench.sh` in the engine's repository) define a function
and call it once per run, the run's tag first and its flags after:

```
COMMON="--moe-stream --io-threads 4 -t 4 --overlap --dense-weights anon"
Q=/data/local/tmp/shardllm/Qwen3-30B-A3B-Q4_K_M.gguf
run() {
  TAG="$1"; MODEL="$2"; shift 2
  ...
}
run qwen_kdef  "$Q" $COMMON --cache-mb 4000 --n-expert-used 0
run qwen_k6    "$Q" $COMMON --cache-mb 4000 --n-expert-used 6
```

A *run line* is a call of a function the script defines whose first word, once the
script's own `NAME=value` assignments are expanded (`$NAME`, `${NAME}`; an unquoted one
splits into words, as the shell splits it), names one of the folder's runs. Its other
words are the run's command line: `enginelog.command_options` reads its flags, and a word
ending in `.gguf` is its model. The run lines give the order the script ran the runs in
(a script runs its lines one after another) and what each was told. Lines the shell would
skip (comments) and calls naming no run are not read; nothing else in the script is
evaluated: a variable set by a command (`$(...)`) or in a loop stays as written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

FUNCTION = re.compile(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_-]*)\s*\(\s*\)\s*\{?")
ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class RunLine:
    """One call of a run function: the tag it names, its line and its other words."""

    tag: str
    line: int
    words: tuple[str, ...]
    text: str  # the line as the script wrote it


def is_driver_script(text: str) -> bool:
    """Whether a script defines a function (and so may call it once per run)."""
    return any(FUNCTION.match(line) for line in text.splitlines())


def run_lines(text: str) -> list[RunLine]:
    """Every call of a function the script defines, with its first word as the tag, in
    file order (the caller keeps those whose tag names a run)."""
    lines = _logical(text.removeprefix("\ufeff").splitlines())
    functions = {m[1] for _, line in lines if (m := FUNCTION.match(line))}
    values: dict[str, str] = {}
    depth = 0  # inside a function's body: its assignments are its own
    out: list[RunLine] = []
    for n, line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if FUNCTION.match(line):
            depth += line.count("{") - line.count("}")
            continue
        if depth > 0:
            depth += line.count("{") - line.count("}")
            continue
        if m := ASSIGN.match(line):  # its value, quotes removed, as one text
            values[m[1]] = " ".join(shlex_split(_expanded(m[2], values)))
            continue
        words = shlex_split(_expanded(stripped, values))
        if len(words) >= 2 and words[0] in functions:
            out.append(RunLine(words[1], n, tuple(words[2:]), stripped))
    return out


def _logical(lines: list[str]) -> list[tuple[int, str]]:
    """Lines with their numbers, a line ending in `\\` joined with the next."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(lines, 1):
        pending = (n, raw) if pending is None else (pending[0], f"{pending[1]} {raw.strip()}")
        if pending[1].rstrip().endswith("\\"):
            pending = (pending[0], pending[1].rstrip()[:-1])
            continue
        out.append(pending)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def _expanded(text: str, values: dict[str, str]) -> str:
    """`$NAME` and `${NAME}` replaced by what the script assigned them (others kept)."""
    return VARIABLE.sub(lambda m: values.get(m[1] or m[2], m[0]), text)


def shlex_split(text: str) -> list[str]:
    """Words as the shell splits them; an unbalanced quote: split on spaces."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


__all__ = ["RunLine", "is_driver_script", "run_lines", "shlex_split"]
