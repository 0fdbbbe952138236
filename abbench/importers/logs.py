"""What a folder's logs and scripts say of its runs: each engine log joined to its run,
each section of a driver log to the run it names, and each run line of a driver script
to its run (docs/import.md#logs-and-scripts).

- **An engine log** `NAME.log` or `NAME.out` (the engine's stderr or stdout, as the
  authors' `bench-run-doc.sh` keeps them) belongs to the run `NAME`. A log named after no
  run is a run of its own when it holds exactly one `generation:` line.
- **A driver log** (`driverlog`): its sections are what the engine printed for each run,
  between `=== NAME ===` banners. A section belongs to the run NAME names: that run, else
  the runs that hold NAME's words (the banner's leading words dropped while nothing
  matches: `=== cell a1 ===` is `a1`), told apart where several do by the section's own
  `generation:` line, whose tokens and tok/s are the run's (the engine prints both from one
  summary). A section that matches no run and holds a `generation:` line is a run of its
  own: tok/s, reads and entry state from the log. Whatever a section states of the
  configuration (its banners, `bmoe: expert sidecar ON`, the loader's lines) is its run's.
- **A driver script** (`script`): its run lines name runs, in the order it ran them, with
  the flags each was told.

A run's configuration takes each key from the first source that has it: its own logs
(`NAME.log`, then `NAME.out`), its driver sections, then its run line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError
from abbench.importers.discover import Found, Run
from abbench.importers.driverlog import DriverEntry, has_entry_lines, parse_driver_log
from abbench.importers.enginelog import command_options, engine_log_config, parse_engine_log
from abbench.importers.script import RunLine, is_driver_script, run_lines
from abbench.records.bmoe_csv import BmoeRun
from abbench.records.summary import RunSummary
from abbench.records.text import clip

WORD = re.compile(r"[A-Za-z0-9]+")
GGUF = re.compile(r"\.gguf$", re.IGNORECASE)


def attach_logs(found: Found) -> None:
    """Every log the folder holds joined to its run, or made a run, or listed as not
    imported with the reason; the driver logs' entries in `found.drivers`."""
    texts = [(stem, path, text) for stem, path in found.logs
             if (text := found.read(path)) is not None]
    found.logs.clear()
    own = [(stem, path, text) for stem, path, text in texts
           if stem in found.runs and not has_entry_lines(text)]
    for stem, path, text in own:  # first: a run's own log outranks a driver's section
        _engine_text(found, found.runs[stem], path, text, 1, path.name)
    for stem, path, text in texts:
        if stem in found.runs and not has_entry_lines(text):
            continue
        entries = parse_driver_log(text, path, found.notes)
        if entries and (joined := _sections(found, path, text, entries)):
            found.drivers.append((path.name, joined))
        elif entries:  # sections, each of something else (a memory benchmark's)
            names = ", ".join(f"`{clip(e.cell, 40)}`" for e in entries[:3])
            more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
            found.leave(path, f"a log of no run here: its sections ({names}{more}) name no "
                        "run of this folder and hold no `generation:` line")
        else:
            _alone(found, stem, path, text)


def _alone(found: Found, stem: str, path: Path, text: str) -> None:
    """A log that names no run and has no sections: a run of its own with one
    `generation:` line, else not imported."""
    try:
        summary = parse_engine_log(text, path)
    except ForeignRunError as e:
        found.skip(path, e)
        return
    generations = text.count("generation:")
    if summary is None or generations != 1:
        found.leave(path, f"a log of no run here: no run `{clip(stem)}`, no `=== NAME ===` "
                    + ("sections, and no `generation:` line" if not generations else
                       f"sections to tell its {generations} `generation:` lines apart"))
        return
    run = found.runs.setdefault(stem, Run(stem))
    _engine_text(found, run, path, text, 1, path.name)


def _engine_text(found: Found, run: Run, path: Path, text: str, first: int,
                 where: str) -> bool:
    """Join what one engine text (a log, or a section of one) says to `run`: its summary
    where the run has none yet, each configuration key it has not; False (and the file
    listed) when a figure in it does not read."""
    try:
        summary = parse_engine_log(text, path)
    except ForeignRunError as e:
        found.skip(path, e)
        return False
    if path not in run.log_files:
        run.log_files.append(path)
    run.log_generations += text.count("generation:")
    if run.log_summary is None and summary is not None:
        run.log_summary, run.summary_where = summary, where
    cfg = engine_log_config(text, first)
    for key, value in cfg.values.items():
        if key not in run.log_config:
            run.log_config[key] = value
            run.log_lines[key] = f"{path.name}:{cfg.lines[key]}"
            if key in cfg.defaults:
                default, line = cfg.defaults[key]
                run.log_defaults[key] = (default, f"{path.name}:{line}")
    run.log_command = run.log_command or cfg.command
    return True


def _sections(found: Found, path: Path, text: str,
              entries: list[DriverEntry]) -> list[DriverEntry]:
    """The log's entries with each section joined to its run (its `cell` the run's name),
    or made a run; a section that is no run's and holds nothing is dropped."""
    lines = text.removeprefix("\ufeff").splitlines()
    out: list[DriverEntry] = []
    for e in entries:
        if e.body is None:  # an entry line outside any section: named by cell=
            out.append(e)
            continue
        first, last = e.body
        body = "\n".join(lines[first - 1:last])
        try:
            own = parse_engine_log(body, path)
        except ForeignRunError as err:
            found.skip(path, err)
            continue
        run = _section_run(found, e.cell, own, path, e)
        if run is None:
            continue
        where = f"{path.name}:{first}-{last} (section `{clip(e.cell)}`)"
        if _engine_text(found, run, path, body, first, where):
            out.append(replace(e, cell=run.name))
    return out


def _section_run(found: Found, name: str, own: Any, path: Path,
                 e: DriverEntry) -> Run | None:
    """The run a section names (`attach_logs`), or a new run of its own; None, with a note
    where it mattered, for a section that is no run's."""
    named = {n: r for n, r in found.runs.items() if n not in found.from_sections}
    where = f"{path.name}:{e.line}"
    for level, candidates in enumerate(_candidates(name, named)):
        if own is not None and own.tok_per_s is not None:
            checked = [r for r in candidates if _same_figures(r, own)]
            unchecked = [r for r in candidates if _figures(r)[1] is None]
            candidates = checked or (unchecked if level == 0 else [])
        elif level > 0:
            break  # a shortened name only with the figures to confirm it
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            found.notes.append(f"{where}: section `{clip(name)}` could be runs "
                               f"{', '.join(clip(r.name) for r in candidates[:4])}, and its "
                               "figures do not tell them apart: left out")
            return None
    if own is None:
        if e.read:
            found.notes.append(f"{where}: section `{clip(name)}` names no run and has no "
                               "`generation:` line: its reading is left out")
        return None
    new = re.sub(r"\s+", "-", name.strip())
    if new in found.runs:
        new = f"{path.stem}-{new}"
    while new in found.runs:
        new += "+"
    found.from_sections.add(new)
    return found.runs.setdefault(new, Run(new))


def _candidates(name: str, runs: dict[str, Run]) -> list[list[Run]]:
    """The runs a section's name may name, most exactly first: the run of that name, or
    those that hold all its words in order; then those that hold its words with the first
    dropped, and so on (`=== cell a1 ===` may be run `qw-a1`)."""
    if name in runs:
        return [[runs[name]]]
    words = WORD.findall(name)
    out = []
    for start in range(len(words)):
        want = words[start:]
        hits = [r for n, r in runs.items() if _holds(WORD.findall(n), want)]
        if hits:
            out.append(hits)
    return out


def _holds(words: list[str], want: list[str]) -> bool:
    k = len(want)
    return any(words[i:i + k] == want for i in range(len(words) - k + 1))


def _same_figures(run: Run, own: Any) -> bool:
    """Whether a section's `generation:` figures are the run's: its tokens, and its tok/s
    to the 3 decimals the line prints."""
    tokens, rate = _figures(run)
    if tokens is None or rate is None or own.tokens is None or own.tok_per_s is None:
        return False
    return int(own.tokens) == tokens and abs(own.tok_per_s - rate) <= max(1.1e-3, 1e-4 * rate)


def _figures(run: Run) -> tuple[int | None, float | None]:
    """The run's decode tokens and decode-only tok/s (as the engine prints them)."""
    table: BmoeRun | None = run.table
    if table is None:
        s = run.log_summary
        return (int(s.tokens), s.tok_per_s) if s and s.tokens is not None else (None, None)
    own = RunSummary.from_json(table.summary)  # its trailer: the decode alone, as printed
    if own.tokens is not None and own.tok_per_s is not None:
        return int(own.tokens), float(own.tok_per_s)
    d = run.digest
    if d is None or not d.walls or d.wall_sum_ms <= 0:
        return None, None
    return d.walls, d.walls / (d.wall_sum_ms / 1e3)


def attach_scripts(found: Found) -> None:
    """Each driver script's run lines joined to the runs they name (the flags each was
    told, and the order, as a driver source without times); a script that names no run is
    listed as not imported."""
    for path in found.scripts:
        text = found.read(path)
        if text is None:
            continue
        if not is_driver_script(text):
            found.leave(path, "a script that defines no function: no run line to read")
            continue
        entries = []
        for line in run_lines(text):
            run = _script_run(line, found.runs)
            if run is None:
                continue
            if run.script is None:
                _told(run, path, line)
            entries.append(DriverEntry(cell=run.name, line=line.line, source=path.name,
                                       named_by="run line", from_script=True))
        if entries:
            found.drivers.append((path.name, entries))
        else:
            found.leave(path, "a script with no line that runs one of this folder's runs "
                        "(`run TAG ...`, a function it defines called with a run's name)")
    found.scripts.clear()


def _script_run(line: RunLine, runs: dict[str, Run]) -> Run | None:
    """The run a run line names: by its exact name only (a tag that is part of another
    run's name ran a run whose files are not here)."""
    return runs.get(line.tag)


def _told(run: Run, path: Path, line: RunLine) -> None:
    """What a run line told its run: its flags, and the model a `.gguf` word names, each a
    key the run's logs do not give."""
    where = f"{path.name}:{line.line} (run line)"
    run.script = where
    found: list[tuple[str, Any]] = command_options(" ".join(shlex.quote(w) for w in line.words))
    for word in line.words:
        if GGUF.search(word):
            found.append(("model", word.replace("\\", "/").rsplit("/", 1)[-1]))
            break
    for key, value in found:
        if key not in run.log_config:
            run.log_config[key] = value
            run.log_lines[key] = where
    run.log_command = True


__all__ = ["attach_logs", "attach_scripts"]
