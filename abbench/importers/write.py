"""Writing an import's run folder: the plan, one journal line and one `cells/LABEL/` folder
per run, the device snapshots as samples, and `import.json` with the provenance of every
fact the journal holds."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from abbench.fsutil import atomic_write_text
from abbench.importers.discover import Run
from abbench.importers.driverlog import DriverEntry
from abbench.importers.facts import entry_state, fingerprint, hit_pct, run_summary, times
from abbench.importers.identity import Identity
from abbench.importers.order import Order
from abbench.importers.state import Snapshot
from abbench.records import (
    IMPORT_FILE,
    CellRecord,
    EntryState,
    Fact,
    ImportedCell,
    ImportInfo,
    NotImported,
    Plan,
    PlannedCell,
    RunSummary,
    Sample,
    append_jsonl,
    document_text,
    keys,
)
from abbench.records.bmoe_csv import parse_bmoe_csv
from abbench.records.bmoe_view import token_view
from abbench.records.cell_doc import IMPORT_DOC_FORMAT, Resolved, import_doc
from abbench.records.provenance import FACT_T_END, FACT_T_START, FACT_TOK_S, CrossSession
from abbench.records.text import clip, read_text_lossy

FORMAT = IMPORT_DOC_FORMAT  # the cells' summary.json, as `records.cell_doc` writes it


def write_run_folder(out: Path, plan: Plan, runs: dict[str, Run], order: Order,
                     identities: dict[str, Identity], notes: list[str], src: Path,
                     not_imported: Sequence[NotImported] = (),
                     sessions: Sequence[CrossSession] = ()) -> None:
    """Write the run folder of `plan` into the (empty) folder `out`; `sessions`: the
    configurations measured in more than one session (`importers.session`)."""
    atomic_write_text(out / "plan.json", json.dumps(plan.to_json(), indent=1) + "\n")
    (out / "journal.jsonl").touch()
    samples: list[Sample] = []
    imported: list[ImportedCell] = []
    for cell in plan.cells:
        name = order.names[cell.index]
        imported.append(_write_cell(out, cell, runs[name], order, identities[name]))
        samples.extend(_samples(runs[name], cell.index, order.entries.get(name), notes))
    for s in sorted(samples, key=lambda s: s.t_wall):
        append_jsonl(out / "samples.jsonl", s.to_json(), fsync=False)
    info = ImportInfo(source=str(src.resolve()), order=order.fact, notes=tuple(notes),
                      cells=tuple(imported), not_imported=tuple(not_imported),
                      sessions=tuple(sessions))
    atomic_write_text(out / IMPORT_FILE, document_text(info.to_json()))


def _write_cell(out: Path, cell: PlannedCell, run: Run, order: Order,
                identity: Identity) -> ImportedCell:
    """One run's `cells/LABEL/` folder and journal line; its provenance."""
    summary, tps_fact = run_summary(run)
    hit, hit_fact = hit_pct(run, summary)
    summary = summary.with_values(cache_hit_pct=hit)  # None (not known): left out
    driver = order.entries.get(order.names[cell.index])
    entry, facts, gate = entry_state(run, driver)
    t_start, t_end, sf, ef = times(run, driver, summary)
    entry = EntryState(**{**entry.to_json(), "t_wall": t_start})
    config, config_facts, _ = identity  # its facts hold the configuration's (`identity`)
    facts.update(config_facts)
    facts.update({"order": order.fact, FACT_T_START: sf, FACT_T_END: ef, FACT_TOK_S: tps_fact,
                  "hit_pct": hit_fact})
    if driver is not None and driver.read:  # (a script's run line or a bare section reads none)
        facts["entry"] = Fact("measured", f"{driver.where} (named by {driver.named_by})")
    fp = fingerprint(run)
    folder = out / "cells" / cell.label
    folder.mkdir(parents=True)
    doc = _summary_doc(run, summary, tps_fact, fp, config)
    # a new file in the import's own staging folder, which is renamed into place whole:
    # no reader sees it half written, so it needs no temp file and no fsync of its own
    (folder / "summary.json").write_text(json.dumps(doc, allow_nan=False) + "\n",
                                         encoding="utf-8")
    if run.table_file is not None:
        shutil.copyfile(run.table_file, folder / "tokens.csv")
    record = CellRecord(
        index=cell.index, name=cell.name, label=cell.label, status="ok",
        t_start_wall=t_start, t_end_wall=t_end, t_start_mono=0.0,
        t_end_mono=max(0.0, t_end - t_start), entry=entry, gate=gate, summary=summary,
        fingerprint=fp, tokens_per_s=summary.tok_per_s,
    )
    append_jsonl(out / "journal.jsonl", record.to_json(), fsync=False)  # staged: see above
    return ImportedCell(cell.label, tuple(p.name for p in run.files()), config, facts)


def _summary_doc(run: Run, summary: RunSummary, tps_fact: Fact, fp: str | None,
                 config: dict[str, Any]) -> dict[str, Any]:
    """The cell's `summary.json`: the run's figures and per-token columns, as an external
    cell's output is kept."""
    threads: Any = (run.table.preamble.get("threads") if run.table else None) \
        or config.get("threads")
    return import_doc(
        files=[p.name for p in run.files()], tps_source=tps_fact.source, summary=summary,
        fingerprint=fp, preamble=run.table.preamble if run.table else {},
        resolved=Resolved(threads=_whole(threads)), metrics=run.metrics,
        per_token=_columns_kept(run),
    )


def _samples(run: Run, index: int, driver: DriverEntry | None,
             notes: list[str]) -> list[Sample]:
    """Every reading of the run that has a time, as a sample with its position: the `.state`
    snapshots (BEFORE, AFTER, any other section: during) and the driver's entry and exit
    lines. Each names the run's cell; the analysis places a during reading in the cell whose
    span holds its time (`analysis.readings`). A later reading with no time is said in
    `notes`: the entry state holds an untimed entry reading, nothing holds a later one."""
    state = run.state.snapshots if run.state else ()
    lines = (driver, *driver.after) if driver is not None else ()
    read = [(snap.t_wall, snap.position, _sample_values(snap),
             f"{run.state_file.name if run.state_file else run.name}:{snap.line}")
            for snap in state]
    read += [(e.t_wall, e.position, _driver_values(e), e.where) for e in lines]
    untimed = [f"{where} ({position})" for t, position, _, where in read
               if t is None and position != keys.BEFORE]
    if untimed:
        notes.append(f"{', '.join(untimed)}: a reading of run {clip(run.name)} with no time (no "
                     "date abbench can place, no t_wall=): not on the timeline, and not "
                     "judged for caps")
    return [Sample(t_mono=t, t_wall=t, values=values, cell=index, position=position)
            for t, position, values, _ in read if t is not None and values]


def _columns_kept(run: Run) -> dict[str, list[float | None]]:
    """The per-token columns summary.json keeps for a run: none where its tokens.csv (the
    table as the engine wrote it) reads as the analysis reads it — `records.cell_files`
    reads it through `bmoe_view.token_view` — and, for a table the import left a column of
    out (a value that is not a number), the columns it kept, in that view."""
    if run.table is None or not run.table.dropped or run.table_file is None:
        return {}
    table = parse_bmoe_csv(read_text_lossy(run.table_file)[0], run.table_file,
                           drop_bad_columns=True)
    return _gaps_as_null(token_view(table))


def _gaps_as_null(columns: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """Per-token columns as summary.json holds them: a gap (NaN) as null."""
    return {k: [v if math.isfinite(v) else None for v in vs] for k, vs in columns.items()}


def _whole(value: Any) -> int | None:
    """A positive whole number however the file wrote it (`8`, `8.0`); None otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or number <= 0 or number != int(number):
        return None
    return int(number)


def _sample_values(s: Snapshot) -> dict[str, Any]:
    """A snapshot in the sampler's flat keys, so the timeline plots it like live samples."""
    v: dict[str, Any] = {}
    for p, pol in s.policies.items():
        for key, val in (("cap_khz", pol.scaling_max_khz), ("hw_max_khz", pol.hw_max_khz),
                         ("cur_khz", pol.cur_khz)):
            if val is not None:
                v[keys.policy_key(p, key)] = val
    readings = [(key, getattr(s, name)) for key, name in keys.ENTRY_READINGS]
    for key, val in (*readings, (keys.ANDROID_THERMAL_STATUS, s.thermal_status)):
        if val is not None:
            v[key] = val
    for name, (c, _) in s.temperatures.items():
        v[keys.android_zone(name)] = c
    return v


def _driver_values(e: DriverEntry) -> dict[str, Any]:
    """A driver's entry or exit line in the sampler's flat keys."""
    v: dict[str, Any] = {keys.cap_khz(p): cap for p, cap in e.caps_khz.items()}
    v.update({keys.hw_max_khz(p): hw for p, hw in e.hw_max_khz.items()})
    readings = [(key, getattr(e, name)) for key, name in keys.ENTRY_READINGS]
    for key, val in (*readings, (keys.ANDROID_THERMAL_STATUS, e.thermal_status)):
        if val is not None:
            v[key] = val
    return v


__all__ = ["FORMAT", "write_run_folder"]
