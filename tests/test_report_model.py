"""The report model (report/model.py, verdicts.py, blocks.py, series.py): one block list built
once from an analysis, laid out by Markdown, HTML and the terminal without computing anything
of their own."""

from __future__ import annotations

import ast
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from runs_helper import cell, make_run

from abbench.analysis.campaign import CampaignAnalysis, analyze
from abbench.records import Sample, append_jsonl, keys
from abbench.report import html, markdown, model, terminal
from abbench.report.blocks import (
    HTML,
    MARKDOWN,
    Bullets,
    Document,
    Figure,
    Mark,
    Note,
    Section,
    Table,
    Text,
    Value,
    columns,
    parts,
    walk,
)
from abbench.report.model import Rates, Series, Timeline

DECIDE = [{"candidate": "C", "baseline": "B", "min_effect": 0.03}]
CAPPED = {"policy0": 2_000_000, "policy4": 2_200_000}
EVIL = "x<script>"
PACKAGE = Path(__file__).resolve().parents[1] / "abbench" / "report"


@pytest.fixture
def analysed(tmp_path: Path) -> CampaignAnalysis:
    """B, C capped (OWED, not compared), a cell whose name needs escaping, a sentinel."""
    run = make_run(tmp_path, [cell("B", 40), cell("C", 30, caps=CAPPED), cell(EVIL, 35),
                              cell("B", 39, sentinel_of=0)], DECIDE)
    return analyze(run)


def md_rows(md: str, heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table under a heading, unescaped as a viewer
    shows them (report.md writes `<` and `&` as entities)."""
    from html import unescape

    lines = md.split(heading + "\n")[1].splitlines()
    start = next(k for k, ln in enumerate(lines) if ln.startswith("|"))
    end = next(k for k in range(start, len(lines) + 1)
               if k == len(lines) or not lines[k].startswith("|"))
    return [[unescape(c) for c in r.removeprefix("| ").removesuffix(" |").split(" | ")]
            for r in lines[start + 2:end]]


def html_rows(page: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under a heading, unescaped, tags removed."""
    from html import unescape

    table = page.split(heading)[1].split("<table>")[1].split("</table>")[0]
    return [[unescape(re.sub("<[^>]+>", "", c)) for c in re.findall("<td>(.*?)</td>", r)]
            for r in re.findall("<tr>(.*?)</tr>", table) if "<td>" in r]


def table(doc: Document, title: str) -> Table:
    """The model's table of that (terminal) title."""
    return next(b for b in walk(doc.blocks) if isinstance(b, Table) and b.title.startswith(title))


def plots(doc: Document) -> tuple[Timeline, Rates, tuple[Series, ...]]:
    """The plotted series: the timeline, the rates, the per-token times."""
    tl, rates, per_token = (b.plot for b in walk(doc.blocks) if isinstance(b, Figure))
    assert isinstance(tl, Timeline) and isinstance(rates, Rates)
    assert isinstance(per_token, tuple)
    return tl, rates, per_token


def said(x: Text) -> str:
    return "".join(p if isinstance(p, str) else str(getattr(p, "text", p)) for p in parts(x))


def walk_inline(xs: tuple[object, ...]) -> list[object]:
    out: list[object] = []
    for x in xs:
        out.append(x)
        inner = getattr(x, "text", None)
        if isinstance(inner, tuple):
            out += walk_inline(inner)
    return out


def test_building_twice_gives_the_same_model(analysed: CampaignAnalysis) -> None:
    first = model.build(analysed)
    assert first == model.build(analysed)
    assert markdown.emit(first) == markdown.render(analysed)
    assert html.emit(first) == html.render_html(analysed)


def test_markdown_and_html_show_the_same_cell_rows(analysed: CampaignAnalysis) -> None:
    r = model.build(analysed, samples=())
    cells = table(r, "cells")
    md_table, page_table = cells.shown_in(MARKDOWN), cells.shown_in(HTML)
    md = md_rows(markdown.emit(r), "## Cells")
    page = html_rows(html.emit(r), "<h2>Cells</h2>")
    assert md == [list(row) for row in md_table.rows]
    assert page == [list(row) for row in page_table.rows]
    shared = [h for h in page_table.head if h != "gate"]
    for name in shared:
        k, j = md_table.head.index(name), page_table.head.index(name)
        assert [row[k] for row in md] == [row[j] for row in page], name
    assert md_table.column("cell")[3] == "B (sentinel of 1)"
    assert EVIL in md_table.column("cell")
    assert "pressure" in md_table.head and "pressure" not in page_table.head


def test_the_verdict_table_and_prose_are_one_in_every_renderer(
        analysed: CampaignAnalysis) -> None:
    r = model.build(analysed, samples=())
    verdicts = table(r, "verdicts")
    assert verdicts.column("verdict") == ("OWED",)
    md, page = markdown.emit(r), html.emit(r)
    assert md_rows(md, "## Verdicts") == [list(row) for row in verdicts.shown_in(MARKDOWN).rows]
    assert html_rows(page, "<h2>Verdicts</h2>") == [list(row) for row in
                                                    verdicts.shown_in(HTML).rows]
    md_note, page_note = (b for b in walk(r.blocks) if isinstance(b, Note))
    details = [said(d) for d in md_note.details]
    assert details == [said(d) for d in page_note.details]
    assert any(d.startswith("not compared: cell 2 (C) vs cell 1 (B)") for d in details)
    assert Mark("OWED", "verdict") in walk_inline(page_note.lead)
    buf = io.StringIO()
    terminal.emit(r, Console(file=buf, color_system=None, width=300))
    out = buf.getvalue()
    for d in details:
        assert f"\n  {d}\n" in md and f"  {d}\n" in out
        assert f"<li>{html.e(d)}</li>" in page


def test_html_and_markdown_both_escape_a_name(analysed: CampaignAnalysis) -> None:
    """Markdown viewers render HTML too (issue 33): report.md writes the tag as text."""
    r = model.build(analysed, samples=())
    md = markdown.emit(r)
    assert EVIL not in md and "x&lt;script>" in md
    page = html.emit(r)
    assert EVIL not in page and html.e(EVIL) in page


def test_sections_bullets_and_tables() -> None:
    s = Section("t", (Bullets(("a", "b")), Table(columns("x", "y"), (("1", "2"),)),
                      Bullets(("c",))))
    assert s.items() == ("a", "b", "c") and s.tables()[0].column("y") == ("2",)
    assert markdown.lines([s]) == ["## t", "", "- a", "- b", "", "| x | y |", "|---|---|",
                                   "| 1 | 2 |", "", "- c", ""]
    assert markdown.lines([Bullets((), "None.")]) == ["None.", ""]
    assert markdown.lines([Bullets(())]) == []
    assert html.section(s)[0] == "<h2>t</h2>"
    assert html.Page().bullets(Bullets((), "a<b")) == ["<p>a&lt;b</p>"]
    assert html.Page().bullets(Bullets((Value("q'"),))) == ["<ul><li>q&#x27;</li></ul>"]


def test_the_timeline_comes_from_the_samples_through_the_key_table(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44, caps=CAPPED)], DECIDE)
    t_wall = json.loads((run / "journal.jsonl").read_text().splitlines()[0])["t_start_wall"]
    append_jsonl(run / "samples.jsonl", Sample(t_wall, t_wall, {keys.CPU_TEMP_C: 41.5},
                                               0).to_json(), fsync=False)
    a = analyze(run)
    tl, _, _ = plots(model.build(a))
    by_policy = {c.series.label: c for c in tl.caps}
    assert set(by_policy) == {"policy0 cap", "policy4 cap"}
    assert min(by_policy["policy0 cap"].series.ys) == 2000.0  # MHz
    assert by_policy["policy4 cap"].hw_max_mhz == 2400.0
    assert [s.label for s in tl.temperatures] == ["CPU"]
    assert tl.temperatures[0].ys == (41.5,)
    assert tl.entry_cpu is not None and tl.entry_cpu.ys == (40.0, 40.0)
    assert [s.label for s in tl.spans] == ["1 B", "2 C"]
    assert tl.spans[0].start == t_wall - tl.t0 and tl.missing == ()
    assert not tl.empty
    tl, rates, per_token = plots(model.build(a, samples=()))
    assert tl.caps == () and tl.mem is None
    assert tl.missing == ("CPU caps", "MemAvailable")  # entry temperatures remain
    assert [p.number for p in rates.points] == [1, 2]
    assert [s.label for s in per_token] == ["1 B", "2 C"]


def test_no_samples_and_no_state_means_nothing_measured(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, per_token=False, caps={}, caps_during=[])],
                   state=False)
    (run / "samples.jsonl").unlink(missing_ok=True)
    r = model.build(analyze(run))
    tl, _, per_token = plots(r)
    assert tl.missing == ("CPU caps", "temperatures", "MemAvailable")
    assert per_token == ()
    assert "Not measured on this device: CPU caps, temperatures, MemAvailable." in html.emit(r)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize("renderer", ["markdown.py", "html.py", "terminal.py", "plots.py"])
def test_renderers_lay_out_the_model_and_read_no_records(renderer: str) -> None:
    imported = _imports(PACKAGE / renderer)
    assert not {m for m in imported if m.startswith("abbench.records")}, imported
    assert "abbench.report.model" in imported or renderer == "plots.py"
