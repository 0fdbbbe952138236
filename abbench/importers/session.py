"""Work and sessions: what else two imported runs must share to be repeats of each other.

Equal configurations are not enough (docs/import.md#work-and-sessions):

- **Equal work**, the import's equivalent of a campaign's work fingerprint: the model (a
  configuration key already), the decoded tokens (the per-token table's rows, else the
  `# summary` or `generation:` tokens), the prompt tokens (`n_prompt` of the `# summary`,
  else the log's `prefill:` line), and a prompt the preamble or command line gives (a
  configuration key already, where the readers find one). Runs of different length or
  prompt are different arms: `tokens` and `n_prompt` join the configuration.
- **One session.** A device left alone for an hour has cooled, reclaimed its page cache
  and run other work: a run after that measures another device state, and its difference
  from the runs before is not cell-to-cell noise. The evidence, first found wins: every
  run's start time (a pause of more than `GAP_S` from the end of one run to the start of
  the next starts a session); else a date in every file name (a new date, a new session);
  else several driver logs without times (each log a session); else one session, which is
  said to be assumed, never measured. A folder of several sessions adds `session` to every
  run's configuration, so that runs of one configuration in two sessions are two arms:
  never repeats, never pooled, and compared only as a comparison across sessions
  (`cross_sessions`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

from abbench.errors import ForeignRunError
from abbench.importers.discover import Run
from abbench.importers.facts import UNKNOWN, run_summary, times
from abbench.importers.order import STAMPS, Order
from abbench.records import Fact, Plan
from abbench.records.provenance import (
    SESSION,
    WORK_PROMPT_TOKENS,
    WORK_TOKENS,
    CrossSession,
    SessionSide,
)

# A pause longer than this between two runs ends a session: the authors' runs follow each
# other within minutes (cool-downs of 45 s to a few minutes), and an hour is long enough
# for the device to cool to ambient and reclaim its page cache.
GAP_S = 3600.0
GAP_WORDS = "a pause of more than 1 h between the end of one run and the start of the next"
# 2026-07-12, 2026_07_12, 20260712 (not part of a longer number)
DATE = re.compile(r"(?<!\d)(\d{4})[-_]?(\d{2})[-_]?(\d{2})(?!\d)")


@dataclass(frozen=True)
class Sessions:
    """Each run's session (1-based, in time order), how the sessions were told apart, and
    what dated them: each run's start (Unix s) and end where known, else its file name's
    day."""

    of: dict[str, int]
    how: Fact
    starts: dict[str, float] = field(default_factory=dict)
    days: dict[str, date] = field(default_factory=dict)

    @functools.cached_property
    def count(self) -> int:
        return max(self.of.values(), default=1)


def work(run: Run) -> tuple[dict[str, Any], dict[str, Fact]]:
    """The run's work as configuration keys (`tokens`, `n_prompt`), where its files give
    them, with where each came from (the first source that gives one)."""
    table, log = run.table, run.log_summary
    tf = run.table_file.name if run.table_file else ""
    lf = run.summary_where
    summary = table.summary if table is not None else {}
    trailer = f"{tf}:{table.summary_line}" if table is not None else tf
    sources: dict[str, tuple[tuple[Any, str], ...]] = {
        WORK_TOKENS: ((run.digest.rows if run.digest is not None and run.digest.rows else None,
                       f"{tf}: its per-token rows"),
                      (summary.get(WORK_TOKENS), f"{trailer} `# summary` tokens"),
                      (log.tokens if log else None, f"{lf} (`generation:` line)")),
        WORK_PROMPT_TOKENS: ((summary.get(WORK_PROMPT_TOKENS), f"{trailer} `# summary` n_prompt"),
                             (log.n_prompt if log else None, f"{lf} (`prefill:` line)")),
    }
    keys: dict[str, Any] = {}
    facts: dict[str, Fact] = {}
    for key, options in sources.items():
        for value, where in options:
            if (whole := _whole(value)) is not None:
                keys[key], facts[key] = whole, Fact("measured", where)
                break
    return keys, facts


def add_work_and_session(config: dict[str, Any], facts: dict[str, Fact], run: Run,
                         sessions: Sessions) -> None:
    """Put the run's work keys and (in a folder of several sessions) its session into its
    configuration, each with its provenance (`config.KEY`), and say how its session was
    told (`session`). A key the run's own files already state is kept as they state it."""
    keys, where = work(run)
    if sessions.count > 1:
        keys[SESSION] = sessions.of[run.name]
        where[SESSION] = Fact("derived", f"session {sessions.of[run.name]} of "
                              f"{sessions.count}: {sessions.how.source}")
    for key, value in keys.items():
        if key not in config:
            config[key] = value
            facts[f"config.{key}"] = where[key]
    facts[SESSION] = sessions.how


def split_sessions(names: list[str], runs: dict[str, Run], order: Order) -> Sessions:
    """The runs' sessions from the best evidence there is (the module docstring)."""
    spans = {n: _span(runs[n], order) for n in names}
    if names and all(spans[n] is not None for n in names):
        return _by_times(names, {n: s for n, s in spans.items() if s is not None})
    days = {n: d for n in names if (d := _day(n)) is not None}
    if names and len(days) == len(names):
        dates = sorted(set(days.values()))
        how = ("dates in the file names" + (": a new date starts a new session"
                                             if len(dates) > 1 else ", all one day"))
        return Sessions({n: dates.index(days[n]) + 1 for n in names}, Fact("derived", how),
                        days=days)
    logs = {n: order.entries[n].source for n in names if n in order.entries}
    if len(logs) == len(names) and len(set(logs.values())) > 1:
        seen = list(dict.fromkeys(logs[n] for n in order.names if n in logs))
        return Sessions({n: seen.index(logs[n]) + 1 for n in names},
                        Fact("derived", "separate driver logs without times ("
                             + ", ".join(seen) + "): each log a session"))
    return Sessions({n: 1 for n in names}, Fact(
        UNKNOWN, "no start time for every run, no date in every file name, no separate "
        "driver logs: taken as one session"))


def _by_times(names: list[str], spans: dict[str, tuple[float, float, str]]) -> Sessions:
    """Sessions from every run's start and end: a new one after a pause over `GAP_S`."""
    ordered = sorted(names, key=lambda n: (spans[n][0], n))
    of: dict[str, int] = {}
    session, last_end = 1, None
    for n in ordered:
        start, end, _ = spans[n]
        if last_end is not None and start - last_end > GAP_S:
            session += 1
        of[n] = session
        last_end = end if last_end is None else max(last_end, end)
    sources = sorted({spans[n][2] for n in names})
    how = f"start times ({', '.join(sources)}): {GAP_WORDS} starts a new session"
    if session == 1:
        how = f"start times ({', '.join(sources)}): no {GAP_WORDS.removeprefix('a ')}"
    return Sessions(of, Fact("derived", how), starts={n: spans[n][0] for n in names})


def _span(run: Run, order: Order) -> tuple[float, float, str] | None:
    """The run's start and end (the start again where the end is not known) and what gave
    the start; None without a start: its driver entry time or its `.state` date, else a
    timestamp in its file name."""
    try:
        summary, _ = run_summary(run)
    except ForeignRunError:
        return None  # the write step reports it
    start, end, sf, _ = times(run, order.entries.get(run.name), summary)
    if start:
        return start, max(start, end), _kind_of(sf)
    stamp = _name_stamp(run.name)
    return (stamp, stamp, "timestamps in the file names") if stamp is not None else None


def _kind_of(fact: Fact) -> str:
    """What gave a start, in a few words: "the driver log's times", "the .state dates"."""
    return ".state dates" if ".state" in fact.source else "driver log times"


def _name_stamp(name: str) -> float | None:
    """A date and time in the file name as Unix seconds (its zone unknown: read as UTC,
    so differences between names are exact)."""
    for pattern in STAMPS:
        if m := pattern.search(name):
            try:
                y, mo, d, h, mi, s = (int(g) for g in m.groups())
                return datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()
            except ValueError:
                return None
    return None


def _day(name: str) -> date | None:
    """The date in a file name (`2026-07-12`, `20260712`), None without a valid one."""
    for m in DATE.finditer(name):
        try:
            return date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            continue
    return None


def _whole(value: Any) -> int | None:
    """A whole number of tokens however the file wrote it (`256`, `256.0`); None else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def cross_sessions(plan: Plan, names: list[str], runs: dict[str, Run],
                   arms: dict[str, dict[str, Any]], sessions: Sessions
                   ) -> tuple[CrossSession, ...]:
    """Every configuration measured in more than one session: its arms that differ only in
    `session`, session by session (cells, their own tok/s, when the session began)."""
    if sessions.count < 2:
        return ()
    labels = {names[c.index]: c.label for c in plan.cells}
    arm_of = {names[c.index]: c.name for c in plan.cells}
    groups: dict[str, list[str]] = {}
    for arm, cfg in arms.items():
        if SESSION in cfg:
            rest = repr(sorted((k, repr(v)) for k, v in cfg.items() if k != SESSION))
            groups.setdefault(rest, []).append(arm)
    out = []
    for group in groups.values():
        if len(group) < 2:
            continue
        sides = [_side(a, arms[a][SESSION], [n for n in names if arm_of[n] == a], labels,
                       runs, sessions) for a in group]
        known = sorted((s for s in sides if s is not None), key=lambda s: s.session)
        if len(known) > 1:
            out.append(CrossSession(tuple(known), sessions.how))
    return tuple(sorted(out, key=lambda x: x.sides[0].cells[0]))


def _side(arm: str, session: int, members: list[str], labels: dict[str, str],
          runs: dict[str, Run], sessions: Sessions) -> SessionSide | None:
    """One session of a configuration (None: none of its runs has a tok/s)."""
    rates = [float(r) for n in members
             if (r := run_summary(runs[n])[0].tok_per_s) is not None and r > 0]
    if not rates:
        return None
    mean = round(math.exp(sum(map(math.log, rates)) / len(rates)), 6)
    starts = [sessions.starts[n] for n in members if n in sessions.starts]
    days = [sessions.days[n] for n in members if n in sessions.days]
    return SessionSide(session=session, arm=arm, cells=tuple(labels[n] for n in members),
                       tok_per_s=mean, start=min(starts) if starts else None,
                       day=min(days).isoformat() if days else None)


__all__ = ["GAP_S", "Sessions", "add_work_and_session", "cross_sessions", "split_sessions",
           "work"]
