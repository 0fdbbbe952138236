"""import.json: where every imported fact came from (measured, derived or unknown)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from abbench.records.jsonl import read_record
from abbench.records.schema import from_dict

IMPORT_FILE = "import.json"
IMPORT_FORMAT = "abbench-import-provenance v1"
FACT_KINDS = ("measured", "derived", "unknown")
# The facts an import states per cell, by the key import.json files them under.
FACT_T_START, FACT_T_END, FACT_TOK_S, FACT_CONFIG = "t_start", "t_end", "tok/s", "config"


@dataclass(frozen=True)
class Fact:
    """Where an imported fact came from: `measured` (`source` names the file and line),
    `derived` (`source` says how), or `unknown` (`source` says why)."""

    kind: str
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ImportedCell:
    """One imported run: its files, the configuration its files give (the keys that name
    its arm), and the provenance of each fact the journal holds for it."""

    label: str
    files: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)  # "t_start", "config.model", ...

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "files": list(self.files), "config": self.config,
                "facts": {k: f.to_json() for k, f in self.facts.items()}}


@dataclass(frozen=True)
class ImportInfo:
    """`import.json`: what an import read, from where, and what it could not."""

    source: str  # the folder imported
    order: Fact
    notes: tuple[str, ...] = ()  # files skipped or read in part, in the order found
    cells: tuple[ImportedCell, ...] = ()
    format: str = IMPORT_FORMAT

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "source": self.source, "order": self.order.to_json(),
                "notes": list(self.notes), "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImportInfo:
        return from_dict(cls, d)


def read_import_info(run: Path) -> ImportInfo | None:
    """A run's import provenance; None for a campaign's run folder."""
    return read_record(run / IMPORT_FILE, ImportInfo, "import provenance")
