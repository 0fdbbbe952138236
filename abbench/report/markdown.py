"""report.md: the report a person reads first, in the order they need it — warnings
about the run itself, verdicts, cells, pairs, drift, tells. Lays out any block list
(`blocks.lay_out`); the campaign's is `report.model`'s.

Names, configurations and failure reasons in it can be what a cell or a file from elsewhere
wrote, and Markdown viewers render HTML: every string goes through `text` (or `cell` in a
table, `code` for inline code) on its way in, as report.html's through `html.escape`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import abbench.report.blocks as blk
from abbench.analysis.campaign import CampaignAnalysis
from abbench.report.model import build
from abbench.textsafe import shown

# A `<` that can open HTML in CommonMark (a tag, comment, declaration, processing
# instruction or autolink all follow it with a non-space character); `<=` and `< 3` cannot,
# and stay as written so that the file reads as it renders.
_HTML_OPEN = re.compile(r"<(?![\s=]|\Z)")
_TICKS = re.compile(r"`+")
# A `]` that closes a link's or an image's text — before its destination `(` or a
# reference `[` — with the backslashes written before it (each must stay a backslash, or
# one of them would escape the escape).
_LINK_CLOSE = re.compile(r"(\\*)\](?=[(\[])")
_DEFINITION_CLOSE = re.compile(r"(\\*)\](?=:)")
_LAST_CLOSE = re.compile(r"(\\*)\]\Z")  # a part's last `]`, which the next part may follow


def _html_safe(s: str) -> str:
    """Control characters as escapes (one line: a newline would start a block), `&` and an
    opening `<` as entities (`&#x202e;` would render as an override; `<http://x>` would be
    an autolink, `<img src=...>` an image)."""
    return _HTML_OPEN.sub("&lt;", shown(s).replace("&", "&amp;"))


def _escaped_close(m: re.Match[str]) -> str:
    return m[1] * 2 + "\\]"  # the backslashes shown as written, the `]` as a character


def _no_links(parts: list[tuple[str, bool]]) -> str:
    """Rendered parts (`(markdown, is_code)`) joined so that none makes a link, an image
    or a reference definition, whichever part its pieces come from: a `]` before `(` or
    `[` escaped; a `]` before `:` too when the line begins with `[` (a definition must);
    a part's last `]` when the next part begins with `(`, `[` or `:`. Code spans are left
    as they are: nothing in one is Markdown."""
    first = next((t for t, _ in parts if t), "")
    definition = first.lstrip(" ").startswith("[") and not parts[0][1]
    out: list[str] = []
    for k, (t, code) in enumerate(parts):
        if not code:
            t = _LINK_CLOSE.sub(_escaped_close, t)
            if definition:
                t = _DEFINITION_CLOSE.sub(_escaped_close, t)
            after = next((u for u, _ in parts[k + 1:] if u), "")
            if t.endswith("]") and after[:1] in ("(", "[", ":"):
                t = _LAST_CLOSE.sub(_escaped_close, t)
        out.append(t)
    return "".join(out)


def text(s: str) -> str:
    """`s` as Markdown shows it, rendering none of it as HTML, a link or an image: control
    characters as escapes, `&` and an opening `<` as entities (`_html_safe`), a `]` that
    could close a link, an image or a reference definition backslash-escaped
    (`[click](javascript:...)`; `![x](http://host/x.png)`, which a viewer would load).
    Emphasis and backticks are left: abbench's own text uses them, and they reach nothing
    outside the file."""
    return _no_links([(_html_safe(s), False)])


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


def inline(xs: Iterable[blk.Inline], escape: bool = True) -> str:
    """Each part escaped on its own, then joined so that no link forms across them
    (`_no_links`); bold as `**`, a drift verdict in bold, other marks as text."""
    say = _html_safe if escape else shown

    def one(p: blk.Inline) -> str:
        match p:
            case str():
                return say(p)
            case blk.Code():
                return code(p.text) if escape else f"`{shown(p.text)}`"
            case blk.Strong():
                return f"**{inline(blk.parts(p.text), escape)}**"
            case blk.Mark() if p.kind == blk.DRIFT:
                return f"**{say(p.text)}**"
            case _:
                return say(p.text)

    parts = [(one(p), isinstance(p, blk.Code)) for p in xs]
    return _no_links(parts) if escape else "".join(t for t, _ in parts)


@dataclass(frozen=True)
class Markdown:
    """Blocks as Markdown lines, each block followed by a blank line. `escape=False`: only
    control characters escaped, for a renderer that escapes for its own medium (the
    terminal, report.html's `<pre>`)."""

    escape: bool = True
    medium: str = blk.MARKDOWN

    def say(self, x: blk.Text) -> str:
        return inline(blk.parts(x), self.escape)

    def row(self, xs: Iterable[str]) -> str:
        in_cell = cell if self.escape else shown
        return "| " + " | ".join(map(in_cell, xs)) + " |"

    def paragraph(self, b: blk.Paragraph) -> list[str]:
        return [self.say(b.parts), ""]

    def banner(self, b: blk.Banner) -> list[str]:
        return [f"> {self.say(blk.Strong(b.text))}", ""]

    def table(self, b: blk.Table) -> list[str]:
        return [self.row(b.head), "|" + "---|" * len(b.head), *map(self.row, b.rows), "",
                *self.bullets(blk.Bullets(b.notes))]

    def bullets(self, b: blk.Bullets) -> list[str]:
        """The lead-in line, then the items (or what is said instead) with no blank line
        between; nothing at all for no lead, no items and nothing to say."""
        body = [f"- {self.say(x)}" for x in b.items] or ([self.say(b.empty)] if b.empty else [])
        body = ([self.say(b.lead)] if b.lead else []) + body
        return [*body, ""] if body else []

    def note(self, b: blk.Note) -> list[str]:
        return [self.say(b.lead), *(f"  {self.say(x)}" for x in b.details), ""]

    def figure(self, b: blk.Figure) -> list[str]:
        return []  # report.md draws nothing

    def plain(self, b: blk.Plain) -> list[str]:
        return blk.lay_out(self, b.blocks)

    def section(self, s: blk.Section) -> list[str]:
        return [f"{'#' * s.level} {self.say(s.title)}", "", *blk.lay_out(self, s.blocks)]


def lines(blocks: Iterable[blk.Block], escape: bool = True) -> list[str]:
    """Blocks as Markdown lines (`Markdown`)."""
    return blk.lay_out(Markdown(escape), blocks)


def section(s: blk.Section, escape: bool = True) -> list[str]:
    return Markdown(escape).section(s)


def emit(d: blk.Document) -> str:
    return "\n".join([f"# {text(d.title)}", "", *lines(d.blocks)])


def render(a: CampaignAnalysis) -> str:
    return emit(build(a, samples=()))  # report.md plots nothing


__all__ = ["Markdown", "cell", "code", "emit", "lines", "render", "section", "text"]
