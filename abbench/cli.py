"""The `abbench` command: a dispatch table over `abbench.commands` and the one error
boundary.

A user's mistake (an `AbbenchError`) prints `ERROR: ...` and, where one helps, `TIP: ...`
on stderr and exits with the error's status (2); it never prints a traceback. Messages and
warnings quote file names, keys and values from files abbench did not write, so every
`ERROR:`, `TIP:` and `WARNING:` line goes through `textsafe.shown`: one line each, control
characters shown as escapes.
"""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from abbench import __version__
from abbench.commands import COMMANDS, load
from abbench.errors import EXIT_BAD, EXIT_INTERRUPTED, AbbenchError
from abbench.textsafe import shown


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in the same `ERROR:` form and exit status as ours."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        print(f"ERROR: {shown(message)}", file=sys.stderr)
        sys.exit(2)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or where `argv` names one, of that one alone (its
    module is the only one imported: `commands.load`)."""
    first = next((a for a in (argv or ()) if not a.startswith("-")), None)
    names = [first] if first in COMMANDS else list(COMMANDS)
    p = _Parser(
        prog="abbench",
        description="Thermally controlled A/B benchmarking of an MoE expert-streaming engine.",
    )
    p.add_argument("--version", action="version", version=f"abbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_Parser)
    for name in names:  # the dispatch table: each command adds its own arguments
        command = load(name)
        command.add_arguments(sub.add_parser(name, help=command.HELP,
                                             description=command.DESCRIPTION))
    return p


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    print(f"WARNING: {shown(message)}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except AbbenchError as e:
        print(f"ERROR: {shown(e.message)}", file=sys.stderr)
        if e.tip:
            print(f"TIP: {shown(e.tip)}", file=sys.stderr)
        return e.exit_status
    except MemoryError:  # an allocation no check foresaw: said, never a traceback
        print("ERROR: out of memory: an allocation failed (MemoryError); the run needs "
              "more memory than this process may have", file=sys.stderr)
        return EXIT_BAD
    except OSError as e:
        if e.errno != errno.ENOMEM:
            raise
        print(f"ERROR: out of memory: {shown(str(e))}", file=sys.stderr)
        return EXIT_BAD
    except RuntimeError as e:  # a thread's stack is address space too (ulimit -v)
        if "can't start new thread" not in str(e):
            raise
        print("ERROR: out of memory: a thread could not be started (its stack needs "
              "address space: ulimit -v?)", file=sys.stderr)
        return EXIT_BAD
    except KeyboardInterrupt:  # Ctrl-C, or a SIGTERM a command turned into one
        print("ERROR: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
