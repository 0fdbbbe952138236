"""import.json: where every imported fact came from (measured, derived or unknown)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from abbench.records.jsonl import read_record
from abbench.records.schema import fail, from_dict

IMPORT_FILE = "import.json"
IMPORT_FORMAT = "abbench-import-provenance v1"
FACT_KINDS = ("measured", "derived", "unknown")
# The facts an import states per cell, by the key import.json files them under.
FACT_T_START, FACT_T_END, FACT_TOK_S, FACT_CONFIG = "t_start", "t_end", "tok/s", "config"
# Configuration keys an import adds to what a run's files state: the work it did (decoded
# tokens, prompt tokens) and, in a folder of several sessions, its session
# (docs/import.md#work-and-sessions). Runs that differ in one are different arms.
WORK_TOKENS, WORK_PROMPT_TOKENS, SESSION = "tokens", "n_prompt", "session"
# How a `config.KEY` fact taken from a word of the run's file name begins its source: no
# file of the run records that key, and the report marks it "(from the file name)".
FROM_FILE_NAME = "the file name"


@dataclass(frozen=True)
class Fact:
    """Where an imported fact came from: `measured` (`source` names the file and line),
    `derived` (`source` says how), or `unknown` (`source` says why)."""

    kind: str
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source}


@dataclass(frozen=True)
class ImportedCell:
    """One imported run: its files, the configuration its files give (the keys that name
    its arm), and the provenance of each fact the journal holds for it."""

    label: str
    files: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)  # "t_start", "config.model", ...

    @property
    def from_file_name(self) -> tuple[str, ...]:
        """The configuration keys only a word of the file name gives (`("model",)`): read
        from the facts, so an import.json written before this was asked says it too."""
        prefix = f"{FACT_CONFIG}."
        return tuple(k.removeprefix(prefix) for k, f in self.facts.items()
                     if k.startswith(prefix) and f.kind == "derived"
                     and f.source.startswith(FROM_FILE_NAME))

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "files": list(self.files), "config": self.config,
                "facts": {k: f.to_json() for k, f in self.facts.items()},
                "from_file_name": list(self.from_file_name)}  # said, never read back


@dataclass(frozen=True)
class NotImported:
    """A file or folder in the imported folder that was not imported, or the part of one
    left out (a column): `path` relative to that folder (a folder's ends in `/`), `line`
    where the reason is on one, `reason` in words."""

    path: str
    reason: str
    line: int | None = None

    def __post_init__(self) -> None:
        for name in ("path", "reason"):
            if not getattr(self, name):
                fail(name, "must not be empty")
        if self.line is not None and self.line < 1:
            fail("line", f"must be a line number, >= 1 (got {self.line})")

    def shown(self) -> str:
        """`warmup/: a folder: ...`, `a.csv:5: column ...`."""
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SessionSide:
    """One session's runs of a configuration measured in several sessions: their arm and
    cell labels, their own tok/s (geometric mean), and when the session began (Unix s;
    None: not recorded) or, where only the file names date it, its day."""

    session: int  # 1-based, in time order
    arm: str
    cells: tuple[str, ...]
    tok_per_s: float
    start: float | None = None
    day: str | None = None  # "2026-07-12"

    def __post_init__(self) -> None:
        if self.session < 1:
            fail("session", f"must be >= 1 (got {self.session})")
        if not self.cells:
            fail("cells", "must name at least one cell")
        if not (self.tok_per_s > 0 and math.isfinite(self.tok_per_s)):
            fail("tok_per_s", f"must be a positive number (got {self.tok_per_s})")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cells": list(self.cells)}


@dataclass(frozen=True)
class CrossSession:
    """One configuration measured in more than one session, session by session: a
    comparison across sessions (with the time between them), never cell-to-cell noise."""

    sides: tuple[SessionSide, ...]
    how: Fact  # how the sessions were told apart

    def __post_init__(self) -> None:
        if len(self.sides) < 2:
            fail("sides", f"must hold two sessions or more (got {len(self.sides)})")

    def to_json(self) -> dict[str, Any]:
        return {"sides": [s.to_json() for s in self.sides], "how": self.how.to_json()}


@dataclass(frozen=True)
class ImportInfo:
    """`import.json`: what an import read, from where, and what it could not."""

    source: str  # the folder imported
    order: Fact
    notes: tuple[str, ...] = ()  # files read in part, and what else the import noted
    cells: tuple[ImportedCell, ...] = ()
    format: str = IMPORT_FORMAT
    # What was not imported, in the order found (an import.json older than this key
    # listed its left-out files among the notes)
    not_imported: tuple[NotImported, ...] = ()
    # Configurations measured in more than one session (written only where there are some)
    sessions: tuple[CrossSession, ...] = ()

    def to_json(self) -> dict[str, Any]:
        across = {"sessions": [x.to_json() for x in self.sessions]} if self.sessions else {}
        return {"format": self.format, "source": self.source, "order": self.order.to_json(),
                "notes": list(self.notes), "cells": [c.to_json() for c in self.cells],
                "not_imported": [x.to_json() for x in self.not_imported]} | across

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImportInfo:
        return from_dict(cls, d)


def read_import_info(run: Path) -> ImportInfo | None:
    """A run's import provenance; None for a campaign's run folder."""
    return read_record(run / IMPORT_FILE, ImportInfo, "import provenance")
