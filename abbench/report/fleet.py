"""The fleet report (docs/fleet.md#the-fleet-report): a NO-GO of any device class first,
then the combined verdict of each question across devices, the table per class and per
device, each device's noise floor and its own report. Terminal text, Markdown and HTML (one block
model, `sections`), JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import abbench.report.html as html
import abbench.report.markdown as md
from abbench.analysis.fleet import Combined, DeviceOutcome, FleetAnalysis
from abbench.analysis.noise import floor_noise
from abbench.fsutil import atomic_write_text
from abbench.records.fleet import FLEET_REPORT_STEM
from abbench.report.blocks import (
    VERDICT,
    Bullets,
    Code,
    Column,
    Paragraph,
    Section,
    Table,
    Value,
    columns,
)
from abbench.report.json_report import plain
from abbench.report.text import interval_text, noise
from abbench.textsafe import shown

FORMAT = "abbench-fleet-report/1"
VERDICT_COLUMN = Column("verdict", mark=VERDICT)  # the page colours it


def _question(c: Combined) -> str:
    return f"{c.candidate} vs {c.baseline}"


def _combined_line(c: Combined) -> str:
    tau = (f", between-device sd ±{c.tau:.1%}" if c.tau is not None and len(c.devices) > 1
           else "")
    return (f"{c.verdict}: {interval_text(c.ratio)} over {len(c.devices)} of "
            f"{len(c.verdicts)} device(s){tau} — {c.reason}")


def _floor(o: DeviceOutcome) -> str:
    """The device's noise floor from its own history, and the noise its verdicts used."""
    a = o.analysis
    if a is None:
        return "-"
    return f"device history: {noise(floor_noise(a.floor))}; verdicts used: {noise(a.noise)}"


def _device_verdicts(o: DeviceOutcome) -> str:
    if o.analysis is None:
        return f"{o.status}: {o.note}" if o.note else o.status
    return ", ".join(f"{d.candidate} vs {d.baseline} {d.verdict} ({interval_text(d.ratio)})"
                     for d in o.analysis.decisions) or "no decision asked"


def text_lines(a: FleetAnalysis) -> list[str]:
    """The terminal report."""
    lines = [f"fleet {a.folder.name}: campaign {a.plan.campaign} on {len(a.devices)} devices"
             + (" (some simulated)" if any(o.device.startswith("sim:") for o in a.devices)
                else "")]
    for c in a.no_go_classes:
        lines.append(f"NO-GO on {c.scope}: {_question(c)} {_combined_line(c)}")
    for c in a.combined:
        lines.append(f"{_question(c)} across devices: {_combined_line(c)}")
    if a.per_class:
        lines.append("per device class:")
        for c in a.per_class:
            lines.append(f"  {c.scope}: {_question(c)} {_combined_line(c)}")
    lines.append("per device:")
    for o in a.devices:
        where = f" on {o.host}" if o.host else ""
        lines.append(f"  {o.device} ({o.class_name}{where}): {_device_verdicts(o)}")
        lines.append(f"    noise: {_floor(o)}")
        if o.folder is not None:
            lines.append(f"    report: {_rel(o.folder / 'report.md', a.folder)}")
    return [shown(x) for x in lines]  # device and host names, reasons from other machines


def sections(a: FleetAnalysis) -> tuple[Section, ...]:
    """The report's body, built once (Markdown and HTML lay it out)."""
    out: list[Section] = []
    if a.no_go_classes:
        out.append(Section("NO-GO", (Bullets(tuple(
            f"{c.scope}: {_question(c)} {_combined_line(c)}" for c in a.no_go_classes)),)))
    out.append(Section("Across devices", (
        Paragraph(("Devices are a level above cells: a random-effects combination of each "
                   "device's log ratio (DerSimonian-Laird between-device variance, a "
                   "Hartung-Knapp t interval with devices - 1 df, never narrower than the "
                   "weights alone give; ", Code("docs/fleet.md"), ")."),),
        Table(columns("question", VERDICT_COLUMN, "ratio", "devices", "between-device sd",
                      "reason"),
              tuple((_question(c), c.verdict, interval_text(c.ratio),
                     f"{len(c.devices)} of {len(c.verdicts)}",
                     f"±{c.tau:.1%}" if c.tau is not None and len(c.devices) > 1 else "-",
                     c.reason) for c in a.combined)),
        Bullets(tuple(f"{_question(c)}: {d} not in it — {why}" for c in a.combined
                      for d, why in c.excluded)))))
    out.append(Section("Per device class", (Table(
        columns("class", "question", VERDICT_COLUMN, "ratio", "devices"),
        tuple((c.scope, _question(c), c.verdict, interval_text(c.ratio),
               f"{len(c.devices)} of {len(c.verdicts)}") for c in a.per_class)),)))
    out.append(Section("Per device", (Table(
        columns("device", "class", "host", "status", "verdicts", "noise", "report"),
        tuple((o.device, o.class_name, o.host or "-", o.status, _device_verdicts(o),
               _floor(o), _rel(o.folder / "report.md", a.folder) if o.folder else "-")
              for o in a.devices)),)))
    return tuple(out)


def _title(a: FleetAnalysis) -> str:
    return f"Fleet report: {a.plan.campaign}"


def _intro(a: FleetAnalysis) -> str:
    sim = any(o.device.startswith("sim:") for o in a.devices)
    return (f"Fleet folder {a.folder.name}, {len(a.devices)} devices"
            + (", some of them simulated (sim:)" if sim else "") + ".")


def markdown(a: FleetAnalysis) -> str:
    out = [f"# {md.text(_title(a))}", "", md.text(_intro(a)), ""]
    for s in sections(a):
        out += [*md.section(s), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def html_page(a: FleetAnalysis) -> str:
    return html.page(_title(a), (Paragraph((Value(_intro(a)),)), *sections(a)))


def to_json(a: FleetAnalysis) -> dict[str, Any]:
    def device(o: DeviceOutcome) -> dict[str, Any]:
        an = o.analysis
        return {"device": o.device, "class": o.class_name, "host": o.host, "status": o.status,
                "note": o.note, "run": _rel(o.folder, a.folder) if o.folder else None,
                "decisions": [{"candidate": d.candidate, "baseline": d.baseline,
                               "verdict": d.verdict, "ratio": plain(d.ratio),
                               "se": plain(d.se), "reason": d.reason}
                              for d in (an.decisions if an else ())],
                "noise": plain(an.noise) if an else None,
                "own_noise": plain(an.own_noise) if an else None,
                "exit_status": an.exit_status if an else None}

    return {"format": FORMAT, "fleet": a.folder.name, "plan": a.plan.to_json(),
            "exit_status": a.exit_status,
            "no_go_classes": [plain(c) for c in a.no_go_classes],
            "combined": [plain(c) for c in a.combined],
            "per_class": [plain(c) for c in a.per_class],
            "devices": [device(o) for o in a.devices]}


def write_fleet_reports(a: FleetAnalysis) -> None:
    atomic_write_text(a.folder / f"{FLEET_REPORT_STEM}.md", markdown(a))
    atomic_write_text(a.folder / f"{FLEET_REPORT_STEM}.html", html_page(a))
    atomic_write_text(a.folder / f"{FLEET_REPORT_STEM}.json",
                      json.dumps(to_json(a), indent=1, allow_nan=False) + "\n")


def _rel(path: Path | None, root: Path) -> str:
    return os.path.relpath(path, root) if path is not None else ""
