"""The parts of a document every renderer lays out: paragraphs of inline text, tables,
bullet lists and sections of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class Code:
    """Inline code: a path, a device name."""

    text: str


@dataclass(frozen=True)
class Strong:
    text: str


Inline: TypeAlias = str | Code | Strong


@dataclass(frozen=True)
class Paragraph:
    parts: tuple[Inline, ...]


@dataclass(frozen=True)
class Table:
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def column(self, name: str) -> tuple[str, ...]:
        k = self.head.index(name)
        return tuple(r[k] for r in self.rows)


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    empty: str = ""  # said instead of an empty list ("": nothing)


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]
    level: int = 2

    def items(self) -> tuple[str, ...]:
        """The section's bullet items, in order."""
        return tuple(x for b in self.blocks if isinstance(b, Bullets) for x in b.items)

    def tables(self) -> tuple[Table, ...]:
        return tuple(b for b in self.blocks if isinstance(b, Table))


Block: TypeAlias = Paragraph | Table | Bullets | Section
