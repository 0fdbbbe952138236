"""The terminal report (rich): lays out any block list (`blocks.lay_out`) as lines and
tables, verdicts in colour; the campaign's is `report.model`'s compact layout (banners,
cells, pairs, drift, tells, then the verdicts). `--style plain` prints the same content
with no colour or box characters.

Names, configurations, notes and failure reasons can be what a cell or a file from elsewhere
wrote: each is printed through `textsafe.shown` (controls as escapes) into a rich `Text`,
never read as rich markup."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

import abbench.report.blocks as blk
import abbench.report.markdown as markdown
from abbench.analysis.campaign import CampaignAnalysis
from abbench.analysis.decide import UNVERIFIED
from abbench.report.model import build
from abbench.textsafe import shown

COLOUR = {"GO": "bold green", "NO-GO": "bold red", "INCONCLUSIVE": "bold yellow",
          "OWED": "bold magenta", UNVERIFIED: "bold yellow"}
PAIR_STYLE = {"matched": "green", "unverified": "yellow"}  # any other state: red


def mark_style(m: blk.Mark) -> str:
    """The colour of a marked word: a verdict, a pair's state, a drift verdict."""
    if m.kind == blk.VERDICT:
        return COLOUR.get(m.text, "bold yellow")
    if m.kind == blk.STATE:
        return PAIR_STYLE.get(m.text, "red")
    if m.kind == blk.DRIFT:
        return "red" if m.text == "drift" else "yellow" if m.text != "stable" else "default"
    return "bold yellow" if m.kind == blk.CAUTION else ""


def text(xs: Iterable[blk.Inline], indent: str = "", style: str = "") -> Text:
    out = Text(indent)
    for p in xs:
        match p:
            case str():
                out.append(shown(p), style or None)
            case blk.Strong():
                out.append(text(blk.parts(p.text), style="bold"))
            case blk.Mark():
                out.append(shown(p.text), mark_style(p) or style or None)
            case _:
                out.append(shown(p.text), style or None)
    return out


@dataclass(frozen=True)
class Terminal:
    """Blocks as rich renderables, one a line or a table."""

    table_box: box.Box = box.SIMPLE
    medium: str = blk.TERMINAL

    def lines(self, xs: Iterable[blk.Text], indent: str) -> list[RenderableType]:
        return [text(blk.parts(x), indent) for x in xs]

    def paragraph(self, b: blk.Paragraph) -> list[RenderableType]:
        return [text(b.parts)]

    def banner(self, b: blk.Banner) -> list[RenderableType]:
        return [text((b.text,), style="bold red")]

    def table(self, b: blk.Table) -> list[RenderableType]:
        out = Table(title=b.title or None, box=self.table_box)
        for c in b.columns:
            out.add_column(c.short or c.head, overflow="fold")
        for row in b.rows:
            out.add_row(*(text((blk.Mark(x, c.mark) if c.mark else x,))
                          for c, x in zip(b.columns, row)))
        return [out, *self.lines(b.notes, "  ")]

    def bullets(self, b: blk.Bullets) -> list[RenderableType]:
        """The items (or what is said instead) indented, further under a lead-in line."""
        items = b.items or ((b.empty,) if b.empty else ())
        if not b.lead:
            return self.lines(items, "  ")
        return [text(b.lead, "  "), *self.lines(items, "    ")]

    def note(self, b: blk.Note) -> list[RenderableType]:
        return [text(b.lead), *self.lines(b.details, "  ")]

    def figure(self, b: blk.Figure) -> list[RenderableType]:
        return []  # the terminal draws nothing

    def plain(self, b: blk.Plain) -> list[RenderableType]:
        return [Text(x) for x in markdown.lines(b.blocks, escape=False)]

    def section(self, s: blk.Section) -> list[RenderableType]:
        return [text((s.title,), style="bold"), *blk.lay_out(self, s.blocks)]


def emit(d: blk.Document, console: Console, table_box: box.Box = box.SIMPLE) -> None:
    """The blocks, one a line or a table (the terminal prints no title: its first line
    says what the report is)."""
    for x in blk.lay_out(Terminal(table_box), d.blocks):
        console.print(x)


def render(a: CampaignAnalysis, console: Console, table_box: box.Box = box.SIMPLE) -> None:
    emit(build(a, samples=()), console, table_box)  # the terminal plots nothing


# Plain text is never wrapped by us: a pipe, a file or a CI log gets whole lines (a table
# row cut at 80 columns, as rich cuts it off a terminal, cannot be grepped or diffed).
PLAIN_WIDTH = 10_000


def print_report(a: CampaignAnalysis, style: str = "rich", file: IO[str] | None = None) -> None:
    """The report on a terminal (`rich`: boxes, colours, the terminal's width), or as plain
    full-width text (`plain`, and `rich` whenever the output is not a terminal)."""
    stream = file if file is not None else sys.stdout
    if style == "plain" or not _is_terminal(stream):
        console = Console(file=file, color_system=None, highlight=False, emoji=False,
                          width=PLAIN_WIDTH, no_color=True)
        render(a, console, box.ASCII2)
    else:
        render(a, Console(file=file, highlight=False, emoji=False))


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False
