"""Finding a folder's runs: each file classified by its extension and content, and grouped
into runs by its file name stem (the file kinds are listed in `importers.folder`). Every
file and subfolder that does not become part of a run is listed with the reason
(`records.NotImported`), hidden ones (a name starting with a dot) aside."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError
from abbench.importers.driverlog import DriverEntry, is_driver_log, parse_driver_log
from abbench.importers.enginelog import engine_log_config, parse_engine_log
from abbench.importers.metrics import parse_metrics
from abbench.importers.state import DeviceState, parse_state
from abbench.records import NotImported
from abbench.records.bmoe_csv import BmoeRun, looks_like_bmoe_csv, parse_bmoe_csv
from abbench.records.summary import RunSummary
from abbench.records.text import clip, read_text_lossy

EXTENSIONS = ("csv", "metrics", "log", "state")
UNKNOWN_KIND = f"not a kind abbench reads ({', '.join('.' + x for x in EXTENSIONS)})"
SUBFOLDER = "a folder: subfolders are not read; import it on its own"

# Each driver log by its file name, with its entry lines in file order.
DriverLogs = list[tuple[str, list[DriverEntry]]]


@dataclass
class Run:
    """What one run's files (`NAME.csv`, `.log`, `.metrics`, `.state`) gave."""

    name: str
    table: BmoeRun | None = None
    table_file: Path | None = None
    log_summary: RunSummary | None = None  # None: no .log, or no `generation:` in it
    log_config: dict[str, Any] = field(default_factory=dict)
    log_lines: dict[str, int] = field(default_factory=dict)
    log_command: bool = False
    # model parameters the log's command line or banner overrode: (the model's value, line)
    log_defaults: dict[str, tuple[Any, int]] = field(default_factory=dict)
    log_generations: int = 0
    log_file: Path | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    metrics_file: Path | None = None
    state: DeviceState | None = None
    state_file: Path | None = None

    def files(self) -> list[Path]:
        return [p for p in (self.table_file, self.log_file, self.metrics_file, self.state_file)
                if p is not None]


def discover(src: Path, notes: list[str], not_imported: list[NotImported]
             ) -> tuple[dict[str, Run], DriverLogs]:
    """The runs in `src` by name, and its driver logs. What is left out is listed in
    `not_imported`, what is read only in part said in `notes`; a folder that leaves no run
    is a ForeignRunError."""
    if not src.is_dir():
        raise ForeignRunError(src, "not a folder")
    root = src.resolve()  # DIR itself may be a link: the user named it
    found = _Found(notes, not_imported)
    for path in sorted(src.iterdir()):
        stem, ext = path.name.rsplit(".", 1) if "." in path.name else (path.name, "")
        if path.name.startswith("."):
            continue  # hidden: a file manager's or a tool's own (.DS_Store, .git/)
        if (why := _outside(path, root) or _not_a_run_file(path, ext)) is not None:
            found.leave(path, why)
            continue
        try:
            found.take(path, stem, ext, _read(path, notes))
        except ForeignRunError as e:
            found.skip(path, e)
    found.attach_logs()
    found.drop_incomplete()
    if not found.runs:
        why = "; ".join(shown_in(src, x) for x in not_imported[:3])
        raise ForeignRunError(src, "no runs here (no bmoe_metrics CSV, no .log with a "
                              "`generation:` line)" + (f": {why}" if why else ""),
                              tip="abbench import reads bmoe_metrics CSVs, .metrics, .state "
                              "and driver logs; see docs/import.md")
    return found.runs, found.drivers


def shown_in(src: Path, x: NotImported) -> str:
    """A not-imported entry with its full path, control characters escaped, as an error
    or a warning names a file: `SRC/a.csv:5: column ...`."""
    folder = "/" if x.path.endswith("/") else ""  # a Path would drop it
    return ForeignRunError(f"{src / x.path}{folder}", x.reason, x.line).message


def _not_a_run_file(path: Path, ext: str) -> str | None:
    """Why `path` (inside the folder) is no file of a run; None when it may be one."""
    if path.is_dir():
        return SUBFOLDER
    if not path.is_file():
        return "not a regular file (a broken link, a pipe or a device): not read"
    return None if ext in EXTENSIONS else UNKNOWN_KIND


def _outside(path: Path, root: Path) -> str | None:
    """Why `path` is not read when it is a link (or a chain of links) that ends outside
    `root`, the folder being imported; None when it is no link or stays inside. The one
    place this is checked: only what `discover` takes is ever read or copied."""
    if not path.is_symlink():
        return None
    target = Path(os.path.realpath(path))
    if target.is_relative_to(root):
        return None
    kind = "folder" if target.is_dir() else "file" if target.exists() else "path"
    return f"a link to a {kind} outside the imported folder"


def _read(path: Path, notes: list[str]) -> str:
    text, problem = read_text_lossy(path)
    if problem:
        notes.append(f"{path.name}: {problem}")
    return text


@dataclass
class _Found:
    """What the folder's files gave so far. Engine logs wait in `logs` until every table
    is known: a log becomes part of a run, or a run of its own only when nothing else is."""

    notes: list[str]
    not_imported: list[NotImported]
    runs: dict[str, Run] = field(default_factory=dict)
    drivers: DriverLogs = field(default_factory=list)
    logs: dict[str, tuple[Path, str]] = field(default_factory=dict)

    def leave(self, path: Path, reason: str, line: int | None = None) -> None:
        name = path.name + ("/" if path.is_dir() and not path.is_symlink() else "")
        self.not_imported.append(NotImported(name, reason, line))

    def skip(self, path: Path, error: ForeignRunError) -> None:
        self.leave(path, error.problem, error.line)

    def take(self, path: Path, stem: str, ext: str, text: str) -> None:
        if ext == "csv" and text.lstrip().startswith("# route_trace"):
            self.leave(path, "a route trace: `abbench replay` reads it")
            return
        if ext == "log":
            if is_driver_log(text):
                self.drivers.append((path.name, parse_driver_log(text, path, self.notes)))
            else:
                self.logs[stem] = (path, text)
            return
        if ext == "csv" or (ext == "metrics" and looks_like_bmoe_csv(text)):
            table = parse_bmoe_csv(text, path, drop_bad_columns=True)
            run = self.runs.setdefault(stem, Run(stem))
            if run.table_file is not None:
                self.leave(path, f"a second per-token table for run `{clip(stem)}` (the "
                           f"first is {run.table_file.name})")
                return
            run.table, run.table_file = table, path
            for col in table.dropped:
                self.leave(path, col.problem, col.line)
        elif ext == "metrics":
            metrics = parse_metrics(text, path)
            run = self.runs.setdefault(stem, Run(stem))
            run.metrics, run.metrics_file = metrics, path
        else:
            state = parse_state(text, path)
            run = self.runs.setdefault(stem, Run(stem))
            run.state, run.state_file = state, path

    def attach_logs(self) -> None:
        for stem, (path, text) in self.logs.items():
            try:
                summary = parse_engine_log(text, path)
            except ForeignRunError as e:
                self.skip(path, e)
                continue
            generations = text.count("generation:")
            if stem not in self.runs and (summary is None or generations != 1):
                self.leave(path, f"an engine log that matches no run (no {stem}.csv, "
                           f"{generations} `generation:` lines): not a run")
                continue
            run = self.runs.setdefault(stem, Run(stem))
            run.log_summary, run.log_file, run.log_generations = summary, path, generations
            cfg = engine_log_config(text)
            run.log_config, run.log_lines, run.log_command = cfg.values, cfg.lines, cfg.command
            run.log_defaults = cfg.defaults

    def drop_incomplete(self) -> None:
        for name, run in list(self.runs.items()):
            if run.table is None and run.log_summary is None:
                del self.runs[name]
                for path in run.files():
                    self.leave(path, f"no per-token CSV and no `generation:` line for run "
                               f"`{clip(name)}`")


__all__ = ["DriverLogs", "Run", "discover", "shown_in"]
