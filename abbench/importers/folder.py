"""A folder of runs made elsewhere → a run folder in the records schema (docs/import.md).

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

Each run's configuration comes from its files, and runs with equal configurations are one
arm: repeats of an arm are sentinels, and its cells pool (`identity` says how, and when a
run is its own arm).

The steps, one module each: `discover` (the files → runs and driver logs), `order` (the
execution order and its source), `identity` (configurations, arms, `--decision`s), `session`
(the work each run did and its session, keys of its configuration: runs of different work
or sessions are never repeats; configurations measured in several sessions), `facts`
(what one run's files say of it, with provenance) and `write` (the run folder); this module
checks the destination, builds the plan and replaces the destination atomically.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from abbench.errors import OrderWarning, UsageError, WriteError
from abbench.fsutil import folder_mode, process_alive
from abbench.importers.discover import MAX_FILES, PROGRESS_FROM, Progress, shown_in, walk
from abbench.importers.identity import configuration, decision_specs, group_arms
from abbench.importers.logs import attach_logs, attach_scripts
from abbench.importers.order import execution_order
from abbench.importers.session import add_work_and_session, cross_sessions, split_sessions
from abbench.importers.write import FORMAT, write_run_folder
from abbench.records import IMPORT_FILE, DecisionSpec, NotImported, Plan, PlannedCell, read_plan
from abbench.records.cell_config import ImportedConfig


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
                  warmup: int = 0, force: bool = False, max_files: int = MAX_FILES,
                  progress: Progress | None = None) -> Path:
    """Write `dest` as a run folder holding every run in `src`; returns `dest`. What the
    import could not read is in `import.json` (and warned about). `progress` hears what a
    large import is doing, a line a phase."""
    src, dest = Path(src), Path(dest)
    # `--out LINK` writes the folder the link names and the link stays a link, as a file
    # written through a link does (`fsutil.atomic_write_text`)
    target = Path(os.path.realpath(dest)) if dest.is_symlink() else dest
    _check_dest(target, force)
    if warmup < 0:
        raise UsageError(f"--warmup {warmup}: expected a number of tokens >= 0")
    notes: list[str] = []
    not_imported: list[NotImported] = []
    if max_files < 1:
        raise UsageError(f"--max-files {max_files}: expected a number of files >= 1")
    found = walk(src, notes, not_imported, max_files, progress)
    attach_logs(found)
    attach_scripts(found)
    runs, drivers = found.finish(src)
    order_info = execution_order(runs, order, drivers, notes)
    names = order_info.names
    identities = {n: configuration(runs[n]) for n in names}
    sessions = split_sessions(names, runs, order_info)
    for n in names:  # equal work in one session, or not repeats (`session`)
        add_work_and_session(identities[n][0], identities[n][1], runs[n], sessions)
    arm_of, arms = group_arms(names, identities)
    specs = decision_specs(decisions or (), arms, arm_of)
    plan = _plan(src, names, arm_of, arms, specs, warmup, order_info.known)
    across = cross_sessions(plan, names, runs, arms, sessions)
    for note in notes:
        warnings.warn(note, OrderWarning, stacklevel=2)
    for x in not_imported:
        warnings.warn(f"not imported: {shown_in(src, x)}", OrderWarning, stacklevel=2)
    if progress is not None and len(names) >= PROGRESS_FROM:
        progress(f"writing {len(names)} runs ({len(arms)} arms) into {dest}")
    _replace(target, lambda out: write_run_folder(out, plan, runs, order_info, identities,
                                                  notes, src, not_imported, across))
    return dest


def _check_dest(dest: Path, force: bool) -> None:
    """`dest` may be written: absent, empty, or (with `force`) an earlier import; and no
    file stands where it or a folder above it must be."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} is not a folder: --out names the run folder to write",
                         tip="choose another --out")
    above = next((p for p in dest.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise UsageError(f"cannot write {dest}: {above} is not a folder",
                         tip="choose another --out")
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise UsageError(f"{dest} exists and is not empty",
                             tip="--force replaces an earlier import there; or choose "
                             "another --out")
        if not is_import(dest):
            raise UsageError(f"{dest} exists and is not an import: --force replaces only an "
                             "earlier import", tip="choose another --out")


def _plan(src: Path, names: list[str], arm_of: dict[str, str],
          arms: dict[str, dict[str, Any]], decisions: list[DecisionSpec], warmup: int,
          order_known: bool) -> Plan:
    """The plan of an import: one cell per run in execution order, labelled `NN-STEM`; a
    run of an arm seen before is a sentinel of the arm's first cell."""
    width = max(2, len(str(len(names))))
    cells: list[PlannedCell] = []
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        arm = arm_of[name]
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".") or "run"
        # The kind first, as plans have always had it; a preamble's own `engine` key (any
        # `key=value` may be one) does not change it.
        config = ImportedConfig({"engine": "imported", **arms[arm]} | {"engine": "imported"})
        cells.append(PlannedCell(index=i, name=arm, config=config,
                                 sentinel_of=first.get(arm), label=f"{i + 1:0{width}d}-{safe}"))
        first.setdefault(arm, i)
    return Plan(campaign=src.resolve().name, cells=tuple(cells), spacing_s=0.0,
                warmup_tokens=warmup, device="imported", decisions=tuple(decisions),
                order_known=order_known)


def _replace(dest: Path, write: Callable[[Path], None]) -> None:
    """`write` into a fresh folder beside `dest`, then put it in `dest`'s place (an
    existing folder keeps its inode and mode: its entries are swapped, `_swap`): a failed
    import leaves `dest` as it was, and no folder it made. A destination that cannot be
    written (a folder that takes no new entries such as /proc, a full disk) is one
    WriteError naming it."""
    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    tmp: Path | None = None
    _remove_stale(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # the staging folder names its process: one left by a killed import is found, and
        # removed, by the next import to the same place (`_remove_stale`)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp",
                                    dir=dest.parent))
        write(tmp)
        _swap(tmp, dest)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # innermost first; rmdir: only if still empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(e, OSError):
            raise _write_error(e, dest, tmp) from None
        raise


def _remove_stale(dest: Path) -> None:
    """Remove the staging folders an import to `dest` left when it was killed (SIGKILL, a
    power cut: nothing ran to clean up): those whose process is gone. An interrupted or
    failed import removes its own."""
    if not dest.parent.is_dir():
        return
    for folder in dest.parent.glob(f".{glob.escape(dest.name)}.*.tmp"):
        pid = folder.name[len(dest.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or process_alive(int(pid)) or not folder.is_dir():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        warnings.warn(f"removed {folder}: the staging folder of an import to {dest} that was "
                      f"killed before it finished (process {pid})", OrderWarning, stacklevel=3)


def _swap(tmp: Path, dest: Path) -> None:
    """Put what was written into `tmp` in `dest`. A new `dest` is `tmp` renamed, with the
    mode `mkdir` would give it. A folder that is there (empty, or an earlier import with
    --force) is kept — its inode, mode and owner, what a link to it names — and its
    entries replaced: the old ones moved aside, the new ones moved in, the old ones moved
    back if that fails; they go only once the new ones are in."""
    if not dest.exists():
        os.chmod(tmp, folder_mode())
        os.replace(tmp, dest)
        return
    # named as a staging folder of this process: one a SIGKILL leaves is removed by the
    # next import here (`_remove_stale`)
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".old.tmp",
                                dir=dest.parent))
    out: list[str] = []
    into: list[str] = []
    try:
        for entry in sorted(os.listdir(dest)):
            os.replace(dest / entry, old / entry)
            out.append(entry)
        for entry in sorted(os.listdir(tmp)):
            os.replace(tmp / entry, dest / entry)
            into.append(entry)
    except BaseException:
        for entry in into:
            with contextlib.suppress(OSError):
                os.replace(dest / entry, tmp / entry)
        back = True
        for entry in out:
            try:
                os.replace(old / entry, dest / entry)
            except OSError:
                back = False
        if back:  # else the earlier import's entries stay in `old`, never deleted
            shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    tmp.rmdir()


def _write_error(e: OSError, dest: Path, tmp: Path | None) -> WriteError:
    """`e` as one message naming what the user asked for: `dest`, or the file inside it that
    failed, never the temp folder (a name the user never saw)."""
    failed = Path(os.fsdecode(e.filename)) if isinstance(e.filename, (str, bytes)) else dest
    where = dest
    if tmp is not None and failed.is_relative_to(tmp):
        where = dest / failed.relative_to(tmp)
    # a full disk or a read-only folder can be fixed where it is; /proc cannot
    fixable = e.errno in (errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EROFS)
    return WriteError.from_os(OSError(e.errno, e.strerror, str(where)),
                              "run the import again" if fixable else "choose another --out")


__all__ = ["FORMAT", "OrderWarning", "import_folder", "is_import"]
