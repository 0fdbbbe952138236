"""report.html: one self-contained page (inline CSS, plots as base64 PNG) — banners,
verdicts, cells, and three plots: the device timeline (caps, temperatures, MemAvailable,
cell spans, gate waits), per-cell tokens/s with 95% intervals, per-token times. Lays out
`report.model`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import abbench.report.markdown as markdown
import abbench.report.plots as plots
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
    WARNING,
    Cells,
    Column,
    DecisionNote,
    PairNote,
    Report,
    Verdicts,
    build,
    samples_of,
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1200px}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:2px;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}.banner{background:#fff3cd;border:2px solid #d39e00;padding:8px;
margin:6px 0;font-weight:bold}.GO{color:#1a7f37;font-weight:bold}
.NO-GO{color:#c62828;font-weight:bold}.other{color:#a15c00;font-weight:bold}
img{max-width:100%;border:1px solid #ddd;margin:6px 0}.muted{color:#666}
"""
# The page's cell table: report.md's without the pressure column, and a gate wait shown
# wherever one is recorded.
CELL_COLUMNS: tuple[Column, ...] = (
    ("#", "number"), ("cell", "name"), ("config", "config"), ("status", "status"),
    ("tok/s", "rate"), ("stability", "stability"), ("drop rate", "drop"),
    ("median ms (p5–p95)", "median_range"), ("prefill tok/s", "prefill"), ("TTFT s", "ttft"),
    ("power", "power"), ("J/tok", "energy"), ("MiB/tok", "mib"), ("hit %", "hit"),
    ("stall ms/tok", "stall"),
    ("majflt/tok", "majflt"), ("CPU occ.", "cpu"), ("spec useful", "spec"),
    ("caps during", "caps"), ("entry", "entry"), ("gate", "gate"))
TIMELINE = ("CPU caps (MHz, per policy; dotted: hardware max), temperatures (°C) and "
            "MemAvailable over wall time; shaded: each cell's span; hatched red: thermal-gate "
            "waits before a cell.")


def e(x: Any) -> str:
    return escape(str(x), quote=True)


def inline(parts: Iterable[Inline]) -> str:
    """Text escaped as text; code and bold escaped with their quotes too (as they always
    were on the page)."""
    return "".join(f"<code>{e(p.text)}</code>" if isinstance(p, Code) else
                   f"<b>{e(p.text)}</b>" if isinstance(p, Strong) else escape(p, quote=False)
                   for p in parts)


def verdict(v: str) -> str:
    cls = v if v in ("GO", "NO-GO") else "other"
    return f'<span class="{cls}">{e(v)}</span>'


def table(tb: Table) -> str:
    h = "".join(f"<th>{e(x)}</th>" for x in tb.head)
    body = "".join("<tr>" + "".join(f"<td>{verdict(x) if k == 'verdict' else e(x)}</td>"
                                    for k, x in zip(tb.head, r)) + "</tr>" for r in tb.rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def bullets(b: Bullets) -> str:
    return ("<ul>" + "".join(f"<li>{e(x)}</li>" for x in b.items) + "</ul>" if b.items else
            f"<p>{e(b.empty)}</p>")


def block(b: Block) -> list[str]:
    if isinstance(b, Table):
        return [table(b)]
    if isinstance(b, Bullets):
        return [bullets(b)]
    if isinstance(b, Paragraph):
        return [f"<p>{inline(b.parts)}</p>"]
    return section(b)


def section(s: Section) -> list[str]:
    return [f"<h{s.level}>{e(s.title)}</h{s.level}>", *(x for b in s.blocks for x in block(b))]


def preformatted(blocks: Iterable[Block]) -> str:
    """Blocks in report.md's words, as they are (an import's provenance, the looks)."""
    return "<pre>" + e("\n".join(markdown.lines(blocks, escape=False))) + "</pre>"


def decision(n: DecisionNote) -> str:
    items = "".join(f"<li><b>{WARNING.strip()}</b> {e(x[len(WARNING):])}</li>"
                    if x.startswith(WARNING) else f"<li>{e(x)}</li>"
                    for x in (d.strip() for d in n.details))
    return (f"<p><b>{e(n.candidate)} vs {e(n.baseline)}: {verdict(n.label)}</b> — "
            f"{e(n.reason)}</p><ul>{items}</ul>")


def verdicts(v: Verdicts) -> list[str]:
    if v.table is None:
        return ["<p>No decisions asked.</p>"]
    out = [f"<p>{e(v.noise_line)}</p>", table(v.table)]
    if v.unverified is not None:
        out += section(v.unverified)
    if v.looks:
        out.append(preformatted(v.looks))
    return out + [decision(n) for n in v.notes]


def cells(c: Cells, columns: Sequence[Column] = CELL_COLUMNS) -> str:
    notes = "".join(f"<li>{e(n)}</li>" for n in c.notes)
    return table(c.table(columns)) + (f"<ul>{notes}</ul>" if notes else "")


def pair(p: PairNote) -> list[str]:
    return [f"<p><b>{e(p.title)}</b>{e(f' ({p.note})') if p.note else ''}</p>",
            bullets(Bullets(tuple(c.text for c in p.checks), "no criteria"))]


def plots_of(r: Report) -> list[str]:
    tl = r.timeline
    out = ["<h2>Timeline</h2>", f"<p class=muted>{TIMELINE}</p>", plots.timeline(tl)]
    if tl.missing:
        out.append(f"<p class=muted>Not measured on this device: {e(', '.join(tl.missing))}.</p>")
    return out + ["<h2>Tokens/s per cell</h2>", plots.rates(r.rates),
                  "<h2>Per-token times</h2>", plots.per_token(r.per_token)]


def emit(r: Report) -> str:
    """The whole page as one string."""
    P = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>{e(r.title)}</title>", f"<style>{CSS}</style></head><body>",
         f"<h1>{e(r.title)}</h1>", f"<p>{inline(r.intro_brief.parts)}</p>"]
    P += [f'<div class="banner">{e(b)}</div>' for b in r.banners]
    if r.imported is not None:
        s = r.imported.section
        P += [f"<h2>{e(s.title)}</h2>", preformatted(s.blocks)]
    P += ["<h2>Verdicts</h2>", *verdicts(r.verdicts), "<h2>Cells</h2>", cells(r.cells)]
    P += plots_of(r) + ["<h2>Adjacent pairs</h2>"]
    for p in r.pairs:
        P += pair(p)
    P += section(r.drift_section(lambda d: f"{d.verdict} — {d.summary}"))
    P += section(r.caps_timeline) + section(r.tells) + ["</body></html>", ""]
    return "\n".join(P)


def render_html(a: CampaignAnalysis, folder: Path | None = None) -> str:
    """The page of an analysis; `folder` (default: the analysis' run folder) is read for
    samples.jsonl only."""
    return emit(build(a, samples_of(Path(folder) if folder is not None else a.run)))


__all__ = ["emit", "render_html"]
