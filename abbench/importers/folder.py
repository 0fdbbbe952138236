"""A folder of runs made elsewhere → a run folder in the records schema (DESIGN 6.3).

What a folder may hold, per run `NAME` (the file name stem):

- `NAME.csv`, or `NAME.metrics` that is a CSV: the per-token table (`bmoe_csv`);
- `NAME.log`: the engine's log: its summary lines and what it says of the configuration
  (`enginelog`); a log named after no run is reported, never made a run of, unless it is
  the only record of a run (one `generation:` line);
- `NAME.metrics` as `key=value`: device pressure around the run (`metrics`);
- `NAME.state`: device snapshots before/after the run (`state`);

and for the whole folder any number of driver logs (a `.log` with `ENTRY STATE:` lines,
`driverlog`), merged in time order. Route traces (`# route_trace v1`) are left for
`abbench replay`.

The files are the field's own, as people leave them: a file that is not UTF-8 is read with
replacement characters (and said so), a file that does not parse is reported and left out,
and only a folder that leaves nothing to import is an error. Every fact the journal holds
carries its provenance in `import.json` (`records.ImportInfo`): *measured* (file and line),
*derived* (and how) or *unknown* — an unknown order leaves no two cells adjacent, an
unknown time leaves a gap unknown, and neither is ever rendered as a measured value.

Each run's configuration comes from its files (the CSV preamble, the engine log's command
line, loader lines and optional summary lines; the model, at worst, from the file name's
first word, marked derived). Runs with equal configurations are one arm, named after the
first of them: repeats of an arm are sentinels, and its cells pool. Where a file gives only
part of a configuration (no preamble, no command line), the run is its own arm, so that two
runs are never taken for repeats on too little evidence.
"""

from __future__ import annotations

import fnmatch
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

from abbench.errors import ForeignRunError, OrderWarning, UsageError
from abbench.fsutil import atomic_write_text
from abbench.importers.driverlog import (
    DriverEntry,
    is_driver_log,
    merge_driver_logs,
    parse_driver_log,
)
from abbench.importers.enginelog import engine_log_config, parse_engine_log
from abbench.importers.metrics import parse_metrics
from abbench.importers.state import DeviceState, Snapshot, parse_state
from abbench.records import (
    IMPORT_FILE,
    CellRecord,
    EntryState,
    Fact,
    GateWait,
    ImportedCell,
    ImportInfo,
    Plan,
    PlannedCell,
    Sample,
    append_jsonl,
    keys,
    read_plan,
)
from abbench.records.bmoe_csv import (
    BmoeRun,
    looks_like_bmoe_csv,
    parse_bmoe_csv,
    work_fingerprint,
)
from abbench.records.text import clip, read_text_lossy

FORMAT = "abbench-import v1"
UNKNOWN = "unknown"
# 20260712-093012, 20260712T093012, 2026-07-12_09-30-12, 2026-07-12T09:30:12 ...
STAMPS = (
    re.compile(r"(?<!\d)(\d{4})(\d{2})(\d{2})[T_-]?(\d{2})(\d{2})(\d{2})(?!\d)"),
    re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[T_ -](\d{2})[:.-](\d{2})[:.-](\d{2})(?!\d)"),
)
# Preamble keys that say how a run was measured, not what it ran: not identity.
NOT_IDENTITY = frozenset({"n_ctx", "turn", "seed"})
SELECTOR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")




@dataclass
class _Run:
    name: str
    table: BmoeRun | None = None
    table_file: Path | None = None
    log_summary: dict[str, Any] = field(default_factory=dict)
    log_config: dict[str, Any] = field(default_factory=dict)
    log_lines: dict[str, int] = field(default_factory=dict)
    log_command: bool = False
    log_generations: int = 0
    log_file: Path | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    metrics_file: Path | None = None
    state: DeviceState | None = None
    state_file: Path | None = None

    def files(self) -> list[Path]:
        return [p for p in (self.table_file, self.log_file, self.metrics_file, self.state_file)
                if p is not None]


# -- discovery ------------------------------------------------------------------------


def _read(path: Path, notes: list[str]) -> str:
    text, problem = read_text_lossy(path)
    if problem:
        notes.append(f"{path.name}: {problem}")
    return text


def _discover(src: Path, notes: list[str]
              ) -> tuple[dict[str, _Run], list[tuple[str, list[DriverEntry]]]]:
    if not src.is_dir():
        raise ForeignRunError(src, "not a folder")
    runs: dict[str, _Run] = {}
    drivers: list[tuple[str, list[DriverEntry]]] = []
    logs: dict[str, tuple[Path, str]] = {}
    skipped: list[str] = []
    for path in sorted(src.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        stem, ext = path.name.rsplit(".", 1) if "." in path.name else (path.name, "")
        if ext not in ("csv", "metrics", "log", "state"):
            continue
        try:
            text = _read(path, notes)
            if ext == "csv" and text.lstrip().startswith("# route_trace"):
                continue  # a route trace: `abbench replay` reads it, it is not a run
            if ext == "log":
                if is_driver_log(text):
                    drivers.append((path.name, parse_driver_log(text, path, notes)))
                else:
                    logs[stem] = (path, text)
                continue
            if ext == "csv" or (ext == "metrics" and looks_like_bmoe_csv(text)):
                table = parse_bmoe_csv(text, path)
                run = runs.setdefault(stem, _Run(stem))
                if run.table_file is not None:
                    notes.append(f"{path.name}: a second per-token table for run "
                                 f"`{clip(stem)}` (the first is {run.table_file.name}): "
                                 "left out")
                    continue
                run.table, run.table_file = table, path
            elif ext == "metrics":
                metrics = parse_metrics(text, path)
                run = runs.setdefault(stem, _Run(stem))
                run.metrics, run.metrics_file = metrics, path
            else:
                state = parse_state(text, path)
                run = runs.setdefault(stem, _Run(stem))
                run.state, run.state_file = state, path
        except ForeignRunError as e:
            notes.append(f"{e.message}: {path.name} left out")
            skipped.append(e.message)
    for stem, (path, text) in logs.items():
        try:
            summary = parse_engine_log(text, path)
        except ForeignRunError as e:
            notes.append(f"{e.message}: {path.name} left out")
            skipped.append(e.message)
            continue
        generations = text.count("generation:")
        if stem not in runs and (not summary or generations != 1):
            notes.append(f"{path.name}: an engine log that matches no run (no {stem}.csv, "
                         f"{generations} `generation:` lines): not a run, left out")
            continue
        run = runs.setdefault(stem, _Run(stem))
        run.log_summary, run.log_file, run.log_generations = summary, path, generations
        run.log_config, run.log_lines, run.log_command = engine_log_config(text)
    for name, run in list(runs.items()):
        if run.table is None and not run.log_summary:
            del runs[name]
            notes.append(f"{', '.join(p.name for p in run.files())}: no per-token CSV and "
                         "no `generation:` line for this run: left out")
    if not runs:
        why = "; ".join(skipped[:3]) if skipped else ""
        raise ForeignRunError(src, "no runs here (no bmoe_metrics CSV, no .log with a "
                              "`generation:` line)" + (f": {why}" if why else ""),
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
    import difflib

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


@dataclass
class _Order:
    names: list[str]
    fact: Fact
    known: bool
    entries: dict[str, DriverEntry] = field(default_factory=dict)


def _order(runs: dict[str, _Run], order: list[str] | None,
           drivers: list[tuple[str, list[DriverEntry]]], notes: list[str]) -> _Order:
    names = sorted(runs)
    entries: dict[str, DriverEntry] = {}
    driven: list[str] = []
    how = ""
    if drivers:
        merged, how = merge_driver_logs(drivers, notes)
        for e in merged:
            try:
                run = _resolve(e.cell, names, f"{e.where}")
            except UsageError as err:
                notes.append(f"{err.message}: the entry line is left out")
                continue
            if run in entries:
                notes.append(f"{e.where}: run `{clip(run)}` again (first at "
                             f"{entries[run].where}): the later entry is used")
                driven.remove(run)
            entries[run] = e
            driven.append(run)
    if order:
        chosen = [_resolve(item, names, "--order") for item in order]
        dup = next((n for n in chosen if chosen.count(n) > 1), None)
        if dup:
            raise UsageError(f"--order: run `{clip(dup)}` appears twice")
        missing = [n for n in names if n not in chosen]
        if missing:
            raise UsageError(f"--order leaves out {_names(missing)}",
                             tip="list every run, in the order they ran")
        return _Order(chosen, Fact("measured", "--order (given on the command line)"), True,
                      entries)
    if drivers and entries:
        logs = ", ".join(n for n, _ in drivers)
        missing = [n for n in names if n not in entries]
        if not missing:
            return _Order(driven, Fact("measured", f"the entry lines of {logs} ({how})"),
                          True, entries)
        notes.append(f"{logs} leave{'s' if len(drivers) == 1 else ''} out "
                     f"{_names(missing)}: the order of the runs is unknown")
    if len(names) == 1:
        return _Order(names, Fact("derived", "a single run"), True, entries)
    stamps = {n: _stamp(n) for n in names}
    if all(stamps.values()) and len(set(stamps.values())) == len(names):
        return _Order(sorted(names, key=lambda n: stamps[n]),  # type: ignore[arg-type,return-value]
                      Fact("derived", "timestamps in the file names"), True, entries)
    why = ("no --order, no driver log covering every run, no timestamps in the file "
           "names: cells are listed in file-name order, and no two are adjacent")
    warnings.warn(f"the execution order of {len(names)} runs is unknown ({why}); give "
                  "--order if you know it", OrderWarning, stacklevel=3)
    return _Order(names, Fact(UNKNOWN, why), False, entries)


# -- one run -----------------------------------------------------------------------


def _summary(run: _Run) -> tuple[dict[str, Any], Fact]:
    table = run.table
    if table is not None and "tok/s" in table.summary:
        where = f"{run.table_file.name}:{table.summary_line}" if run.table_file else "summary"
        return dict(table.summary), Fact("measured", f"{where} (`# summary` tok/s)")
    if run.log_summary:
        log = run.log_file.name if run.log_file else "log"
        return dict(run.log_summary), Fact("measured", f"{log} (`generation:` line)")
    walls = table.column("wall_ms") if table is not None else None
    where = run.table_file or run.name
    if not walls:
        raise ForeignRunError(where, "no tokens/s: no `# summary` line, no .log `generation:` "
                              "line and no `wall_ms` values")
    total_s = sum(walls) / 1e3
    if total_s <= 0:
        raise ForeignRunError(where, "the `wall_ms` column sums to zero")
    return ({"tokens": len(walls), "s/tok": total_s / len(walls),
             "tok/s": len(walls) / total_s},
            Fact("derived", f"tokens / sum of wall_ms in {Path(str(where)).name}"))


def _hit_pct(run: _Run, summary: dict[str, Any]) -> tuple[float | None, Fact]:
    """The run's hit rate: its summary's, else the last value of the per-token column,
    which the seed engine writes cumulative (a mean of it would weigh the cold start);
    negative values mean the cache was off."""
    v = summary.get("cache_hit_pct")
    if isinstance(v, (int, float)):
        return (float(v) if v >= 0 else None), Fact("measured", "the run's summary")
    col = run.table.column("cache_hit_pct") if run.table is not None else None
    if col:
        last = col[-1]
        return (last if last >= 0 else None), Fact(
            "derived", f"the last (cumulative) `cache_hit_pct` of {run.table_file.name}"
            if run.table_file else "the last cumulative value")
    return None, Fact(UNKNOWN, "no summary hit rate and no `cache_hit_pct` column")


def _scaled(metrics: dict[str, float | None], key: str, div: float) -> float | None:
    v = metrics.get(key)
    return None if v is None else v / div


def _entry(run: _Run, driver: DriverEntry | None
           ) -> tuple[EntryState, dict[str, Fact], GateWait]:
    """The entry state from what was recorded — the driver log's entry line, then
    `.metrics` `*_before_*`, then `.state` BEFORE — with where each value came from."""
    before: Snapshot | None = run.state.before if run.state else None
    m = run.metrics
    facts: dict[str, Fact] = {}
    metrics_name = run.metrics_file.name if run.metrics_file else ""
    state_where = f"{run.state_file.name}:{before.line}" if run.state_file and before else ""

    def pick(key: str, *options: tuple[Any, str]) -> Any:
        for value, where in options:
            if value is not None:
                facts[f"entry.{key}"] = Fact("measured", where)
                return value
        facts[f"entry.{key}"] = Fact(UNKNOWN, "not recorded")
        return None

    dw = driver.where if driver else ""
    caps = driver.caps_khz if driver and driver.caps_khz else {}
    hw = driver.hw_max_khz if driver and driver.hw_max_khz else {}
    if caps:
        facts["entry.caps_khz"] = Fact("measured", dw)
    elif before is not None and before.policies:
        caps = {p: v.scaling_max_khz for p, v in before.policies.items()
                if v.scaling_max_khz is not None}
        hw = {p: v.hw_max_khz for p, v in before.policies.items() if v.hw_max_khz is not None}
        facts["entry.caps_khz"] = Fact("measured", state_where)
    else:
        facts["entry.caps_khz"] = Fact(UNKNOWN, "not recorded")
    if caps and not all(p in hw for p in caps):
        facts["entry.hw_max_khz"] = Fact(UNKNOWN, "the hardware maximum of "
                                         + ", ".join(p for p in caps if p not in hw)
                                         + " was not recorded")
    entry = EntryState(
        t_wall=0.0, caps_khz=caps, hw_max_khz=hw,
        cpu_temp_c=pick("cpu_temp_c", (driver.cpu_temp_c if driver else None, dw),
                        (_scaled(m, "cpu_temp_before_mC", 1000),
                         f"{metrics_name} `cpu_temp_before_mC`"),
                        (before.cpu_temp_c if before else None, state_where)),
        battery_temp_c=pick("battery_temp_c", (driver.battery_temp_c if driver else None, dw),
                            (_scaled(m, "batt_temp_before_dC", 10),
                             f"{metrics_name} `batt_temp_before_dC`"),
                            (before.battery_temp_c if before else None, state_where)),
        mem_available_mib=pick("mem_available_mib",
                               (driver.mem_available_mib if driver else None, dw),
                               (_scaled(m, "mem_avail_before_kb", 1024),
                                f"{metrics_name} `mem_avail_before_kb`"),
                               (before.mem_available_mib if before else None, state_where)),
        thermal_status=pick("thermal_status", (driver.thermal_status if driver else None, dw),
                            (before.thermal_status if before else None, state_where)),
    )
    gate = GateWait(waited_s=driver.gate_waited_s or 0.0) if driver else GateWait()
    return entry, facts, gate


def _times(run: _Run, driver: DriverEntry | None, summary: dict[str, Any]
           ) -> tuple[float, float, Fact, Fact]:
    """Start and end (0: unknown) and where they came from."""
    before = run.state.before if run.state else None
    after = run.state.after if run.state else None
    start, sf = 0.0, Fact(UNKNOWN, "no driver entry time, no dated .state snapshot")
    if driver is not None and driver.t_wall is not None:
        start = driver.t_wall
        sf = (Fact("measured", f"{driver.where} t_wall=") if driver.t_wall_how == "t_wall="
              else Fact("derived", f"the timestamp at the start of {driver.where} (time zone "
                        "unknown: differences between lines are exact)"))
    elif before is not None and before.t_wall is not None and run.state_file:
        start, sf = before.t_wall, Fact("measured", f"{run.state_file.name}:{before.line} date")
    if after is not None and after.t_wall is not None and run.state_file and start:
        return start, after.t_wall, sf, Fact("measured",
                                             f"{run.state_file.name}:{after.line} date")
    if not start:
        return 0.0, 0.0, sf, Fact(UNKNOWN, "the start is unknown")
    walls = run.table.column("wall_ms") if run.table is not None else None
    decode = sum(walls) / 1e3 if walls else float(summary.get("s/tok", 0.0)) * float(
        summary.get("tokens", 0.0))
    own = decode + float(summary.get("load_s") or 0.0) + float(summary.get("prefill_s") or 0.0)
    return start, start + own, sf, Fact("derived", f"the start + the run's own time ({own:.0f} "
                                        "s: load, prefill and decode as its files give them)")


def _fingerprint(table: BmoeRun | None) -> str | None:
    """The work the run reports, as the campaign's external cells fingerprint it: bytes read
    per token."""
    return work_fingerprint(table) if table is not None else None


def _config(run: _Run) -> tuple[dict[str, Any], dict[str, Fact], bool]:
    """The run's configuration as its files give it, where each key came from, and
    whether that is the whole configuration (a preamble or a command line)."""
    config: dict[str, Any] = {}
    facts: dict[str, Fact] = {}
    pre = run.table.preamble if run.table is not None else {}
    tf = run.table_file.name if run.table_file else ""
    for k, v in pre.items():
        if k not in NOT_IDENTITY:
            config[k] = v
            facts[f"config.{k}"] = Fact("measured", f"{tf} preamble")
    log = run.log_file.name if run.log_file else ""
    for k, v in run.log_config.items():
        if k not in config:
            config[k] = str(v)
            facts[f"config.{k}"] = Fact("measured", f"{log}:{run.log_lines.get(k, 0)}")
    if "model" in config:
        config["model"] = str(config["model"]).replace("\\", "/").rsplit("/", 1)[-1]
    else:
        word = re.match(r"[A-Za-z]+", run.name)
        config["model"] = word[0].lower() if word else run.name
        facts["config.model"] = Fact("derived", "the file name's first word (no file names "
                                     "the model)")
    complete = bool(pre) or run.log_command
    return config, facts, complete


# -- decisions by arm --------------------------------------------------------------------


def _arm_of(item: str, arms: dict[str, dict[str, Any]], stems: dict[str, str],
            what: str) -> str:
    """An arm named by its name, a run's file stem (or a unique word of one), a glob over
    file stems, or `key=value[,key=value]` over the arms' configurations."""
    if item in arms:
        return item
    if SELECTOR.match(item):
        want = dict(kv.split("=", 1) for kv in item.split(",") if "=" in kv)
        hits = [a for a, cfg in arms.items()
                if all(str(cfg.get(k)) == v for k, v in want.items())]
    elif any(c in item for c in "*?["):
        hits = sorted({stems[s] for s in stems if fnmatch.fnmatchcase(s, item)})
    else:
        try:
            hits = [stems[_resolve(item, sorted(stems), what)]]
        except UsageError:
            hits = []
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UsageError(f"{what}: `{clip(item)}` names no arm (arms: {_names(list(arms))})",
                         tip="an arm's name, a run's file name, a glob (`qwen_*`) or "
                         "key=value of its configuration")
    raise UsageError(f"{what}: `{clip(item)}` names several arms: {_names(hits)}",
                     tip="add a key=value, or name the arm")


# -- the folder --------------------------------------------------------------------


def is_import(folder: Path) -> bool:
    """Whether a folder is a run folder an import wrote (one `--force` may replace)."""
    if (folder / IMPORT_FILE).is_file():
        return True
    try:
        return read_plan(folder).device == "imported"
    except Exception:  # noqa: BLE001 — anything else is not ours to replace
        return False


def import_folder(src: Path, dest: Path, order: list[str] | None = None,
                  decisions: list[tuple[str, str, float]] | None = None,
                  warmup: int = 0, force: bool = False) -> Path:
    """Write `dest` as a run folder holding every run in `src`; returns `dest`. What the
    import could not read is in `import.json` (and warned about)."""
    src, dest = Path(src), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        if not force:
            raise UsageError(f"{dest} exists and is not empty",
                             tip="--force replaces an earlier import there; or choose "
                             "another --out")
        if not is_import(dest):
            raise UsageError(f"{dest} exists and is not an import: --force replaces only an "
                             "earlier import", tip="choose another --out")
    if warmup < 0:
        raise UsageError(f"--warmup {warmup}: expected a number of tokens >= 0")
    notes: list[str] = []
    runs, drivers = _discover(src, notes)
    order_info = _order(runs, order, drivers, notes)
    names = order_info.names

    identities: dict[str, tuple[dict[str, Any], dict[str, Fact], bool]] = {
        n: _config(runs[n]) for n in names}
    arm_of: dict[str, str] = {}
    arms: dict[str, dict[str, Any]] = {}
    for n in names:
        cfg, _, complete = identities[n]
        key = cfg if complete else {**cfg, "run": n}
        arm = next((a for a, c in arms.items() if c == key), None)
        if arm is None:
            arm = n
            arms[arm] = key
        arm_of[n] = arm

    plan_decisions = []
    for cand, base, effect in decisions or ():
        c = _arm_of(cand, arms, arm_of, "--decision")
        b = _arm_of(base, arms, arm_of, "--decision")
        if c == b:
            raise UsageError(f"--decision: `{clip(c)}` against itself")
        if not effect >= 0:
            raise UsageError(f"--decision: min_effect {effect} is not >= 0")
        plan_decisions.append({"candidate": c, "baseline": b, "min_effect": effect,
                               "expect": "faster"})

    width = max(2, len(str(len(names))))
    cells: list[PlannedCell] = []
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        arm = arm_of[name]
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".") or "run"
        cells.append(PlannedCell(index=i, name=arm, config={"engine": "imported", **arms[arm]},
                                 sentinel_of=first.get(arm), label=f"{i + 1:0{width}d}-{safe}"))
        first.setdefault(arm, i)
    plan = Plan(campaign=src.resolve().name, cells=tuple(cells), spacing_s=0.0,
                warmup_tokens=warmup, device="imported", decisions=tuple(plan_decisions),
                order_known=order_info.known)
    for note in notes:
        warnings.warn(note, OrderWarning, stacklevel=2)

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        _write(tmp, plan, runs, order_info, identities, notes, src)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _write(out: Path, plan: Plan, runs: dict[str, _Run], order: _Order,
           identities: dict[str, tuple[dict[str, Any], dict[str, Fact], bool]],
           notes: list[str], src: Path) -> None:
    atomic_write_text(out / "plan.json", json.dumps(plan.to_json(), indent=1) + "\n")
    (out / "journal.jsonl").touch()
    samples: list[Sample] = []
    imported: list[ImportedCell] = []
    for cell in plan.cells:
        name = order.names[cell.index]
        run = runs[name]
        summary, tps_fact = _summary(run)
        hit, hit_fact = _hit_pct(run, summary)
        if hit is not None:
            summary["cache_hit_pct"] = hit
        else:
            summary.pop("cache_hit_pct", None)
        driver = order.entries.get(name)
        entry, facts, gate = _entry(run, driver)
        t_start, t_end, sf, ef = _times(run, driver, summary)
        entry = EntryState(**{**entry.to_json(), "t_wall": t_start})
        config, config_facts, complete = identities[name]
        facts.update(config_facts)
        facts.update({"order": order.fact, "t_start": sf, "t_end": ef, "tok/s": tps_fact,
                      "hit_pct": hit_fact,
                      "config": Fact("measured", "whole: the CSV preamble or the log's "
                                     "command line") if complete else
                      Fact("derived", "partial (no preamble, no command line): its own arm")})
        if driver is not None:
            facts["entry"] = Fact("measured", f"{driver.where} (named by {driver.named_by})")
        fp = _fingerprint(run.table)
        folder = out / "cells" / cell.label
        folder.mkdir(parents=True)
        threads = (run.table.preamble.get("threads") if run.table else None) \
            or config.get("threads")
        doc = {
            "format": FORMAT, "files": [p.name for p in run.files()],
            "tok/s_source": tps_fact.source, "summary": summary, "fingerprint": fp,
            "preamble": run.table.preamble if run.table else {},
            "resolved": {"threads": int(threads)} if _whole(threads) else {},
            "metrics": run.metrics,
            "per_token": dict(run.table.columns) if run.table else {},
        }
        atomic_write_text(folder / "summary.json", json.dumps(doc, allow_nan=False) + "\n")
        if run.table_file is not None:
            shutil.copyfile(run.table_file, folder / "tokens.csv")
        record = CellRecord(
            index=cell.index, name=cell.name, label=cell.label, status="ok",
            t_start_wall=t_start, t_end_wall=t_end, t_start_mono=0.0,
            t_end_mono=max(0.0, t_end - t_start), entry=entry, gate=gate, summary=summary,
            fingerprint=fp, tokens_per_s=float(summary["tok/s"]),
        )
        append_jsonl(out / "journal.jsonl", record.to_json())
        imported.append(ImportedCell(cell.label, tuple(p.name for p in run.files()), config,
                                     facts))
        for snap in run.state.snapshots if run.state else ():
            if snap.t_wall is not None:
                samples.append(Sample(t_mono=snap.t_wall, t_wall=snap.t_wall,
                                      values=_sample_values(snap),
                                      cell=cell.index if snap.section == "BEFORE" else None))
    for s in sorted(samples, key=lambda s: s.t_wall):
        append_jsonl(out / "samples.jsonl", s.to_json(), fsync=False)
    info = ImportInfo(source=str(src.resolve()), order=order.fact, notes=tuple(notes),
                      cells=tuple(imported))
    atomic_write_text(out / IMPORT_FILE, json.dumps(info.to_json(), indent=1) + "\n")


def _whole(value: Any) -> bool:
    try:
        return float(value) == int(float(value)) and int(float(value)) > 0
    except (TypeError, ValueError):
        return False


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


__all__ = ["FORMAT", "OrderWarning", "import_folder", "is_import"]
