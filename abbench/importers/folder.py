"""A folder of runs made elsewhere → a run folder in the records schema (DESIGN 6.3).

What a folder may hold, per run `NAME` (the file name stem):

- `NAME.csv`, or `NAME.metrics` that is a CSV: the per-token table (`bmoe_csv`);
- `NAME.log`: the engine's summary lines (`enginelog`), for CSVs without `# summary`;
- `NAME.metrics` as `key=value`: device pressure around the run (`metrics`);
- `NAME.state`: device snapshots before/after the run (`state`);

and for the whole folder a driver log (any `.log` with `ENTRY STATE:` lines, `driverlog`).
Route traces (`# route_trace v1`) are left for `abbench replay`.

Tokens/s is the run's own summary (`# summary tok/s=`, else the `.log`'s `generation:`
line), and only without either is it computed from the rows' `wall_ms`. Entry state comes
from what was recorded (driver log, then `.metrics` `*_before_*`, then `.state` BEFORE) and
stays empty where nothing was: imported numbers are never made up. The execution order is
`--order`, else the driver log, else timestamps in the file names; without any of them the
cells are in file-name order, a warning says so and each cell's config says
`"order_source": "unknown"`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from abbench.errors import UsageError
from abbench.fsutil import atomic_write_text
from abbench.importers.bmoe_csv import BmoeRun, looks_like_bmoe_csv, parse_bmoe_csv
from abbench.importers.driverlog import DriverEntry, is_driver_log, parse_driver_log
from abbench.importers.enginelog import parse_engine_log
from abbench.importers.errors import ForeignRunError, clip, read_text
from abbench.importers.metrics import parse_metrics
from abbench.importers.state import DeviceState, Snapshot, parse_state
from abbench.records import (
    CellRecord,
    EntryState,
    Plan,
    PlannedCell,
    Sample,
    append_jsonl,
)

FORMAT = "abbench-import v1"
UNKNOWN = "unknown"
# 20260712-093012, 20260712T093012, 2026-07-12_09-30-12, 2026-07-12T09:30:12 ...
STAMPS = (
    re.compile(r"(?<!\d)(\d{4})(\d{2})(\d{2})[T_-]?(\d{2})(\d{2})(\d{2})(?!\d)"),
    re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[T_ -](\d{2})[:.-](\d{2})[:.-](\d{2})(?!\d)"),
)


class OrderWarning(UserWarning):
    """The execution order of imported runs is not known."""


@dataclass
class _Run:
    name: str
    table: BmoeRun | None = None
    table_file: Path | None = None
    log_summary: dict[str, Any] = field(default_factory=dict)
    log_file: Path | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    metrics_file: Path | None = None
    state: DeviceState | None = None
    state_file: Path | None = None

    def files(self) -> list[Path]:
        return [p for p in (self.table_file, self.log_file, self.metrics_file, self.state_file)
                if p is not None]


# -- discovery ------------------------------------------------------------------------


def _discover(src: Path) -> tuple[dict[str, _Run], list[tuple[Path, list[DriverEntry]]]]:
    if not src.is_dir():
        raise ForeignRunError(src, "not a folder")
    runs: dict[str, _Run] = {}
    drivers: list[tuple[Path, list[DriverEntry]]] = []
    for path in sorted(src.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        stem, ext = path.name.rsplit(".", 1) if "." in path.name else (path.name, "")
        if ext not in ("csv", "metrics", "log", "state"):
            continue
        text = read_text(path)
        if ext == "csv" and text.lstrip().startswith("# route_trace"):
            continue  # a route trace: `abbench replay` reads it, it is not a run
        if ext == "log" and is_driver_log(text):
            drivers.append((path, parse_driver_log(text, path)))
            continue
        run = runs.setdefault(stem, _Run(stem))
        if ext == "csv" or (ext == "metrics" and looks_like_bmoe_csv(text)):
            if run.table_file is not None:
                raise ForeignRunError(path, f"a second per-token table for run `{clip(stem)}` "
                                      f"(the first is {clip(run.table_file.name)})")
            run.table, run.table_file = parse_bmoe_csv(text, path), path
        elif ext == "metrics":
            run.metrics, run.metrics_file = parse_metrics(text, path), path
        elif ext == "state":
            run.state, run.state_file = parse_state(text, path), path
        else:
            run.log_summary, run.log_file = parse_engine_log(text, path), path
    for name, run in list(runs.items()):
        if run.table is None and not run.log_summary:
            del runs[name]
            warnings.warn(f"{_names([p.name for p in run.files()])}: no per-token CSV and "
                          "no `generation:` line for this run: skipped", OrderWarning,
                          stacklevel=3)
    if not runs:
        raise ForeignRunError(src, "no runs here (no bmoe_metrics CSV, no .log with a "
                              "`generation:` line)",
                              tip="abbench import reads bmoe_metrics CSVs, .metrics, .state "
                              "and driver logs; see docs/import.md")
    return runs, drivers


def _resolve(item: str, names: list[str], what: str) -> str:
    """A run named exactly, else the one run whose name has `item` as a `-`/`_` word."""
    if item in names:
        return item
    hits = [n for n in names if item in re.split(r"[-_.]", n)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise UsageError(f"{what}: `{clip(item)}` matches several runs: {_names(hits)}")
    close = difflib.get_close_matches(item, names, n=1) if len(item) <= 200 else []
    raise UsageError(f"{what}: no run `{clip(item)}` (runs: {_names(names)})",
                     tip=f"did you mean `{close[0]}`?" if close else None)


def _names(names: list[str], n: int = 8) -> str:
    """Run names for a message: the first `n`, then how many more."""
    shown = ", ".join(clip(name) for name in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _stamp(name: str) -> datetime | None:
    for pattern in STAMPS:
        if m := pattern.search(name):
            try:
                return datetime(*(int(g) for g in m.groups()))  # type: ignore[misc]
            except ValueError:
                return None
    return None


def _order(runs: dict[str, _Run], order: list[str] | None,
           drivers: list[tuple[Path, list[DriverEntry]]]) -> tuple[list[str], str]:
    names = sorted(runs)
    if order:
        chosen = [_resolve(item, names, "--order") for item in order]
        source = "--order"
    elif drivers:
        if len(drivers) > 1:
            raise UsageError(f"two driver logs: {_names([d.name for d, _ in drivers])}",
                             tip="give the execution order with --order")
        path, entries = drivers[0]
        chosen = [_resolve(e.cell, names, f"{clip(path.name)}:{e.line}") for e in entries]
        source = f"driver log {clip(path.name)}"
    elif len(names) == 1:
        return names, "single run"
    else:
        stamps = {n: _stamp(n) for n in names}
        if all(stamps.values()) and len(set(stamps.values())) == len(names):
            return sorted(names, key=lambda n: stamps[n]), "file-name timestamps"
        warnings.warn(
            f"the execution order of {len(names)} runs is unknown (no --order, no driver log, "
            "no timestamps in the file names): cells are in file-name order, recorded as "
            '"order_source": "unknown"; give --order if you know it', OrderWarning,
            stacklevel=3)
        return names, UNKNOWN
    dup = next((n for n in chosen if chosen.count(n) > 1), None)
    if dup:
        raise UsageError(f"{source}: run `{clip(dup)}` appears twice")
    missing = [n for n in names if n not in chosen]
    if missing:
        raise UsageError(f"{source} leaves out {_names(missing)}",
                         tip="list every run, in the order they ran")
    return chosen, source


# -- one run -----------------------------------------------------------------------


def _summary(run: _Run) -> tuple[dict[str, Any], str]:
    table = run.table
    if table is not None and "tok/s" in table.summary:
        return dict(table.summary), "summary"
    if run.log_summary:
        return dict(run.log_summary), "log"
    walls = table.column("wall_ms") if table is not None else None
    where = run.table_file or run.name
    if not walls:
        raise ForeignRunError(where, "no tokens/s: no `# summary` line, no .log `generation:` "
                              "line and no `wall_ms` values")
    total_s = sum(walls) / 1e3
    if total_s <= 0:
        raise ForeignRunError(where, "the `wall_ms` column sums to zero")
    return {"tokens": len(walls), "s/tok": total_s / len(walls),
            "tok/s": len(walls) / total_s}, "rows"


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _scaled(metrics: dict[str, float | None], key: str, div: float) -> float | None:
    v = metrics.get(key)
    return None if v is None else v / div


def _entry(run: _Run, driver: DriverEntry | None) -> EntryState:
    before: Snapshot | None = run.state.before if run.state else None
    m = run.metrics
    caps = driver.caps_khz if driver and driver.caps_khz else {}
    hw = driver.hw_max_khz if driver and driver.hw_max_khz else {}
    if not caps and before is not None:
        caps = {p: v.scaling_max_khz for p, v in before.policies.items()
                if v.scaling_max_khz is not None}
        hw = {p: v.hw_max_khz for p, v in before.policies.items() if v.hw_max_khz is not None}
    status = driver.thermal_status if driver else None
    return EntryState(
        t_wall=_first(driver.t_wall if driver else None, before.t_wall if before else None)
        or 0.0,
        caps_khz=caps, hw_max_khz=hw,
        cpu_temp_c=_first(driver.cpu_temp_c if driver else None,
                          _scaled(m, "cpu_temp_before_mC", 1000),
                          before.cpu_temp_c if before else None),
        battery_temp_c=_first(driver.battery_temp_c if driver else None,
                              _scaled(m, "batt_temp_before_dC", 10),
                              before.battery_temp_c if before else None),
        mem_available_mib=_first(driver.mem_available_mib if driver else None,
                                 _scaled(m, "mem_avail_before_kb", 1024),
                                 before.mem_available_mib if before else None),
        thermal_status=status if status is not None else (before.thermal_status
                                                          if before else None),
    )


def _fingerprint(table: BmoeRun | None) -> str | None:
    """The work the run reports, as the campaign's external cells fingerprint it: bytes read
    per token."""
    reads = table.column("read_bytes") if table is not None else None
    if not reads:
        return None
    return "sha256:" + hashlib.sha256(json.dumps([int(r) for r in reads]).encode()).hexdigest()


def _sample_values(s: Snapshot) -> dict[str, Any]:
    """A snapshot in the sampler's flat keys, so the timeline plots it like live samples."""
    v: dict[str, Any] = {}
    for p, pol in s.policies.items():
        for key, val in (("cap_khz", pol.scaling_max_khz), ("hw_max_khz", pol.hw_max_khz),
                         ("cur_khz", pol.cur_khz)):
            if val is not None:
                v[f"cpu.{p}.{key}"] = val
    for key, val in (("temp.cpu_c", s.cpu_temp_c), ("battery.temp_c", s.battery_temp_c),
                     ("mem.available_mib", s.mem_available_mib),
                     ("android.thermal_status", s.thermal_status)):
        if val is not None:
            v[key] = val
    for name, (c, _) in s.temperatures.items():
        v[f"android.temp.{name}_c"] = c
    return v


# -- the folder --------------------------------------------------------------------


def import_folder(src: Path, dest: Path, order: list[str] | None = None,
                  decisions: list[tuple[str, str, float]] | None = None) -> Path:
    """Write `dest` as a run folder holding every run in `src`; returns `dest`."""
    src, dest = Path(src), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not empty",
                         tip="choose another --out, or remove it first")
    runs, drivers = _discover(src)
    names, order_source = _order(runs, order, drivers)
    by_cell: dict[str, DriverEntry] = {}
    for _, entries in drivers[:1]:
        for e in entries:
            by_cell.setdefault(_resolve(e.cell, sorted(runs), "driver log"), e)
    plan_decisions = []
    for cand, base, effect in decisions or ():
        c, b = _resolve(cand, names, "--decision"), _resolve(base, names, "--decision")
        if c == b:
            raise UsageError(f"--decision: `{clip(c)}` against itself")
        if not effect >= 0:
            raise UsageError(f"--decision: min_effect {effect} is not >= 0")
        plan_decisions.append({"candidate": c, "baseline": b, "min_effect": effect})

    width = max(2, len(str(len(names))))
    cells: list[PlannedCell] = []
    for i, name in enumerate(names):
        run = runs[name]
        config: dict[str, Any] = {"engine": "imported",
                                  "source": (run.table_file or run.log_file or Path()).name,
                                  "order_source": order_source}
        if run.table is not None and run.table.preamble:
            config["preamble"] = dict(run.table.preamble)
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".") or "run"
        cells.append(PlannedCell(index=i, name=name, config=config,
                                 label=f"{i + 1:0{width}d}-{safe}"))
    plan = Plan(campaign=src.resolve().name, cells=tuple(cells), spacing_s=0.0,
                warmup_tokens=0, device="imported", decisions=tuple(plan_decisions))

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        _write(tmp, plan, runs, by_cell)
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _write(out: Path, plan: Plan, runs: dict[str, _Run],
           by_cell: dict[str, DriverEntry]) -> None:
    atomic_write_text(out / "plan.json", json.dumps(plan.to_json(), indent=1) + "\n")
    (out / "journal.jsonl").touch()
    samples: list[Sample] = []
    for cell in plan.cells:
        run = runs[cell.name]
        summary, tps_source = _summary(run)
        entry = _entry(run, by_cell.get(cell.name))
        after = run.state.after if run.state else None
        t_end = after.t_wall if after and after.t_wall and entry.t_wall else entry.t_wall
        fp = _fingerprint(run.table)
        folder = out / "cells" / cell.label
        folder.mkdir(parents=True)
        doc = {
            "format": FORMAT, "source": cell.config["source"],
            "files": [p.name for p in run.files()], "tok/s_source": tps_source,
            "summary": summary, "fingerprint": fp,
            "preamble": run.table.preamble if run.table else {},
            "metrics": run.metrics,
            "per_token": dict(run.table.columns) if run.table else {},
        }
        atomic_write_text(folder / "summary.json", json.dumps(doc, allow_nan=False) + "\n")
        if run.table_file is not None:
            shutil.copyfile(run.table_file, folder / "tokens.csv")
        record = CellRecord(
            index=cell.index, name=cell.name, label=cell.label, status="ok",
            t_start_wall=entry.t_wall, t_end_wall=t_end, t_start_mono=0.0,
            t_end_mono=t_end - entry.t_wall, entry=entry, summary=summary, fingerprint=fp,
            tokens_per_s=float(summary["tok/s"]),
        )
        append_jsonl(out / "journal.jsonl", record.to_json())
        for snap in run.state.snapshots if run.state else ():
            if snap.t_wall is not None:
                samples.append(Sample(t_mono=snap.t_wall, t_wall=snap.t_wall,
                                      values=_sample_values(snap),
                                      cell=cell.index if snap.section == "BEFORE" else None))
    for s in sorted(samples, key=lambda s: s.t_wall):
        append_jsonl(out / "samples.jsonl", s.to_json(), fsync=False)
