"""The terminal report (rich): banners, verdicts in colour, cells, pairs, drift, tells.
`--style plain` prints the same content with no colour or box characters. A compact
layout of `report.model`.

Names, configurations, notes and failure reasons can be what a cell or a file from elsewhere
wrote: each is printed through `textsafe.shown` (controls as escapes) and never read as
rich markup (`_m` inside a markup line, `Text` in a table, `markup=False` for a whole
line)."""

from __future__ import annotations

import sys
from typing import IO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

import abbench.report.markdown as markdown
from abbench.analysis.campaign import CampaignAnalysis
from abbench.analysis.decide import UNVERIFIED
from abbench.report.model import Cells, Column, Report, Verdicts, build
from abbench.textsafe import shown

COLOUR = {"GO": "bold green", "NO-GO": "bold red", "INCONCLUSIVE": "bold yellow",
          "OWED": "bold magenta", UNVERIFIED: "bold yellow"}
CELL_COLUMNS: tuple[Column, ...] = (
    ("#", "number"), ("cell", "marked"), ("config", "config"), ("status", "status"),
    ("tok/s", "rate"), ("stab.", "stability"), ("drop", "drop"), ("median ms", "median"),
    ("prefill tok/s", "prefill"), ("TTFT s", "ttft"), ("J/tok", "energy"), ("MiB/tok", "mib"),
    ("hit %", "hit"), ("majflt/tok", "majflt"), ("CPU occ.", "cpu"),
    ("caps during", "caps"), ("entry", "entry"))
PAIR_STYLE = {"matched": "green", "unverified": "yellow"}  # any other state: red


def _m(x: object) -> str:
    """A value inside a markup line: controls escaped, its `[` not read as a style."""
    return escape(shown(x))


def cells(c: Console, cs: Cells, table_box: box.Box) -> None:
    """The cell table (the config column only where the cells' configurations differ)."""
    show_config = any(r.config != "-" for r in cs.rows)
    tb = cs.table([x for x in CELL_COLUMNS if show_config or x[1] != "config"])
    out = Table(title="cells (steady window; ± is the 95% bootstrap interval)", box=table_box)
    for col in tb.head:
        out.add_column(col, overflow="fold")
    for row in tb.rows:
        out.add_row(*(Text(shown(x)) for x in row))
    c.print(out)
    for n in cs.notes:
        c.print(f"  {shown(n)}", markup=False)


def pairs_drift_tells(c: Console, r: Report) -> None:
    c.print("[bold]adjacent pairs[/]")
    for p in r.pairs:
        c.print(f"  {_m(p.first)} → {_m(p.second)}: "
                f"[{PAIR_STYLE.get(p.state, 'red')}]{_m(p.state)}[/]"
                + (f" ({_m(p.note)})" if p.note else ""))
        for ck in p.checks:
            if not ck.ok:
                c.print(f"    {shown(ck.text)}", markup=False)
    if r.unverified_ratios is not None:
        c.print("[bold yellow]unverified ratios[/] (device state or times not recorded: not "
                "matched, no verdict)")
        for tb in r.unverified_ratios.tables():
            for pair, ratio, ci in tb.rows:
                c.print(shown(f"  {pair}: {ratio} (95% CI {ci})"), markup=False)
    if r.drift:
        c.print("[bold]drift (sentinels)[/]")
        for d in r.drift:
            style = "red" if d.verdict == "drift" else "yellow" if d.verdict != "stable" else ""
            c.print(f"  [{style or 'default'}]{_m(d.verdict)}[/] — ", end="")
            c.print(shown(d.summary), markup=False)
    if tells := r.tells.items():
        c.print("[bold]contamination tells[/]")
        for x in tells:
            c.print(f"  {shown(x)}", markup=False)


def verdicts(c: Console, v: Verdicts, table_box: box.Box) -> None:
    if v.table is None:
        c.print(shown("no decisions asked" + (f"; {v.noise}" if v.noise_known else "")),
                markup=False)
        return
    c.print(shown(v.noise_line), markup=False)
    out = Table(title="verdicts (matched pairs only)", box=table_box)
    for col in ("candidate", "baseline", "question", "verdict", "comparison"):
        out.add_column(col)
    for n in v.notes:
        out.add_row(Text(shown(n.candidate)), Text(shown(n.baseline)), Text(shown(n.question)),
                    f"[{COLOUR[n.verdict]}]{n.verdict}[/]", Text(shown(n.comparison)))
    c.print(out)
    for line in markdown.lines(v.looks, escape=False):
        c.print(line, markup=False)
    for n in v.notes:
        for line in (*n.unverified_pairs, *n.details):
            c.print(f"  {shown(line)}", markup=False)


def emit(r: Report, console: Console, table_box: box.Box = box.SIMPLE) -> None:
    c, h = console, r.header
    c.print(f"[bold]{_m(h.campaign)}[/] — {h.recorded} of {h.planned} cells, device "
            f"{_m(h.device)}, run folder {_m(h.run)}")
    for b in r.banners:
        c.print(f"[bold red]{_m(b)}[/]")
    if r.imported is not None:
        c.print(shown(f"import: order {r.imported.order} ({r.imported.order_source})"),
                markup=False)
        for n in r.imported.notes:
            c.print(f"  WARNING: {shown(n)}", markup=False)
    cells(c, r.cells, table_box)
    pairs_drift_tells(c, r)
    verdicts(c, r.verdicts, table_box)


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
