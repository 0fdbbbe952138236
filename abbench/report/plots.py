"""The page's three plots, drawn from the report model's series as base64 PNG `<img>` tags:
the device timeline, tokens/s per cell, per-token times.

A plot of more than `MANY` cells (an import of a thousand runs) is drawn in one call per
kind of mark, without a label per cell — matplotlib's cost is per artist, and a label per
cell is unreadable there anyway — and the per-token plot shows the first `LINES` cells,
said in its legend's title.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from abbench.report.model import Rates, Series, Timeline  # noqa: E402
from abbench.textsafe import shown  # noqa: E402

MANY = 60  # cells above which marks are drawn in bulk and not labelled one by one
LINES = 12  # per-token series drawn at most


def png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _not_measured(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}: not measured", transform=ax.transAxes, ha="center",
            va="center", color="#888", fontsize=11)
    ax.set_yticks([])


def _caps(ax: Any, tl: Timeline) -> None:
    for cap in tl.caps:
        ax.step(cap.series.xs, cap.series.ys, where="post", label=cap.series.label)
        if cap.hw_max_mhz is not None:
            ax.axhline(cap.hw_max_mhz, ls=":", lw=0.8, color="#999")
    if tl.caps:
        ax.legend(loc="lower left", fontsize=8)
    else:
        _not_measured(ax, "CPU caps")
    ax.set_ylabel("cap (MHz)")


def _temperatures(ax: Any, tl: Timeline) -> None:
    for s in tl.temperatures:
        ax.plot(s.xs, s.ys, label=s.label)
    for at_entry, fmt in ((tl.entry_cpu, "kv"), (tl.entry_battery, "g^")):
        if at_entry is not None:
            ax.plot(at_entry.xs, at_entry.ys, fmt, ms=5, label=at_entry.label)
    if tl.temperatures or tl.entry_cpu or tl.entry_battery:
        ax.legend(loc="lower left", fontsize=8)
    else:
        _not_measured(ax, "temperatures")
    ax.set_ylabel("temperature (°C)")


def _spans(axes: Any, tl: Timeline) -> None:
    """Each cell's span shaded, its gate wait hatched red, its name above the caps (up to
    `MANY` cells; beyond that the spans alone, in two shades)."""
    if len(tl.spans) > MANY:
        for ax in axes:
            for k in (0, 1):
                bars = [(sp.start, sp.end - sp.start) for sp in tl.spans[k::2]]
                ax.broken_barh(bars, (0, 1), transform=ax.get_xaxis_transform(),
                               color="C0" if k == 0 else "C1", alpha=0.12, lw=0)
        return
    gate_labelled = False
    for k, sp in enumerate(tl.spans):
        for ax in axes:
            ax.axvspan(sp.start, sp.end, color="C0" if k % 2 == 0 else "C1", alpha=0.12, lw=0)
            if sp.gate_wait_s > 0:
                ax.axvspan(sp.start - sp.gate_wait_s, sp.start, facecolor="none",
                           edgecolor="#c62828", hatch="//", lw=0,
                           label=None if gate_labelled else "gate wait")
        gate_labelled = gate_labelled or sp.gate_wait_s > 0
        axes[0].text((sp.start + sp.end) / 2, 1.01, shown(sp.label), rotation=30,
                     transform=axes[0].get_xaxis_transform(), ha="left", va="bottom",
                     fontsize=8)
    if gate_labelled:
        axes[-1].legend(loc="lower left", fontsize=8)


def timeline(tl: Timeline) -> str:
    n = 3 if tl.mem is not None else 2
    fig = Figure(figsize=(12, 2.6 * n + 0.6))
    axes = fig.subplots(n, 1, sharex=True)
    _caps(axes[0], tl)
    _temperatures(axes[1], tl)
    if tl.mem is not None:
        axes[2].plot(tl.mem.xs, tl.mem.ys, color="#6a3d9a", label=tl.mem.label)
        axes[2].set_ylabel("MemAvailable (MiB)")
    _spans(axes, tl)
    if tl.empty:
        axes[0].set_xlim(0, 1)
    axes[-1].set_xlabel(f"seconds since t0 = {tl.t0:.0f} (wall clock, Unix time)")
    fig.tight_layout()
    return png(fig)


def rates(r: Rates) -> str:
    """tokens/s per cell with its token-level 95% interval and, behind it, the cell-level
    band."""
    fig = Figure(figsize=(12, 4))
    ax = fig.subplots()
    if len(r.points) > MANY:
        _rates_in_bulk(ax, r)
    else:
        _rates_each(ax, r)
    ax.set_xlim(0.5, max(len(r.points), 1) + 0.5)
    ax.set_ylabel("tokens/s (steady window, 95% CI)")
    ax.set_ylim(bottom=0)
    ax.plot([], [], "o", color="C0", label="cell (95% CI of its tokens)")
    ax.plot([], [], "D", color="C3", label="sentinel")
    if r.band_label is not None:
        ax.bar([0], [0], color="#999", alpha=0.25, label=r.band_label)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return png(fig)


def _rates_each(ax: Any, r: Rates) -> None:
    """Every cell's point, interval, band and name, one by one."""
    for p in r.points:
        if p.band is not None:
            ax.bar([p.number], [p.band[1]], bottom=[p.band[0]], width=0.5, color="#999",
                   alpha=0.25, lw=0)
    for p in r.points:
        if p.estimate is None:
            ax.text(p.number, 0.03, "no data", rotation=90, ha="center", va="bottom",
                    fontsize=8, color="#888", transform=ax.get_xaxis_transform())
            continue
        sent = p.sentinel_of is not None
        fmt, colour = ("D", "C3") if sent else ("o", "C0")
        if p.interval is not None:
            low, high = p.interval
            ax.errorbar([p.number], [p.estimate], yerr=[[p.estimate - low], [high - p.estimate]],
                        fmt=fmt, color=colour, capsize=4)
        else:
            ax.errorbar([p.number], [p.estimate], fmt=fmt, color=colour, capsize=4)
            ax.annotate("no interval", (p.number, p.estimate), fontsize=7,
                        textcoords="offset points", xytext=(5, 5))
        if p.sentinel_of is not None:
            ax.annotate(f"sentinel of {p.sentinel_of + 1}", (p.number, p.estimate),
                        fontsize=7, textcoords="offset points", xytext=(5, -12), color="C3")
    ax.set_xticks([p.number for p in r.points] or [1])
    # A name's own controls as escapes: the font has no glyph for them (a warning each)
    ax.set_xticklabels([f"{p.number}\n{shown(p.name)}" for p in r.points] or [""], fontsize=8)


def _rates_in_bulk(ax: Any, r: Rates) -> None:
    """The same marks for many cells, one call per kind: numbers on the axis, no names."""
    banded = [p for p in r.points if p.band is not None]
    if banded:  # one collection of segments: a bar each costs an artist each
        ax.vlines([p.number for p in banded], [p.band[0] for p in banded],  # type: ignore[index]
                  [p.band[0] + p.band[1] for p in banded],  # type: ignore[index]
                  color="#999", alpha=0.25, lw=2)
    for sent, fmt, colour in ((False, "o", "C0"), (True, "D", "C3")):
        pts = [p for p in r.points
               if p.estimate is not None and (p.sentinel_of is not None) == sent]
        if not pts:
            continue
        est = [p.estimate for p in pts]
        low = [e - (p.interval[0] if p.interval else e) for e, p in zip(est, pts)]  # type: ignore[operator]
        high = [(p.interval[1] if p.interval else e) - e for e, p in zip(est, pts)]  # type: ignore[operator]
        ax.errorbar([p.number for p in pts], est, yerr=[low, high], fmt=fmt, color=colour,
                    ms=2, lw=0.5, capsize=0)
    ax.set_xlabel(f"cell ({len(r.points)} cells: see the cells table for their names)")


def per_token(series: tuple[Series, ...]) -> str:
    fig = Figure(figsize=(12, 4))
    ax = fig.subplots()
    for s in series[:LINES]:
        ax.plot(s.xs, s.ys, lw=0.9, label=shown(s.label))
    if series:
        title = f"the first {LINES} of {len(series)} cells" if len(series) > LINES else None
        ax.legend(loc="upper right", fontsize=8, ncol=2, title=title, title_fontsize=8)
    else:
        _not_measured(ax, "per-token times")
    ax.set_xlabel("decode token index (steady window, after the warm-up)")
    ax.set_ylabel("wall time per token (ms)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return png(fig)
