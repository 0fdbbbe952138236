"""Finding a folder's runs: each file classified by its extension and content, and grouped
into runs by its file name stem (the file kinds are listed in `importers.folder`); what the
logs and scripts say of the runs is joined to them by `logs`. Every file and subfolder
that does not become part of a run is listed with the reason (`records.NotImported`),
hidden ones (a name starting with a dot) aside."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError, UsageError
from abbench.importers.driverlog import DriverEntry
from abbench.importers.state import DeviceState, parse_state
from abbench.records import NotImported
from abbench.records.bmoe_csv import BmoeRun, looks_like_bmoe_csv, parse_bmoe_csv
from abbench.records.bmoe_view import Digest, digest
from abbench.records.metrics_file import parse_metrics
from abbench.records.summary import RunSummary
from abbench.records.text import clip, read_text_lossy
from abbench.workers import map_all, workers

EXTENSIONS = ("csv", "metrics", "log", "out", "state", "sh")
# The most entries a folder may hold (`--max-files` raises it): ten thousand runs of three
# files each, with room; a folder of more is refused before any file is read.
MAX_FILES = 50_000
PROGRESS_FROM = 1000  # files: a folder this large says what it is doing as it goes
Progress = Callable[[str], None]
UNKNOWN_KIND = f"not a kind abbench reads ({', '.join('.' + x for x in EXTENSIONS)})"
SUBFOLDER = "a folder: subfolders are not read; import it on its own"
# A per-token CSV the authors' route-trace script names `TAG.metrics.csv`: run TAG's table.
TABLE_SUFFIX = ".metrics"

# Each driver log (or script) by its file name, with its entries in file order.
DriverLogs = list[tuple[str, list[DriverEntry]]]


@dataclass
class Run:
    """What one run's files (`NAME.csv`, `.log`, `.out`, `.metrics`, `.state`, a driver
    log's section, a script's run line) gave."""

    name: str
    # its per-token table's preamble, trailers and problems (`table.columns` are not kept:
    # `digest` holds what the import needs of them, and the writer reads the file again)
    table: BmoeRun | None = None
    digest: Digest | None = None
    table_file: Path | None = None
    log_summary: RunSummary | None = None  # None: no log, or no `generation:` in it
    summary_where: str = ""  # the log (or section) the summary came from
    log_config: dict[str, Any] = field(default_factory=dict)
    log_lines: dict[str, str] = field(default_factory=dict)  # key -> "file:line"
    log_command: bool = False  # a command line (or a script's run line) was read
    # model parameters the run overrode: (the model's value, "file:line")
    log_defaults: dict[str, tuple[Any, str]] = field(default_factory=dict)
    log_generations: int = 0
    log_files: list[Path] = field(default_factory=list)
    script: str | None = None  # the run line that ran it: "driver.sh:12 (run line)"
    metrics: dict[str, float | None] = field(default_factory=dict)
    metrics_file: Path | None = None
    state: DeviceState | None = None
    state_file: Path | None = None

    @property
    def log_file(self) -> Path | None:
        return self.log_files[0] if self.log_files else None

    def files(self) -> list[Path]:
        return list(dict.fromkeys(p for p in (self.table_file, *self.log_files,
                                              self.metrics_file, self.state_file)
                                  if p is not None))


def walk(src: Path, notes: list[str], not_imported: list[NotImported],
         max_files: int = MAX_FILES, progress: Progress | None = None) -> Found:
    """Every file of `src` read and classified: its tables, `.metrics` and `.state` by
    run, its logs and scripts waiting for `logs` to join them. What is left out is listed
    in `not_imported`, what is read only in part said in `notes`. A folder of more than
    `max_files` entries is refused before any is read. The files are read on every core
    (`workers.map_all`), and taken in file-name order."""
    if not src.is_dir():
        raise ForeignRunError(src, "not a folder")
    _check_size(src, max_files)
    root = src.resolve()  # DIR itself may be a link: the user named it
    found = Found(notes, not_imported)
    readable: list[tuple[Path, str, str]] = []
    for path in sorted(src.iterdir()):
        stem, ext = path.name.rsplit(".", 1) if "." in path.name else (path.name, "")
        if path.name.startswith("."):
            continue  # hidden: a file manager's or a tool's own (.DS_Store, .git/)
        if (why := _outside(path, root) or _not_a_run_file(path, ext)) is not None:
            found.leave(path, why)
            continue
        readable.append((path, stem, ext))
    if progress is not None and len(readable) >= PROGRESS_FROM:
        progress(f"reading {len(readable)} files of {src} on {workers()} cores")
    for loaded in map_all(load, None, readable):
        found.take(loaded)
    return found


def _check_size(src: Path, max_files: int) -> None:
    """A folder of more than `max_files` entries is refused, counted without listing all
    of it (bounded time and memory, whatever it holds)."""
    with os.scandir(src) as entries:
        count = sum(1 for _ in itertools.islice(entries, max_files + 1))
    if count > max_files:
        raise UsageError(f"{src} holds more than {max_files} entries: an import reads at most "
                         f"{max_files}", tip="import its campaigns a subfolder at a time, or "
                         "raise the limit with --max-files N (an import reads every file, "
                         "and writes a folder and a report line per run)")


@dataclass(frozen=True)
class Loaded:
    """One file read: what it is (`kind`: table, metrics, state, log, script, left) and
    what it gave, or why it is left out; and what it held only in part."""

    path: Path
    stem: str
    kind: str
    value: Any = None
    reason: str = ""
    line: int | None = None
    note: str | None = None  # not UTF-8 from byte N ...


def load(_: None, item: tuple[Path, str, str]) -> Loaded:
    """A file of the folder read and parsed (in a worker: `walk`)."""
    path, stem, ext = item
    if ext in ("log", "out", "sh"):
        return Loaded(path, stem, "script" if ext == "sh" else "log")  # read when joined
    note = None
    try:
        text, problem = read_text_lossy(path)
        note = f"{path.name}: {problem}" if problem else None
        kind, value, reason, stem = _classified(path, stem, ext, text)
    except ForeignRunError as e:
        return Loaded(path, stem, "left", reason=e.problem, line=e.line, note=note)
    return Loaded(path, stem, kind, value, reason, note=note)


def _classified(path: Path, stem: str, ext: str, text: str) -> tuple[str, Any, str, str]:
    if ext == "csv" and text.lstrip().startswith("# route_trace"):
        return "left", None, "a route trace: `abbench replay` reads it", stem
    if ext == "csv" and _has_rows(text) and not looks_like_bmoe_csv(text) \
            and "# summary" not in text:
        return "left", None, ("a CSV that is not a per-token table (its columns: "
                              f"{_columns(text)}; a bmoe_metrics CSV has `wall_ms` or "
                              "`step`)"), stem
    if ext == "csv" or (ext == "metrics" and looks_like_bmoe_csv(text)):
        table = parse_bmoe_csv(text, path, drop_bad_columns=True)
        stem = stem.removesuffix(TABLE_SUFFIX) if ext == "csv" else stem
        return "table", (replace(table, columns={}), digest(table)), "", stem
    if ext == "metrics":
        return "metrics", parse_metrics(text, path), "", stem
    return "state", parse_state(text, path), "", stem


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


@dataclass
class Found:
    """What the folder's files gave so far. Logs and scripts wait in `logs` and `scripts`
    until every table is known (`logs`): a log becomes part of a run, or a run of its own
    only when nothing else is."""

    notes: list[str]
    not_imported: list[NotImported]
    runs: dict[str, Run] = field(default_factory=dict)
    drivers: DriverLogs = field(default_factory=list)
    logs: list[tuple[str, Path]] = field(default_factory=list)  # read when joined (`logs`)
    scripts: list[Path] = field(default_factory=list)
    from_sections: set[str] = field(default_factory=set)  # runs a driver log's section made

    def read(self, path: Path) -> str | None:
        """A log's or a script's text (not UTF-8: said in the notes); None, with the file
        listed as not imported, where it cannot be read."""
        try:
            text, problem = read_text_lossy(path)
        except ForeignRunError as e:
            self.skip(path, e)
            return None
        if problem:
            self.notes.append(f"{path.name}: {problem}")
        return text

    def leave(self, path: Path, reason: str, line: int | None = None) -> None:
        name = path.name + ("/" if path.is_dir() and not path.is_symlink() else "")
        self.not_imported.append(NotImported(name, reason, line))

    def skip(self, path: Path, error: ForeignRunError) -> None:
        self.leave(path, error.problem, error.line)

    def take(self, loaded: Loaded) -> None:
        path, stem = loaded.path, loaded.stem
        if loaded.note:
            self.notes.append(loaded.note)
        if loaded.kind == "left":
            self.leave(path, loaded.reason, loaded.line)
        elif loaded.kind == "log":
            self.logs.append((stem, path))
        elif loaded.kind == "script":
            self.scripts.append(path)
        elif loaded.kind == "table":
            self._table(path, stem, *loaded.value)
        elif loaded.kind == "metrics":
            run = self.runs.setdefault(stem, Run(stem))
            run.metrics, run.metrics_file = loaded.value, path
        else:
            run = self.runs.setdefault(stem, Run(stem))
            run.state, run.state_file = loaded.value, path

    def _table(self, path: Path, stem: str, table: BmoeRun, dig: Digest) -> None:
        run = self.runs.setdefault(stem, Run(stem))
        if run.table_file is not None:
            self.leave(path, f"a second per-token table for run `{clip(stem)}` (the first "
                       f"is {run.table_file.name})")
            return
        run.table, run.digest, run.table_file = table, dig, path
        for col in table.dropped:
            self.leave(path, col.problem, col.line)

    def finish(self, src: Path) -> tuple[dict[str, Run], DriverLogs]:
        """The runs and the driver sources, once logs and scripts are joined: a run with
        neither a table nor a `generation:` line is listed as not imported, and a folder
        that leaves no run is a ForeignRunError."""
        for name, run in list(self.runs.items()):
            if run.table is None and run.log_summary is None:
                del self.runs[name]
                for path in run.files():
                    self.leave(path, f"no per-token CSV and no `generation:` line for run "
                               f"`{clip(name)}`")
        self.not_imported.sort(key=lambda x: (x.path, x.line or 0))  # a listing by path
        if not self.runs:
            why = "; ".join(shown_in(src, x) for x in self.not_imported[:3])
            raise ForeignRunError(src, "no runs here (no bmoe_metrics CSV, no .log with a "
                                  "`generation:` line)" + (f": {why}" if why else ""),
                                  tip="abbench import reads bmoe_metrics CSVs, .metrics, "
                                  ".state, engine and driver logs and driver scripts; see "
                                  "docs/import.md")
        return self.runs, self.drivers


def _has_rows(text: str) -> bool:
    """Whether a file has a line that is not blank and not a comment."""
    return any(line.strip() and not line.lstrip().startswith("#")
               for line in text.splitlines())


def _columns(text: str) -> str:
    """A CSV's first line's columns, a few of them, for a message."""
    first = next((line for line in text.splitlines() if line.strip()
                  and not line.lstrip().startswith("#")), "")
    names = [clip(x.strip(), 24) for x in first.split(",")[:6]]
    return ", ".join(names) + (", ..." if first.count(",") >= 6 else "") or "none"


__all__ = ["MAX_FILES", "DriverLogs", "Found", "Progress", "Run", "shown_in", "walk"]
