"""The campaign file's errors: the one validator (`records.schema`) read strictly, its
problems raised as `CampaignFileError`s naming their key path.

A problem names its key relative to the table being checked; `under` re-roots it as the
check climbs out, and `load_campaign` adds the file name and line at the end.
"""

from __future__ import annotations

from typing import Any, NoReturn

from abbench.errors import BadField, CampaignFileError, Key, format_key
from abbench.records import schema
from abbench.records.schema import describe, show


def error_at(key: Key, problem: str, tip: str | None = None,
             at: Key | None = None) -> CampaignFileError:
    message = f"`{format_key(key)}`: {problem}" if key else problem
    return CampaignFileError(message, tip, key=key, problem=problem, at=at)


def fail(key: Key, problem: str, tip: str | None = None, at: Key | None = None) -> NoReturn:
    raise error_at(key, problem, tip, at)


def under(e: CampaignFileError, prefix: Key) -> CampaignFileError:
    """The same problem, its key taken as relative to the table at `prefix`."""
    return error_at((*prefix, *e.key), e.problem, e.tip, (*prefix, *e.at))


def _campaign_error(e: BadField) -> CampaignFileError:
    return error_at(e.key, e.problem, e.tip)


def coerce(key: Key, value: Any, hint: Any) -> Any:
    """`value` as the type `hint` names (`records.schema.coerce`), or a problem naming `key`."""
    try:
        return schema.coerce(key, value, hint)
    except BadField as e:
        raise _campaign_error(e) from None


def as_table(key: Key, raw: Any) -> dict[str, Any]:
    try:
        return schema.as_table(key, raw)
    except BadField as e:
        raise _campaign_error(e) from None


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


def check_keys(key: Key, table: dict[str, Any], valid: list[str] | tuple[str, ...],
               tip: Any = None) -> None:
    try:
        schema.check_keys(key, table, valid, tip)
    except BadField as e:
        raise _campaign_error(e) from None


def build(cls: type[Any], raw: Any, key: Key, **given: Any) -> Any:
    """A table's dataclass from its TOML table (`records.schema.build`, strict); every
    problem names its key under `key`."""
    try:
        return schema.build(cls, raw, key, strict=True, **given)
    except BadField as e:
        raise _campaign_error(e) from None
    except CampaignFileError as e:  # from the dataclass's own checks, relative to it
        raise under(e, key) from None


def in_range(key: str, ok: bool, must: str, value: Any) -> None:
    if not ok:
        fail((key,), f"must be {must} (got {show(value)})")
