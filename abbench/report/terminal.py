"""The terminal report (rich): banners, verdicts in colour, cells, pairs, drift, tells.
`--style plain` prints the same content with no colour or box characters."""

from __future__ import annotations

from typing import IO

from rich import box
from rich.console import Console
from rich.table import Table

from abbench.analysis.campaign import CampaignAnalysis
from abbench.analysis.decide import UNVERIFIED
from abbench.report import text as t
from abbench.report.markdown import MARK, banners, cell_name, decision_lines, looks_lines

COLOUR = {"GO": "bold green", "NO-GO": "bold red", "INCONCLUSIVE": "bold yellow",
          "OWED": "bold magenta", UNVERIFIED: "bold yellow"}


def render(a: CampaignAnalysis, console: Console, table_box: box.Box = box.SIMPLE) -> None:
    c = console
    c.print(f"[bold]{a.plan.campaign}[/] — {len(a.records)} of {len(a.plan.cells)} cells, "
            f"device {a.plan.device}, run folder {a.run}")
    for b in banners(a):
        c.print(f"[bold red]{b}[/]")
    if a.imported is not None:
        info = a.imported
        c.print(f"import: order {info.order.kind} ({info.order.source})", markup=False)
        for n in info.notes:
            c.print(f"  WARNING: {n}", markup=False)

    cells = Table(title="cells (steady window; ± is the 95% bootstrap interval)",
                  box=table_box)
    apart = t.config_apart(a.cells)
    show_config = any(v != "-" for v in apart.values())
    for col in ("#", "cell", *(("config",) if show_config else ()), "status", "tok/s",
                "drop", "median ms", "MiB/tok", "hit %", "majflt/tok", "CPU occ.",
                "caps during", "entry"):
        cells.add_column(col, overflow="fold")
    for s in a.cells:
        rec = next((r for r in a.records if r.index == s.index), None)
        cells.add_row(
            str(s.index + 1), s.name + (" *" if s.sentinel_of is not None else ""),
            *((apart[s.index],) if show_config else ()), s.status,
            t.rate(s.tokens_per_s), t.num(s.drop_rate and 100 * s.drop_rate, ".1f", "%"),
            t.num(s.median_ms, ".1f"), t.num(s.read_mib_per_token),
            t.num(s.hit_pct, ".1f"), t.num(s.majflt_per_token),
            t.num(s.cpu_occupancy and 100 * s.cpu_occupancy, ".0f", "%"),
            t.caps_during(s), t.entry(rec.entry) if rec else "-")
    c.print(cells)
    for s in a.cells:
        for n in s.notes:
            c.print(f"  cell {s.index + 1} ({s.name}): {n}", markup=False)

    c.print("[bold]adjacent pairs[/]")
    for m in a.pairs:
        style = {"matched": "green", "unverified": "yellow"}.get(m.state, "red")
        c.print(f"  {cell_name(a, m.first)} → {cell_name(a, m.second)}: [{style}]{m.state}[/]"
                + (f" ({m.note})" if m.note else ""))
        for cr in m.criteria:
            if cr.status != "ok":
                c.print(f"    {MARK[cr.status]} {cr.name}: {cr.detail}", markup=False)

    if a.unverified_ratios:
        c.print("[bold yellow]unverified ratios[/] (device state or times not recorded: not "
                "matched, no verdict)")
        for f, s, r in a.unverified_ratios:
            c.print(f"  {cell_name(a, s)} / {cell_name(a, f)}: {r.estimate:.3f} "
                    f"(95% CI {r.low:.3f}–{r.high:.3f})", markup=False)

    if a.drift:
        c.print("[bold]drift (sentinels)[/]")
        for d in a.drift:
            style = "red" if d.verdict == "drift" else "yellow" if d.verdict != "stable" else ""
            c.print(f"  [{style or 'default'}]{d.verdict}[/] — ", end="")
            c.print(d.summary, markup=False)
    if a.tells:
        c.print("[bold]contamination tells[/]")
        for x in a.tells:
            where = "campaign" if x.cell is None else cell_name(a, x.cell)
            c.print(f"  {where} [{x.kind}]: {x.detail}", markup=False)

    if a.decisions:
        c.print(t.noise(a.noise) + (f" — {a.noise.note}" if a.noise.note else ""),
                markup=False)
        v = Table(title="verdicts (matched pairs only)", box=table_box)
        for col in ("candidate", "baseline", "question", "verdict", "comparison"):
            v.add_column(col)
        for d in a.decisions:
            comparison = ("-" if d.ratio is None or d.verdict == UNVERIFIED
                          else t.times(d.candidate, d.baseline, d.ratio))
            v.add_row(d.candidate, d.baseline, t.question(d),
                      f"[{COLOUR[d.verdict]}]{d.verdict}[/]", comparison)
        c.print(v)
        for line in looks_lines(a):
            c.print(line, markup=False)
        for d in a.decisions:
            if d.verdict == UNVERIFIED:
                for p in d.pairs:
                    c.print(f"  unverified pair: {cell_name(a, p.candidate)} "
                            f"vs {cell_name(a, p.baseline)}: "
                            f"{t.times(d.candidate, d.baseline, p.ratio) if p.ratio else '-'}",
                            markup=False)
            for line in decision_lines(a, d)[1:]:
                c.print(line, markup=False)
    else:
        c.print("no decisions asked" + (f"; {t.noise(a.noise)}" if a.noise.known else ""),
                markup=False)


def print_report(a: CampaignAnalysis, style: str = "rich", file: IO[str] | None = None) -> None:
    if style == "plain":
        console = Console(file=file, color_system=None, highlight=False, emoji=False,
                          width=160, no_color=True)
        render(a, console, box.ASCII2)
    else:
        render(a, Console(file=file, highlight=False, emoji=False))
