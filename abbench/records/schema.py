"""The one validator: a frozen dataclass from a TOML table or a JSON object, each value
checked against its field's annotation, every problem a `BadField` naming its key path.

One set of rules, read two ways:

- `strict=True` for files people write (cells.toml, simulated device profiles): an
  unknown key is a problem, with the closest valid key suggested;
- `strict=False` for records abbench writes (JSON): unknown keys are ignored (newer
  writers), missing optional keys take their defaults.

A boolean is never a number; an integer is a number where a float is asked; numbers are
finite and within `LIMIT`; strings hold no NUL; arrays become tuples. Range checks belong
to the dataclasses themselves (`__post_init__`); the callers turn a `BadField` into their
file's error (`CampaignFileError`, `RecordError`, `UsageError`) naming file and line.
"""

from __future__ import annotations

import difflib
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from typing import Any, NoReturn, TypeVar, Union, get_args, get_origin, get_type_hints

from abbench.errors import BadField, Key
from abbench.records.toml import dump_value

T = TypeVar("T")

# No number a run folder records comes near this (Unix times ~2e9, bytes per token ~1e10);
# beyond it sums, spans and plot ranges overflow to infinity.
LIMIT = 1e18


def is_number(value: Any) -> bool:
    """A finite number within LIMIT (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LIMIT  # False for NaN; never converts a huge int to a float


def fail(key: Key | str, problem: str, tip: str | None = None) -> NoReturn:
    raise BadField(key, problem, tip)


def did_you_mean(word: str, choices: Iterable[str], what: str = "") -> str | None:
    """The closest of `choices` to a misspelt `word`; else the choices, if few."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    if choices and len(choices) <= 12:
        return f"{what or 'valid keys'}: " + ", ".join(f"`{c}`" for c in choices)
    return "docs/cells.md lists every key" if not what else None


def show(value: Any) -> str:
    """A value as the file would write it, shortened for a message."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"a {len(str(abs(value)))}-digit number" if abs(value) < 10**4000 else \
            "a number of thousands of digits"
    if value is None:
        return "null"
    try:
        text = dump_value(value)
    except (TypeError, ValueError, RecursionError):
        text = str(value) if not isinstance(value, (list, dict)) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


# -- types -------------------------------------------------------------------------------

_NOUNS = {bool: "a boolean (`true` or `false`)", int: "an integer", float: "a number",
          str: "a string"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


@cache
def _plain_kind(hint: Any) -> type | None:
    """`str`, `float` or `int` for a hint that is that type (or it or None); None else."""
    alts = _alternatives(hint)
    plain = alts[0] if alts is not None and len(alts) == 1 else hint
    return plain if plain in (str, float, int) else None


@cache
def _shape(hint: Any) -> tuple[list[Any] | None, Any]:
    """A hint's alternatives (a union's members but None) and its origin, read once per
    hint: a record of ten thousand cells asks the same few hints a million times."""
    return _alternatives(hint), get_origin(hint)


def _alternatives(hint: Any) -> list[Any] | None:
    if get_origin(hint) in (Union, types.UnionType):
        return [a for a in get_args(hint) if a is not type(None)]
    return None


def _expected(hint: Any, table: str) -> str:
    alts = _alternatives(hint)
    if alts is not None:
        return " or ".join(_expected(a, table) for a in alts)
    origin = get_origin(hint)
    if origin is tuple:
        item = get_args(hint)[0]
        items = _alternatives(item) or [item]
        noun = table.split(" ", 1)[-1]  # "an object" -> "object"
        return "an array of " + " or ".join(_PLURALS.get(a, f"{noun}s") for a in items)
    if origin in (dict, Mapping) or is_dataclass(hint):
        return table
    return _NOUNS.get(hint, str(hint))


def describe(value: Any, table: str = "a table") -> str:
    """What a value is, for "expected X, got Y" (`table`: what the format calls a table)."""
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
        return table
    if value is None:
        return "null"
    return f"a date/time ({value})"


def coerce(key: Key, value: Any, hint: Any, strict: bool = True) -> Any:
    """`value` as the annotation `hint` asks, or a `BadField` naming `key`. Tables within
    (dataclass hints) are read with the same `strict`."""
    if hint is Any:
        return value
    kind = _plain_kind(hint)  # the commonest fields of a record, read without the walk
    if kind is str and type(value) is str and "\x00" not in value:
        return value
    if kind is float and type(value) in (float, int) and abs(value) <= LIMIT:
        return float(value)  # (NaN fails `<=`: the walk names it)
    if kind is int and type(value) is int and abs(value) <= LIMIT:
        return value
    alts, origin = _shape(hint)
    if alts is not None:
        if value is None and len(alts) < len(get_args(hint)):
            return None
        same_shape = [a for a in alts if (get_origin(a) is tuple) == isinstance(value, list)]
        if len(same_shape) == 1 and (len(alts) == 1 or isinstance(value, list)):
            return coerce(key, value, same_shape[0], strict)  # its own message is precise
        for alt in same_shape:
            try:
                return coerce(key, value, alt, strict)
            except BadField:
                continue
    elif origin is tuple:
        if isinstance(value, list):
            item = get_args(hint)[0]
            return tuple(coerce((*key, i), v, item, strict) for i, v in enumerate(value))
    elif origin in (dict, Mapping):
        if isinstance(value, dict):
            item = get_args(hint)[1]
            return {k: coerce((*key, k), v, item, strict) for k, v in value.items()}
    elif is_dataclass(hint):
        return build(hint, value, key, strict=strict)  # type: ignore[arg-type]
    elif isinstance(value, bool):  # TOML's and JSON's booleans are ints: never a number here
        if hint is bool:
            return value
    elif hint is int and isinstance(value, int):
        if not is_number(value):
            fail(key, f"{show(value)} is too large (at most {LIMIT:g})")
        return value
    elif hint is float and isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            fail(key, f"must be a finite number (got {show(value)})")
        if not is_number(value):
            fail(key, f"{show(value)} is too large (at most {LIMIT:g})")
        return float(value)
    elif hint is str and isinstance(value, str):
        if "\x00" in value:
            fail(key, "must not contain a NUL character")
        return value
    table = _table_word(strict)
    fail(key, f"expected {_expected(hint, table)}, got {describe(value, table)}")


def _table_word(strict: bool) -> str:
    # The strict reading is of TOML files, whose tables JSON records call objects.
    return "a table" if strict else "an object"


def as_table(key: Key, raw: Any, strict: bool = True) -> dict[str, Any]:
    if not isinstance(raw, dict):
        table = _table_word(strict)
        fail(key, f"expected {table}, got {describe(raw, table)}")
    return raw


def check_keys(key: Key, table: Mapping[str, Any], valid: Sequence[str],
               tip: Any = None, root: str = "table") -> None:
    """Every key of `table` is one of `valid`; else a problem naming the first that is not,
    with `tip(key)` or the closest valid key as the tip. What the document's root holds
    (`root`) is a table in cells.toml, a key in a simulated device profile."""
    for k in table:
        if k not in valid:
            what = "key" if key else root
            hint = (tip(k) if tip else None) or did_you_mean(k, valid, "" if key else f"{root}s")
            fail((*key, k), f"unknown {what}", hint)


@cache
def annotations_of(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def build(cls: type[T], raw: Any, key: Key = (), *, strict: bool = True, **given: Any) -> T:
    """A dataclass from its table: keys and types checked here, ranges by the dataclass
    itself; `given` fields are supplied by the caller, not the table."""
    table = as_table(key, raw, strict)
    names = [f.name for f in fields(cls) if f.name not in given]  # type: ignore[arg-type]
    if strict:
        check_keys(key, table, names, root="key")
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in names and f.name not in table and f.default is MISSING \
                and f.default_factory is MISSING:
            fail(key, f"missing key `{f.name}`")
    hints = annotations_of(cls)
    values = {k: coerce((*key, k), v, hints[k], strict) for k, v in table.items()
              if k in names}
    return cls(**values, **given)


def from_dict(cls: type[T], d: Any, key: Key = ()) -> T:
    """A record from a JSON object abbench wrote: unknown keys ignored (newer writers),
    missing keys with a default take it."""
    return build(cls, d, key, strict=False)


def typed(value: Any, hint: Any, key: Key) -> Any:
    """One JSON value as `hint` asks (`key` names it in a problem)."""
    return coerce(key, value, hint, strict=False)
