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

The oldest files have neither preamble nor summary and only 8 columns; the newest (v2,
the seed engine's `core/src/metrics/csv_metrics_sink.cpp`) 29, and one `# summary` per
*turn*: a session writes its rows and trailer for each prompt in turn, so rows after a
trailer are the next turn's, and the run's summary combines the turns (`combine_turns`).
Columns are read by name and every one is optional; a cell that is empty is a gap
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
import warnings
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from abbench.errors import ForeignRunError
from abbench.records.schema import LIMIT
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
class Turn:
    """One `# summary` trailer: its line, the token rows above it (of the whole file) and
    its figures (numbers as float, else str)."""

    line: int
    rows: int
    summary: dict[str, Any]


@dataclass(frozen=True)
class BmoeRun:
    """One run's per-token table, its preamble and its own `# summary` lines (if it wrote
    any): `summary` is the run's (one trailer's, or the turns combined)."""

    source: str
    version: str | None
    preamble: dict[str, str]
    columns: dict[str, list[float | None]]  # header order, one value per token row
    summary: dict[str, Any] = field(default_factory=dict)  # numbers as float, else str
    summary_line: int | None = None  # the last trailer's
    dropped: tuple[DroppedColumn, ...] = ()  # read with `drop_bad_columns`: left out
    turns: tuple[Turn, ...] = ()  # every trailer, in file order

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


# How a `# summary` key of one turn joins the same key of the others (every other key: the
# last turn's, as the session's state after it — the hit rate, the cache's residency, the
# route-ahead agreement the engine counts over the session). Counts add; per-token figures
# are weighted by the turn's tokens; the load happens once.
SUMMED = frozenset({
    "tokens", "read_MiB", "io_s", "n_prompt", "prefill_s", "spec_read_MiB", "spec_experts",
    "spec_useful", "experts_routed", "experts_dropped", "mtp_drafted", "mtp_accepted",
    "mtp_decodes", "drafted_steps", "cache_resizes", "evictions", "rereads"})
FIRST = frozenset({"load_s"})


def combine_turns(turns: Sequence[Turn]) -> dict[str, Any]:
    """The run's summary from its trailers: one trailer as written; several (the turns of
    one session) joined key by key — counts summed, per-token figures (`.../tok`) weighted
    by each turn's tokens, `tok/s` and `prefill_tps` from the sums, `load_s` the first
    turn's, the rest the last turn's — and `turns`, how many."""
    if len(turns) <= 1:
        return dict(turns[0].summary) if turns else {}
    out: dict[str, Any] = {}
    weights = [t.summary.get("tokens") for t in turns]
    for key in dict.fromkeys(k for t in turns for k in t.summary):
        values = [t.summary.get(key) for t in turns]
        numbers = [v for v in values if isinstance(v, float)]
        if key in SUMMED and len(numbers) == len(values):
            out[key] = math.fsum(numbers)
        elif key.endswith("/tok") and len(numbers) == len(values) \
                and all(isinstance(w, float) for w in weights) and math.fsum(weights) > 0:
            out[key] = math.fsum(v * w for v, w in zip(numbers, weights)) / math.fsum(weights)
        elif key in FIRST:
            out[key] = next((v for v in values if v is not None), None)
        else:
            out[key] = next((v for v in reversed(values) if v is not None), None)
    if isinstance(out.get("s/tok"), float) and out["s/tok"] > 0:
        out["tok/s"] = 1.0 / out["s/tok"]
    if isinstance(out.get("prefill_s"), float) and out["prefill_s"] > 0 \
            and isinstance(out.get("n_prompt"), float):
        out["prefill_tps"] = out["n_prompt"] / out["prefill_s"]
    out["turns"] = float(len(turns))
    return out


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
                   drop_bad_columns: bool = False,
                   columns: Collection[str] | None = None) -> BmoeRun:
    """The file's run. `torn_ok`: a row that does not read ends the table instead of being
    an error, and a file with no header row is an empty run. `drop_bad_columns`: a column
    other than `NEEDED_COLUMNS` with a value that is not a number is left out (in the run's
    `dropped`) instead of being an error. `columns`: the only columns the reader wants
    (the others are not kept, and in the common file not even converted)."""
    try:
        run = _parse(text, source, torn_ok, drop_bad_columns, columns)
    except ForeignRunError:
        if not torn_ok:
            raise
        return BmoeRun(str(source), None, {}, {})
    if columns is not None and any(c not in columns for c in run.columns):
        run = replace(run, columns={k: v for k, v in run.columns.items() if k in columns})
    return run


def _parse(text: str, source: str | Path, torn_ok: bool, drop_bad: bool,
           wanted: Collection[str] | None = None) -> BmoeRun:
    lines = text.removeprefix("\ufeff").splitlines()
    fast = _parse_fast(lines, source, wanted)
    if fast is not None:
        return fast
    head = _Head()
    header: list[str] | None = None
    whats: list[str] = []  # each column as messages name it
    columns: dict[str, list[float | None]] = {}
    rows = 0
    dropped: dict[str, DroppedColumn] | None = {} if drop_bad else None
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            head.comment(line, n, rows, source, header is None)
            continue
        fields = [f.strip() for f in line.split(",")]
        if header is None:
            header = _header(fields, source, n)
            whats = [f"column `{clip(name)}`" for name in header]
            columns = {name: [] for name in header}
            continue
        try:
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
        rows += 1
    if header is None and not head.turns:
        raise ForeignRunError(source, "no header row, no token rows and no `# summary` line"
                              " (empty, or not a bmoe_metrics CSV)")
    for name in dropped or ():
        del columns[name]
    return head.run(source, columns, tuple((dropped or {}).values()))


@dataclass
class _Head:
    """What a file's comment lines say: its version, its preamble (the comments before the
    header row) and its trailers."""

    version: str | None = None
    preamble: dict[str, str] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)

    def comment(self, line: str, n: int, rows: int, source: str | Path,
                before_header: bool) -> None:
        if line.startswith("# summary") and line[9:10] in ("", " ", "\t"):
            self.turns.append(Turn(n, rows, parse_summary(line[9:], source, n)))
        elif m := VERSION.match(line):
            self.version = m[1]
        elif before_header:
            for pair in line[1:].split():
                key, eq, value = pair.partition("=")
                if eq and key:
                    self.preamble[key] = value

    def run(self, source: str | Path, columns: dict[str, list[float | None]],
            dropped: tuple[DroppedColumn, ...] = ()) -> BmoeRun:
        turns = tuple(self.turns)
        return BmoeRun(str(source), self.version, self.preamble, columns,
                       combine_turns(turns), turns[-1].line if turns else None, dropped,
                       turns)


def _parse_fast(lines: list[str], source: str | Path,
                wanted: Collection[str] | None = None) -> BmoeRun | None:
    """The file read in bulk when every token row is numbers (the common file: an import of
    ten thousand runs reads them all); None for anything else, which the line-by-line
    reading reads (and names the problem of) exactly as before."""
    head = _Head()
    header: list[str] | None = None
    body: list[str] = []
    try:
        for n, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                head.comment(line, n, len(body), source, header is None)
            elif header is None:
                header = _header([f.strip() for f in line.split(",")], source, n)
            else:
                body.append(line)
    except ForeignRunError:  # which problem comes first is the careful reading's to say
        return None
    if header is None or not body:
        return None
    keep = [j for j, name in enumerate(header) if wanted is None or name in wanted]
    commas = len(header) - 1
    if not keep or any(line.count(",") != commas for line in body):
        return None  # a row of the wrong width: the careful reading names it (or ends there)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an empty line or field: the careful reading
            table = np.loadtxt(body, delimiter=",", dtype=float, ndmin=2,
                               usecols=keep)  # (rows, kept columns)
    except (ValueError, UserWarning):
        return None
    if table.shape != (len(body), len(keep)) or not np.isfinite(table).all():
        return None
    return head.run(source, {header[j]: table[:, k].tolist() for k, j in enumerate(keep)})


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
    if not dropped:  # the common row, all numbers: what `number` reads, without the walk
        try:
            fast = [float(value) for value in fields]
        except ValueError:
            pass
        else:
            if all(abs(x) <= LIMIT for x in fast):  # (False for NaN): `number`'s range
                return fast  # type: ignore[return-value]
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
