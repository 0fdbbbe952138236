"""The report's cell table: each cell's figures as shown (`CellRow`), and the columns that
show them, defined once with where each is shown."""

from __future__ import annotations

from dataclasses import dataclass, replace

import abbench.report.text as t
from abbench.analysis.campaign import CampaignAnalysis
from abbench.report.blocks import HTML, MARKDOWN, PAGES, TERMINAL, Column, Table


@dataclass(frozen=True)
class CellRow:
    """One cell's figures as shown; `CELL_COLUMNS` picks them."""

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
    memory: str  # under a memory limit: "365 / 1024 MiB" (its cgroup's peak / limit)
    gate: str  # "waited 12 s", wherever a wait is recorded
    gate_polled: str  # the same where the gate polled or gave up, "-" otherwise
    prefill: str  # prompt tokens per second until the first token
    ttft: str  # time to first token, seconds
    stability: str  # worst over best window throughput ("0.94")
    power: str  # mean power over the cell ("3.21 ± 0.12 W")
    energy: str  # energy per token ("0.0451 ± 0.002 J/tok")
    foreign: str  # other processes' mean busy cores during the cell ("0.12")
    decode: str  # the decode alone, where tok/s is what a user waits through ("11.2")
    speculation: str  # "62% accepted, 1.9 tok/decode; route-ahead 97% agree"


# Each column with the CellRow field it shows: report.md all but the page's gate; the page
# without the pressure, and a gate wait wherever one is recorded; the terminal a compact
# set (its configurations only where they differ, the foreign load only where some cell
# has it — a run without /proc/stat, or older than it: `cell_table`).
CELL_COLUMNS: tuple[tuple[Column, str], ...] = (
    (Column("#"), "number"), (Column("cell", PAGES), "name"),
    (Column("cell", TERMINAL), "marked"), (Column("config"), "config"),
    (Column("status"), "status"), (Column("tok/s"), "rate"),
    (Column("decode-only tok/s", short="decode tok/s"), "decode"),
    (Column("speculation", short="spec"), "speculation"),
    (Column("stability", short="stab."), "stability"),
    (Column("drop rate", short="drop"), "drop"),
    (Column("median ms (p5–p95)", PAGES), "median_range"),
    (Column("median ms", TERMINAL), "median"), (Column("prefill tok/s"), "prefill"),
    (Column("TTFT s"), "ttft"), (Column("power", PAGES), "power"), (Column("J/tok"), "energy"),
    (Column("MiB/tok"), "mib"), (Column("hit %"), "hit"),
    (Column("stall ms/tok", PAGES), "stall"), (Column("majflt/tok"), "majflt"),
    (Column("CPU occ."), "cpu"), (Column("spec useful", PAGES), "spec"),
    (Column("caps during"), "caps"), (Column("foreign cores", short="foreign"), "foreign"),
    (Column("entry"), "entry"),
    (Column("cgroup peak / limit", short="memory"), "memory"),
    (Column("pressure", MARKDOWN), "pressure"), (Column("gate", MARKDOWN), "gate_polled"),
    (Column("gate", HTML), "gate"))


# Columns shown only where some cell has a figure in them.
OPTIONAL = frozenset({"foreign", "decode", "speculation", "memory"})


def cell_table(a: CampaignAnalysis) -> Table:
    """Every cell's row, and the notes on what is missing ("no per-token times ...")."""
    apart = t.config_apart(a.cells)
    named = {c.label: c.from_file_name for c in a.imported.cells} if a.imported else {}
    rows = tuple(cell_row(a, c.index, from_file_name(apart[c.index], named.get(c.label, ())))
                 for c in a.cells)
    shown = tuple((c, f) for c, f in CELL_COLUMNS
                  if f not in OPTIONAL or any(getattr(r, f) != "-" for r in rows))
    cols = tuple(c for c, _ in shown)
    if all(r.config == "-" for r in rows):  # one configuration: the terminal leaves it out
        cols = tuple(replace(c, media=PAGES) if c.head == "config" else c for c in cols)
    notes = tuple(f"cell {c.index + 1} ({c.name}): {n}" for c in a.cells
                  for n in (*c.notes, *((c.energy.note,) if c.energy.note else ())))
    return Table(cols, tuple(tuple(getattr(r, f) for _, f in shown) for r in rows),
                 "cells (steady window; ± is the 95% bootstrap interval)", notes)


def from_file_name(config: str, keys: tuple[str, ...]) -> str:
    """`config` as the table shows it (`model=gemma spec_gate=1`) with each of `keys` said
    to come from a word of the file name: no file of the run records it."""
    return " ".join(f"{w} (from the file name)" if "=" in w and w.split("=", 1)[0] in keys
                    else w for w in config.split(" "))


def cell_row(a: CampaignAnalysis, index: int, config: str) -> CellRow:
    c = a.cells[index]
    rec = a.record_of(c.index)
    gate = polled = "-"
    if rec and (rec.gate.polls or rec.gate.gave_up or rec.gate.waited_s):
        gate = f"waited {rec.gate.waited_s:.0f} s" + (", GAVE UP" if rec.gate.gave_up else "")
        polled = gate if rec.gate.polls or rec.gate.gave_up else "-"
    median = t.num(c.median_ms, ".1f")
    return CellRow(
        number=str(c.index + 1),
        name=c.name + (f" (sentinel of {c.sentinel_of + 1})" if c.sentinel_of is not None
                       else ""),
        marked=c.name + (" *" if c.sentinel_of is not None else ""),
        config=config, status=c.status, rate=t.rate(c.tokens_per_s),
        drop=t.num(c.work.drop_rate and 100 * c.work.drop_rate, ".1f", "%"), median=median,
        median_range=f"{median} ({t.num(c.p5_ms, '.1f')}–{t.num(c.p95_ms, '.1f')})",
        mib=t.num(c.work.read_mib_per_token), hit=t.num(c.work.hit_pct, ".1f"),
        stall=t.num(c.work.stall_ms_per_token, ".1f"), majflt=t.num(c.work.majflt_per_token),
        cpu=t.num(c.work.cpu_occupancy and 100 * c.work.cpu_occupancy, ".0f", "%"),
        spec=t.num(c.work.spec_useful_pct, ".0f", "%"), caps=t.caps_during(c),
        entry=t.entry(rec.entry) if rec else "-", pressure=t.pressure(c),
        memory=t.cgroup_memory(c), gate=gate,
        gate_polled=polled, prefill=t.num(c.prefill_tok_s, ".1f"),
        ttft=t.num(c.ttft_s, ".3f"), stability=t.num(c.stability, ".2f"),
        power=t.measure(c.energy.power_w, "W"), energy=t.measure(c.energy.j_per_token, "J/tok"),
        foreign=t.num(c.during.foreign_cores, ".2f"), decode=t.num(c.work.decode_tok_s, ".2f"),
        speculation=t.speculation(c))
