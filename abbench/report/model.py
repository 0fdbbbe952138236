"""The report model: what a campaign report says, built once from an analysis as one list
of blocks (blocks.py) — the header, banners, the import, verdicts, cells (cell_table.py),
the plots' series (series.py), pairs, drift, tells — each table's columns defined once,
with `only` where a medium has its own wording: report.md the long method, the page its
plots, the terminal a compact layout with the verdicts last. The Markdown, HTML and
terminal renderers lay it out and compute nothing; report.json (json_report.py) is the
analysis' own document and is not built from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import abbench.report.text as t
from abbench.analysis.campaign import CampaignAnalysis
from abbench.analysis.decide import UNVERIFIED, Decision
from abbench.analysis.matching import PairMatch
from abbench.records import Sample
from abbench.records.provenance import FACT_CONFIG, FACT_T_END, FACT_T_START, FACT_TOK_S
from abbench.report.blocks import (
    CAUTION,
    DRIFT,
    HTML,
    MARKDOWN,
    PAGES,
    STATE,
    TERMINAL,
    VERDICT,
    WARNING,
    Banner,
    Block,
    Bullets,
    Code,
    Column,
    Document,
    Figure,
    Inline,
    Mark,
    Note,
    Paragraph,
    Plain,
    Section,
    Strong,
    Table,
    Text,
    Value,
    columns,
    only,
)
from abbench.report.cell_table import cell_table
from abbench.report.series import Rates, Series, Timeline, per_token, rates, samples_of, timeline
from abbench.report.sessions import across_sessions

MARK = {"ok": "✓", "fail": "✗", "not measured": "–"}
# The terminal lists at most this many cells, pairs, drifts or tells of each kind and says
# how many more the pages hold: an import of ten thousand runs is a page to read, not a
# screen to scroll.
TERMINAL_ITEMS = 40
WARNS = "WARNING: "  # a detail line that warns (the page sets it in bold)
CELLS_METHOD = ("Cells' intervals: 95%, moving-block bootstrap over per-token times (block "
                "ceil(n^(1/3)), seeded)")
VERDICTS_METHOD = ("two levels, tokens within cells and cells (Student t on the cell-to-cell "
                   "noise; docs/method.md)")
VERDICTS_METHOD_BRIEF = "two levels, tokens and cells (docs/method.md)"  # report.html's
TIMELINE = ("CPU caps (MHz, per policy; dotted: hardware max), temperatures (°C) and "
            "MemAvailable over wall time; shaded: each cell's span; hatched red: thermal-gate "
            "waits before a cell.")
VERDICT_COLUMNS = columns("candidate", "baseline", "question", Column("verdict", mark=VERDICT),
                          Column("ratio", PAGES), Column("CI", PAGES),
                          Column("matched pairs", PAGES), Column("comparison", TERMINAL))


def build(a: CampaignAnalysis, samples: Sequence[Sample] | None = None) -> Document:
    """The report of an analysis. `samples` feed the timeline only (default: the run
    folder's; pass () where nothing is plotted)."""
    ticks = samples_of(a.run) if samples is None else samples
    cells = cell_table(a)
    page_verdicts, terminal_verdicts = _verdicts(a)
    return Document(f"{a.plan.campaign} — abbench report", (
        only(TERMINAL, Paragraph((
            Strong(a.plan.campaign), f" — {len(a.records)} of {len(a.plan.cells)} cells, "
            "device ", Value(a.plan.device), ", run folder ", Value(str(a.run))))),
        only(MARKDOWN, _intro(a, f"{CELLS_METHOD}. Verdicts' intervals: {VERDICTS_METHOD}.")),
        only(HTML, _intro(a, f"{CELLS_METHOD}; verdicts' intervals: {VERDICTS_METHOD_BRIEF}.")),
        *(Banner(b) for b in banners(a)), *_imported(a), *across_sessions(a.imported),
        only(PAGES, page_verdicts, Section("Cells", (cells,))), only(TERMINAL, _cut_table(cells)),
        only(HTML, *_figures(a, ticks)), *_pairs(a), *_unverified_ratios(a),
        *_listed("Drift (sentinels)", tuple(
            (Mark(d.verdict, DRIFT), " — ", Value(d.summary)) for d in a.drift),
                 "No sentinels in this plan."),
        only(PAGES, Section("Caps timeline", (Bullets(
            tuple(a.caps_timeline), "No policy was capped (or caps not measured)."),))),
        *_listed("Contamination tells", tuple(
            f"{'campaign' if x.cell is None else cell_name(a, x.cell)} [{x.kind}]: {x.detail}"
            for x in a.tells), "None."),
        only(TERMINAL, *terminal_verdicts)))


def _intro(a: CampaignAnalysis, method: str) -> Paragraph:
    setup = (f"{len(a.records)} of {len(a.plan.cells)} cells, warm-up {a.plan.warmup_tokens} "
             f"tokens, spacing {a.plan.spacing_s:g} s")
    return Paragraph(("Run folder ", Code(str(a.run)), ", device ", Code(a.plan.device),
                      f", {setup}. {method}"))


def banners(a: CampaignAnalysis) -> tuple[str, ...]:
    """The things to know before reading any number."""
    out: list[str] = []
    if a.simulated:
        out.append(f"SIMULATED DEVICE ({a.plan.device}): these numbers come from a simulated "
                   "device, not hardware.")
    if not a.complete:
        out.append(f"INCOMPLETE: {len(a.records)} of {len(a.plan.cells)} cells recorded "
                   f"(state: {a.state}).")
    if not a.device_state_recorded:
        out.append("NO DEVICE STATE recorded: no pair can be verified as matched; ratios "
                   "below are unverified.")
    if not a.plan.order_known:
        out.append("EXECUTION ORDER UNKNOWN: nothing recorded the order the runs ran in, so no "
                   "two cells are adjacent and none is compared.")
    return tuple(out)


def cell_name(a: CampaignAnalysis, index: int) -> str:
    """"cell 3 (B)": the cell's number and arm; and its own run where the arm is named
    after another ("cell 4 (qwen_base_r2, arm qwen_base_r1)": an import names an arm after
    its first run)."""
    arm, run = a.cells[index].name, run_name(a, index)
    return f"cell {index + 1} ({arm})" if run == arm else f"cell {index + 1} ({run}, arm {arm})"


def run_name(a: CampaignAnalysis, index: int) -> str:
    """The cell's own name: its label without the leading number (a campaign's is its
    arm's; an imported run's, its file stem)."""
    number, dash, run = a.cells[index].label.partition("-")
    return run if dash and number.isdigit() else a.cells[index].label


def _pairs_named(a: CampaignAnalysis, d: Decision) -> str | None:
    """The decision's pairs by their cells' labels, where the arms' names do not name
    the runs in them (an import's arm is named after its first run, which may not be in a
    pair); None where they do."""
    cells = [i for p in d.pairs for i in (p.candidate, p.baseline)]
    if all(run_name(a, i) == a.cells[i].name for i in cells):
        return None
    return "pairs behind this verdict: " + ", ".join(
        f"{a.cells[p.candidate].label} vs {a.cells[p.baseline].label}" for p in d.pairs)


def _imported(a: CampaignAnalysis) -> tuple[Block, ...]:
    """Where the order and each cell's times came from, what each cell's configuration
    rests on, what the import could not read, and what it did not import with the reason
    (the terminal: the order, the notes and what was not imported)."""
    info = a.imported
    if info is None:
        return ()
    blocks: list[Block] = [Paragraph((
        "Imported from ", Code(info.source), ". Execution order: ", Strong(info.order.kind),
        f" — {info.order.source}."))]
    if info.notes:
        blocks += [Paragraph(("What the import could not read, or read only in part:",)),
                   Bullets(tuple(info.notes))]
    rows = []
    for k, c in enumerate(info.cells):
        shown = {key: f"{x.kind}: {x.source}" for key, x in c.facts.items()}
        rows.append((str(k + 1), c.label, ", ".join(c.files),
                     *(shown.get(key, "-") for key in (FACT_T_START, FACT_T_END, FACT_TOK_S,
                                                      FACT_CONFIG))))
    blocks.append(Table(columns("#", "run", "files", "start", "end", "tok/s", "configuration"),
                        tuple(rows)))
    left_out = tuple(x.shown() for x in info.not_imported)
    return (only(PAGES, Section("Import", (Plain(tuple(blocks)),)),
                 *([Section("Not imported", (Bullets(left_out),))] if left_out else [])),
            only(TERMINAL,
                 Paragraph((f"import: order {info.order.kind} ({info.order.source})",)),
                 Bullets(_cut(tuple(f"{WARNS}{n}" for n in info.notes), "notes")),
                 *([Bullets(_cut(left_out, "files"), lead=("not imported:",))]
                   if left_out else [])))


def _verdicts(a: CampaignAnalysis) -> tuple[Section, tuple[Block, ...]]:
    """The pages' Verdicts section, and the terminal's verdict blocks: the noise the
    verdicts rest on, the verdict table, the looks, the unverified pairs, each verdict's
    prose and evidence."""
    noise = t.noise(a.noise)
    if not a.decisions:
        asked = "No decisions asked."
        return (Section("Verdicts", (
            only(MARKDOWN, Paragraph((asked + (f" {noise}." if a.noise.known else ""),))),
            only(HTML, Paragraph((asked,))))),
            (Paragraph(("no decisions asked" + (f"; {noise}" if a.noise.known else ""),)),))
    note = a.noise.note or ""
    noise_line = Paragraph((Value(noise + (f" — {note}" if note else "")),))
    table = Table(VERDICT_COLUMNS, tuple(map(_verdict_row, a.decisions)),
                  "verdicts (matched pairs only)")
    looks = (Plain(_looks(a)),) if a.looks else ()
    details = [_details(a, d) for d in a.decisions]
    page = (only(MARKDOWN, Paragraph((f"{noise}." + (f" {note}." if note else ""),))),
            only(HTML, noise_line), table, only(MARKDOWN, *looks), *_unverified(a),
            only(HTML, *looks), *(x for d, ds in zip(a.decisions, details)
                                  for x in _notes(d, ds)))
    terminal = (noise_line, table, *looks,
                Bullets(tuple(x for d, ds in zip(a.decisions, details)
                              for x in (*_unverified_pairs(a, d), *ds))))
    return Section("Verdicts", page), terminal


def _verdict_row(d: Decision) -> tuple[str, ...]:
    ratio, ci_s, pairs = t.verdict_cells(d)
    comparison = ("-" if d.ratio is None or d.verdict == UNVERIFIED
                  else t.times(d.candidate, d.baseline, d.ratio, d.metric))
    return d.candidate, d.baseline, t.question(d), d.verdict, ratio, ci_s, pairs, comparison


def _notes(d: Decision, details: tuple[str, ...]) -> tuple[Block, ...]:
    """The verdict in bold and its details: report.md with the question and the look, the
    page with the verdict coloured."""
    label = d.verdict
    if d.verdict == UNVERIFIED:
        why = ", confounded" if d.matched else " if matched"
        label = f"UNVERIFIED ({d.unverified_verdict}{why})"
    look = f" at look {d.look}" if d.look is not None else ""
    return (only(MARKDOWN, Note((Strong(f"{d.candidate} vs {d.baseline} ({t.question(d)}): "
                                       f"{label}{look}"), f" — {d.reason}"),
                                tuple(map(_warns, details)))),
            only(HTML, Note((Strong((Value(d.candidate), " vs ", Value(d.baseline), ": ",
                                     Mark(label, VERDICT))), " — ", Value(d.reason)),
                            tuple(_warns(x.strip()) for x in details))))


def _warns(x: str) -> Text:
    """A detail line, its leading "WARNING:" marked."""
    if x.startswith(WARNS):
        return Mark(WARNS.strip(), WARNING), " ", Value(x[len(WARNS):])
    return Value(x)


def _unverified(a: CampaignAnalysis) -> tuple[Block, ...]:
    """The unverified pairs' ratios, never in the verdict table."""
    rows = tuple((cell_name(a, p.candidate), cell_name(a, p.baseline),
                  t.num(p.ratio.estimate if p.ratio else None, ".3f"), t.ci(p.ratio))
                 for d in a.decisions if d.verdict == UNVERIFIED and not d.matched
                 for p in d.pairs)
    if not rows:
        return ()
    return (Section("Unverified pairs (device state or times not recorded — not matched)",
                    (Table(columns("candidate", "baseline", "ratio", "95% CI"), rows),),
                    level=3),)


def _unverified_pairs(a: CampaignAnalysis, d: Decision) -> tuple[str, ...]:
    return tuple(
        f"unverified pair: {cell_name(a, p.candidate)} vs {cell_name(a, p.baseline)}: "
        f"{t.times(d.candidate, d.baseline, p.ratio, d.metric) if p.ratio else '-'}"
        for p in (d.pairs if d.verdict == UNVERIFIED and not d.matched else ()))


def _looks(a: CampaignAnalysis) -> tuple[Block, ...]:
    """A sequential campaign's looks: cells, the level each tested at, each decision's
    interval."""
    s = a.plan.sequential
    budget = ", ".join(x for x in (f"max {s.max_cells} cells" if s and s.max_cells else "",
                                   f"max {s.max_minutes:g} min" if s and s.max_minutes
                                   else "") if x)
    rows = tuple((f"{lk.number}{' (last)' if lk.final else ''}", str(lk.cells),
                  f"{lk.alpha:.4f}", f"{d.candidate} vs {d.baseline}", d.verdict, t.ci(d.ratio))
                 for lk in a.looks for d in lk.decisions)
    out: list[Block] = [
        Paragraph((f"Sequential campaign ({budget}): {len(a.looks)} look"
                   f"{'s' if len(a.looks) > 1 else ''}, each testing at its group-sequential "
                   "boundary's alpha (docs/method.md).",)),
        Table(columns("look", "cells", "alpha", "decision", "verdict", "interval"), rows)]
    if a.pending:
        out.append(Paragraph((f"Cells {', '.join(str(i + 1) for i in a.pending)} ran after "
                              "the last look and are not in a verdict yet.",)))
    return tuple(out)


def _details(a: CampaignAnalysis, d: Decision) -> tuple[str, ...]:
    """The lines under a verdict: comparison, what the noise and power were, what would
    settle it, the order, warnings, the pairs not compared."""
    out: list[str] = []
    if d.ratio is not None and (d.verdict != UNVERIFIED or d.matched) \
            and t.finite(d.ratio.low):
        out.append(t.times(d.candidate, d.baseline, d.ratio, d.metric))
    if d.confound:
        out.append(f"{WARNS}confounded: {d.confound}")
    if d.slices:
        out.append(d.slices)
    if (named := _pairs_named(a, d)) is not None:
        out.append(named)
    if d.identical:
        out.append(f"{d.candidate} and {d.baseline} have the same configuration: an A/A "
                   "comparison (the truth is a ratio of 1)")
    if d.noise is not None and d.pairs and d.noise != a.noise:  # read at an earlier look
        out.append(t.noise(d.noise) + (f" — {d.noise.note}" if d.noise.note else ""))
    if (r := t.resolvable(d)) is not None:
        out.append(r)
    if d.consistency:
        out.append(f"consistency: {d.consistency}")
    if d.settle:
        out.append(f"what would settle it: {d.settle}")
    if d.order is not None and d.order.position is not None and not d.order_warning:
        p = d.order.position
        out.append(f"order: {d.order.candidate_first} pairs with {d.candidate} first, "
                   f"{d.order.baseline_first} with {d.baseline} first; position effect "
                   f"(second cell over first) {p.estimate:.3f}"
                   + (f" ({p.level:.0%} CI {p.low:.3f} .. {p.high:.3f}): no order effect "
                      "shown" if t.finite(p.low) else " (no interval)"))
    if d.order_warning:
        out.append(WARNS + d.order_warning)
    for u in d.unmatched:
        out.append(f"not compared: {cell_name(a, u.candidate)} vs {cell_name(a, u.baseline)}"
                   f" — {'; '.join(u.match.reasons) or u.match.state}")
    return tuple(out)


def _figures(a: CampaignAnalysis, ticks: Sequence[Sample]) -> tuple[Block, ...]:
    tl = timeline(a, ticks)
    missing = f"Not measured on this device: {', '.join(tl.missing)}." if tl.missing else ""
    return (Section("Timeline", (Figure(tl, TIMELINE, missing),)),
            Section("Tokens/s per cell", (Figure(rates(a)),)),
            Section("Per-token times", (Figure(per_token(a)),)))


def _pairs(a: CampaignAnalysis) -> tuple[Block, ...]:
    """Every pair with all its criteria; the terminal colours the state and lists only the
    criteria that failed."""
    def note(m: PairMatch) -> tuple[Inline, ...]:
        return (Value(f" ({m.note})"),) if m.note else ()

    def checks(m: PairMatch, failed: bool = False) -> tuple[str, ...]:
        return tuple(f"{MARK[c.status]} {c.name}: {c.detail}" for c in m.criteria
                     if not failed or c.status != "ok")

    def lead(m: PairMatch) -> tuple[Inline, ...]:
        return (Value(cell_name(a, m.first)), " → ", Value(cell_name(a, m.second)), ": ",
                Mark(m.state, STATE), *note(m))

    def span(run: list[PairMatch]) -> tuple[Inline, ...]:
        first, last = run[0], run[-1]
        return (Value(cell_name(a, first.first)), " → … → ", Value(cell_name(a, last.second)),
                f" ({len(run)} pairs in a row alike): ", Mark(first.state, STATE), *note(first))

    # The terminal says once what a run of neighbouring pairs share (an import's hundreds of
    # pairs with nothing recorded read alike), the pages every pair.
    runs: list[list[PairMatch]] = []
    for m in a.pairs:
        if runs and _alike(runs[-1][-1], m, checks):
            runs[-1].append(m)
        else:
            runs.append([m])
    return (only(PAGES, Section("Adjacent pairs", tuple(Bullets(checks(m), "no criteria", (
                Strong(f"{cell_name(a, m.first)} → {cell_name(a, m.second)}: {m.state}"),
                *note(m))) for m in a.pairs))),
            only(TERMINAL, Section("adjacent pairs", (*(
                Bullets(checks(r[0], failed=True), lead=lead(r[0]) if len(r) == 1 else span(r))
                for r in runs[:TERMINAL_ITEMS]), *_more(len(runs), "pair lines")))))


def _alike(m: PairMatch, n: PairMatch,
           checks: Callable[[PairMatch, bool], tuple[str, ...]]) -> bool:
    return (m.second == n.first and m.state == n.state and m.note == n.note
            and checks(m, True) == checks(n, True))


def _unverified_ratios(a: CampaignAnalysis) -> tuple[Block, ...]:
    if not a.unverified_ratios:
        return ()
    why = "device state or times not recorded: not matched, no verdict"
    rows = tuple((f"{cell_name(a, s)} / {cell_name(a, f)}", f"{r.estimate:.3f}",
                  f"{r.low:.3f}–{r.high:.3f}") for f, s, r in a.unverified_ratios)
    return (only(MARKDOWN, Section(f"Unverified ratios ({why})", (
                Table(columns("second / first", "ratio", "95% CI"), rows),), level=3)),
            only(TERMINAL, Paragraph((Mark("unverified ratios", CAUTION), f" ({why})")),
                 Bullets(_cut(tuple(f"{p}: {ratio} (95% CI {ci})" for p, ratio, ci in rows),
                              "ratios"))))


def _listed(title: str, items: tuple[Text, ...], empty: str) -> tuple[Block, ...]:
    """A section of bullets on the pages (`empty` said where there are none); on the
    terminal, its title in lower case and the items, only where there are some."""
    terminal = (Section(title[0].lower() + title[1:], (Bullets(_cut(items, "items")),)),) \
        if items else ()
    return only(PAGES, Section(title, (Bullets(items, empty),))), only(TERMINAL, *terminal)


def _cut(items: tuple[Text, ...], what: str) -> tuple[Text, ...]:
    """The first `TERMINAL_ITEMS` of a terminal list, and how many more the pages hold."""
    if len(items) <= TERMINAL_ITEMS:
        return items
    return (*items[:TERMINAL_ITEMS], _more_line(len(items), what))


def _more_line(total: int, what: str) -> str:
    return (f"… and {total - TERMINAL_ITEMS} more {what} (the first {TERMINAL_ITEMS} of "
            f"{total} here): report.md and report.html list every one")


def _more(total: int, what: str) -> tuple[Block, ...]:
    return (Paragraph((_more_line(total, what),)),) if total > TERMINAL_ITEMS else ()


def _cut_table(table: Table) -> Table:
    """The cells table on the terminal: its first `TERMINAL_ITEMS` rows."""
    if len(table.rows) <= TERMINAL_ITEMS:
        return table
    return Table(table.columns, table.rows[:TERMINAL_ITEMS], table.title,
                 (*table.notes, _more_line(len(table.rows), "cells")))


__all__ = ["Rates", "Series", "Timeline", "banners", "build", "samples_of"]
