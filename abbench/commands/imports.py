"""`abbench import DIR`: a folder of runs made elsewhere → a run folder."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from abbench.commands.outcome import ended
from abbench.errors import UsageError
from abbench.importers.discover import MAX_FILES, PROGRESS_FROM
from abbench.importers.folder import import_folder
from abbench.records import read_plan
from abbench.report import print_report, write_reports
from abbench.report.model import TERMINAL_ITEMS


def parse_decision(text: str) -> tuple[str, str, float]:
    """`CANDIDATE:BASELINE[:MIN_EFFECT]`, MIN_EFFECT a fraction (0.03 = 3%); each side an
    arm's name, a run's file name (or a unique word of one), a glob, or key=value[,...]."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise UsageError(f"--decision {text!r}: expected CANDIDATE:BASELINE[:MIN_EFFECT]")
    effect = 0.0
    if len(parts) == 3:
        try:
            effect = float(parts[2])
        except ValueError:
            raise UsageError(f"--decision {text!r}: MIN_EFFECT {parts[2]!r} is not a number",
                             tip="a fraction: 0.03 asks for at least 3% faster") from None
    return parts[0], parts[1], effect


def _progress(line: str) -> None:
    print(f"import: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while the import runs, so that its staging
    folder is removed as on Ctrl-C (a SIGKILL's is removed by the next import: `folder`)."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield  # (signals reach the main thread only: a caller on another has its own)
        return
    before = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


HELP = "turn a folder of runs made elsewhere into a run folder"
DESCRIPTION = ("Read bmoe_metrics CSVs, .log summaries, .metrics, .state and driver logs "
               "from DIR and write a run folder that `abbench report` reads (docs/import.md).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR")
    p.add_argument("--out", type=Path, default=None,
                   help="the run folder to write (default: reports/import-<DIR name>)")
    p.add_argument("--order", default=None,
                   help="execution order, comma-separated run names (or a unique word of "
                   "each, e.g. E,F,H,I)")
    p.add_argument("--decision", action="append", default=[], metavar="CAND:BASE[:MIN_EFFECT]",
                   help="a decision (repeatable): each side names an arm by its name, a run's "
                   "file name, a glob (qwen_*) or its configuration (dense_weights=anon)")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="tokens of each run left out of its statistics (default 0: the runs' "
                   "own figures)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier import at --out")
    p.add_argument("--max-files", type=int, default=MAX_FILES, metavar="N",
                   help=f"refuse a folder of more than N entries before reading any (default "
                   f"{MAX_FILES}); import an archive of many campaigns a subfolder at a time")
    p.add_argument("--style", choices=("rich", "plain"), default="rich",
                   help="the printed report's style (default rich)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Import, write the reports, print the summary and the report; the exit status is the
    decisions' (0 all GO or none asked, 1 a NO-GO, 3 open), as for a campaign."""
    src: Path = args.dir
    out: Path = args.out or Path("reports") / f"import-{src.resolve().name}"
    order = [s.strip() for s in args.order.split(",") if s.strip()] if args.order else None
    decisions = [parse_decision(d) for d in args.decision]
    with _terminated_as_interrupted():  # SIGTERM cleans up as Ctrl-C does: nothing left
        folder = import_folder(src, out, order, decisions, warmup=args.warmup,
                               force=args.force, max_files=args.max_files, progress=_progress)
        if len(read_plan(folder).cells) >= PROGRESS_FROM:
            _progress(f"analysing and reporting {folder}")
        a, rc = write_reports(folder)
    info, journal = a.imported, a.records
    source = (f"{info.order.kind}: {info.order.source}" if info is not None else "unknown")
    runs = f"{len(journal)} run{'s' if len(journal) != 1 else ''}"
    arms = len({c.name for c in a.plan.cells})
    print(f"imported {runs} ({arms} arm{'s' if arms != 1 else ''}) from {src} into {folder} "
          f"(order {source})")
    width = max(len(r.label) for r in journal[:TERMINAL_ITEMS])
    for r in journal[:TERMINAL_ITEMS]:
        e = r.entry
        bits = [f"cpu {e.cpu_temp_c:.1f} C" if e.cpu_temp_c is not None else None,
                f"battery {e.battery_temp_c:.1f} C" if e.battery_temp_c is not None else None,
                f"MemAvailable {e.mem_available_mib:.0f} MiB"
                if e.mem_available_mib is not None else None,
                f"capped {','.join(e.capped())}" if e.capped() else
                "caps at hardware max" if e.caps_khz and all(p in e.hw_max_khz
                                                            for p in e.caps_khz)
                else "caps recorded (hardware max unknown)" if e.caps_khz else None]
        state = ", ".join(b for b in bits if b) or "no entry state recorded"
        print(f"  {r.label:<{width}}  {r.tokens_per_s:8.3f} tok/s  {state}")
    if len(journal) > TERMINAL_ITEMS:
        print(f"  … and {len(journal) - TERMINAL_ITEMS} more runs (the report lists every one)")
    print_report(a, args.style)
    print(f"report: {folder / 'report.html'}, {folder / 'report.md'}, "
          f"{folder / 'report.json'}")
    return ended(a, rc)
