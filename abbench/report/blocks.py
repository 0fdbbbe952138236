"""The parts of a document every renderer lays out: inline text, paragraphs, banners, tables
with their columns, bullet lists, notes, figures and sections of them; `Only` for what one
medium shows and the others do not. `lay_out` walks a block list for a `Layout` (Markdown,
HTML, the terminal), so each renderer says how a kind of block looks and nothing else."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

MARKDOWN, HTML, TERMINAL = "markdown", "html", "terminal"
ALL: frozenset[str] = frozenset({MARKDOWN, HTML, TERMINAL})
PAGES: frozenset[str] = frozenset({MARKDOWN, HTML})  # report.md and report.html
Media: TypeAlias = str | frozenset[str]  # one medium by its name, or a set of them


def shows(media: Media, medium: str) -> bool:
    return medium == media if isinstance(media, str) else medium in media

# What a `Mark` is; each renderer sets it apart by its own rule (report.html colours a
# verdict, the terminal colours each kind, report.md sets a drift verdict in bold).
VERDICT = "verdict"  # GO, NO-GO, INCONCLUSIVE, OWED, UNVERIFIED
STATE = "state"  # a pair's matched / unverified / unmatched
DRIFT = "drift"  # a sentinel's verdict
WARNING = "warning"  # "WARNING:" leading a line
CAUTION = "caution"  # a heading over numbers to read with care


@dataclass(frozen=True)
class Code:
    """Inline code: a path, a device name."""

    text: str


@dataclass(frozen=True)
class Value:
    """Inline text computed from a run (a noise estimate, a cell's name) among abbench's own
    words: report.html escapes its quotes too, as in a table cell."""

    text: str


@dataclass(frozen=True)
class Mark:
    """A word of a kind above (a verdict, a pair's state) that renderers may set apart."""

    text: str
    kind: str


@dataclass(frozen=True)
class Strong:
    text: str | tuple[Inline, ...]


Inline: TypeAlias = str | Code | Value | Mark | Strong
Text: TypeAlias = Inline | tuple[Inline, ...]  # a line of inline parts


def parts(x: Text) -> tuple[Inline, ...]:
    return x if isinstance(x, tuple) else (x,)


@dataclass(frozen=True)
class Paragraph:
    parts: tuple[Inline, ...]


@dataclass(frozen=True)
class Banner:
    """What to know before reading any number (a simulated device, an incomplete run)."""

    text: str


@dataclass(frozen=True)
class Column:
    head: str
    media: Media = ALL  # where it is shown
    short: str = ""  # the heading where width is scarce (the terminal); "": `head`
    mark: str = ""  # each value a `Mark` of this kind; "": plain text


def columns(*heads: str | Column) -> tuple[Column, ...]:
    return tuple(h if isinstance(h, Column) else Column(h) for h in heads)


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]  # one value per column
    title: str = ""  # shown where a table stands apart from any heading (the terminal)
    notes: tuple[str, ...] = ()  # under the table

    @property
    def head(self) -> tuple[str, ...]:
        return tuple(c.head for c in self.columns)

    def column(self, name: str) -> tuple[str, ...]:
        k = self.head.index(name)
        return tuple(r[k] for r in self.rows)

    def shown_in(self, medium: str) -> Table:
        """The columns `medium` shows, with their values."""
        keep = [k for k, c in enumerate(self.columns) if shows(c.media, medium)]
        return Table(tuple(self.columns[k] for k in keep),
                     tuple(tuple(r[k] for k in keep) for r in self.rows), self.title,
                     self.notes)


@dataclass(frozen=True)
class Bullets:
    items: tuple[Text, ...]
    empty: str = ""  # said instead of an empty list ("": nothing)
    lead: tuple[Inline, ...] = ()  # the line that introduces the list (): none


@dataclass(frozen=True)
class Note:
    """A line in bold and the lines that detail it (a verdict and its evidence)."""

    lead: tuple[Inline, ...]
    details: tuple[Text, ...]


@dataclass(frozen=True)
class Figure:
    """A plot, drawn where a renderer draws (report.html): `plot` is the series it shows."""

    plot: object
    caption: str = ""
    note: str = ""  # under the plot ("": none)


@dataclass(frozen=True)
class Plain:
    """Blocks shown as Markdown text wherever the medium does not lay them out itself
    (report.html in a `<pre>`, the terminal as they are)."""

    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]
    level: int = 2

    def items(self) -> tuple[Text, ...]:
        """The section's bullet items, in order."""
        return tuple(x for b in self.blocks if isinstance(b, Bullets) for x in b.items)

    def tables(self) -> tuple[Table, ...]:
        return tuple(b for b in self.blocks if isinstance(b, Table))


@dataclass(frozen=True)
class Only:
    """Blocks that only `media` show (the page's plots, the terminal's compact lines)."""

    media: Media
    blocks: tuple[Block, ...]


Block: TypeAlias = Paragraph | Banner | Table | Bullets | Note | Figure | Plain | Section | Only


def only(media: Media, *blocks: Block) -> Only:
    return Only(media, blocks)


@dataclass(frozen=True)
class Document:
    title: str
    blocks: tuple[Block, ...]


def walk(blocks: Iterable[Block]) -> Iterator[Block]:
    """Every block, depth first, inside sections, `Plain` and `Only` of every medium."""
    for b in blocks:
        yield b
        if isinstance(b, (Section, Plain, Only)):
            yield from walk(b.blocks)


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Layout(Protocol[T_co]):
    """How one medium lays out each kind of block: a list of lines or renderables."""

    medium: str

    def paragraph(self, b: Paragraph) -> list[T_co]: ...
    def banner(self, b: Banner) -> list[T_co]: ...
    def table(self, b: Table) -> list[T_co]: ...
    def bullets(self, b: Bullets) -> list[T_co]: ...
    def note(self, b: Note) -> list[T_co]: ...
    def figure(self, b: Figure) -> list[T_co]: ...
    def plain(self, b: Plain) -> list[T_co]: ...
    def section(self, b: Section) -> list[T_co]: ...


def lay_out(layout: Layout[T], blocks: Iterable[Block]) -> list[T]:
    """The blocks `layout.medium` shows, each laid out by `layout`, in order."""
    out: list[T] = []
    for b in blocks:
        match b:
            case Only():
                out += lay_out(layout, b.blocks) if shows(b.media, layout.medium) else []
            case Paragraph():
                out += layout.paragraph(b)
            case Banner():
                out += layout.banner(b)
            case Table():
                out += layout.table(b.shown_in(layout.medium))
            case Bullets():
                out += layout.bullets(b)
            case Note():
                out += layout.note(b)
            case Figure():
                out += layout.figure(b)
            case Plain():
                out += layout.plain(b)
            case Section():
                out += layout.section(b)
    return out
