"""report.md: the report a person reads first, in the order they need it — warnings
about the run itself, verdicts, cells, pairs, drift, tells. Lays out `report.model`."""

from __future__ import annotations

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


def inline(parts: Iterable[Inline]) -> str:
    return "".join(f"`{p.text}`" if isinstance(p, Code) else f"**{p.text}**"
                   if isinstance(p, Strong) else p for p in parts)


def lines(blocks: Iterable[Block]) -> list[str]:
    """Blocks as Markdown lines, each block followed by a blank line."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Paragraph):
            out += [inline(b.parts), ""]
        elif isinstance(b, Table):
            out += ["| " + " | ".join(b.head) + " |", "|" + "---|" * len(b.head)]
            out += ["| " + " | ".join(r) + " |" for r in b.rows] + [""]
        elif isinstance(b, Bullets):
            if b.items:
                out += [f"- {x}" for x in b.items] + [""]
            elif b.empty:
                out += [b.empty, ""]
        else:
            out += section(b)
    return out


def section(s: Section) -> list[str]:
    return [f"{'#' * s.level} {s.title}", "", *lines(s.blocks)]


def decision(n: DecisionNote) -> list[str]:
    """The verdict in bold, then its details indented."""
    look = f" at look {n.look}" if n.look is not None else ""
    return [f"**{n.candidate} vs {n.baseline} ({n.question}): {n.label}{look}** — {n.reason}",
            *(f"  {x}" for x in n.details)]


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
        out.append(f"**{p.title}**" + (f" ({p.note})" if p.note else ""))
        out += [f"- {c.text}" for c in p.checks] + [""]
    return out


def emit(r: Report) -> str:
    L = [f"# {r.title}", "", *lines([r.intro])]
    for b in r.banners:
        L += [f"> **{b}**", ""]
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


__all__ = ["emit", "lines", "render"]
