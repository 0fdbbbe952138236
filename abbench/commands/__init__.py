"""The `abbench` subcommands, one module each: its `HELP` (a line for `abbench --help`),
its `DESCRIPTION` (for its own `--help`, or None) and `add_arguments(p)`, which adds its
arguments to its parser and sets its handler as the parser's `func` (which returns the exit
status). These modules are the only
place that chains campaign → analysis → report; nothing imports them but `abbench.cli`.

A command's module is imported only where it is run (`load`): every campaign cell starts
`abbench engine run` as a child process, and the other commands' imports (the report's
plots, Ray, scipy) would cost each cell about 0.8 s of start (measured: `abbench
--version` with every command 1.2 s, the engine's alone 0.4 s)."""

from __future__ import annotations

import importlib
from types import ModuleType

# the subcommands, in the order `abbench --help` lists them; each is its module's name but
# `import`, a keyword
_LISTED = "campaign calibrate engine fleet import model replay report sensors sentinels sim"
COMMANDS: tuple[str, ...] = tuple(_LISTED.split())
_MODULE = {"import": "imports"}


def load(command: str) -> ModuleType:
    """The module of subcommand `command`."""
    return importlib.import_module(f"{__name__}.{_MODULE.get(command, command)}")


__all__ = ["COMMANDS", "load"]
