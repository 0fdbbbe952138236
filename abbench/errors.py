"""The exception tree. The CLI's single boundary turns these into `ERROR:`/`TIP:` lines."""

from __future__ import annotations


class AbbenchError(Exception):
    """A user-facing failure: printed as one `ERROR:` line (plus an optional `TIP:`)."""

    exit_status = 2

    def __init__(self, message: str, tip: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.tip = tip


class UsageError(AbbenchError):
    """A command line that cannot be run as given."""


class ConfigError(AbbenchError):
    """A configuration value out of range or inconsistent with another."""


class ModelFileError(AbbenchError):
    """A model file the engine cannot run: bad magic, truncated, unknown architecture or type."""


class EngineError(AbbenchError):
    """The engine failed while running (an I/O error on the model file, for example)."""
