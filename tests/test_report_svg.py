"""The report's SVG charts (`report/svg.py`): round ticks inside the range, axes that hold
the data, lines broken where a value is missing, text escaped, one well-formed element on
one line."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from abbench.report.svg import Axes, Panel, figure, span_of, ticks

NS = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(("lo", "hi", "want", "decimals"), [
    (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], 1),
    (1980.0, 2420.0, [2000.0, 2100.0, 2200.0, 2300.0, 2400.0], 0),
    (-0.03, 0.07, [-0.02, 0.0, 0.02, 0.04, 0.06], 2),
    (0.0, 12.5, [0.0, 2.5, 5.0, 7.5, 10.0, 12.5], 1),
])
def test_ticks_are_round_and_inside_the_range(lo: float, hi: float, want: list[float],
                                              decimals: int) -> None:
    values, d = ticks(lo, hi, 5)
    assert values == pytest.approx(want) and d == decimals
    assert all(lo - 1e-9 <= v <= hi + 1e-9 for v in values)


def test_a_range_holds_its_values_with_air_and_is_never_empty() -> None:
    assert span_of([]) == (0.0, 1.0) and span_of([math.nan]) == (0.0, 1.0)
    assert span_of([5.0]) == (4.5, 5.5) and span_of([0.0]) == (-1.0, 1.0)
    lo, hi = span_of([10.0, 20.0, math.inf])
    assert lo == pytest.approx(9.5) and hi == pytest.approx(20.5)


def _svg(*panels: Panel, **kw: object) -> ET.Element:
    out = figure(panels, **kw)  # type: ignore[arg-type]
    assert "\n" not in out and out.startswith("<svg ") and out.endswith("</svg>")
    return ET.fromstring(out)


def test_a_line_is_broken_where_a_value_is_missing_and_a_step_holds_each_value() -> None:
    p = Panel()
    p.line([0, 1, 2, 3], [1.0, math.nan, 2.0, 3.0], "#000")
    p.line([0, 1, 2], [5.0, 6.0, 7.0], "#111", step=True)
    root = _svg(p)
    broken, step = [e.get("d") for e in root.iter(NS + "path") if e.get("stroke") in
                    ("#000", "#111")]
    assert broken.count("M") == 2 and broken.count("L") == 1
    corners = re.findall(r"[ML](-?[\d.]+),(-?[\d.]+)", step)
    assert len(corners) == 5  # (0,5) (1,5) (1,6) (2,6) (2,7)
    assert corners[0][1] == corners[1][1] and corners[1][0] == corners[2][0]


def test_the_axes_hold_the_data() -> None:
    p = Panel(height=200)
    p.points([10.0, 20.0], [100.0, 300.0], "o", "#000")
    root = _svg(p)
    frame = [e for e in root.iter(NS + "rect") if e.get("stroke") == "#444"][0]
    x0, y0 = float(frame.get("x")), float(frame.get("y"))
    x1, y1 = x0 + float(frame.get("width")), y0 + float(frame.get("height"))
    (marks,) = [e.get("d") for e in root.iter(NS + "path") if e.get("fill") == "#000"]
    centres = [(float(x) + 4, float(y)) for x, y in re.findall(r"M(-?[\d.]+),(-?[\d.]+)a", marks)]
    assert len(centres) == 2
    for cx, cy in centres:
        assert x0 < cx < x1 and y0 < cy < y1
    assert centres[0][1] > centres[1][1]  # 300 is drawn above 100


def test_axes_map_their_ends_to_the_frame() -> None:
    ax = Axes(0.0, 10.0, -1.0, 1.0, left=50, top=20, width=100, height=40)
    assert (ax.px(0.0), ax.px(10.0)) == (50, 150)
    assert (ax.py(-1.0), ax.py(1.0)) == (60, 20)


def test_text_and_labels_are_escaped_and_nothing_outside_is_referred_to() -> None:
    p = Panel(ylabel="a<b", notice="x & y")
    p.line([0, 1], [0, 1], "#000", label='"</svg><script>')
    p.vspan(0.2, 0.4, "#f00", hatch=True)
    p.text(0.5, 0.5, "<img src=x>")
    out = figure([p], "t0 <now>", label="a\"b")
    root = ET.fromstring(out)
    texts = "".join(e.text or "" for e in root.iter(NS + "text"))
    assert "a<b" in texts and "x & y" in texts and "<img src=x>" in texts
    assert '"</svg><script>' in texts and "t0 <now>" in texts
    assert "<script" not in out and "<img" not in out
    refs = set(re.findall(r"url\(#([^)]*)\)", out))
    assert refs and refs <= set(re.findall(r'id="([^"]*)"', out))


def test_a_legend_lists_every_labelled_mark_in_its_columns() -> None:
    p = Panel(legend_columns=2, legend_title="the first 3 of 9")
    for k in range(3):
        p.line([0, 1], [k, k + 1], f"#00000{k}", label=f"cell {k}")
    root = _svg(p)
    texts = [e.text for e in root.iter(NS + "text")]
    assert {"cell 0", "cell 1", "cell 2", "the first 3 of 9"} <= set(texts)
