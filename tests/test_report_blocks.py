"""The block list and its layouts (report/blocks.py): every renderer lays out any list,
each medium showing what `Only` and a column's media give it."""

from __future__ import annotations

import io

from rich.console import Console

from abbench.report import html, markdown, terminal
from abbench.report.blocks import (
    DRIFT,
    HTML,
    MARKDOWN,
    TERMINAL,
    VERDICT,
    WARNING,
    Banner,
    Bullets,
    Column,
    Document,
    Figure,
    Mark,
    Note,
    Only,
    Paragraph,
    Plain,
    Section,
    Strong,
    Table,
    Value,
    columns,
    walk,
)

TABLE = Table(columns("name", Column("verdict", mark=VERDICT), Column("long heading", short="lh"),
                      Column("md only", frozenset({MARKDOWN}))),
              (("a|b", "GO", "1", "x"),), "the table", ("a note",))
DOC = Document("T", (
    Banner("look first"),
    Only(frozenset({TERMINAL}), (Paragraph(("terminal only",)),)),
    Only(frozenset({MARKDOWN, HTML}), (Section("S", (TABLE,)),)),
    Only(frozenset({TERMINAL}), (TABLE,)),
    Bullets(((Mark("drift", DRIFT), " — ", Value("it's")),), lead=(Strong("lead"),)),
    Note((Strong("C vs B"), " — why"), ((Mark("WARNING:", WARNING), " ", Value("x<y")),)),
    Figure(()),
    Plain((Paragraph(("in <pre>",)),))))


def printed(d: Document) -> str:
    buf = io.StringIO()
    terminal.emit(d, Console(file=buf, color_system=None, width=200))
    return buf.getvalue()


def test_markdown_lays_out_any_block_list() -> None:
    assert markdown.emit(DOC).splitlines() == [
        "# T", "", "> **look first**", "", "## S", "",
        "| name | verdict | long heading | md only |", "|---|---|---|---|",
        "| a\\|b | GO | 1 | x |", "", "- a note", "",
        "**lead**", "- **drift** — it's", "",
        "**C vs B** — why", "  WARNING: x&lt;y", "", "in &lt;pre>"]


def test_html_lays_out_any_block_list() -> None:
    page = html.emit(DOC)
    body = page.split("<h1>T</h1>\n")[1].split("\n</body>")[0].splitlines()
    assert body[:3] == ['<div class="banner">look first</div>', "<h2>S</h2>",
                        '<table><tr><th>name</th><th>verdict</th><th>long heading</th></tr>'
                        '<tr><td>a|b</td><td><span class="GO">GO</span></td><td>1</td></tr>'
                        "</table><ul><li>a note</li></ul>"]
    assert body[3:6] == ["<p><b>lead</b></p>", "<ul><li>drift — it&#x27;s</li></ul>",
                         "<p><b>C vs B</b> — why</p><ul><li><b>WARNING:</b> x&lt;y</li></ul>"]
    assert body[6].startswith('<svg ') and body[6].endswith("</svg>")  # the figure, drawn
    assert body[7:] == ["<pre>in &lt;pre&gt;", "</pre>"]  # report.md's lines, escaped


def test_the_terminal_lays_out_any_block_list() -> None:
    out = printed(DOC)
    lines = out.splitlines()
    assert lines[:3] == ["look first", "terminal only", "the table".center(23)]
    assert lines[4].split() == ["name", "verdict", "lh"]  # the short heading, no md column
    assert lines[8:] == ["  a note", "  lead", "    drift — it's", "C vs B — why",
                         "  WARNING: x<y", "in <pre>", ""]


def test_walk_reaches_every_block() -> None:
    kinds = {type(b).__name__ for b in walk(DOC.blocks)}
    assert {"Section", "Table", "Only", "Plain", "Paragraph", "Figure"} <= kinds
