"""Cells that run llama.cpp's own tools (docs/cells.md#llamacpp-cells): what a
`llama-bench` or `llama-completion` cell is, the binary it runs, and its command line.

A cell's `[cells.NAME.llama]` table holds llama.cpp options under llama.cpp's own names,
mapped to flags by one rule: a key written with its dashes (`"-nr" = true`) is the flag;
a key of up to three characters is a short flag (`fa` → `-fa`, `t` → `-t`, `ngl` →
`-ngl`); a longer one a long flag with `_` as `-` (`threads` → `--threads`, `n_prompt` →
`--n-prompt`). `true` passes the flag alone, `false` leaves it out, a number or a string
passes the flag and its value. The binary judges the options: one it does not know makes
it exit with an error, which fails the cell with its stderr tail, and the report shows it
against the cell.

What a cell measures is abbench's to set, so those flags are refused in the table:
`llama-bench -m MODEL -n TOKENS -r REPETITIONS -o jsonl`; `llama-completion -m MODEL -p
PROMPT -n TOKENS --seed SEED --temp 0 --ignore-eos -no-cnv --no-display-prompt`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from abbench.campaign._check import fail
from abbench.records.cell_config import LLAMA_TOOLS as TOOLS  # a plan's cell kinds
from abbench.records.schema import show

OLD_COMPLETION = "llama-cli"  # llama.cpp before llama-completion: `llama-cli -no-cnv`
Scalar = str | int | float | bool

# Flags abbench sets, per tool, in every spelling llama.cpp accepts: what sets each.
_MODEL = {"-m": "`model`", "--model": "`model`"}
RESERVED: dict[str, dict[str, str]] = {
    "llama-bench": {**_MODEL, "-n": "`tokens`", "--n-gen": "`tokens`",
                    "-r": "`repetitions`", "--repetitions": "`repetitions`",
                    **dict.fromkeys(("-o", "--output", "-oe", "--output-err"),
                                    "abbench (it reads JSONL)")},
    "llama-completion": {**_MODEL, "-p": "`prompt`", "--prompt": "`prompt`",
                         "-f": "`prompt`", "--file": "`prompt`", "-n": "`tokens`",
                         "--n-predict": "`tokens`", "-s": "`seed`", "--seed": "`seed`",
                         **dict.fromkeys(("--temp", "--ignore-eos", "-no-cnv",
                                          "--no-conversation", "-cnv", "--conversation",
                                          "-i", "--interactive", "--no-display-prompt"),
                                         "abbench (greedy, fixed length, one shot)")},
}


def flag(key: str) -> str:
    """The llama.cpp flag a `[cells.NAME.llama]` key names (see the module docstring)."""
    if key.startswith("-"):
        return key
    return f"-{key}" if len(key) <= 3 else "--" + key.replace("_", "-")


@dataclass(frozen=True)
class LlamaCell:
    """A llama.cpp cell, resolved: the tool, what it runs on and its options."""

    tool: str  # "llama-bench" | "llama-completion"
    model: str  # a path on the device, or `synthetic:...` (this machine only)
    tokens: int  # generated tokens (per repetition for llama-bench)
    prompt: str  # llama-completion's prompt text
    seed: int = 0
    repetitions: int = 5  # llama-bench's own default
    bin_dir: str | None = None  # `llama_cpp_bin`: the folder of llama.cpp's binaries
    options: tuple[tuple[str, Scalar], ...] = ()  # the `llama` table, in file order

    def __post_init__(self) -> None:
        if self.tool not in TOOLS:
            fail(("engine",), f"{show(self.tool)} is not a llama.cpp tool")
        if not 1 <= self.tokens <= 1_000_000:
            fail(("tokens",), f"must be in 1 .. 1000000 (got {self.tokens})")
        if self.tool == "llama-bench" and not 1 <= self.repetitions <= 1000:
            fail(("repetitions",), f"must be in 1 .. 1000 (got {self.repetitions})")
        if self.seed < 0:
            fail(("seed",), f"must be >= 0 (got {self.seed})")
        for key, value in self.options:
            at = ("llama", key)
            if not key or any(c.isspace() for c in key):
                fail(at, f"{show(key)} is not an option name")
            if not isinstance(value, (str, int, float)):
                fail(at, f"must be a string, number or boolean (got {show(value)})",
                     tip="one value per cell: write one cell per value")
            by = RESERVED[self.tool].get(flag(key))
            if by is not None:
                fail(at, f"`{flag(key)}` is set by {by} in a {self.tool} cell",
                     tip="abbench fixes what a cell measures; the other options are yours")

    def argv(self, binary: str, model_path: str) -> list[str]:
        """The command line, the binary first."""
        opts: list[str] = []
        for key, value in self.options:
            if value is False:
                continue
            opts += [flag(key)] if value is True else [flag(key), str(value)]
        if self.tool == "llama-bench":
            return [binary, "-m", model_path, "-n", str(self.tokens), "-r",
                    str(self.repetitions), "-o", "jsonl", *opts]
        return [binary, "-m", model_path, "-p", self.prompt, "-n", str(self.tokens),
                "--seed", str(self.seed), "--temp", "0", "--ignore-eos", "-no-cnv",
                "--no-display-prompt", *opts]


def find_binary(tool: str, bin_dir: str | None, on_host: bool) -> str | None:
    """The binary a cell runs: in `bin_dir` (`llama_cpp_bin`), else on PATH; for
    llama-completion an older build's `llama-cli`. On another device (`on_host` false)
    the device's path as given, unchecked; here None when nothing is found."""
    names = [tool] + ([OLD_COMPLETION] if tool == "llama-completion" else [])
    if not on_host:
        return f"{bin_dir.rstrip('/')}/{tool}" if bin_dir else tool
    for name in names:
        if bin_dir is not None:
            path = Path(bin_dir).expanduser() / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
        else:
            found = shutil.which(name)
            if found:
                return found
    return None
