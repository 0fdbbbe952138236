"""What abbench did not write is escaped (issue 33, class 8): control characters from a
model file, a campaign file, a run folder or a cell's output are shown as escapes on the
terminal, and report.md writes HTML from them as text. One test per surface, through the
real command where one prints it, plus the two escaping functions themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from conftest import run_main
from runs_helper import cell, make_run

from abbench.campaign.view import CampaignView
from abbench.engine import synth
from abbench.records import CellRecord, EntryState, GateWait, read_plan
from abbench.report.markdown import cell as md_cell
from abbench.report.markdown import code as md_code
from abbench.report.markdown import text as md_text
from abbench.sensors import Device
from abbench.textsafe import shown

REPO = Path(__file__).resolve().parents[1]
# A colour change, a right-to-left override and a newline: what a hostile name holds.
EVIL = "ok\x1b[31mRED\u202elive\nERROR: fake"
SEEN = r"ok\x1b[31mRED\u202elive\nERROR: fake"
CONTROLS = ([chr(c) for c in range(0x20) if c != 0x09] + [chr(c) for c in range(0x7F, 0xA0)]
            + list("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
                   "\u2028\u2029"))
SVG = "<svg onload=alert(1)>"


def raw_controls(text: str) -> list[str]:
    """The control characters in `text` other than the line ends abbench prints itself."""
    return [c for c in text if c in CONTROLS and c != "\n"]


def test_shown_writes_every_control_as_an_escape_and_nothing_else() -> None:
    assert shown(EVIL) == SEEN
    assert all(shown(c).startswith("\\") and shown(c).isprintable() for c in CONTROLS)
    assert shown("\r\x00\x7f\x9b\u2069") == r"\r\x00\x7f\x9b\u2069"
    kept = "tab\there, é 中文 🙂 \\x1b as typed, ‐–— «»"
    assert shown(kept) == kept


def test_markdown_writes_html_and_table_breakers_as_text() -> None:
    assert md_text(SVG) == "&lt;svg onload=alert(1)>"
    assert md_text("</b><!-- x --><?php") == "&lt;/b>&lt;!-- x -->&lt;?php"
    assert md_text("&#x202e; &amp;") == "&amp;#x202e; &amp;amp;"  # no entity renders
    assert md_text("<= 900 s, < 3 °C, (> 3 °C), **bold** `code`") == (
        "<= 900 s, < 3 °C, (> 3 °C), **bold** `code`")  # abbench's own words, unchanged
    assert md_text("a\nb\x1b") == r"a\nb\x1b"  # a newline would start a block
    assert md_cell("a | b\n| c |") == r"a \| b\n\| c \|"
    assert md_code("x") == "`x`" and md_code("a`<b>`c") == "``a`<b>`c``"
    assert md_code("`x") == "`` `x ``"


def test_model_info_shows_a_hostile_general_name_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Today: the terminal turned red, the name reversed, and a second line began."""
    path = tmp_path / "m.gguf"
    synth.write_model(synth.preset("tiny"), path, name=EVIL)
    rc, out, err = run_main(["model", "info", str(path)], capsys)
    assert rc == 0, err
    assert not raw_controls(out)
    (row,) = [ln for ln in out.splitlines() if ln.startswith("architecture")]
    assert row.endswith(f"qwen3moe ({SEEN})")
    assert not any(ln.startswith("ERROR") for ln in out.splitlines())
    rc, out, _ = run_main(["model", "info", str(path), "--json"], capsys)
    assert json.loads(out)["name"] == EVIL  # the data keeps the file's words


@pytest.mark.parametrize("where, toml", [
    ("cell name", '[cells."x\\u001b[31m\\u202e\\nB"]\ntokens = 4\n'),
    ("campaign name", '[campaign]\nname = "c\\u001b[2J\\u202e"\n[cells.B]\ntokens = 4\n'),
])
def test_a_campaign_file_with_control_characters_is_one_escaped_error(
        where: str, toml: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A name is refused (it names a folder); the message quoting it stays one line."""
    path = tmp_path / "c.toml"
    path.write_text('[workload]\nmodel = "synthetic:tiny"\n' + toml, encoding="utf-8")
    rc, out, err = run_main(["campaign", str(path), "--dry-run"], capsys)
    assert rc == 2 and out == ""
    assert not raw_controls(err), where
    lines = err.splitlines()
    assert lines[0].startswith("ERROR: ") and "\\u202e" in lines[0]
    assert all(ln.startswith(("ERROR: ", "TIP: ")) for ln in lines)


def test_a_transport_with_control_characters_is_printed_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[device]\ntransport = "ssh:h\\u001b[31mo\\u202est"\n'
                    '[cells.x]\ncommand = ["true", "\\u001b]0;title\\u0007"]\n'
                    'output = "stdout-summary"\n', encoding="utf-8")
    rc, out, err = run_main(["campaign", str(path), "--dry-run"], capsys)
    assert rc == 0, err
    assert not raw_controls(out + err)
    assert r"on ssh:h\x1b[31mo\u202est," in out and r"\x1b]0;title\x07" in out


def test_the_campaign_view_shows_a_resumed_run_folders_names_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan.json from elsewhere (`--resume`) names cells as it likes: the progress
    lines print them, the cell's failure reason and the transport escaped."""
    run = make_run(tmp_path, [cell("B", 40)])
    doc = json.loads((run / "plan.json").read_text())
    doc["cells"][0]["name"] = EVIL
    (run / "plan.json").write_text(json.dumps(doc))
    plan = read_plan(run)
    device = cast(Device, SimpleNamespace(transport="ssh:\x1b[2Jh", simulated=False))
    record = CellRecord(index=0, name=EVIL, label="01-B", status="failed", t_start_wall=0,
                        t_end_wall=1, t_start_mono=0, t_end_mono=1, entry=EntryState(t_wall=0),
                        gate=GateWait(), error=f"its output said {EVIL}")
    with CampaignView(plan, device, live=False) as view:
        view.phase(plan.cells[0], "running")
        view.finished(plan.cells[0], record)
    err = capsys.readouterr().err
    assert not raw_controls(err)
    lines = err.splitlines()
    assert len(lines) == 3 and r"on ssh:\x1b[2Jh" in lines[0]
    assert lines[2].endswith(f"cell 1/1 {SEEN}: failed, - (its output said {SEEN})")


def test_a_run_folders_hostile_cell_name_is_escaped_in_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`abbench report` of a run folder made elsewhere: the terminal report and report.md
    show the name, and neither lets it restyle, reorder or inject HTML; report.html's plots
    draw it as text."""
    name = EVIL + SVG + " | [bold red]styled[/]"
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44)])
    doc = json.loads((run / "plan.json").read_text())
    doc["cells"][1]["name"] = name
    (run / "plan.json").write_text(json.dumps(doc))
    journal = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    journal[1]["name"] = name
    (run / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in journal))
    rc, out, err = run_main(["report", str(run), "--style", "plain"], capsys)
    assert rc in (0, 3), err
    assert not raw_controls(out + err)
    assert "[bold red]styled[/]" in out  # shown as written, not read as a style
    md = (run / "report.md").read_text(encoding="utf-8")
    assert not raw_controls(md) and SVG not in md
    (row,) = [ln for ln in md.splitlines() if ln.startswith("| 2 |")]
    assert f"| {SEEN}&lt;svg onload=alert(1)> \\| [bold red]styled[/] |" in row
    page = (run / "report.html").read_text(encoding="utf-8")
    # the page's plots are SVG elements of its own: the name is text in them, never one
    assert SVG not in page and page.count("<svg ") == 3
    plots = page[page.index("<svg "):page.rindex("</svg>")]
    assert "&lt;svg onload=alert(1)&gt;" in plots  # its tick label, as text


def test_what_an_external_cell_wrote_reaches_report_md_as_text(tmp_path: Path) -> None:
    """Two ways a cell's words reach report.md: the `ERROR:` line of its stderr (why it
    failed) and the output abbench could not read (quoted in the reason). Today the tag
    was written raw, and a Markdown viewer renders it."""
    cells = {
        "said": ["sh", "-c", f"echo 'ERROR: {SVG}' >&2; exit 1"],
        "wrote": ["sh", "-c", f"echo '{SVG}' > {tmp_path / 'w.csv'}"],
        "ok": ["sh", "-c", "echo 'generation: 4 tokens, 0.5 s/token (2.0 tok/s)'"],
    }
    outputs = {"said": "stdout-summary", "wrote": f"bmoe-csv:{tmp_path / 'w.csv'}",
               "ok": "stdout-summary"}
    (tmp_path / "c.toml").write_text(
        '[campaign]\nname = "svg"\nspacing_s = 0\nwarmup_tokens = 0\n'
        + "".join(f"[cells.{k}]\ncommand = {json.dumps(v)}\noutput = \"{outputs[k]}\"\n"
                  for k, v in cells.items()), encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", "c.toml", "--out", "out",
                        "--sentinels", "out/sentinels", "--no-live"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in p.stderr, p.stderr
    (run,) = (tmp_path / "out").glob("svg-*")
    md = (run / "report.md").read_text(encoding="utf-8")
    assert SVG not in md
    assert md.count("&lt;svg onload=alert(1)>") >= 2, md


# -- issue 42, class 3: links and images in what abbench did not write -----------------------

LINKS = "[click](javascript:alert(1)) and ![x](http://evil/x.png)"


def _rendered(md: str) -> str:
    """report.md as a CommonMark viewer renders it (markdown-it-py: rich's own parser)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").render(md)


@pytest.mark.parametrize("s", [
    LINKS,
    "[r]: http://evil/definition",  # a reference definition, then `[r]` would link
    "<http://evil/autolink>",
    "a\\](http://evil/escaped-escape)",  # a backslash of its own before the `]`
    "[x] [y]: (http://evil/after-a-space)",
])
def test_no_link_or_image_forms_from_foreign_text(s: str) -> None:
    html = _rendered(f"- {md_text(s)}\n\n{md_text(s)}\n\n| a |\n|---|\n| {md_cell(s)} |\n\n[r]\n")
    assert "<a " not in html and "<img" not in html, html
    assert "evil" in html  # shown, as text


def test_no_link_forms_across_parts_of_a_line() -> None:
    """A name ending in `[x]` set beside abbench's own `(...)`, or a `[` in one part and
    its `](` in another."""
    from abbench.report import blocks as blk
    from abbench.report.markdown import inline

    for parts in (["see [x]", "(http://evil/a)"], ["[x", blk.Code("c"), "](http://evil/b)"],
                  ["[x]", ": http://evil/c"]):
        html = _rendered(inline(parts) + "\n\n[x]\n")
        assert "<a " not in html and "<img" not in html, (parts, html)


def test_an_external_cells_stderr_reaches_report_md_without_its_links(
        tmp_path: Path) -> None:
    """Before: report.md kept `[click](javascript:...)` and `![x](http://evil/x.png)` raw
    from a failed external cell's stderr, and a viewer loaded the image from the outside
    host."""
    (tmp_path / "c.toml").write_text(
        '[campaign]\nname = "links"\nspacing_s = 0\nwarmup_tokens = 0\n'
        '[cells.said]\ncommand = ["sh", "-c", ' + json.dumps(f"echo 'ERROR: {LINKS}' >&2; exit 1")
        + ']\noutput = "stdout-summary"\n'
        '[cells.ok]\ncommand = ["sh", "-c", "echo \'generation: 4 tokens, 0.5 s/token '
        '(2.0 tok/s)\'"]\noutput = "stdout-summary"\n', encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", "c.toml", "--out", "out",
                        "--sentinels", "out/sentinels", "--no-live"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in p.stderr, p.stderr
    (run,) = (tmp_path / "out").glob("links-*")
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "http://evil/x.png" in md  # the reason is there, as text
    html = _rendered(md)
    assert "<img" not in html and 'href="javascript' not in html
    assert "<a " not in html


def test_a_closing_bracket_escaped_once_across_parts_shows_as_written() -> None:
    """A part with a `](` of its own and a last `]` that the next part's `(` follows: each
    `]` escaped once, so the viewer shows the text as written, no stray backslash."""
    from abbench.report.markdown import inline

    html = _rendered(inline(["a](b]", "(c)"]) + "\n")
    assert "<a " not in html and "a](b](c)" in html, html
