"""The one reader of every JSON record: each field checked against its annotation.

A value of the wrong type, a number that is not finite or beyond `LIMIT`, a missing
required key is a `BadField` naming the key (`entry.cpu_temp_c`); the readers of each
format turn it into a `RecordError` naming the file and line. Unknown keys are ignored
(newer writers); missing optional keys take their defaults.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

# The one TOML reader (cells.toml, sim profiles): tomllib, tomli before Python 3.11.
if sys.version_info >= (3, 11):
    import tomllib as tomllib  # re-exported
else:  # pragma: no cover - exercised on Python 3.10 only
    pass

T = TypeVar("T")




# -- reading: every field checked against its annotation ---------------------------------


# No number a run folder records comes near this (Unix times ~2e9, bytes per token ~1e10);
# beyond it sums, spans and plot ranges overflow to infinity.
LIMIT = 1e18


def is_number(value: Any) -> bool:
    """A finite JSON number within LIMIT (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LIMIT  # False for NaN; never converts a huge int to a float


class BadField(ValueError):
    """A record field of the wrong type or shape; `key` names it (`entry.cpu_temp_c`)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"`{key}` {problem}" if key else problem)


def shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"a {len(str(abs(value)))}-digit number" if abs(value) < 10**4000 else \
            "a number of thousands of digits"
    try:
        text = json.dumps(value, allow_nan=True, default=str)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


@cache
def annotations_of(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def typed(value: Any, hint: Any, key: str) -> Any:
    """`value` as the annotation `hint` asks (lists become tuples, whole numbers become
    floats where a float is asked); anything else raises `BadField` naming `key`."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return typed(value, inner[0], key)
    if hint is bool:
        if not isinstance(value, bool):
            raise BadField(key, f"is {shown(value)}, expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadField(key, f"is {shown(value)}, expected a whole number")
        if not is_number(value):
            raise BadField(key, f"is {shown(value)}, out of range (at most {LIMIT:g})")
        return value
    if hint is float:
        if not is_number(value):
            raise BadField(key, f"is {shown(value)}, expected a finite number "
                            f"(at most {LIMIT:g})")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise BadField(key, f"is {shown(value)}, expected a string")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise BadField(key, f"is {shown(value)}, expected an object")
        return {k: typed(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list):
            raise BadField(key, f"is {shown(value)}, expected a list")
        return tuple(typed(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if is_dataclass(hint):
        return from_dict(hint, value, key)  # type: ignore[arg-type]
    raise TypeError(f"records: no reader for the annotation {hint!r}")  # a bug here


def from_dict(cls: type[T], d: Any, key: str = "") -> T:
    """A record from a JSON object: known keys checked against their annotations, unknown
    keys ignored (newer writers), missing keys with a default take it."""
    if not isinstance(d, dict):
        raise BadField(key, f"is {shown(d)}, expected an object")
    hints = annotations_of(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        at = f"{key}.{f.name}" if key else f.name
        if f.name in d:
            values[f.name] = typed(d[f.name], hints[f.name], at)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise BadField(at, "is missing")
    return cls(**values)
