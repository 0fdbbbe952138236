"""report.html: one self-contained page (inline CSS, plots as inline SVG). Lays out any
block list (`blocks.lay_out`), drawing its figures (`plots.py`); the campaign's is
`report.model`'s: banners, verdicts, cells, the three plots (the device timeline, per-cell
tokens/s with 95% intervals, per-token times), pairs, drift, tells."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import abbench.report.blocks as blk
import abbench.report.markdown as markdown
import abbench.report.plots as plots
from abbench.analysis.campaign import CampaignAnalysis
from abbench.report.model import Rates, Timeline, build, samples_of

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1200px}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:2px;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}.banner{background:#fff3cd;border:2px solid #d39e00;padding:8px;
margin:6px 0;font-weight:bold}.GO{color:#1a7f37;font-weight:bold}
.NO-GO{color:#c62828;font-weight:bold}.other{color:#a15c00;font-weight:bold}
svg.plot{max-width:100%;height:auto;border:1px solid #ddd;margin:6px 0;display:block}
.muted{color:#666}
"""
DRAW: dict[type, Callable[[Any], str]] = {Timeline: plots.timeline, Rates: plots.rates}


def e(x: Any) -> str:
    return escape(str(x), quote=True)


def verdict(v: str) -> str:
    cls = v if v in ("GO", "NO-GO") else "other"
    return f'<span class="{cls}">{e(v)}</span>'


def inline(xs: Iterable[blk.Inline], quote: bool = True) -> str:
    """Text escaped as text (`quote=False`: a paragraph's own words, quotes as written, as
    they always were on the page); values, code and bold escaped with their quotes too; a
    verdict coloured, a warning in bold."""

    def one(p: blk.Inline) -> str:
        match p:
            case str():
                return escape(p, quote=quote)
            case blk.Code():
                return f"<code>{e(p.text)}</code>"
            case blk.Strong():
                return f"<b>{e(p.text) if isinstance(p.text, str) else inline(p.text)}</b>"
            case blk.Mark() if p.kind == blk.VERDICT:
                return verdict(p.text)
            case blk.Mark() if p.kind == blk.WARNING:
                return f"<b>{e(p.text)}</b>"
            case _:
                return e(p.text)

    return "".join(map(one, xs))


def item(x: blk.Text) -> str:
    return inline(blk.parts(x))


@dataclass(frozen=True)
class Page:
    """Blocks as the page's elements, one string each."""

    medium: str = blk.HTML

    def paragraph(self, b: blk.Paragraph) -> list[str]:
        return [f"<p>{inline(b.parts, quote=False)}</p>"]

    def banner(self, b: blk.Banner) -> list[str]:
        return [f'<div class="banner">{e(b.text)}</div>']

    def table(self, b: blk.Table) -> list[str]:
        def td(c: blk.Column, x: str) -> str:
            return f"<td>{item(blk.Mark(x, c.mark) if c.mark else x)}</td>"

        h = "".join(f"<th>{e(c.head)}</th>" for c in b.columns)
        body = "".join("<tr>" + "".join(map(td, b.columns, r)) + "</tr>" for r in b.rows)
        notes = "".join(f"<li>{e(n)}</li>" for n in b.notes)
        return [f"<table><tr>{h}</tr>{body}</table>" + (f"<ul>{notes}</ul>" if notes else "")]

    def bullets(self, b: blk.Bullets) -> list[str]:
        lead = [f"<p>{inline(b.lead)}</p>"] if b.lead else []
        if not b.items:
            return [*lead, f"<p>{e(b.empty)}</p>"]
        return [*lead, "<ul>" + "".join(f"<li>{item(x)}</li>" for x in b.items) + "</ul>"]

    def note(self, b: blk.Note) -> list[str]:
        details = "".join(f"<li>{item(x)}</li>" for x in b.details)
        return [f"<p>{inline(b.lead)}</p><ul>{details}</ul>"]

    def figure(self, b: blk.Figure) -> list[str]:
        def muted(x: str) -> list[str]:
            return [f"<p class=muted>{escape(x, quote=False)}</p>"] if x else []

        return [*muted(b.caption), DRAW.get(type(b.plot), plots.per_token)(b.plot),
                *muted(b.note)]

    def plain(self, b: blk.Plain) -> list[str]:
        """Blocks in report.md's words, as they are (an import's provenance, the looks)."""
        return ["<pre>" + e("\n".join(markdown.lines(b.blocks, escape=False))) + "</pre>"]

    def section(self, s: blk.Section) -> list[str]:
        return [f"<h{s.level}>{e(s.title)}</h{s.level}>", *blk.lay_out(self, s.blocks)]


def section(s: blk.Section) -> list[str]:
    return Page().section(s)


def page(title: str, blocks: Iterable[blk.Block]) -> str:
    """The whole page as one string: its title, then the blocks."""
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{e(title)}</title>", f"<style>{CSS}</style></head><body>",
                      f"<h1>{e(title)}</h1>", *blk.lay_out(Page(), blocks), "</body></html>", ""])


def emit(d: blk.Document) -> str:
    return page(d.title, d.blocks)


def render_html(a: CampaignAnalysis, folder: Path | None = None) -> str:
    """The page of an analysis; `folder` (default: the analysis' run folder) is read for
    samples.jsonl only."""
    return emit(build(a, samples_of(Path(folder) if folder is not None else a.run)))


__all__ = ["emit", "page", "render_html", "section"]
