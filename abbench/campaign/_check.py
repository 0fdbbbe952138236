"""Checking TOML values: the campaign file's error, key paths, types and ranges.

A problem is raised as a `CampaignFileError` naming its key path relative to the table
being checked; `under` re-roots it as the check climbs out, and `load_campaign` adds the
file name and line at the end.
"""

from __future__ import annotations

import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, fields
from typing import Any, NoReturn

from abbench.campaign._toml import Key, dump_value, format_key
from abbench.errors import CampaignFileError


def error_at(key: Key, problem: str, tip: str | None = None,
             at: Key | None = None) -> CampaignFileError:
    message = f"`{format_key(key)}`: {problem}" if key else problem
    return CampaignFileError(message, tip, key=key, problem=problem, at=at)


def fail(key: Key, problem: str, tip: str | None = None, at: Key | None = None) -> NoReturn:
    raise error_at(key, problem, tip, at)


def under(e: CampaignFileError, prefix: Key) -> CampaignFileError:
    """The same problem, its key taken as relative to the table at `prefix`."""
    return error_at((*prefix, *e.key), e.problem, e.tip, (*prefix, *e.at))


def did_you_mean(word: str, choices: Iterable[str], what: str = "") -> str | None:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    if choices and len(choices) <= 12:
        return f"{what or 'valid keys'}: " + ", ".join(f"`{c}`" for c in choices)
    return "docs/cells.md lists every key" if not what else None


def show(value: Any) -> str:
    """A value as the file would write it, shortened for a message."""
    try:
        text = dump_value(value)
    except TypeError:
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- TOML types ----------------------------------------------------------------------

_NOUNS = {bool: "a boolean (`true` or `false`)", int: "an integer", float: "a number",
          str: "a string"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _alternatives(hint: Any) -> list[Any] | None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if a is not type(None)]
    return None


def _expected(hint: Any) -> str:
    alts = _alternatives(hint)
    if alts is not None:
        return " or ".join(_expected(a) for a in alts)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        items = _alternatives(item) or [item]
        return "an array of " + " or ".join(_PLURALS[a] for a in items)
    return _NOUNS[hint]


def describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({show(value)})"
    if isinstance(value, int):
        return f"an integer ({show(value)})"
    if isinstance(value, float):
        return f"a float ({show(value)})"
    if isinstance(value, str):
        return f"a string ({show(value)})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a date/time ({value})"


def coerce(key: Key, value: Any, hint: Any) -> Any:
    """`value` as the type `hint` names, or a problem naming `key`. A boolean is never a
    number; an integer is a number; floats must be finite; strings must not hold NUL."""
    alts = _alternatives(hint)
    if alts is not None:
        same_shape = [a for a in alts if (typing.get_origin(a) is tuple) == isinstance(value, list)]
        if len(same_shape) == 1 and (len(alts) == 1 or isinstance(value, list)):
            return coerce(key, value, same_shape[0])  # its own message is the more precise
        for alt in same_shape:
            try:
                return coerce(key, value, alt)
            except CampaignFileError:
                continue
    elif typing.get_origin(hint) is tuple:
        if isinstance(value, list):
            item = typing.get_args(hint)[0]
            return tuple(coerce((*key, i), v, item) for i, v in enumerate(value))
    elif isinstance(value, bool):  # TOML's booleans are Python ints: never a number here
        if hint is bool:
            return value
    elif hint is int and isinstance(value, int):
        return value
    elif hint is float and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            fail(key, f"{show(value)} is too large")
        if not math.isfinite(number):
            fail(key, f"must be a finite number (got {show(value)})")
        return number
    elif hint is str and isinstance(value, str):
        if "\x00" in value:
            fail(key, "must not contain a NUL character")
        return value
    fail(key, f"expected {_expected(hint)}, got {describe(value)}")


def as_table(key: Key, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        fail(key, f"expected a table, got {describe(raw)}")
    return raw


def as_array_of_tables(key: Key, raw: Any) -> list[dict[str, Any]]:
    name = format_key(key)
    if isinstance(raw, dict):
        fail(key, "expected an array of tables", tip=f"write `[[{name}]]`, not `[{name}]`")
    if not isinstance(raw, list):
        fail(key, f"expected an array of tables, got {describe(raw)}",
             tip=f"write one `[[{name}]]` table per entry")
    for i, item in enumerate(raw):
        as_table((*key, i), item)
    return raw


def check_keys(key: Key, table: dict[str, Any], valid: Sequence[str],
               tip: Callable[[str], str | None] | None = None) -> None:
    """Every key of `table` is one of `valid`; else a problem naming the first that is not,
    with `tip(key)` or the closest valid key as the tip."""
    for k in table:
        if k not in valid:
            hint = (tip(k) if tip else None) or did_you_mean(k, valid, "" if key else "tables")
            fail((*key, k), "unknown key" if key else "unknown table", hint)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build(cls: type[Any], raw: Any, key: Key, **given: Any) -> Any:
    """A table's dataclass from its TOML table: keys and types checked here, values by the
    dataclass itself; every problem names its key under `key`."""
    table = as_table(key, raw)
    names = [f.name for f in fields(cls) if f.name not in given]
    check_keys(key, table, names)
    for f in fields(cls):
        if f.name in names and f.name not in table and f.default is MISSING \
                and f.default_factory is MISSING:
            fail(key, f"missing key `{f.name}`")
    values = {k: coerce((*key, k), v, _hints(cls)[k]) for k, v in table.items()}
    try:
        return cls(**values, **given)
    except CampaignFileError as e:
        raise under(e, key) from None


def in_range(key: str, ok: bool, must: str, value: Any) -> None:
    if not ok:
        fail((key,), f"must be {must} (got {show(value)})")
