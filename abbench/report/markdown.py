"""report.md: the report a person reads first, in the order they need it — warnings
about the run itself, verdicts, cells, pairs, drift, tells."""

from __future__ import annotations

from abbench.analysis.campaign import CampaignAnalysis
from abbench.analysis.decide import UNVERIFIED, Decision
from abbench.report import text as t

MARK = {"ok": "✓", "fail": "✗", "not measured": "–"}


def banners(a: CampaignAnalysis) -> list[str]:
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
    return out


def cell_name(a: CampaignAnalysis, index: int) -> str:
    c = a.cells[index]
    return f"cell {index + 1} ({c.name})"


def decision_lines(a: CampaignAnalysis, d: Decision) -> list[str]:
    """The prose under a verdict: comparison, reason, what would settle it, warnings."""
    out: list[str] = []
    label = d.verdict
    if d.verdict == UNVERIFIED:
        label = f"UNVERIFIED ({d.unverified_verdict} if matched)"
    look = f" at look {d.look}" if d.look is not None else ""
    out.append(f"**{d.candidate} vs {d.baseline} ({t.question(d)}): {label}{look}** — "
               f"{d.reason}")
    if d.ratio is not None and d.verdict != UNVERIFIED and t.finite(d.ratio.low):
        out.append(f"  {t.times(d.candidate, d.baseline, d.ratio)}")
    if d.identical:
        out.append(f"  {d.candidate} and {d.baseline} have the same configuration: an A/A "
                   "comparison (the truth is a ratio of 1)")
    if d.noise is not None and d.pairs and d.noise != a.noise:  # read at an earlier look
        out.append(f"  {t.noise(d.noise)}" + (f" — {d.noise.note}" if d.noise.note else ""))
    if (r := t.resolvable(d)) is not None:
        out.append(f"  {r}")
    if d.consistency:
        out.append(f"  consistency: {d.consistency}")
    if d.settle:
        out.append(f"  what would settle it: {d.settle}")
    if d.order is not None and d.order.position is not None and not d.order_warning:
        p = d.order.position
        out.append(f"  order: {d.order.candidate_first} pairs with {d.candidate} first, "
                   f"{d.order.baseline_first} with {d.baseline} first; position effect "
                   f"(second cell over first) {p.estimate:.3f}"
                   + (f" ({p.level:.0%} CI {p.low:.3f} .. {p.high:.3f}): no order effect "
                      "shown" if t.finite(p.low) else " (no interval)"))
    if d.order_warning:
        out.append(f"  WARNING: {d.order_warning}")
    for u in d.unmatched:
        out.append(f"  not compared: {cell_name(a, u.candidate)} vs {cell_name(a, u.baseline)}"
                   f" — {'; '.join(u.match.reasons) or u.match.state}")
    return out


def import_lines(a: CampaignAnalysis) -> list[str]:
    """An import's provenance: where the order and each cell's times came from, what each
    cell's configuration rests on, and what the import could not read."""
    info = a.imported
    if info is None:
        return []
    out = [f"Imported from `{info.source}`. Execution order: **{info.order.kind}** — "
           f"{info.order.source}.", ""]
    if info.notes:
        out += ["What the import could not read, or read only in part:", ""]
        out += [f"- {n}" for n in info.notes] + [""]
    out += ["| # | run | files | start | end | tok/s | configuration |",
            "|---|---|---|---|---|---|---|"]
    for k, c in enumerate(info.cells):
        shown = {key: f"{x.kind}: {x.source}" for key, x in c.facts.items()}
        out.append(f"| {k + 1} | {c.label} | {', '.join(c.files)} | "
                   + " | ".join(shown.get(key, "-") for key in ("t_start", "t_end", "tok/s",
                                                              "config")) + " |")
    return [*out, ""]


def looks_lines(a: CampaignAnalysis) -> list[str]:
    """A sequential campaign's looks: cells, alpha spent, each decision's interval."""
    if not a.looks:
        return []
    s = a.plan.sequential
    budget = ", ".join(x for x in (f"max {s.max_cells} cells" if s and s.max_cells else "",
                                   f"max {s.max_minutes:g} min" if s and s.max_minutes
                                   else "") if x)
    out = [f"Sequential campaign ({budget}): {len(a.looks)} look"
           f"{'s' if len(a.looks) > 1 else ''}, each at the alpha it spends (docs/method.md).",
           "", "| look | cells | alpha | decision | verdict | interval |",
           "|---|---|---|---|---|---|"]
    for lk in a.looks:
        for d in lk.decisions:
            out.append(f"| {lk.number}{' (last)' if lk.final else ''} | {lk.cells} | "
                       f"{lk.alpha:.4f} | {d.candidate} vs {d.baseline} | {d.verdict} | "
                       f"{t.ci(d.ratio)} |")
    if a.pending:
        out.append("")
        out.append(f"Cells {', '.join(str(i + 1) for i in a.pending)} ran after the last look "
                   "and are not in a verdict yet.")
    return [*out, ""]


def render(a: CampaignAnalysis) -> str:
    L: list[str] = [f"# {a.plan.campaign} — abbench report", ""]
    L += [f"Run folder `{a.run}`, device `{a.plan.device}`, {len(a.records)} of "
          f"{len(a.plan.cells)} cells, warm-up {a.plan.warmup_tokens} tokens, spacing "
          f"{a.plan.spacing_s:g} s. Cells' intervals: 95%, moving-block bootstrap over "
          "per-token times (block ceil(n^(1/3)), seeded). Verdicts' intervals: two levels, "
          "tokens within cells and cells (Student t on the cell-to-cell noise; "
          "docs/method.md).", ""]
    for b in banners(a):
        L += [f"> **{b}**", ""]
    if a.imported is not None:
        L += ["## Import", "", *import_lines(a)]

    L += ["## Verdicts", ""]
    if not a.decisions:
        L += ["No decisions asked." + (f" {t.noise(a.noise)}." if a.noise.known else ""), ""]
    else:
        L += [f"{t.noise(a.noise)}." + (f" {a.noise.note}." if a.noise.note else ""), ""]
        L += ["| candidate | baseline | question | verdict | ratio | CI | matched pairs |",
              "|---|---|---|---|---|---|---|"]
        for d in a.decisions:
            ratio, ci_s, pairs = t.verdict_cells(d)
            L.append(f"| {d.candidate} | {d.baseline} | {t.question(d)} | {d.verdict} | "
                     f"{ratio} | {ci_s} | {pairs} |")
        L.append("")
        L += looks_lines(a)
        unv = [(d, p) for d in a.decisions if d.verdict == UNVERIFIED for p in d.pairs]
        if unv:
            L += ["### Unverified pairs (device state or times not recorded — not matched)", "",
                  "| candidate | baseline | ratio | 95% CI |", "|---|---|---|---|"]
            for _d, p in unv:
                L.append(f"| {cell_name(a, p.candidate)} | {cell_name(a, p.baseline)} | "
                         f"{t.num(p.ratio.estimate if p.ratio else None, '.3f')} | "
                         f"{t.ci(p.ratio)} |")
            L.append("")
        for d in a.decisions:
            L += decision_lines(a, d) + [""]

    apart = t.config_apart(a.cells)
    L += ["## Cells", "",
          "| # | cell | config | status | tok/s | drop rate | median ms (p5–p95) | MiB/tok | "
          "hit % | stall ms/tok | majflt/tok | CPU occ. | spec useful | caps during | entry | "
          "pressure | gate |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in a.cells:
        rec = next((r for r in a.records if r.index == c.index), None)
        gate = "-"
        if rec and (rec.gate.polls or rec.gate.gave_up):
            gate = f"waited {rec.gate.waited_s:.0f} s" + (", GAVE UP" if rec.gate.gave_up else "")
        name = c.name + (f" (sentinel of {c.sentinel_of + 1})" if c.sentinel_of is not None
                         else "")
        L.append(
            f"| {c.index + 1} | {name} | {apart[c.index]} | {c.status} | "
            f"{t.rate(c.tokens_per_s)} | "
            f"{t.num(c.drop_rate and 100 * c.drop_rate, '.1f', '%')} | "
            f"{t.num(c.median_ms, '.1f')} ({t.num(c.p5_ms, '.1f')}–{t.num(c.p95_ms, '.1f')}) | "
            f"{t.num(c.read_mib_per_token)} | {t.num(c.hit_pct, '.1f')} | "
            f"{t.num(c.stall_ms_per_token, '.1f')} | {t.num(c.majflt_per_token)} | "
            f"{t.num(c.cpu_occupancy and 100 * c.cpu_occupancy, '.0f', '%')} | "
            f"{t.num(c.spec_useful_pct, '.0f', '%')} | {t.caps_during(c)} | "
            f"{t.entry(rec.entry) if rec else '-'} | {t.pressure(c)} | {gate} |")
    L.append("")
    notes = [(c, n) for c in a.cells for n in c.notes]
    for c, n in notes:
        L.append(f"- cell {c.index + 1} ({c.name}): {n}")
    if notes:
        L.append("")

    L += ["## Adjacent pairs", ""]
    for m in a.pairs:
        L.append(f"**{cell_name(a, m.first)} → {cell_name(a, m.second)}: {m.state}**"
                 + (f" ({m.note})" if m.note else ""))
        for cr in m.criteria:
            L.append(f"- {MARK[cr.status]} {cr.name}: {cr.detail}")
        L.append("")

    if a.unverified_ratios:
        L += ["### Unverified ratios (device state or times not recorded: not matched, no "
              "verdict)", "",
              "| second / first | ratio | 95% CI |", "|---|---|---|"]
        for f, s, r in a.unverified_ratios:
            L.append(f"| {cell_name(a, s)} / {cell_name(a, f)} | {r.estimate:.3f} | "
                     f"{r.low:.3f}–{r.high:.3f} |")
        L.append("")

    L += ["## Drift (sentinels)", ""]
    L += [f"- **{d.verdict}** — {d.summary}" for d in a.drift] or ["No sentinels in this plan."]
    L.append("")
    L += ["## Caps timeline", ""]
    L += [f"- {x}" for x in a.caps_timeline] or ["No policy was capped (or caps not measured)."]
    L.append("")
    L += ["## Contamination tells", ""]
    L += [f"- {'campaign' if x.cell is None else cell_name(a, x.cell)} [{x.kind}]: {x.detail}"
          for x in a.tells] or ["None."]
    L.append("")
    return "\n".join(L)
