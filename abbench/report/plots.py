"""The page's three plots, drawn from the report model's series as inline SVG (`svg`): the
device timeline, tokens/s per cell, per-token times.

A plot of more than `MANY` cells (an import of a thousand runs) draws its marks without a
label per cell — a label per cell is unreadable there — and the per-token plot shows the
first `LINES` cells, said in its legend's title.
"""

from __future__ import annotations

from abbench.report.series import Rates, Series, Timeline
from abbench.report.svg import CHAR, Entry, Panel, colour, figure
from abbench.textsafe import shown

MANY = 60  # cells above which marks are drawn in bulk and not labelled one by one
LINES = 12  # per-token series drawn at most
SENTINEL = colour(3)
GATE = "#c62828"


def _caps(tl: Timeline) -> Panel:
    p = Panel(ylabel="cap (MHz)", notice="" if tl.caps else "CPU caps: not measured")
    for k, cap in enumerate(tl.caps):
        p.line(cap.series.xs, cap.series.ys, colour(k), cap.series.label, step=True)
        if cap.hw_max_mhz is not None:
            p.hline(cap.hw_max_mhz, "#999")
    return p


def _temperatures(tl: Timeline) -> Panel:
    there = tl.temperatures or tl.entry_cpu or tl.entry_battery
    p = Panel(ylabel="temperature (°C)", notice="" if there else "temperatures: not measured")
    for k, s in enumerate(tl.temperatures):
        p.line(s.xs, s.ys, colour(k), s.label)
    for at_entry, shape, c in ((tl.entry_cpu, "v", "#222"), (tl.entry_battery, "^", "#008000")):
        if at_entry is not None:
            p.points(at_entry.xs, at_entry.ys, shape, c, at_entry.label)
    return p


def _spans(panels: list[Panel], tl: Timeline) -> int:
    """Each cell's span shaded, its gate wait hatched red, its name above the first panel
    (up to `MANY` cells; beyond that the spans alone, in two shades); the room the names
    take above the panel, in px."""
    for k, sp in enumerate(tl.spans):
        for p in panels:
            p.vspan(sp.start, sp.end, colour(k % 2))
            if sp.gate_wait_s > 0 and len(tl.spans) <= MANY:
                p.vspan(sp.start - sp.gate_wait_s, sp.start, GATE, hatch=True)
    if len(tl.spans) > MANY or not tl.spans:
        return 12
    for sp in tl.spans:
        panels[0].text((sp.start + sp.end) / 2, 0, shown(sp.label), rotate=30, place="top")
    if any(sp.gate_wait_s > 0 for sp in tl.spans):
        panels[-1].legend.append(Entry("gate wait", GATE, "hatch"))
    return 16 + int(CHAR * 0.5 * max(len(shown(sp.label)) for sp in tl.spans))


def timeline(tl: Timeline) -> str:
    panels = [_caps(tl), _temperatures(tl)]
    if tl.mem is not None:
        mem = Panel(ylabel="MemAvailable (MiB)")
        mem.line(tl.mem.xs, tl.mem.ys, "#6a3d9a", tl.mem.label)
        panels.append(mem)
    top = _spans(panels, tl)
    return figure(panels, f"seconds since t0 = {tl.t0:.0f} (wall clock, Unix time)",
                  xlim=(0.0, 1.0) if tl.empty else None, top=top,
                  label="the device over the campaign: caps, temperatures, memory")


def rates(r: Rates) -> str:
    """tokens/s per cell with its token-level 95% interval and, behind it, the cell-level
    band."""
    p = Panel(height=300, ylabel="tokens/s (steady window, 95% CI)", ylim=(0.0, None),
              legend_at="lower right", grid=True)
    bulk = len(r.points) > MANY
    (_rates_in_bulk if bulk else _rates_each)(p, r)
    p.legend += [Entry("cell (95% CI of its tokens)", colour(0), "o"),
                 Entry("sentinel", SENTINEL, "D")]
    if r.band_label is not None:
        p.legend.append(Entry(r.band_label, "#999", "swatch"))
    xlabel = f"cell ({len(r.points)} cells: see the cells table for their names)" if bulk else ""
    return figure([p], xlabel, xlim=(0.5, max(len(r.points), 1) + 0.5),
                  label="tokens/s per cell")


def _rates_each(p: Panel, r: Rates) -> None:
    """Every cell's point, interval, band and name, one by one."""
    for pt in r.points:
        if pt.band is not None:
            p.band(pt.number, pt.band[0], pt.band[0] + pt.band[1], 0.25, "#999", 0.25)
    for pt in r.points:
        if pt.estimate is None:
            p.text(pt.number, 0, "no data", colour="#888", dx=4, rotate=90, place="bottom")
            continue
        c, shape = (SENTINEL, "D") if pt.sentinel_of is not None else (colour(0), "o")
        if pt.interval is not None:
            p.errorbars([pt.number], [pt.interval[0]], [pt.interval[1]], c)
        else:
            p.text(pt.number, pt.estimate, "no interval", dx=5, dy=-5)
        p.points([pt.number], [pt.estimate], shape, c)
        if pt.sentinel_of is not None:
            p.text(pt.number, pt.estimate, f"sentinel of {pt.sentinel_of + 1}", colour=c,
                   dx=5, dy=14)
    p.xticks = [(pt.number, (str(pt.number), shown(pt.name))) for pt in r.points] or [(1, ("",))]


def _rates_in_bulk(p: Panel, r: Rates) -> None:
    """The same marks for many cells, one path per kind: numbers on the axis, no names."""
    for pt in r.points:
        if pt.band is not None:
            p.band(pt.number, pt.band[0], pt.band[0] + pt.band[1], 0.3, "#999", 0.25)
    for sent, shape, c in ((False, "o", colour(0)), (True, "D", SENTINEL)):
        pts = [pt for pt in r.points
               if pt.estimate is not None and (pt.sentinel_of is not None) == sent]
        spread = [pt for pt in pts if pt.interval is not None]
        p.errorbars([pt.number for pt in spread], [pt.interval[0] for pt in spread],  # type: ignore[index]
                    [pt.interval[1] for pt in spread], c, cap=0, width=0.5)  # type: ignore[index]
        p.points([pt.number for pt in pts], [pt.estimate for pt in pts], shape, c,  # type: ignore[misc]
                 size=2)


def per_token(series: tuple[Series, ...]) -> str:
    title = f"the first {LINES} of {len(series)} cells" if len(series) > LINES else ""
    p = Panel(height=300, ylabel="wall time per token (ms)", legend_at="upper right",
              legend_columns=2, legend_title=title, grid=True,
              notice="" if series else "per-token times: not measured")
    for k, s in enumerate(series[:LINES]):
        p.line(s.xs, s.ys, colour(k), shown(s.label), width=0.9)
    return figure([p], "decode token index (steady window, after the warm-up)",
                  label="wall time per token")
