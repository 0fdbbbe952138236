"""report.md: the report a person reads first, in the order they need it — warnings
about the run itself, verdicts, cells, pairs, drift, tells. Lays out `report.model`.

Names, configurations and failure reasons in it can be what a cell or a file from elsewhere
wrote, and Markdown viewers render HTML: every string goes through `text` (or `cell` in a
table, `code` for inline code) on its way in, as report.html's through `html.escape`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from abbench.analysis.campaign import CampaignAnalysis
from abbench.report.blocks import (
    Block,
    Bullets,
    Code,
    Inline,
    Paragraph,
    Section,
    Strong,
    Table,
)
from abbench.report.model import (
    Cells,
    DecisionNote,
    PairNote,
    Report,
    Verdicts,
    build,
)
from abbench.textsafe import shown

# A `<` that can open HTML in CommonMark (a tag, comment, declaration, processing
# instruction or autolink all follow it with a non-space character); `<=` and `< 3` cannot,
# and stay as written so that the file reads as it renders.
_HTML_OPEN = re.compile(r"<(?![\s=]|\Z)")
_TICKS = re.compile(r"`+")


def text(s: str) -> str:
    """`s` as Markdown shows it and renders none of it as HTML: control characters as
    escapes (one line: a newline would start a block), `&` and an opening `<` as entities
    (`&#x202e;` would render as an override). Emphasis and backticks are left: abbench's
    own text uses them, and they render no HTML."""
    return _HTML_OPEN.sub("&lt;", shown(s).replace("&", "&amp;"))


def cell(s: str) -> str:
    """`text` for a table cell, where a `|` would end the cell."""
    return text(s).replace("|", "\\|")


def code(s: str) -> str:
    """Inline code holding `s` whatever backticks it holds: the fence is one backtick
    longer than its longest run (CommonMark), padded where `s` begins or ends with one.
    A code span renders no HTML and shows entities as written, so only controls are
    escaped."""
    s = shown(s)
    fence = "`" * (max((len(m) for m in _TICKS.findall(s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def inline(parts: Iterable[Inline], escape: bool = True) -> str:
    say = text if escape else shown
    return "".join((code(p.text) if escape else f"`{shown(p.text)}`") if isinstance(p, Code)
                   else f"**{say(p.text)}**" if isinstance(p, Strong) else say(p)
                   for p in parts)


def lines(blocks: Iterable[Block], escape: bool = True) -> list[str]:
    """Blocks as Markdown lines, each block followed by a blank line. `escape=False`: only
    control characters escaped, for a renderer that escapes for its own medium (the
    terminal, report.html's `<pre>`)."""
    say, in_cell = (text, cell) if escape else (shown, shown)

    def row(xs: Iterable[str]) -> str:
        return "| " + " | ".join(map(in_cell, xs)) + " |"

    out: list[str] = []
    for b in blocks:
        if isinstance(b, Paragraph):
            out += [inline(b.parts, escape), ""]
        elif isinstance(b, Table):
            out += [row(b.head), "|" + "---|" * len(b.head)]
            out += [row(r) for r in b.rows] + [""]
        elif isinstance(b, Bullets):
            if b.items:
                out += [f"- {say(x)}" for x in b.items] + [""]
            elif b.empty:
                out += [say(b.empty), ""]
        else:
            out += section(b, escape)
    return out


def section(s: Section, escape: bool = True) -> list[str]:
    return [f"{'#' * s.level} {text(s.title) if escape else shown(s.title)}", "",
            *lines(s.blocks, escape)]


def decision(n: DecisionNote) -> list[str]:
    """The verdict in bold, then its details indented."""
    look = f" at look {n.look}" if n.look is not None else ""
    return [text(f"**{n.candidate} vs {n.baseline} ({n.question}): {n.label}{look}** — "
                 f"{n.reason}"), *(f"  {text(x)}" for x in n.details)]


def verdicts(v: Verdicts) -> list[str]:
    out = ["## Verdicts", ""]
    if v.table is None:
        return out + lines([Paragraph(("No decisions asked." + (f" {v.noise}." if
                                                               v.noise_known else ""),))])
    out += lines([Paragraph((f"{v.noise}." + (f" {v.noise_note}." if v.noise_note else ""),)),
                  v.table, *v.looks, *((v.unverified,) if v.unverified else ())])
    for n in v.notes:
        out += [*decision(n), ""]
    return out


def cells(c: Cells) -> list[str]:
    return section(Section("Cells", (c.table(), Bullets(c.notes))))


def pairs(ps: Iterable[PairNote]) -> list[str]:
    out = ["## Adjacent pairs", ""]
    for p in ps:
        out.append(text(f"**{p.title}**" + (f" ({p.note})" if p.note else "")))
        out += [f"- {text(c.text)}" for c in p.checks] + [""]
    return out


def emit(r: Report) -> str:
    L = [f"# {text(r.title)}", "", *lines([r.intro])]
    for b in r.banners:
        L += [f"> **{text(b)}**", ""]
    if r.imported is not None:
        L += section(r.imported.section)
    L += verdicts(r.verdicts) + cells(r.cells) + pairs(r.pairs)
    if r.unverified_ratios is not None:
        L += section(r.unverified_ratios)
    L += section(r.drift_section(lambda d: f"**{d.verdict}** — {d.summary}"))
    L += section(r.caps_timeline) + section(r.tells)
    return "\n".join(L)


def render(a: CampaignAnalysis) -> str:
    return emit(build(a, samples=()))  # report.md plots nothing


__all__ = ["cell", "code", "emit", "lines", "render", "text"]
