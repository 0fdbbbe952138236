"""The report model: what a report says, built once from an analysis — the header, banners,
sections of paragraphs, tables and bullets (blocks.py), the verdicts' prose, the cells'
figures and the series the page plots (series.py). The Markdown, HTML and terminal
renderers lay it out and compute nothing; report.json (json_report.py) is the analysis' own
document and is not built from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import abbench.report.text as t
from abbench.analysis.campaign import CampaignAnalysis
from abbench.analysis.decide import UNVERIFIED, Decision
from abbench.analysis.matching import PairMatch
from abbench.records import Sample
from abbench.records.provenance import FACT_CONFIG, FACT_T_END, FACT_T_START, FACT_TOK_S
from abbench.report.blocks import Block, Bullets, Code, Paragraph, Section, Strong, Table
from abbench.report.series import Rates, Series, Timeline, per_token, rates, samples_of, timeline

MARK = {"ok": "✓", "fail": "✗", "not measured": "–"}
WARNING = "WARNING: "  # a detail line that warns (the page sets it in bold)
CELLS_METHOD = ("Cells' intervals: 95%, moving-block bootstrap over per-token times (block "
                "ceil(n^(1/3)), seeded)")
VERDICTS_METHOD = ("two levels, tokens within cells and cells (Student t on the cell-to-cell "
                   "noise; docs/method.md)")
VERDICTS_METHOD_BRIEF = "two levels, tokens and cells (docs/method.md)"  # report.html's


@dataclass(frozen=True)
class Header:
    campaign: str
    run: str
    device: str
    recorded: int
    planned: int
    warmup_tokens: int
    spacing_s: float

    @property
    def setup(self) -> str:
        """"3 of 4 cells, warm-up 4 tokens, spacing 30 s"."""
        return (f"{self.recorded} of {self.planned} cells, warm-up {self.warmup_tokens} "
                f"tokens, spacing {self.spacing_s:g} s")


@dataclass(frozen=True)
class Imported:
    """An import's provenance: the report.md section, and its order and notes apart."""

    order: str
    order_source: str
    notes: tuple[str, ...]
    section: Section


@dataclass(frozen=True)
class DecisionNote:
    """The prose under one verdict."""

    candidate: str
    baseline: str
    question: str
    verdict: str
    label: str  # the verdict, or "UNVERIFIED (GO if matched)"
    look: int | None
    reason: str
    details: tuple[str, ...]  # comparison, noise, power, settle, order, warnings, unmatched
    comparison: str  # "C ran 1.20 ± 0.03 times faster than B", "-" without a matched ratio
    unverified_pairs: tuple[str, ...]  # "unverified pair: cell 2 (C) vs cell 1 (B): ..."


@dataclass(frozen=True)
class Verdicts:
    noise: str
    noise_note: str
    noise_known: bool
    table: Table | None  # None: no decision asked
    looks: tuple[Block, ...]  # a sequential campaign's looks
    unverified: Section | None  # unverified pairs, never in the verdict table
    notes: tuple[DecisionNote, ...]

    @property
    def noise_line(self) -> str:
        return self.noise + (f" — {self.noise_note}" if self.noise_note else "")


@dataclass(frozen=True)
class CellRow:
    """One cell's figures as shown; each renderer picks its columns."""

    number: str
    name: str  # "B (sentinel of 1)"
    marked: str  # "B *" (a sentinel)
    config: str
    status: str
    rate: str
    drop: str
    median: str
    median_range: str  # "25.1 (24.0–26.3)"
    mib: str
    hit: str
    stall: str
    majflt: str
    cpu: str
    spec: str
    caps: str
    entry: str
    pressure: str
    gate: str  # "waited 12 s", wherever a wait is recorded
    gate_polled: str  # the same where the gate polled or gave up, "-" otherwise
    prefill: str  # prompt tokens per second until the first token
    ttft: str  # time to first token, seconds
    stability: str  # worst over best window throughput ("0.94")
    power: str  # mean power over the cell ("3.21 ± 0.12 W")
    energy: str  # energy per token ("0.0451 ± 0.002 J/tok")


Column: TypeAlias = tuple[str, str]  # (heading, CellRow field)
CELL_COLUMNS: tuple[Column, ...] = (
    ("#", "number"), ("cell", "name"), ("config", "config"), ("status", "status"),
    ("tok/s", "rate"), ("stability", "stability"), ("drop rate", "drop"),
    ("median ms (p5–p95)", "median_range"), ("prefill tok/s", "prefill"), ("TTFT s", "ttft"),
    ("power", "power"), ("J/tok", "energy"), ("MiB/tok", "mib"), ("hit %", "hit"),
    ("stall ms/tok", "stall"),
    ("majflt/tok", "majflt"), ("CPU occ.", "cpu"), ("spec useful", "spec"),
    ("caps during", "caps"), ("entry", "entry"), ("pressure", "pressure"),
    ("gate", "gate_polled"))  # report.md's


@dataclass(frozen=True)
class Cells:
    rows: tuple[CellRow, ...]
    notes: tuple[str, ...]  # "cell 2 (C): no per-token times ..."

    def table(self, columns: Sequence[Column] = CELL_COLUMNS) -> Table:
        return Table(tuple(h for h, _ in columns),
                     tuple(tuple(str(getattr(r, f)) for _, f in columns) for r in self.rows))


@dataclass(frozen=True)
class Check:
    ok: bool
    text: str  # "✗ caps: ..."


@dataclass(frozen=True)
class PairNote:
    """Two adjacent cells and whether they are matched."""

    first: str
    second: str
    state: str
    note: str
    checks: tuple[Check, ...]

    @property
    def title(self) -> str:
        return f"{self.first} → {self.second}: {self.state}"


@dataclass(frozen=True)
class DriftLine:
    verdict: str
    summary: str


@dataclass(frozen=True)
class Report:
    title: str
    header: Header
    intro: Paragraph  # report.md's
    intro_brief: Paragraph  # report.html's shorter wording of the verdicts' method
    banners: tuple[str, ...]
    imported: Imported | None
    verdicts: Verdicts
    cells: Cells
    pairs: tuple[PairNote, ...]
    unverified_ratios: Section | None
    drift: tuple[DriftLine, ...]
    caps_timeline: Section
    tells: Section
    timeline: Timeline
    rates: Rates
    per_token: tuple[Series, ...]  # wall ms per decode token index, one per cell

    def drift_section(self, line: Callable[[DriftLine], str]) -> Section:
        """The sentinels' drift, each as `line` writes it (report.md sets the verdict in
        bold, the page does not)."""
        return Section("Drift (sentinels)", (Bullets(tuple(map(line, self.drift)),
                                                     "No sentinels in this plan."),))


# -- building it -------------------------------------------------------------------------


def build(a: CampaignAnalysis, samples: Sequence[Sample] | None = None) -> Report:
    """The report of an analysis. `samples` feed the timeline only (default: the run
    folder's; pass () where nothing is plotted)."""
    ticks = samples_of(a.run) if samples is None else samples
    header = Header(a.plan.campaign, str(a.run), a.plan.device, len(a.records),
                    len(a.plan.cells), a.plan.warmup_tokens, a.plan.spacing_s)
    return Report(
        title=f"{a.plan.campaign} — abbench report", header=header,
        intro=_intro(header, f"{CELLS_METHOD}. Verdicts' intervals: {VERDICTS_METHOD}."),
        intro_brief=_intro(header, f"{CELLS_METHOD}; verdicts' intervals: "
                                   f"{VERDICTS_METHOD_BRIEF}."),
        banners=banners(a), imported=_imported(a), verdicts=_verdicts(a), cells=_cells(a),
        pairs=tuple(_pair(a, m) for m in a.pairs), unverified_ratios=_unverified_ratios(a),
        drift=tuple(DriftLine(d.verdict, d.summary) for d in a.drift),
        caps_timeline=Section("Caps timeline", (Bullets(
            tuple(a.caps_timeline), "No policy was capped (or caps not measured)."),)),
        tells=Section("Contamination tells", (Bullets(tuple(
            f"{'campaign' if x.cell is None else cell_name(a, x.cell)} [{x.kind}]: {x.detail}"
            for x in a.tells), "None."),)),
        timeline=timeline(a, ticks), rates=rates(a), per_token=per_token(a))


def _intro(h: Header, method: str) -> Paragraph:
    return Paragraph(("Run folder ", Code(h.run), ", device ", Code(h.device),
                      f", {h.setup}. {method}"))


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
    return f"cell {index + 1} ({a.cells[index].name})"


def _imported(a: CampaignAnalysis) -> Imported | None:
    """Where the order and each cell's times came from, what each cell's configuration
    rests on, and what the import could not read."""
    info = a.imported
    if info is None:
        return None
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
    blocks.append(Table(("#", "run", "files", "start", "end", "tok/s", "configuration"),
                        tuple(rows)))
    return Imported(info.order.kind, info.order.source, tuple(info.notes),
                    Section("Import", tuple(blocks)))


def _verdicts(a: CampaignAnalysis) -> Verdicts:
    rows = []
    for d in a.decisions:
        ratio, ci_s, pairs = t.verdict_cells(d)
        rows.append((d.candidate, d.baseline, t.question(d), d.verdict, ratio, ci_s, pairs))
    table = Table(("candidate", "baseline", "question", "verdict", "ratio", "CI",
                   "matched pairs"), tuple(rows)) if a.decisions else None
    unv = tuple((cell_name(a, p.candidate), cell_name(a, p.baseline),
                 t.num(p.ratio.estimate if p.ratio else None, ".3f"), t.ci(p.ratio))
                for d in a.decisions if d.verdict == UNVERIFIED for p in d.pairs)
    unverified = Section("Unverified pairs (device state or times not recorded — not matched)",
                         (Table(("candidate", "baseline", "ratio", "95% CI"), unv),),
                         level=3) if unv else None
    return Verdicts(t.noise(a.noise), a.noise.note or "", a.noise.known, table, _looks(a),
                    unverified, tuple(_decision(a, d) for d in a.decisions))


def _looks(a: CampaignAnalysis) -> tuple[Block, ...]:
    """A sequential campaign's looks: cells, alpha spent, each decision's interval."""
    if not a.looks:
        return ()
    s = a.plan.sequential
    budget = ", ".join(x for x in (f"max {s.max_cells} cells" if s and s.max_cells else "",
                                   f"max {s.max_minutes:g} min" if s and s.max_minutes
                                   else "") if x)
    rows = tuple((f"{lk.number}{' (last)' if lk.final else ''}", str(lk.cells),
                  f"{lk.alpha:.4f}", f"{d.candidate} vs {d.baseline}", d.verdict, t.ci(d.ratio))
                 for lk in a.looks for d in lk.decisions)
    out: list[Block] = [
        Paragraph((f"Sequential campaign ({budget}): {len(a.looks)} look"
                   f"{'s' if len(a.looks) > 1 else ''}, each at the alpha it spends "
                   "(docs/method.md).",)),
        Table(("look", "cells", "alpha", "decision", "verdict", "interval"), rows)]
    if a.pending:
        out.append(Paragraph((f"Cells {', '.join(str(i + 1) for i in a.pending)} ran after "
                              "the last look and are not in a verdict yet.",)))
    return tuple(out)


def _decision(a: CampaignAnalysis, d: Decision) -> DecisionNote:
    label = d.verdict
    if d.verdict == UNVERIFIED:
        label = f"UNVERIFIED ({d.unverified_verdict} if matched)"
    comparison = ("-" if d.ratio is None or d.verdict == UNVERIFIED
                  else t.times(d.candidate, d.baseline, d.ratio, d.metric))
    unverified = tuple(
        f"unverified pair: {cell_name(a, p.candidate)} vs {cell_name(a, p.baseline)}: "
        f"{t.times(d.candidate, d.baseline, p.ratio, d.metric) if p.ratio else '-'}"
        for p in (d.pairs if d.verdict == UNVERIFIED else ()))
    return DecisionNote(d.candidate, d.baseline, t.question(d), d.verdict, label, d.look,
                        d.reason, _details(a, d), comparison, unverified)


def _details(a: CampaignAnalysis, d: Decision) -> tuple[str, ...]:
    """The lines under a verdict: comparison, what the noise and power were, what would
    settle it, the order, warnings, the pairs not compared."""
    out: list[str] = []
    if d.ratio is not None and d.verdict != UNVERIFIED and t.finite(d.ratio.low):
        out.append(t.times(d.candidate, d.baseline, d.ratio, d.metric))
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
        out.append(WARNING + d.order_warning)
    for u in d.unmatched:
        out.append(f"not compared: {cell_name(a, u.candidate)} vs {cell_name(a, u.baseline)}"
                   f" — {'; '.join(u.match.reasons) or u.match.state}")
    return tuple(out)


def _cells(a: CampaignAnalysis) -> Cells:
    apart = t.config_apart(a.cells)
    rows = []
    for c in a.cells:
        rec = next((r for r in a.records if r.index == c.index), None)
        gate = polled = "-"
        if rec and (rec.gate.polls or rec.gate.gave_up or rec.gate.waited_s):
            gate = f"waited {rec.gate.waited_s:.0f} s" + (", GAVE UP" if rec.gate.gave_up
                                                          else "")
            polled = gate if rec.gate.polls or rec.gate.gave_up else "-"
        median = t.num(c.median_ms, ".1f")
        rows.append(CellRow(
            number=str(c.index + 1),
            name=c.name + (f" (sentinel of {c.sentinel_of + 1})" if c.sentinel_of is not None
                           else ""),
            marked=c.name + (" *" if c.sentinel_of is not None else ""),
            config=apart[c.index], status=c.status, rate=t.rate(c.tokens_per_s),
            drop=t.num(c.drop_rate and 100 * c.drop_rate, ".1f", "%"), median=median,
            median_range=f"{median} ({t.num(c.p5_ms, '.1f')}–{t.num(c.p95_ms, '.1f')})",
            mib=t.num(c.read_mib_per_token), hit=t.num(c.hit_pct, ".1f"),
            stall=t.num(c.stall_ms_per_token, ".1f"), majflt=t.num(c.majflt_per_token),
            cpu=t.num(c.cpu_occupancy and 100 * c.cpu_occupancy, ".0f", "%"),
            spec=t.num(c.spec_useful_pct, ".0f", "%"), caps=t.caps_during(c),
            entry=t.entry(rec.entry) if rec else "-", pressure=t.pressure(c), gate=gate,
            gate_polled=polled, prefill=t.num(c.prefill_tok_s, ".1f"),
            ttft=t.num(c.ttft_s, ".3f"), stability=t.num(c.stability, ".2f"),
            power=t.measure(c.energy.power_w, "W"),
            energy=t.measure(c.energy.j_per_token, "J/tok")))
    notes = tuple(f"cell {c.index + 1} ({c.name}): {n}" for c in a.cells
                  for n in (*c.notes, *((c.energy.note,) if c.energy.note else ())))
    return Cells(tuple(rows), notes)


def _pair(a: CampaignAnalysis, m: PairMatch) -> PairNote:
    return PairNote(cell_name(a, m.first), cell_name(a, m.second), m.state, m.note or "",
                    tuple(Check(cr.status == "ok", f"{MARK[cr.status]} {cr.name}: {cr.detail}")
                          for cr in m.criteria))


def _unverified_ratios(a: CampaignAnalysis) -> Section | None:
    if not a.unverified_ratios:
        return None
    rows = tuple((f"{cell_name(a, s)} / {cell_name(a, f)}", f"{r.estimate:.3f}",
                  f"{r.low:.3f}–{r.high:.3f}") for f, s, r in a.unverified_ratios)
    return Section("Unverified ratios (device state or times not recorded: not matched, no "
                   "verdict)", (Table(("second / first", "ratio", "95% CI"), rows),), level=3)
