"""The `bmoe_metrics` per-token CSV, every generation of it: read and write.

The seed engine writes it, abbench's engine writes it (`--csv`, version 2), an external
cell's `output = "bmoe-csv:PATH"` is one, and `abbench import` reads archives of them
(docs/formats.md#per-token-csv-bmoe_metrics-v2).

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
a name is an error naming the file and line (and the column) — or, read `torn_ok` (a cell's
own tokens.csv, which a crash can cut mid-row), the end of the table; read
`drop_bad_columns` (an archive being imported), a column holding a value that is not a
number is left out and said, unless the run's figures need it (`NEEDED_COLUMNS`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError
from abbench.records.summary import RunSummary
from abbench.records.text import clip, number, quote, read_text

VERSION = re.compile(r"#\s*bmoe_metrics\s+(v\S+)\s*$")
WRITTEN_VERSION = "v2"  # what abbench's engine writes
# The preamble's cache budget in MiB: the seed engine named it `cache_mb` (its flag is
# `--cache-mb`), and abbench's engine keeps the name for the seed engine's readers.
CACHE_BUDGET = "cache_mb"
# The run summary's figures on the `# summary` trailer abbench's engine writes, in order.
TRAILER_KEYS = ("tokens", "s/tok", "tok/s", "read_MiB", "cache_hit_pct", "stall_s/tok",
                "majflt/tok", "cpu_s/tok", "experts_routed", "experts_dropped",
                "spec_read_MiB", "spec_experts", "spec_useful", "io_s/tok", "compute_s/tok",
                "mgmt_s/tok", "n_prompt", "prefill_s", "ttft_s", "prefill_tok/s", "load_s",
                "cache_resident_MiB", "cache_budget_MiB", "peak_rss_MiB")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./%-]*$")
# What a token row's value must be, said wherever one is not.
EXPECTED = "the per-token columns are numbers, an empty field a gap"
# Words a switch is written in by hand (`overlap=on`): the column wants it as 1 or 0.
SWITCH_WORDS = frozenset({"on", "off", "true", "false", "yes", "no"})
# The columns a run's figures rest on (tokens/s is the tokens over the sum of `wall_ms`): a
# bad value there is an error even where other columns are left out (`drop_bad_columns`).
NEEDED_COLUMNS = ("wall_ms",)


@dataclass(frozen=True)
class DroppedColumn:
    """A column left out of a table read with `drop_bad_columns`: the line of its first
    value that is not a number, and what is wrong with that value."""

    name: str
    line: int
    problem: str  # "column `overlap`: 'off' is not a number (...)"


@dataclass(frozen=True)
class BmoeRun:
    """One run's per-token table, its preamble and its own `# summary` (if it wrote one)."""

    source: str
    version: str | None
    preamble: dict[str, str]
    columns: dict[str, list[float | None]]  # header order, one value per token row
    summary: dict[str, Any] = field(default_factory=dict)  # numbers as float, else str
    summary_line: int | None = None
    dropped: tuple[DroppedColumn, ...] = ()  # read with `drop_bad_columns`: left out

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


def parse_bmoe_csv(text: str, source: str | Path = "<text>", *, torn_ok: bool = False,
                   drop_bad_columns: bool = False) -> BmoeRun:
    """The file's run. `torn_ok`: a row that does not read ends the table instead of being
    an error, and a file with no header row is an empty run. `drop_bad_columns`: a column
    other than `NEEDED_COLUMNS` with a value that is not a number is left out (in the run's
    `dropped`) instead of being an error."""
    try:
        return _parse(text, source, torn_ok, drop_bad_columns)
    except ForeignRunError:
        if not torn_ok:
            raise
        return BmoeRun(str(source), None, {}, {})


def _parse(text: str, source: str | Path, torn_ok: bool, drop_bad: bool) -> BmoeRun:
    text = text.removeprefix("\ufeff")
    version: str | None = None
    preamble: dict[str, str] = {}
    header: list[str] | None = None
    whats: list[str] = []  # each column as messages name it
    columns: dict[str, list[float | None]] = {}
    summary: dict[str, Any] = {}
    summary_line: int | None = None
    dropped: dict[str, DroppedColumn] | None = {} if drop_bad else None
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
            header = _header(fields, source, n)
            whats = [f"column `{clip(name)}`" for name in header]
            columns = {name: [] for name in header}
            continue
        try:
            if summary_line is not None:
                raise ForeignRunError(source, "a token row after the `# summary` line", n)
            if len(fields) != len(header):
                raise ForeignRunError(source, f"{len(fields)} fields, the header has "
                                      f"{len(header)}", n)
            row = _row(header, whats, fields, source, n, dropped)
        except ForeignRunError:
            if torn_ok:
                break
            raise
        for name, value in zip(header, row):
            columns[name].append(value)
    if header is None and summary_line is None:
        raise ForeignRunError(source, "no header row, no token rows and no `# summary` line"
                              " (empty, or not a bmoe_metrics CSV)")
    for name in dropped or ():
        del columns[name]
    return BmoeRun(str(source), version, preamble, columns, summary, summary_line,
                   tuple((dropped or {}).values()))


def _header(fields: list[str], source: str | Path, line: int) -> list[str]:
    """The header row's column names, each a name and none twice."""
    for name in fields:
        if not NAME.match(name):
            raise ForeignRunError(source, f"header: {quote(name)} is not a column name "
                                  "(a bmoe_metrics CSV starts with a header row)", line)
    if len(set(fields)) != len(fields):
        dup = next(f for f in fields if fields.count(f) > 1)
        raise ForeignRunError(source, f"header: column `{clip(dup)}` appears twice", line)
    return fields


def _row(header: list[str], whats: list[str], fields: list[str], source: str | Path,
         line: int, dropped: dict[str, DroppedColumn] | None) -> list[float | None]:
    """One token row's values. A value that is not a number is an error naming its column
    and what was expected; with `dropped` (not None) its column is left out instead and
    recorded there, unless the run's figures need it."""
    row: list[float | None] = []
    for name, what, value in zip(header, whats, fields):
        if value == "" or (dropped is not None and name in dropped):
            row.append(None)
            continue
        try:
            row.append(number(value, source, line, what))
        except ForeignRunError as e:
            expected = EXPECTED + ("; a switch as 1 or 0" if value.lower() in SWITCH_WORDS
                                   else "")
            if dropped is None:
                raise ForeignRunError(source, f"{e.problem} ({expected})", line) from None
            if name in NEEDED_COLUMNS:
                raise ForeignRunError(source, f"{e.problem} ({expected}; the run's tokens/s "
                                      f"rests on `{name}`: the file is not imported)",
                                      line) from None
            dropped[name] = DroppedColumn(name, line, f"{e.problem} ({expected}): the column "
                                          "is left out, the rest of the file is read")
            row.append(None)
    return row


def read_bmoe_csv(path: Path) -> BmoeRun:
    return parse_bmoe_csv(read_text(path), path)


def token_columns(run: BmoeRun) -> dict[str, list[float]]:
    """Every column as floats, a gap as NaN (as a per-token JSON column's null)."""
    return {k: [math.nan if v is None else v for v in vs] for k, vs in run.columns.items()}


def run_summary(run: BmoeRun) -> dict[str, Any]:
    """The run's summary: its own `# summary` line, else tokens, s/tok and tok/s from the
    rows' wall times; {} when it has neither."""
    summary = dict(run.summary)
    walls = run.column("wall_ms")
    if "tok/s" not in summary and walls and sum(walls) > 0:
        summary["tokens"] = len(walls)
        summary["s/tok"] = sum(walls) / len(walls) / 1e3
        summary["tok/s"] = len(walls) / (sum(walls) / 1e3)
    if summary:
        summary.setdefault("tokens", len(walls or []))
    return summary


def work_fingerprint(run: BmoeRun) -> str | None:
    """The work an engine outside abbench reports, as abbench fingerprints it: the bytes it
    read per token (None without a read_bytes column)."""
    reads = run.column("read_bytes")
    if not reads:
        return None
    return "sha256:" + hashlib.sha256(json.dumps([int(r) for r in reads]).encode()).hexdigest()


def trailer(summary: RunSummary) -> dict[str, Any]:
    """The figures of the `# summary` trailer (TRAILER_KEYS) from a run summary, as numbers:
    the writer formats them."""
    doc = summary.to_json()
    return {k: doc.get(k) for k in TRAILER_KEYS}


def _field(value: Any) -> str:
    return str(value).replace(" ", "_")


def format_bmoe_csv(preamble: dict[str, Any], columns: Sequence[str],
                    rows: Iterable[dict[str, Any]], summary: dict[str, str]) -> str:
    """The file abbench's engine writes: version line, preamble, header, one row per token
    (values already formatted or numbers), `# summary` trailer."""
    lines = [f"# bmoe_metrics {WRITTEN_VERSION}",
             "# " + " ".join(f"{k}={_field(v)}" for k, v in preamble.items()),
             ",".join(columns)]
    lines += [",".join(str(row[c]) for c in columns) for row in rows]
    lines.append("# summary " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return "\n".join(lines) + "\n"
