"""The order the runs ran in, and where that came from: `--order`, else driver logs and
scripts that cover every run, else every run's `.state` BEFORE date, else timestamps in the
file names, else unknown (file-name order, with no two cells adjacent)."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from datetime import datetime

from abbench.errors import OrderWarning, UsageError
from abbench.importers.discover import DriverLogs, Run
from abbench.importers.driverlog import DriverEntry, merge_driver_logs
from abbench.importers.facts import UNKNOWN
from abbench.records import Fact
from abbench.records.text import clip

# 20260712-093012, 20260712T093012, 2026-07-12_09-30-12, 2026-07-12T09:30:12 ...
STAMPS = (
    re.compile(r"(?<!\d)(\d{4})(\d{2})(\d{2})[T_-]?(\d{2})(\d{2})(\d{2})(?!\d)"),
    re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[T_ -](\d{2})[:.-](\d{2})[:.-](\d{2})(?!\d)"),
)


@dataclass
class Order:
    """The runs in execution order; where the order came from; whether it is known (an
    unknown order makes no two cells adjacent); each run's driver entry line."""

    names: list[str]
    fact: Fact
    known: bool
    entries: dict[str, DriverEntry] = field(default_factory=dict)


def resolve_run(item: str, names: list[str], what: str) -> str:
    """A run named exactly, else the one run whose name has `item` as a `-`/`_` word."""
    if item in names:
        return item
    hits = [n for n in names if item in re.split(r"[-_.]", n)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise UsageError(f"{what}: `{clip(item)}` matches several runs: {run_names(hits)}")
    import difflib

    close = difflib.get_close_matches(item, names, n=1) if len(item) <= 200 else []
    raise UsageError(f"{what}: no run `{clip(item)}` (runs: {run_names(names)})",
                     tip=f"did you mean `{close[0]}`?" if close else None)


def run_names(names: list[str], n: int = 8) -> str:
    """Run names for a message: the first `n`, then how many more."""
    shown = ", ".join(clip(name) for name in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def execution_order(runs: dict[str, Run], order: list[str] | None, drivers: DriverLogs,
                    notes: list[str]) -> Order:
    """The runs' order from the best source there is; an unknown order is warned about
    (OrderWarning, attributed to the caller of `import_folder`)."""
    names = sorted(runs)
    entries, driven, how = _driver_entries(drivers, names, notes)
    if order:
        return _given_order(order, names, entries)
    if drivers and entries:
        logs = ", ".join(n for n, _ in drivers)
        missing = [n for n in names if n not in entries]
        if not missing:
            return Order(driven, Fact("measured", f"the runs in sequence in {logs} ({how})"),
                         True, entries)
        notes.append(f"{logs} leave{'s' if len(drivers) == 1 else ''} out "
                     f"{run_names(missing)}: the order of the runs is unknown")
    if len(names) == 1:
        return Order(names, Fact("derived", "a single run"), True, entries)
    dated = {n: run.state.before.t_wall for n, run in runs.items()
             if run.state and run.state.before and run.state.before.t_wall is not None}
    if len(dated) == len(names) and len(set(dated.values())) == len(names):
        files = ", ".join(sorted(runs[n].state_file.name for n in names  # type: ignore[union-attr]
                                 if runs[n].state_file)[:3])
        return Order(sorted(names, key=lambda n: dated[n]),
                     Fact("measured", f"the BEFORE dates of every run's .state ({files}"
                          + (", ..." if len(names) > 3 else "") + ")"), True, entries)
    stamps = {n: _stamp(n) for n in names}
    if all(stamps.values()) and len(set(stamps.values())) == len(names):
        return Order(sorted(names, key=lambda n: stamps[n]),  # type: ignore[arg-type,return-value]
                     Fact("derived", "timestamps in the file names"), True, entries)
    why = ("no --order, no driver log covering every run, no timestamps in the file "
           "names: cells are listed in file-name order, and no two are adjacent")
    warnings.warn(f"the execution order of {len(names)} runs is unknown ({why}); give "
                  "--order if you know it", OrderWarning, stacklevel=3)
    return Order(names, Fact(UNKNOWN, why), False, entries)


def _driver_entries(drivers: DriverLogs, names: list[str], notes: list[str]
                    ) -> tuple[dict[str, DriverEntry], list[str], str]:
    """Each run's entry line (a run entered twice: the later line), the runs in the order
    the lines give, and how the logs were merged."""
    entries: dict[str, DriverEntry] = {}
    driven: list[str] = []
    if not drivers:
        return entries, driven, ""
    merged, how = merge_driver_logs(drivers, notes)
    for e in merged:
        try:
            run = resolve_run(e.cell, names, f"{e.where}")
        except UsageError as err:
            notes.append(f"{err.message}: the entry line is left out")
            continue
        if run in entries and e.from_script:
            continue  # a script's run line gives the order of runs no log entered only
        if run in entries and not entries[run].from_script:
            notes.append(f"{e.where}: run `{clip(run)}` again (first at "
                         f"{entries[run].where}): the later entry is used")
        if run in entries:
            driven.remove(run)
        entries[run] = e
        driven.append(run)
    return entries, driven, how


def _given_order(order: list[str], names: list[str], entries: dict[str, DriverEntry]
                 ) -> Order:
    """`--order`: every run, once each."""
    chosen = [resolve_run(item, names, "--order") for item in order]
    dup = next((n for n in chosen if chosen.count(n) > 1), None)
    if dup:
        raise UsageError(f"--order: run `{clip(dup)}` appears twice")
    missing = [n for n in names if n not in chosen]
    if missing:
        raise UsageError(f"--order leaves out {run_names(missing)}",
                         tip="list every run, in the order they ran")
    return Order(chosen, Fact("measured", "--order (given on the command line)"), True,
                 entries)


def _stamp(name: str) -> datetime | None:
    for pattern in STAMPS:
        if m := pattern.search(name):
            year, month, day, hour, minute, second = (int(g) for g in m.groups())
            try:
                return datetime(year, month, day, hour, minute, second)
            except ValueError:
                return None
    return None


__all__ = ["Order", "execution_order", "resolve_run", "run_names"]
