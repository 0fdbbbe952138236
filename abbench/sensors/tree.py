"""Where readers read from: a directory tree, or a snapshot of files fetched from a device.

Every reader takes a `root`: a path (`/` on the machine itself, a fixture folder in tests,
the tree the simulated device writes) or a `SnapshotTree` — the files a remote device sent
back in one batched shell call. Both answer the same two questions, `read` and `glob`, on
absolute paths, so one reader serves every transport.
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tree(Protocol):
    """Read-only access to absolute paths (`/proc/meminfo`) of some device's filesystem."""

    def read(self, path: str) -> str | None:
        """The file's text, or None when it is absent or unreadable."""
        ...

    def glob(self, pattern: str) -> list[str]:
        """Existing paths matching a shell pattern (`*` within one component), naturally sorted."""
        ...


def natural_key(text: str) -> list[object]:
    """Sort `policy10` after `policy6` and `thermal_zone10` after `thermal_zone9`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


_READ_SIZE = 1 << 16


class LocalTree:
    """Files under a directory of this machine; `LocalTree("/")` is the machine itself."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)
        # plain string joins: the sampler reads ~20 files per tick, pathlib costs add up
        self._prefix = str(self.root).rstrip("/")

    def read(self, path: str) -> str | None:
        # os.read rather than open(): a text file object costs twice the syscalls' time, and
        # the sampler pays it ~20 times a tick
        try:
            fd = os.open(self._prefix + path, os.O_RDONLY)
        except (OSError, ValueError):  # absent, EACCES, NUL in the path
            return None
        try:
            # a /proc or /sys file comes whole in one read; a read that fills the buffer
            # may have more behind it (a big fixture, a file that grew): read on
            data = chunk = os.read(fd, _READ_SIZE)
            while len(chunk) == _READ_SIZE:
                chunk = os.read(fd, _READ_SIZE)
                data += chunk
        except OSError:  # EIO/ENODATA: a sensor that failed its read
            return None
        finally:
            os.close(fd)
        return data.decode("utf-8", errors="replace")

    def glob(self, pattern: str) -> list[str]:
        folder, _, name = pattern.rpartition("/")
        if _glob.has_magic(folder):
            n = len(self._prefix)
            found = _glob.glob(_glob.escape(self._prefix) + pattern)
            return sorted((p[n:] for p in found), key=natural_key)
        try:  # the readers' patterns (`.../policy*`): one listdir, half glob's cost
            names = os.listdir(self._prefix + folder)
        except OSError:
            return []
        return sorted((f"{folder}/{n}" for n in fnmatch.filter(names, name)
                       if not n.startswith(".")), key=natural_key)

    def __repr__(self) -> str:
        return f"LocalTree({str(self.root)!r})"


class SnapshotTree:
    """Files captured at one instant from a remote device: {absolute path: text}."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.files = dict(files)
        # folders exist where files are under them: readers glob `policy*` and read inside
        self._paths = set(self.files)
        for path in self.files:
            parts = path.split("/")
            self._paths.update("/".join(parts[:i]) for i in range(2, len(parts)))

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def glob(self, pattern: str) -> list[str]:
        parts = pattern.split("/")
        hits = [p for p in self._paths if _match_parts(p.split("/"), parts)]
        return sorted(hits, key=natural_key)

    def __repr__(self) -> str:
        return f"SnapshotTree({len(self.files)} files)"


def _match_parts(path: list[str], pattern: list[str]) -> bool:
    return len(path) == len(pattern) and all(
        fnmatch.fnmatchcase(a, b) for a, b in zip(path, pattern))


def as_tree(root: str | os.PathLike[str] | Tree) -> Tree:
    if isinstance(root, (str, os.PathLike)):
        return LocalTree(root)
    return root


# The marker that separates files in a batched remote read; no kernel file starts with it.
MARKER = "@@abbench@@ "


def batch_script(globs: Iterable[str], commands: Mapping[str, str] | None = None) -> str:
    """A POSIX sh script printing `MARKER path` then the file, for every file the globs match.

    Built only from the fixed patterns in this package (checked here), never from a user's
    value, so it needs no quoting; `commands` maps a pseudo-path to a fixed command whose
    output is captured under that path (Android's `dumpsys battery`, for example).
    """
    patterns = list(globs)
    for text in [*patterns, *(commands or {})]:
        if not re.fullmatch(r"[A-Za-z0-9_/*.\-]+", text):
            raise ValueError(f"unsafe path pattern in a batch script: {text!r}")
    for command in (commands or {}).values():
        if not re.fullmatch(r"[A-Za-z0-9_ .\-]+", command):
            raise ValueError(f"unsafe command in a batch script: {command!r}")
    # one line, `;`-separated: old adb servers mangle newlines in a shell command
    parts = [
        f"for f in {' '.join(patterns)}; do"
        f' if [ -f "$f" ]; then echo "{MARKER}$f"; cat "$f"; echo; fi; done 2>/dev/null',
    ]
    for path, command in (commands or {}).items():
        parts.append(f'echo "{MARKER}{path}"; {command} 2>/dev/null')
    parts.append("true")  # exit 0 when the shell ran, whatever the last command did
    return "; ".join(parts)


def parse_batch(text: str) -> SnapshotTree:
    """The files of a `batch_script` run's output; a file that could not be read is absent."""
    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(MARKER):
            current = files.setdefault(line[len(MARKER):].strip(), [])
        elif current is not None:
            current.append(line)
    return SnapshotTree({path: "\n".join(lines).strip("\n") + "\n"
                         for path, lines in files.items()
                         if any(line.strip() for line in lines)})
