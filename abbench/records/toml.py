"""TOML text in and out: cells.toml, sim profiles, `abbench calibrate`'s tables.

Reading goes through `tomllib` (`tomli` before Python 3.11). `tomllib` gives a position only
for syntax errors, so `KeyLines` finds the line of a key by scanning the text for table
headers and `key =` lines — best effort: a key inside an inline table is reported at the
line of the table that holds it, and a key it cannot find gets no line at all.

Writing covers what a resolved campaign holds: tables and arrays of tables of strings,
integers, finite floats, booleans and flat lists of those.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable
from typing import Any

from abbench.errors import Key

# The one TOML reader: tomllib, tomli before Python 3.11.
if sys.version_info >= (3, 11):
    import tomllib as tomllib  # re-exported
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # noqa: F401 - re-exported

TOMLDecodeError = tomllib.TOMLDecodeError


_BARE = re.compile(r"[A-Za-z0-9_-]+\Z")
_KEY_PART = re.compile(r"""[ \t]*(?:([A-Za-z0-9_-]+)|"((?:[^"\\\n]|\\.)*)"|'([^'\n]*)')[ \t]*""")
_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*\Z")
_AT_END = re.compile(r"\s*\(at end of document\)\s*\Z")


def parse(text: str) -> dict[str, Any]:
    """The document as a dict. Raises `TOMLDecodeError` or `RecursionError`."""
    try:
        return tomllib.loads(text)
    except TOMLDecodeError:
        raise
    except ValueError as e:  # past what Python reads: an integer of over 4300 digits
        raise TOMLDecodeError(f"a value Python cannot read ({e})") from None


def error_position(e: TOMLDecodeError, text: str) -> tuple[str, int | None, int | None]:
    """(message without its position, line, column) of a syntax error."""
    msg = getattr(e, "msg", None) or str(e)
    line, col = getattr(e, "lineno", None), getattr(e, "colno", None)
    m = _POSITION.search(msg)
    if m:
        msg, line, col = msg[: m.start()], int(m[1]), int(m[2])
    m = _AT_END.search(msg)
    if m:  # the end of the document: report its last line
        msg = msg[: m.start()]
        lines = text.split("\n")
        line, col = len(lines), len(lines[-1]) + 1
    return msg, line, col


def _parse_key(s: str, pos: int) -> tuple[list[str], int] | None:
    """A dotted key starting at `s[pos]`: (its parts, the index after it)."""
    parts: list[str] = []
    while True:
        m = _KEY_PART.match(s, pos)
        if not m:
            return None
        if m[1] is not None:
            parts.append(m[1])
        elif m[2] is not None:
            try:
                parts.append(json.loads(f'"{m[2]}"'))
            except ValueError:  # a TOML-only escape (\e, \U...): close enough for a line number
                parts.append(m[2])
        else:
            parts.append(m[3])
        pos = m.end()
        if pos < len(s) and s[pos] == ".":
            pos += 1
            continue
        return parts, pos


class KeyLines:
    """The line of each table header and `key =` line of a TOML text, by key path."""

    def __init__(self, text: str) -> None:
        self._lines: dict[Key, int] = {}
        table: Key = ()
        counts: dict[Key, int] = {}  # arrays of tables seen so far, by name
        open_string: str | None = None  # delimiter of a multi-line string being skipped
        for n, raw in enumerate(text.split("\n"), 1):
            line = raw.rstrip("\r")
            if open_string is not None:
                if line.count(open_string) % 2 == 1:
                    open_string = None
                continue
            s = line.lstrip(" \t")
            if s.startswith("[["):
                parsed = _parse_key(s, 2)
                if parsed and s.startswith("]]", parsed[1]):
                    name = tuple(parsed[0])
                    counts[name] = counts.get(name, -1) + 1
                    table = (*name, counts[name])
                    self._lines.setdefault(table, n)
                continue
            if s.startswith("["):
                parsed = _parse_key(s, 1)
                if parsed and s.startswith("]", parsed[1]):
                    table = tuple(parsed[0])
                    self._lines.setdefault(table, n)
                continue
            parsed = _parse_key(s, 0)
            if parsed and s.startswith("=", parsed[1]):
                self._lines.setdefault((*table, *parsed[0]), n)
                rest = s[parsed[1] + 1:]
                for delim in ('"""', "'''"):
                    if delim in rest and rest.count(delim) % 2 == 1:
                        open_string = delim
                        break

    def line(self, key: Key) -> int | None:
        """The line of `key`, else of the nearest table or key above it that is known."""
        for end in range(len(key), 0, -1):
            n = self._lines.get(key[:end])
            if n is not None:
                return n
        return None


# -- writing -------------------------------------------------------------------------

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b",
            "\f": "\\f"}


def dump_key(key: str) -> str:
    return key if _BARE.match(key) else dump_value(key)


def dump_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(float(value))  # a `.` or an exponent: a float (numpy's repr is not TOML)
    if isinstance(value, str):
        return '"' + "".join(
            _ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
            for c in value
        ) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dump_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{dump_key(k)} = {dump_value(v)}"
                                for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def dump_table(header: Iterable[str], items: dict[str, Any], array: bool = False) -> list[str]:
    """`[header]` (or `[[header]]`) and its `key = value` lines; None values are left out."""
    name = ".".join(dump_key(h) for h in header)
    lines = [f"[[{name}]]" if array else f"[{name}]"]
    lines += [f"{dump_key(k)} = {dump_value(v)}" for k, v in items.items() if v is not None]
    return lines
