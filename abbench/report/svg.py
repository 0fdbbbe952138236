"""Charts as inline SVG for report.html: panels of lines, steps, markers, error bars, bars
and shaded spans over shared or own axes, with ticks, labels and legends. Written here
rather than drawn by a plotting library: a page's three plots cost a few milliseconds
instead of a second and a half (most of it importing the library), and the report is
vector text a reader can zoom and search.

A `Panel` collects marks in data coordinates; `figure` fits the axes to what the panels
hold and writes one `<svg>` element (one line: the page is line-oriented). Every piece of
text is escaped; nothing outside the element is referred to.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
MUTED = "#888"
WIDTH = 1000  # px of the viewBox; the page scales it to its column
LEFT, RIGHT = 72, 16  # room for the y ticks and label; a little air on the right
FONT = 11  # px
CHAR = 6.2  # px a character of FONT takes, near enough to size a legend box


def colour(k: int) -> str:
    return PALETTE[k % len(PALETTE)]


def _t(s: str) -> str:
    """Text as SVG text: escaped, on one line."""
    return escape(" ".join(str(s).split()), quote=True)


def _n(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if math.isfinite(v) else "0"


def ticks(lo: float, hi: float, count: int = 6) -> tuple[list[float], int]:
    """Round tick values within [lo, hi] (about `count`) and the decimals to print them."""
    raw = (hi - lo) / count if hi > lo else 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    values = [(first + k) * step for k in range(int((hi - first * step) / step + 1e-9) + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if step / mag == 2.5 else 0)
    return values, decimals


def span_of(values: Sequence[float], pad: float = 0.05) -> tuple[float, float]:
    """The range of `values` with `pad` of it added each side; (0, 1) with none."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if hi == lo:
        d = abs(lo) * 0.1 or 1.0
        return lo - d, hi + d
    d = (hi - lo) * pad
    return lo - d, hi + d


@dataclass(frozen=True)
class Entry:
    """A legend row: a line, a marker or a swatch in a colour."""

    label: str
    colour: str
    kind: str = "line"  # line, dotted, o, D, v, ^, swatch, hatch


@dataclass
class Panel:
    """One plot area being drawn: its marks as SVG in data coordinates, rendered once the
    axes are known (a builder, not a record)."""

    height: int = 220
    ylabel: str = ""
    ylim: tuple[float | None, float | None] = (None, None)
    legend_at: str = "lower left"  # lower left, lower right, upper right
    legend_columns: int = 1
    legend_title: str = ""
    grid: bool = False
    notice: str = ""  # centred in the panel where it has nothing to show
    xs: list[float] = field(default_factory=list)  # extents the marks cover
    ys: list[float] = field(default_factory=list)
    marks: list[tuple] = field(default_factory=list)
    legend: list[Entry] = field(default_factory=list)
    xticks: list[tuple[float, tuple[str, ...]]] | None = None  # fixed ticks, label lines

    def line(self, xs: Sequence[float], ys: Sequence[float], colour: str, label: str = "",
             width: float = 1.5, step: bool = False, dash: str = "") -> None:
        if step and len(xs) > 1:
            xs2 = [x for a, b in zip(xs, xs[1:]) for x in (a, b)] + [xs[-1]]
            ys2 = [y for y in ys[:-1] for _ in (0, 1)] + [ys[-1]]
            xs, ys = xs2, ys2
        self.xs += xs
        self.ys += ys
        self.marks.append(("line", tuple(xs), tuple(ys), colour, width, dash))
        if label:
            self.legend.append(Entry(label, colour, "dotted" if dash else "line"))

    def points(self, xs: Sequence[float], ys: Sequence[float], shape: str, colour: str,
               label: str = "", size: float = 4.0) -> None:
        self.xs += xs
        self.ys += ys
        self.marks.append(("points", tuple(xs), tuple(ys), shape, colour, size))
        if label:
            self.legend.append(Entry(label, colour, shape))

    def errorbars(self, xs: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                  colour: str, cap: float = 4.0, width: float = 1.2) -> None:
        self.xs += xs
        self.ys += [*lows, *highs]
        self.marks.append(("bars", tuple(xs), tuple(lows), tuple(highs), colour, cap, width))

    def band(self, x: float, low: float, high: float, half_width: float, colour: str,
             opacity: float) -> None:
        """A filled rectangle from `low` to `high`, `half_width` either side of `x`."""
        self.xs += [x - half_width, x + half_width]
        self.ys += [low, high]
        self.marks.append(("band", x, low, high, half_width, colour, opacity))

    def vspan(self, x0: float, x1: float, colour: str, opacity: float = 0.12,
              hatch: bool = False) -> None:
        """A column over the panel's whole height (a cell's span, a gate wait)."""
        self.xs += [x0, x1]
        self.marks.append(("vspan", x0, x1, colour, opacity, hatch))

    def hline(self, y: float, colour: str, dash: str = "2,3") -> None:
        self.ys.append(y)
        self.marks.append(("hline", y, colour, dash))

    def text(self, x: float, y: float, s: str, colour: str = "#222", dx: float = 0,
             dy: float = 0, rotate: float = 0, size: int = FONT - 2, place: str = "data"
             ) -> None:
        """`s` at (x, y) offset by (dx, dy) px, turned `rotate` degrees counter-clockwise;
        `place` "bottom" or "top": at the panel's bottom or top edge, `y` aside."""
        self.marks.append(("text", x, y, s, colour, dx, dy, rotate, size, place))


@dataclass(frozen=True)
class Axes:
    """Data to pixels for one panel."""

    x0: float
    x1: float
    y0: float
    y1: float
    left: float
    top: float
    width: float
    height: float

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.width

    def py(self, y: float) -> float:
        return self.top + self.height - (y - self.y0) / (self.y1 - self.y0) * self.height


def figure(panels: Sequence[Panel], xlabel: str = "", xlim: tuple[float, float] | None = None,
           top: int = 12, label: str = "plot") -> str:
    """The panels stacked over one x axis (`xlim`, else what they hold), its ticks and
    `xlabel` under the last; `top` px above the first for labels placed there."""
    x0, x1 = xlim if xlim is not None else span_of([x for p in panels for x in p.xs], 0.02)
    lines = max((len(t[1]) for p in panels for t in (p.xticks or [])), default=1)
    bottom = 8 + 14 * lines + (18 if xlabel else 0)
    height = top + sum(p.height for p in panels) + 10 * (len(panels) - 1) + bottom
    hatch = "h" + hashlib.sha1(repr([p.marks for p in panels]).encode()).hexdigest()[:10]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" role="img" '
           f'aria-label="{_t(label)}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
           f'height="{height}" font-family="sans-serif" font-size="{FONT}">',
           f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
           f'<defs><pattern id="{hatch}" patternUnits="userSpaceOnUse" width="6" height="6" '
           'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" '
           'stroke="#c62828" stroke-width="1.5"/></pattern></defs>']
    y = top
    for k, p in enumerate(panels):
        ax = Axes(x0, x1, *_ylim(p), LEFT, y, WIDTH - LEFT - RIGHT, p.height)
        out += _panel(p, ax, hatch, last=k == len(panels) - 1)
        y += p.height + 10
    if xlabel:
        out.append(f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{height - 6}" '
                   f'text-anchor="middle">{_t(xlabel)}</text>')
    return "".join(out) + "</svg>"


def _ylim(p: Panel) -> tuple[float, float]:
    lo, hi = span_of(p.ys)
    want_lo, want_hi = p.ylim
    lo = want_lo if want_lo is not None else lo
    hi = want_hi if want_hi is not None else hi
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def _panel(p: Panel, ax: Axes, hatch: str, last: bool) -> list[str]:
    out = [_mark(m, ax, hatch) for m in p.marks if m[0] in ("vspan", "band")]
    yt, yd = ticks(ax.y0, ax.y1, max(2, p.height // 45))
    right = ax.left + ax.width
    for v in yt:
        y = ax.py(v)
        if p.grid:
            out.append(f'<line x1="{ax.left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" '
                       'stroke="#ccc"/>')
        out.append(f'<line x1="{ax.left - 4}" y1="{y:.1f}" x2="{ax.left}" y2="{y:.1f}" '
                   'stroke="#444"/><text x="{}" y="{:.1f}" text-anchor="end">{}</text>'
                   .format(ax.left - 6, y + 4, f"{v:.{yd}f}"))
    if p.ylabel:
        cy = ax.top + ax.height / 2
        out.append(f'<text x="14" y="{cy:.0f}" text-anchor="middle" '
                   f'transform="rotate(-90 14 {cy:.0f})">{_t(p.ylabel)}</text>')
    bottom = ax.top + ax.height
    xt = p.xticks if p.xticks is not None else [
        (v, (f"{v:.{d}f}",)) for vs, d in [ticks(ax.x0, ax.x1, 10)] for v in vs]
    for v, words in xt:
        x = ax.px(v)
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" '
                   'stroke="#444"/>')
        if last:
            out += [f'<text x="{x:.1f}" y="{bottom + 16 + 14 * i}" text-anchor="middle">'
                    f'{_t(w)}</text>' for i, w in enumerate(words)]
    out += [_mark(m, ax, hatch) for m in p.marks if m[0] not in ("vspan", "band")]
    out.append(f'<rect x="{ax.left}" y="{ax.top}" width="{ax.width}" height="{ax.height}" '
               'fill="none" stroke="#444"/>')
    if p.notice:
        out.append(f'<text x="{ax.left + ax.width / 2:.0f}" y="{ax.top + ax.height / 2:.0f}" '
                   f'text-anchor="middle" fill="{MUTED}" font-size="13">{_t(p.notice)}</text>')
    return out + _legend(p, ax, hatch)


def _path(xs: Sequence[float], ys: Sequence[float], ax: Axes) -> str:
    """A polyline's path, broken where a value is not finite."""
    out, pen = [], "M"
    for x, y in zip(xs, ys):
        if not (math.isfinite(x) and math.isfinite(y)):
            pen = "M"
            continue
        out.append(f"{pen}{_n(ax.px(x))},{_n(ax.py(y))}")
        pen = "L"
    return "".join(out)


# A marker's corners, as offsets in units of its size (y down, as SVG's)
CORNERS = {"D": ((0, -1), (1, 0), (0, 1), (-1, 0)), "v": ((-1, -1), (1, -1), (0, 1)),
           "^": ((-1, 1), (1, 1), (0, -1))}


def _shape(shape: str, x: float, y: float, r: float) -> str:
    """A marker at (x, y) px: a diamond, a triangle down or up, else a circle."""
    if shape in CORNERS:
        return "M" + "L".join(f"{_n(x + r * a)},{_n(y + r * b)}" for a, b in CORNERS[shape]) + "Z"
    return (f"M{_n(x - r)},{_n(y)}a{_n(r)},{_n(r)} 0 1,0 {_n(2 * r)},0"
            f"a{_n(r)},{_n(r)} 0 1,0 {_n(-2 * r)},0Z")


def _mark(m: tuple, ax: Axes, hatch: str) -> str:
    top, bottom = ax.top, ax.top + ax.height
    match m:
        case ("line", xs, ys, colour, width, dash):
            d = f' stroke-dasharray="{dash}"' if dash else ""
            return (f'<path fill="none" stroke="{colour}" stroke-width="{width}"{d} '
                    f'stroke-linejoin="round" d="{_path(xs, ys, ax)}"/>')
        case ("points", xs, ys, shape, colour, size):
            d = "".join(_shape(shape, ax.px(x), ax.py(y), size) for x, y in zip(xs, ys)
                        if math.isfinite(x) and math.isfinite(y))
            return f'<path fill="{colour}" d="{d}"/>'
        case ("bars", xs, lows, highs, colour, cap, width):
            d = "".join(f"M{_n(ax.px(x))},{_n(ax.py(lo))}V{_n(ax.py(hi))}"
                        + (f"M{_n(ax.px(x) - cap)},{_n(ax.py(lo))}h{_n(2 * cap)}"
                           f"M{_n(ax.px(x) - cap)},{_n(ax.py(hi))}h{_n(2 * cap)}" if cap else "")
                        for x, lo, hi in zip(xs, lows, highs))
            return f'<path fill="none" stroke="{colour}" stroke-width="{width}" d="{d}"/>'
        case ("band", x, low, high, hw, colour, opacity):
            x0, y0 = ax.px(x - hw), ax.py(high)
            return (f'<rect x="{_n(x0)}" y="{_n(y0)}" width="{_n(ax.px(x + hw) - x0)}" '
                    f'height="{_n(ax.py(low) - y0)}" fill="{colour}" opacity="{opacity}"/>')
        case ("vspan", x0, x1, colour, opacity, hatched):
            fill = f'url(#{hatch})' if hatched else colour
            a, b = sorted((ax.px(x0), ax.px(x1)))
            return (f'<rect x="{_n(a)}" y="{top}" width="{_n(max(b - a, 0.5))}" '
                    f'height="{ax.height}" fill="{fill}" '
                    f'opacity="{1 if hatched else opacity}"/>')
        case ("hline", y, colour, dash):
            return (f'<line x1="{ax.left}" x2="{ax.left + ax.width}" y1="{_n(ax.py(y))}" '
                    f'y2="{_n(ax.py(y))}" stroke="{colour}" stroke-dasharray="{dash}"/>')
        case ("text", x, y, s, colour, dx, dy, rotate, size, place):
            px = ax.px(x) + dx
            py = {"bottom": bottom - 4, "top": top - 3}.get(place, ax.py(y)) + dy
            turn = f' transform="rotate({-rotate} {_n(px)} {_n(py)})"' if rotate else ""
            return (f'<text x="{_n(px)}" y="{_n(py)}" fill="{colour}" font-size="{size}"'
                    f'{turn}>{_t(s)}</text>')
    raise ValueError(f"unknown mark {m[0]!r}")


def _legend(p: Panel, ax: Axes, hatch: str) -> list[str]:
    if not p.legend:
        return []
    cols = max(1, min(p.legend_columns, len(p.legend)))
    rows = math.ceil(len(p.legend) / cols)
    col_w = 34 + CHAR * max(len(e.label) for e in p.legend)
    head = 15 if p.legend_title else 0
    w, h = col_w * cols + 8, rows * 15 + head + 8
    x = ax.left + 6 if p.legend_at.endswith("left") else ax.left + ax.width - w - 6
    y = ax.top + 6 if p.legend_at.startswith("upper") else ax.top + ax.height - h - 6
    out = [f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{h}" fill="#fff" '
           'fill-opacity="0.85" stroke="#ccc"/>']
    if p.legend_title:
        out.append(f'<text x="{_n(x + 6)}" y="{_n(y + 14)}" font-size="{FONT - 2}">'
                   f'{_t(p.legend_title)}</text>')
    for k, e in enumerate(p.legend):
        ex, ey = x + 6 + col_w * (k // rows), y + head + 12 + 15 * (k % rows)
        out.append(_swatch(e, ex, ey - 4, hatch))
        out.append(f'<text x="{_n(ex + 26)}" y="{_n(ey)}" font-size="{FONT - 1}">'
                   f'{_t(e.label)}</text>')
    return out


def _swatch(e: Entry, x: float, y: float, hatch: str) -> str:
    match e.kind:
        case "line" | "dotted":
            d = ' stroke-dasharray="2,3"' if e.kind == "dotted" else ""
            return (f'<line x1="{_n(x)}" y1="{_n(y)}" x2="{_n(x + 20)}" y2="{_n(y)}" '
                    f'stroke="{e.colour}" stroke-width="2"{d}/>')
        case "swatch" | "hatch":
            fill = f"url(#{hatch})" if e.kind == "hatch" else e.colour
            opacity = "1" if e.kind == "hatch" else "0.25"
            return (f'<rect x="{_n(x)}" y="{_n(y - 5)}" width="20" height="10" fill="{fill}" '
                    f'opacity="{opacity}"/>')
        case shape:
            return f'<path fill="{e.colour}" d="{_shape(shape, x + 10, y, 4)}"/>'
