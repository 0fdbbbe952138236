"""A cell's own folder (cells/NN-NAME/): its `summary.json` document (`records.cell_doc`)
with its per-token columns, else the bmoe CSV the cell wrote (tokens.csv), read into
`CellFiles`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from abbench.records.bmoe_csv import parse_bmoe_csv
from abbench.records.bmoe_view import BATCH, COSTS, TURN, token_view
from abbench.records.cell_doc import (
    FINGERPRINT,
    METRICS,
    NOTES,
    PER_TOKEN,
    REPETITIONS,
    RESOLVED,
    SAMPLES,
    SUMMARY,
)
from abbench.records.metrics_file import Pressure
from abbench.records.schema import LIMIT, is_number
from abbench.records.summary import RunSummary
from abbench.records.tokens import PER_TOKEN_COLUMNS, STEP, TURN_COLUMNS, WALL_MS

SUMMARY_JSON = "summary.json"
TOKENS_CSV = "tokens.csv"


# Where a cell's per-token columns came from: summary.json's `per_token`, its tokens.csv,
# or nowhere.
ColumnSource = Literal["per_token", "tokens.csv", "none"]


@dataclass(frozen=True)
class CellFiles:
    """What a cell's own files say, as the analysis reads them. Whatever the files lack or
    hold in the wrong type reads as absent: no columns, an empty summary, None."""

    columns: dict[str, list[float]] = field(default_factory=dict)  # records.tokens names;
    # each a list of floats, NaN where the cell wrote null or nothing (not measured)
    source: ColumnSource = "none"  # where the columns came from
    summary: RunSummary = field(default_factory=RunSummary)  # summary.json's `summary`
    fingerprint: str | None = None
    threads: int | None = None  # the compute threads `resolved` names
    notes: tuple[str, ...] = ()  # what the cell's output reader noted (llama-completion)
    repetitions: bool = False  # each column value is one repetition (llama-bench), not a token
    # the pressure readings: an import's `.metrics`, a bmoe cell's wrapper's (finite only)
    metrics: Pressure = field(default_factory=Pressure)


def read_cell_files(cell_dir: Path) -> CellFiles:
    """A cell's per-token columns, where they came from, and what its `summary.json` says.

    Columns come from `summary.json` `per_token` (the engine's --json), else `tokens.csv`
    (a bmoe_metrics CSV). Fail-soft like the cell that wrote them (an external command's
    output may be anything): a document that is not JSON counts as absent, a column that
    is not a list of numbers is left out, a CSV row that does not parse ends the table (a
    torn file), and a section of the wrong type reads as absent."""
    doc = _document(cell_dir / SUMMARY_JSON)
    cols = {k: c for k, v in _object(doc, PER_TOKEN).items() if (c := _column(v)) is not None}
    source = "per_token"
    if not cols.get(WALL_MS):
        cols, source = _tokens_csv(cell_dir / TOKENS_CSV), "tokens.csv"
    if not cols.get(WALL_MS):
        cols, source = {}, "none"
    fingerprint = doc.get(FINGERPRINT)
    threads = _object(doc, RESOLVED).get("threads")  # `cell_doc.Resolved.threads`
    notes = doc.get(NOTES)
    return CellFiles(
        columns=cols, source=source, summary=_summary(doc),
        fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        threads=threads if isinstance(threads, int) else None,
        notes=tuple(n for n in notes if isinstance(n, str)) if isinstance(notes, list) else (),
        repetitions=doc.get(SAMPLES) == REPETITIONS,
        metrics=Pressure.of({k: _finite(v) for k, v in _object(doc, METRICS).items()}),
    )


def _document(path: Path) -> dict[str, Any]:
    """summary.json as an object; {} when it is absent, unreadable or not a JSON object."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # absent, unreadable, not JSON
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _summary(doc: dict[str, Any]) -> RunSummary:
    try:
        return RunSummary.from_json(_object(doc, SUMMARY))
    except RecursionError:  # nested past what `finite` walks: garbage, not a summary
        return RunSummary()


_NUMBERS = frozenset({int, float, type(None)})


def _column(values: Any) -> list[float] | None:
    """A per-token column: a list of numbers (null: not measured), else None."""
    if not isinstance(values, list):
        return None
    if set(map(type, values)) <= _NUMBERS:  # the common column, read in bulk
        try:
            column = np.array(values, dtype=float)  # (n,): None as NaN
        except OverflowError:  # an integer past any float: not a number here
            return None
        gaps = np.isnan(column)
        if int(gaps.sum()) == values.count(None) and bool(np.all(gaps | (np.abs(column) <= LIMIT))):
            return column.tolist()  # type: ignore[no-any-return]
        return None  # a NaN written as a number, or a number past LIMIT
    if not all(v is None or is_number(v) for v in values):
        return None
    return [math.nan if v is None else float(v) for v in values]


def _finite(value: Any) -> float | None:
    """A number as a float when it is one and finite (a whole number too large for a float
    is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# What a cell's reader uses of a tokens.csv: the measures and the view's accounting.
READ_COLUMNS = frozenset({*PER_TOKEN_COLUMNS, *TURN_COLUMNS, *COSTS, BATCH, TURN, STEP})


def _tokens_csv(path: Path) -> dict[str, list[float]]:
    """A cell's tokens.csv, fail-soft: a row that does not parse ends the table (a torn
    file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return token_view(parse_bmoe_csv(text, path, torn_ok=True, columns=READ_COLUMNS))


__all__ = ["SUMMARY_JSON", "TOKENS_CSV", "CellFiles", "read_cell_files"]
