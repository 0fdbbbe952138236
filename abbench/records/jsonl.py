"""JSON-lines and JSON record files: appended whole or not at all, read with the line of
every error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from abbench.errors import BadField, RecordError
from abbench.fsutil import append_line
from abbench.records.schema import T, from_dict

# -- files ---------------------------------------------------------------------------


def jsonl_line(obj: dict[str, Any]) -> str:
    """One record as a JSON line: compact, NaN refused, the newline included."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


def append_jsonl(path: Path, obj: dict[str, Any], fsync: bool = True) -> None:
    """Append one JSON line, written whole or not at all (`fsutil.append_line`: one locked
    write, a torn tail cut first, undone on failure) and by default fsync'd."""
    append_line(path, jsonl_line(obj), fsync)


def document_text(doc: dict[str, Any]) -> str:
    """A JSON document as abbench writes its records (plan.json, import.json, report.json):
    one top-level key a line, and a list of objects one item a line — readable, diffable by
    line, and written by json's C encoder (an indented dump of ten thousand cells takes
    seconds). NaN is refused, as everywhere in a record."""

    def one(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            items = ",\n  ".join(one(x) for x in value)
            lines.append(f" {one(key)}: [\n  {items}\n ]")
        else:
            lines.append(f" {one(key)}: {one(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def numbered_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every complete line of a JSON-lines file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RecordError(f"{path}: cannot read ({e.strerror or e})") from None
    out = []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: torn by a crash
                continue
            raise RecordError(f"{path}:{n}: not a JSON line ({e.msg})") from None
        except ValueError:  # a number of thousands of digits
            raise RecordError(f"{path}:{n}: not a JSON line (a number too long)") from None
        except RecursionError:
            raise RecordError(f"{path}:{n}: not a JSON line (nested too deeply)") from None
        if not isinstance(obj, dict):
            raise RecordError(f"{path}:{n}: expected a JSON object")
        out.append((n, obj))
    return out



def read_jsonl_records(path: Path, read: Callable[[dict[str, Any]], T], what: str) -> list[T]:
    """Every line of a JSON-lines file as a record (`read` raises `BadField` for one that is
    not), in order; a malformed line is a `RecordError` naming the file, line and `what`."""
    out = []
    for n, d in numbered_jsonl(path):
        try:
            out.append(read(d))
        except BadField as e:
            raise RecordError(f"{path}:{n}: malformed {what}: {e}") from None
    return out

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file; a torn last line (a crash mid-write) is
    ignored, any other bad line is an error naming the file and line."""
    return [obj for _, obj in numbered_jsonl(path)]


# A cell's folder name: at most one path component, so that `cells/LABEL` stays inside


def read_record(path: Path, cls: type[T], what: str) -> T | None:
    """One JSON record file of a run folder: None when absent, a RecordError naming the
    file when it does not parse."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RecordError(f"{path}: malformed {what} ({str(e)[:200]})") from None
    try:
        return from_dict(cls, doc)
    except BadField as e:
        raise RecordError(f"{path}: malformed {what}: {e}") from None
