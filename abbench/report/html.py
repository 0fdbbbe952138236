"""report.html: one self-contained page (inline CSS, plots as base64 PNG) — banners,
verdicts, cells, and three plots: the device timeline (caps, temperatures, MemAvailable,
cell spans, gate waits), per-cell tokens/s with 95% intervals, per-token times."""

from __future__ import annotations

import base64
import io
import math
from html import escape
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from abbench.analysis.campaign import CampaignAnalysis  # noqa: E402
from abbench.analysis.decide import UNVERIFIED  # noqa: E402
from abbench.errors import RecordError
from abbench.records import Sample, keys, read_samples  # noqa: E402
from abbench.report import text as t  # noqa: E402
from abbench.report.markdown import (  # noqa: E402
    MARK,
    banners,
    cell_name,
    decision_lines,
    import_lines,
    looks_lines,
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1200px}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:2px;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}.banner{background:#fff3cd;border:2px solid #d39e00;padding:8px;
margin:6px 0;font-weight:bold}.GO{color:#1a7f37;font-weight:bold}
.NO-GO{color:#c62828;font-weight:bold}.other{color:#a15c00;font-weight:bold}
img{max-width:100%;border:1px solid #ddd;margin:6px 0}.muted{color:#666}
"""


def e(x: Any) -> str:
    return escape(str(x), quote=True)


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _series(samples: list[Sample], key: str, t0: float) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in samples:
        v = s.values.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(s.t_wall - t0)
            ys.append(float(v))
    return xs, ys


def _not_measured(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}: not measured", transform=ax.transAxes, ha="center",
            va="center", color="#888", fontsize=11)
    ax.set_yticks([])


def timeline(a: CampaignAnalysis, samples: list[Sample]) -> tuple[str, list[str]]:
    """The timeline plot and the list of series that were not measured."""
    starts = [r.t_start_wall - r.gate.waited_s for r in a.records]
    t0 = min([s.t_wall for s in samples] + starts, default=0.0)
    policies = sorted({p for s in samples for p in keys.policies(s.values, "cap_khz")})
    temps = [(k, lbl) for k, lbl in ((keys.CPU_TEMP_C, "CPU"), (keys.BATTERY_TEMP_C, "battery"))
             if _series(samples, k, t0)[0]]
    mem = _series(samples, keys.MEM_AVAILABLE_MIB, t0)
    ent = [(r.t_start_wall - t0, r.entry.cpu_temp_c, r.entry.battery_temp_c)
           for r in a.records]
    has_ent = any(c is not None or b is not None for _, c, b in ent)
    missing = ([] if policies else ["CPU caps"]) + ([] if temps or has_ent
                                                   else ["temperatures"])
    missing += [] if mem[0] else ["MemAvailable"]
    n = 3 if mem[0] else 2
    fig = Figure(figsize=(12, 2.6 * n + 0.6))
    axes = fig.subplots(n, 1, sharex=True)
    ax_caps, ax_temp = axes[0], axes[1]
    for p in policies:
        xs, ys = _series(samples, keys.cap_khz(p), t0)
        ax_caps.step(xs, [y / 1000 for y in ys], where="post", label=f"{p} cap")
        hx, hy = _series(samples, keys.hw_max_khz(p), t0)
        if hy:
            ax_caps.axhline(max(hy) / 1000, ls=":", lw=0.8, color="#999")
    if policies:
        ax_caps.legend(loc="lower left", fontsize=8)
    else:
        _not_measured(ax_caps, "CPU caps")
    ax_caps.set_ylabel("cap (MHz)")
    for k, lbl in temps:
        xs, ys = _series(samples, k, t0)
        ax_temp.plot(xs, ys, label=lbl)
    for j, (lbl, fmt) in enumerate((("entry CPU", "kv"), ("entry battery", "g^"))):
        pts = [(x, v[j]) for x, *v in ent if v[j] is not None]
        if pts:
            ax_temp.plot([x for x, _ in pts], [y for _, y in pts], fmt, ms=5, label=lbl)
    if temps or has_ent:
        ax_temp.legend(loc="lower left", fontsize=8)
    else:
        _not_measured(ax_temp, "temperatures")
    ax_temp.set_ylabel("temperature (°C)")
    if mem[0]:
        axes[2].plot(mem[0], mem[1], color="#6a3d9a", label="MemAvailable")
        axes[2].set_ylabel("MemAvailable (MiB)")
    gate_labelled = False
    for k, r in enumerate(a.records):
        s, end = r.t_start_wall - t0, r.t_end_wall - t0
        for ax in axes:
            ax.axvspan(s, end, color="C0" if k % 2 == 0 else "C1", alpha=0.12, lw=0)
            if r.gate.waited_s > 0:
                ax.axvspan(s - r.gate.waited_s, s, facecolor="none", edgecolor="#c62828",
                           hatch="//", lw=0, label=None if gate_labelled else "gate wait")
        gate_labelled = gate_labelled or r.gate.waited_s > 0
        ax_caps.text((s + end) / 2, 1.01, f"{r.index + 1} {r.name}", rotation=30,
                     transform=ax_caps.get_xaxis_transform(), ha="left", va="bottom",
                     fontsize=8)
    if gate_labelled:
        axes[-1].legend(loc="lower left", fontsize=8)
    if not a.records and not samples:
        ax_caps.set_xlim(0, 1)
    axes[-1].set_xlabel(f"seconds since t0 = {t0:.0f} (wall clock, Unix time)")
    fig.tight_layout()
    return _png(fig), missing


def rates_plot(a: CampaignAnalysis) -> str:
    """tokens/s per cell with its token-level 95% interval and, behind it, the cell-level
    band: where 95% of identical cells would land at the campaign's cell-to-cell noise."""
    fig = Figure(figsize=(12, 4))
    ax = fig.subplots()
    noise = a.noise
    for c in a.cells:
        iv = c.tokens_per_s
        if noise.known and iv is not None and t.finite(iv.estimate):
            v = c.token_variance if math.isfinite(c.token_variance) else noise.token_variance
            half = 1.96 * math.sqrt(noise.between + v)
            ax.bar([c.index + 1], [iv.estimate * (math.exp(half) - math.exp(-half))],
                   bottom=[iv.estimate * math.exp(-half)], width=0.5, color="#999",
                   alpha=0.25, lw=0)
    for c in a.cells:
        iv = c.tokens_per_s
        if iv is None or not t.finite(iv.estimate):
            ax.text(c.index + 1, 0.03, "no data", rotation=90, ha="center", va="bottom",
                    fontsize=8, color="#888", transform=ax.get_xaxis_transform())
            continue
        sent = c.sentinel_of is not None
        kw = {"fmt": "D" if sent else "o", "color": "C3" if sent else "C0", "capsize": 4}
        if t.finite(iv.low) and t.finite(iv.high):
            ax.errorbar([c.index + 1], [iv.estimate],
                        yerr=[[iv.estimate - iv.low], [iv.high - iv.estimate]], **kw)
        else:
            ax.errorbar([c.index + 1], [iv.estimate], **kw)
            ax.annotate("no interval", (c.index + 1, iv.estimate), fontsize=7,
                        textcoords="offset points", xytext=(5, 5))
        if sent:
            ax.annotate(f"sentinel of {c.sentinel_of + 1}", (c.index + 1, iv.estimate),
                        fontsize=7, textcoords="offset points", xytext=(5, -12), color="C3")
    ax.set_xlim(0.5, max(len(a.cells), 1) + 0.5)
    ax.set_xticks([c.index + 1 for c in a.cells] or [1])
    ax.set_xticklabels([f"{c.index + 1}\n{c.name}" for c in a.cells] or [""], fontsize=8)
    ax.set_ylabel("tokens/s (steady window, 95% CI)")
    ax.set_ylim(bottom=0)
    ax.plot([], [], "o", color="C0", label="cell (95% CI of its tokens)")
    ax.plot([], [], "D", color="C3", label="sentinel")
    if noise.known:
        ax.bar([0], [0], color="#999", alpha=0.25,
               label=f"where 95% of identical cells land (±{noise.sd:.1%} per cell)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def per_token_plot(a: CampaignAnalysis) -> str:
    fig = Figure(figsize=(12, 4))
    ax = fig.subplots()
    drawn = False
    for c in a.cells:
        if not c.wall_ms:
            continue
        off = c.tokens - c.steady_tokens
        ax.plot(range(off, off + len(c.wall_ms)), c.wall_ms, lw=0.9,
                label=f"{c.index + 1} {c.name}")
        drawn = True
    if drawn:
        ax.legend(loc="upper right", fontsize=8, ncol=2)
    else:
        _not_measured(ax, "per-token times")
    ax.set_xlabel("decode token index (steady window, after the warm-up)")
    ax.set_ylabel("wall time per token (ms)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """Cells are already HTML (escaped by the caller)."""
    h = "".join(f"<th>{x}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _verdict(v: str) -> str:
    cls = v if v in ("GO", "NO-GO") else "other"
    return f'<span class="{cls}">{e(v)}</span>'


def verdicts(a: CampaignAnalysis) -> str:
    if not a.decisions:
        return "<p>No decisions asked.</p>"
    rows = []
    for d in a.decisions:
        ratio, ci_s, pairs = t.verdict_cells(d)
        rows.append([e(d.candidate), e(d.baseline), e(t.question(d)),
                     _verdict(d.verdict), e(ratio), e(ci_s), e(pairs)])
    out = [f"<p>{e(t.noise(a.noise))}{e(' — ' + a.noise.note) if a.noise.note else ''}</p>",
           _table(["candidate", "baseline", "question", "verdict", "ratio", "CI",
                   "matched pairs"], rows)]
    unv = [p for d in a.decisions if d.verdict == UNVERIFIED for p in d.pairs]
    if unv:
        out.append("<h3>Unverified pairs (device state or times not recorded — not matched)</h3>")
        out.append(_table(["candidate", "baseline", "ratio", "95% CI"], [
            [e(cell_name(a, p.candidate)), e(cell_name(a, p.baseline)),
             e(t.num(p.ratio.estimate if p.ratio else None, ".3f")), e(t.ci(p.ratio))]
            for p in unv]))
    looks = looks_lines(a)
    if looks:
        out.append("<pre>" + e("\n".join(looks)) + "</pre>")
    for d in a.decisions:
        label = d.verdict
        if d.verdict == UNVERIFIED:
            label = f"UNVERIFIED ({d.unverified_verdict} if matched)"
        items = []
        for line in decision_lines(a, d)[1:]:  # the same prose as report.md
            line = line.strip()
            items.append("<b>WARNING:</b> " + e(line[len("WARNING: "):])
                         if line.startswith("WARNING: ") else e(line))
        out.append(f"<p><b>{e(d.candidate)} vs {e(d.baseline)}: {_verdict(label)}</b> — "
                   f"{e(d.reason)}</p><ul>" + "".join(f"<li>{i}</li>" for i in items)
                   + "</ul>")
    return "\n".join(out)


def cells_table(a: CampaignAnalysis) -> str:
    rows = []
    apart = t.config_apart(a.cells)
    for c in a.cells:
        rec = next((r for r in a.records if r.index == c.index), None)
        gate = "-"
        if rec and (rec.gate.polls or rec.gate.gave_up or rec.gate.waited_s):
            gate = f"waited {rec.gate.waited_s:.0f} s" + (", GAVE UP" if rec.gate.gave_up
                                                          else "")
        name = c.name + (f" (sentinel of {c.sentinel_of + 1})" if c.sentinel_of is not None
                         else "")
        rows.append([e(x) for x in (
            c.index + 1, name, apart[c.index], c.status, t.rate(c.tokens_per_s),
            t.num(c.drop_rate and 100 * c.drop_rate, ".1f", "%"),
            f"{t.num(c.median_ms, '.1f')} ({t.num(c.p5_ms, '.1f')}–{t.num(c.p95_ms, '.1f')})",
            t.num(c.read_mib_per_token), t.num(c.hit_pct, ".1f"),
            t.num(c.stall_ms_per_token, ".1f"), t.num(c.majflt_per_token),
            t.num(c.cpu_occupancy and 100 * c.cpu_occupancy, ".0f", "%"),
            t.num(c.spec_useful_pct, ".0f", "%"), t.caps_during(c),
            t.entry(rec.entry) if rec else "-", gate)])
    out = _table(["#", "cell", "config", "status", "tok/s", "drop rate", "median ms (p5–p95)",
                  "MiB/tok", "hit %", "stall ms/tok", "majflt/tok", "CPU occ.",
                  "spec useful", "caps during", "entry", "gate"], rows)
    notes = [f"<li>cell {c.index + 1} ({e(c.name)}): {e(n)}</li>" for c in a.cells
             for n in c.notes]
    return out + (f"<ul>{''.join(notes)}</ul>" if notes else "")


def _list(items: list[str], empty: str) -> str:
    return "<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>" if items else \
        f"<p>{e(empty)}</p>"


def render_html(a: CampaignAnalysis, folder: Path | None = None) -> str:
    """The whole page as one string; `folder` (default: the analysis' run folder) is read
    for samples.jsonl only."""
    run = Path(folder) if folder is not None else a.run
    try:
        samples = read_samples(run)
    except RecordError:
        samples = []
    tl, missing = timeline(a, samples)
    P: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                    f"<title>{e(a.plan.campaign)} — abbench report</title>",
                    f"<style>{CSS}</style></head><body>",
                    f"<h1>{e(a.plan.campaign)} — abbench report</h1>",
                    f"<p>Run folder <code>{e(a.run)}</code>, device <code>{e(a.plan.device)}"
                    f"</code>, {len(a.records)} of {len(a.plan.cells)} cells, warm-up "
                    f"{a.plan.warmup_tokens} tokens, spacing {a.plan.spacing_s:g} s. "
                    "Cells' intervals: 95%, moving-block bootstrap over per-token times "
                    "(block ceil(n^(1/3)), seeded); verdicts' intervals: two levels, tokens "
                    "and cells (docs/method.md).</p>"]
    P += [f'<div class="banner">{e(b)}</div>' for b in banners(a)]
    if a.imported is not None:
        P += ["<h2>Import</h2>", "<pre>" + e("\n".join(import_lines(a))) + "</pre>"]
    P += ["<h2>Verdicts</h2>", verdicts(a), "<h2>Cells</h2>", cells_table(a)]
    P += ["<h2>Timeline</h2>",
          "<p class=muted>CPU caps (MHz, per policy; dotted: hardware max), temperatures "
          "(°C) and MemAvailable over wall time; shaded: each cell's span; hatched red: "
          "thermal-gate waits before a cell.</p>", tl]
    if missing:
        P.append(f"<p class=muted>Not measured on this device: {e(', '.join(missing))}.</p>")
    P += ["<h2>Tokens/s per cell</h2>", rates_plot(a),
          "<h2>Per-token times</h2>", per_token_plot(a)]
    P += ["<h2>Adjacent pairs</h2>"]
    for m in a.pairs:
        P.append(f"<p><b>{e(cell_name(a, m.first))} → {e(cell_name(a, m.second))}: "
                 f"{e(m.state)}</b>{e(f' ({m.note})') if m.note else ''}</p>")
        P.append(_list([e(f"{MARK[cr.status]} {cr.name}: {cr.detail}") for cr in m.criteria],
                       "no criteria"))
    P += ["<h2>Drift (sentinels)</h2>",
          _list([e(f"{d.verdict} — {d.summary}") for d in a.drift],
                "No sentinels in this plan."),
          "<h2>Caps timeline</h2>",
          _list([e(x) for x in a.caps_timeline], "No policy was capped (or caps not measured)."),
          "<h2>Contamination tells</h2>",
          _list([e(f"{'campaign' if x.cell is None else cell_name(a, x.cell)} [{x.kind}]: "
                   f"{x.detail}") for x in a.tells], "None."),
          "</body></html>", ""]
    return "\n".join(P)


__all__ = ["render_html"]
