"""A cell's own folder (cells/NN-NAME/): the engine's summary.json with its per-token
columns, else the bmoe CSV the cell wrote (tokens.csv)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from abbench.records.bmoe_csv import parse_bmoe_csv, token_columns
from abbench.records.schema import is_number

# -- a cell's own files ----------------------------------------------------------------------


def _column(values: Any) -> list[float] | None:
    """A per-token column: a list of numbers (null: not measured), else None."""
    if not isinstance(values, list) or not all(v is None or is_number(v) for v in values):
        return None
    return [math.nan if v is None else float(v) for v in values]


def read_cell_files(cell_dir: Path) -> tuple[dict[str, list[float]], str, dict[str, Any]]:
    """A cell's per-token columns, where they came from, and its `summary.json` document.

    Columns come from `summary.json` `per_token` (the engine's --json), else `tokens.csv`
    (a bmoe_metrics CSV); source is "per_token", "tokens.csv" or "none". Fail-soft like the
    cell that wrote them (an external command's output may be anything): a document that is
    not JSON counts as absent, a column that is not a list of numbers is left out, a CSV row
    that does not parse ends the table (a torn file), and `summary`, `fingerprint` and
    `resolved` of the wrong type are dropped."""
    doc: dict[str, Any] = {}
    path = cell_dir / "summary.json"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # absent, unreadable, not JSON
        loaded = None
    if isinstance(loaded, dict):
        doc = {k: v for k, v in loaded.items() if not (
            (k in ("summary", "resolved", "per_token") and not isinstance(v, dict))
            or (k == "fingerprint" and not isinstance(v, str)))}
    pt = doc.get("per_token", {})
    cols = {k: c for k, c in ((k, _column(v)) for k, v in pt.items()) if c is not None}
    if cols.get("wall_ms"):
        return cols, "per_token", doc
    cols = _tokens_csv(cell_dir / "tokens.csv")
    if cols.get("wall_ms"):
        return cols, "tokens.csv", doc
    return {}, "none", doc


def _tokens_csv(path: Path) -> dict[str, list[float]]:
    """A cell's tokens.csv, fail-soft: a row that does not parse ends the table (a torn
    file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return token_columns(parse_bmoe_csv(text, path, torn_ok=True))
