"""The report's comparisons across sessions: a configuration an import found measured in
more than one session, session by session with the time between them — shown as what it
is, never as cell-to-cell noise (docs/import.md#work-and-sessions)."""

from __future__ import annotations

from datetime import date

from abbench.records import ImportInfo
from abbench.records.provenance import CrossSession, SessionSide
from abbench.report.blocks import PAGES, TERMINAL, Block, Bullets, Paragraph, Section, only

WHY = ("Runs of one configuration in different sessions are different arms: never repeats, "
       "never pooled into the cell-to-cell noise, never sentinels of one another.")


def across_sessions(info: ImportInfo | None) -> tuple[Block, ...]:
    """The Sessions section (pages) and its lines (terminal); nothing for an import of one
    session or a campaign."""
    if info is None or not info.sessions:
        return ()
    lines = tuple(map(comparison, info.sessions))
    how = info.sessions[0].how
    told = Paragraph((f"Sessions told apart by {how.source} ({how.kind}). {WHY}",))
    return (only(PAGES, Section("Sessions", (told, Bullets(lines)))),
            only(TERMINAL, Section("sessions", (Bullets(lines),))))


def comparison(x: CrossSession) -> str:
    """"qwen_base in 2 sessions 1 day 2 h apart: 5.09 → 7.07 tok/s (+38.8%) — a comparison
    across sessions, not cell-to-cell noise (session 1: ...; session 2: ...)"."""
    sides = x.sides
    steps = list(zip(sides, sides[1:]))
    gaps = [apart(a, b) for a, b in steps]
    when = gaps[0] if len(steps) == 1 else f"({', then '.join(gaps)})"
    rates = " → ".join(f"{s.tok_per_s:.2f}" for s in sides)
    changes = ", ".join(f"{b.tok_per_s / a.tok_per_s - 1:+.1%}" for a, b in steps)
    what = "a comparison" if len(steps) == 1 else "comparisons"
    runs = "; ".join(f"session {s.session}: {', '.join(s.cells)}" for s in sides)
    return (f"{sides[0].arm} in {len(sides)} sessions {when}: {rates} tok/s ({changes}) — "
            f"{what} across sessions, not cell-to-cell noise ({runs})")


def apart(a: SessionSide, b: SessionSide) -> str:
    """How far apart two sessions began (their first starts), as far as it is known:
    "1 day 2 h apart", "1 day apart by the dates in the file names"."""
    if a.start is not None and b.start is not None:
        return f"{duration(b.start - a.start)} apart"
    if a.day is not None and b.day is not None:
        days = (date.fromisoformat(b.day) - date.fromisoformat(a.day)).days
        return f"{_days(days)} apart by the dates in the file names"
    return "a time apart not recorded"


def duration(seconds: float) -> str:
    """"1 day 2 h", "3 h 20 min", "45 min" (minutes dropped beside days)."""
    minutes = round(abs(seconds) / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = [_days(days) if days else "", f"{hours} h" if hours else "",
             f"{mins} min" if mins and not days else ""]
    return " ".join(p for p in parts if p) or "0 min"


def _days(n: int) -> str:
    return f"{n} day{'' if n == 1 else 's'}"


__all__ = ["across_sessions", "apart", "comparison", "duration"]
