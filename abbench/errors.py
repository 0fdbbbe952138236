"""The exception tree. The CLI's single boundary turns these into `ERROR:`/`TIP:` lines.

```
AbbenchError                 exit status 2 unless the class says otherwise
├── UsageError               a command line that cannot be run as given
├── ConfigError              an engine configuration out of range or inconsistent
├── CampaignFileError        a cells.toml that cannot be run as written (names the key)
├── ModelFileError           a model file the engine cannot run
├── EngineError              the engine failed while running
│   └── GgmlUnavailable      ggml's kernels cannot be loaded here (engine/kernels/ggml/)
├── RecordError              a run-folder file that cannot be read (names file, line, key)
├── ForeignRunError          a file from a run made elsewhere that cannot be imported
├── TraceError               a route trace that cannot be read
├── CellOutputError          a cell finished but what it wrote cannot be read
├── FitError                 a timeline the simulated device cannot be fitted to
├── WriteError               a file abbench writes could not be written
├── SnapshotError            one remote sensor snapshot failed: that sample is a gap
├── Interrupted              the user stopped the campaign (exit status 4)
└── NoMeasurement            a campaign ran but measured nothing a verdict could use (5)
OrderWarning (UserWarning)   what an import also says in its report
BadField (ValueError)        a value the validator (records.schema) rejects; never shown
                             as is: each reader turns it into its file's error above
```
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Key = tuple[str | int, ...]  # a key path in a TOML/JSON document; ints index arrays
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def format_key(key: Key) -> str:
    """`cells."B.v2".cache_mib`, `decision[0].baseline` — how messages name a key (a part
    longer than 60 characters is shortened: the message stays one readable line)."""
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY.match(part) else json.dumps(part, ensure_ascii=False)
            text = text if len(text) <= 60 else text[:57] + "..."
            out += ("." if out else "") + text
    return out

EXIT_OK, EXIT_NO_GO, EXIT_BAD, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4
# A run with no valid cell, or a decision with an arm that has none: not 0 (a pipeline
# would read success), not 3 (more cells would not settle it: the cells fail).
EXIT_NO_MEASUREMENT = 5


class AbbenchError(Exception):
    """A user-facing failure: printed as one `ERROR:` line (plus an optional `TIP:`)."""

    exit_status = EXIT_BAD

    def __init__(self, message: str, tip: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.tip = tip


class UsageError(AbbenchError):
    """A command line that cannot be run as given."""


@dataclass(frozen=True)
class Setting:
    """A configuration field named inside a `ConfigError`'s problem: each front end writes
    it its own way (the engine's `--cache-mib`, a campaign file's `cache_mib`)."""

    name: str


Problem = tuple[str | Setting, ...]


def flag(field: str) -> str:
    """How the engine's command line names a configuration field."""
    return f"`--{field.replace('_', '-')}`"


class ConfigError(AbbenchError):
    """A configuration value out of range or inconsistent with another.

    `field` is the field at fault and `problem` what is wrong with it, other fields named
    as `Setting`s, so a front end words the message with its own names (`render`) instead of
    parsing this one. The message is the command line's: `--flag problem`."""

    def __init__(self, message: str, tip: str | None = None, *, field: str | None = None,
                 problem: Problem = ()) -> None:
        super().__init__(message, tip)
        self.field = field
        self.problem = problem

    @classmethod
    def of(cls, field: str, *problem: str | Setting) -> ConfigError:
        """The error about `field`, worded for the command line."""
        return cls(f"{flag(field)} {render(problem, flag)}", field=field, problem=problem)


def render(problem: Problem, name: Callable[[str], str]) -> str:
    """A problem's text with each field written by `name`."""
    return "".join(part if isinstance(part, str) else name(part.name) for part in problem)


class CampaignFileError(AbbenchError):
    """A campaign file that cannot be run as written."""

    def __init__(self, message: str, tip: str | None = None, *, key: Key = (),
                 problem: str | None = None, at: Key | None = None,
                 located: bool = False) -> None:
        super().__init__(message, tip)
        self.key = key  # the key the message names
        self.problem = message if problem is None else problem
        self.at = key if at is None else at  # where to look for a line number
        self.located = located  # the message already names the file


class ModelFileError(AbbenchError):
    """A model file the engine cannot run: bad magic, truncated, unknown architecture or type."""


class EngineError(AbbenchError):
    """The engine failed while running (an I/O error on the model file, for example)."""


class ArenaFull(EngineError):
    """A ggml arena has no room for what a context or graph asks of it: the caller takes
    another way (a prefill batch, a graph a layer)."""


class GgmlUnavailable(EngineError):
    """ggml's library cannot be found or loaded, or is not the layout the engine mirrors."""


class RecordError(AbbenchError):
    """A run folder file that cannot be read."""


class ForeignRunError(AbbenchError):
    """A file from a run made elsewhere that cannot be imported (names the file and line)."""

    def __init__(self, source: str | Path, message: str, line: int | None = None,
                 tip: str | None = None) -> None:
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(source))
        where = f"{shown}:{line}" if line is not None else shown
        super().__init__(f"{where}: {message}", tip=tip)
        self.source = str(source)
        self.line = line
        self.problem = message  # what is wrong there, without the file and line


class TraceError(AbbenchError):
    """A route trace that cannot be read: names the file and the line."""


class CellOutputError(AbbenchError):
    """A cell finished but what it wrote cannot be read."""


class FitError(AbbenchError):
    """A run whose timeline cannot be fitted."""


class WriteError(AbbenchError):
    """A file abbench writes could not be written (a full disk, a read-only folder)."""

    @classmethod
    def from_os(cls, e: OSError, then: str = "run the command again") -> WriteError:
        """`cannot write FILE: WHY`, with a tip ending in `then`."""
        what, first = (e.strerror or str(e)).lower(), None
        if e.errno == errno.ENOSPC:
            what, first = "no space left on device", "free some space on that disk"
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            first = "make it writable"
        return cls(f"cannot write {e.filename or 'a file'}: {what}",
                   f"{first}, then {then}" if first else then[0].upper() + then[1:])


class SnapshotError(AbbenchError):
    """A remote snapshot failed (device gone, timeout): that sample is a gap."""


class Interrupted(AbbenchError):
    """The user stopped the campaign (Ctrl-C); what finished is in the journal."""

    exit_status = EXIT_INTERRUPTED

    def __init__(self, message: str, tip: str | None = None, folder: Path | None = None):
        super().__init__(message, tip)
        self.folder = folder


class NoMeasurement(AbbenchError):
    """A campaign ran to its end but no cell (or no cell of a decision's arm) is a valid
    measurement; its report says why each failed."""

    exit_status = EXIT_NO_MEASUREMENT


class OrderWarning(UserWarning):
    """Something about the imported runs that the report also says (an unknown order, a
    file left out)."""


class BadField(ValueError):
    """A value of the wrong type or shape. `key` is its path (`cells.B.tokens`,
    `entry.cpu_temp_c`) — a tuple from the validator, or a path already written out."""

    def __init__(self, key: Key | str, problem: str, tip: str | None = None) -> None:
        self.key: Key = key if isinstance(key, tuple) else ()
        self.where = format_key(key) if isinstance(key, tuple) else key
        self.problem, self.tip = problem, tip
        super().__init__(f"`{self.where}`: {problem}" if self.where else problem)
