"""Reader for `bmoe_metrics` per-token CSVs (DESIGN 6.1), every generation of them.

```
# bmoe_metrics v1                                    optional: format and version
# model=... arch=qwen35moe n_layer=40 threads=4      optional: key=value preamble lines
step,steps,wall_ms,io_ms,compute_ms,...              header row (names, any order)
1,256,664.200,431.883,...                            one row per decoded token
# summary tokens=256 s/tok=0.423 tok/s=2.366 ...     optional trailer
```

The oldest files have neither preamble nor summary and only 8 columns; the newest 22 or
more. Columns are read by name and every one is optional; a cell that is empty is a gap
(None). A row with the wrong number of fields, a non-numeric value or a header that repeats
a name is an error naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError
from abbench.importers.errors import clip, number, quote, read_text

VERSION = re.compile(r"#\s*bmoe_metrics\s+(v\S+)\s*$")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./%-]*$")


@dataclass(frozen=True)
class BmoeRun:
    """One run's per-token table, its preamble and its own `# summary` (if it wrote one)."""

    source: str
    version: str | None
    preamble: dict[str, str]
    columns: dict[str, list[float | None]]  # header order, one value per token row
    summary: dict[str, Any] = field(default_factory=dict)  # numbers as float, else str
    summary_line: int | None = None

    @property
    def n_rows(self) -> int:
        return len(next(iter(self.columns.values()), []))

    def column(self, name: str) -> list[float] | None:
        """A column's values without gaps, None when the file has no such column."""
        values = self.columns.get(name)
        return None if values is None else [v for v in values if v is not None]


def looks_like_bmoe_csv(text: str) -> bool:
    """Whether a file's first non-comment line is a header naming `wall_ms` or `step`
    (a `.metrics` file can be a per-token CSV as well as `key=value` lines)."""
    for line in text.removeprefix("\ufeff").splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        names = [n.strip() for n in s.split(",")]
        return "wall_ms" in names or "step" in names
    return False


def parse_summary(body: str, source: str | Path, line: int) -> dict[str, Any]:
    """`key=value` pairs separated by spaces; numbers become floats."""
    out: dict[str, Any] = {}
    for pair in body.split():
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ForeignRunError(source, f"`# summary`: {quote(pair)} is not key=value", line)
        try:
            out[key] = number(value, source, line, f"`# summary` {clip(key)}")
        except ForeignRunError:
            if key in ("tokens", "s/tok", "tok/s"):  # the numbers an import rests on
                raise
            out[key] = value
    return out


def parse_bmoe_csv(text: str, source: str | Path = "<text>") -> BmoeRun:
    text = text.removeprefix("\ufeff")
    version: str | None = None
    preamble: dict[str, str] = {}
    header: list[str] | None = None
    whats: list[str] = []  # each column as messages name it
    columns: dict[str, list[float | None]] = {}
    summary: dict[str, Any] = {}
    summary_line: int | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# summary") and line[9:10] in ("", " ", "\t"):
                if summary_line is not None:
                    raise ForeignRunError(source, "a second `# summary` line "
                                          f"(the first is line {summary_line})", n)
                summary, summary_line = parse_summary(line[9:], source, n), n
            elif m := VERSION.match(line):
                version = m[1]
            elif header is None:
                for pair in line[1:].split():
                    key, eq, value = pair.partition("=")
                    if eq and key:
                        preamble[key] = value
            continue
        fields = [f.strip() for f in line.split(",")]
        if header is None:
            for name in fields:
                if not NAME.match(name):
                    raise ForeignRunError(source, f"header: {quote(name)} is not a column name "
                                          "(a bmoe_metrics CSV starts with a header row)", n)
            if len(set(fields)) != len(fields):
                dup = next(f for f in fields if fields.count(f) > 1)
                raise ForeignRunError(source, f"header: column `{clip(dup)}` appears twice", n)
            header = fields
            whats = [f"`{clip(name)}`" for name in header]
            columns = {name: [] for name in header}
            continue
        if summary_line is not None:
            raise ForeignRunError(source, "a token row after the `# summary` line", n)
        if len(fields) != len(header):
            raise ForeignRunError(source, f"{len(fields)} fields, the header has {len(header)}",
                                  n)
        for name, what, value in zip(header, whats, fields):
            columns[name].append(None if value == "" else number(value, source, n, what))
    if header is None and summary_line is None:
        raise ForeignRunError(source, "no header row, no token rows and no `# summary` line"
                              " (empty, or not a bmoe_metrics CSV)")
    return BmoeRun(str(source), version, preamble, columns, summary, summary_line)


def read_bmoe_csv(path: Path) -> BmoeRun:
    return parse_bmoe_csv(read_text(path), path)
