"""Writing files so that a crash never leaves a half-written one: temp file, fsync, rename
for whole files; one locked `write()` per line, undone on failure, for appended files.

An `OSError` raised here names the file it was writing (`e.filename`), so the caller's error
boundary can say which file a full disk refused; `WriteError.from_os` turns it into the
one-line message the CLI prints.

Test-only fault injection (tests/test_faults.py, docs/reliability.md): with the environment
variable `ABBENCH_FAULT="ACTION:POINT:N"`, the Nth time this process reaches POINT, ACTION
happens there: `kill` SIGKILLs the process (a crash), `interrupt` sends it SIGINT (Ctrl-C),
`enospc` raises ENOSPC (a full disk). A POINT is a file name, reached halfway through
writing it (half its bytes written), or `before-cell` in the campaign runner. Unset, it
costs one environment lookup per write.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import tempfile
import threading
import warnings
from collections import Counter
from pathlib import Path

FAULT_ENV = "ABBENCH_FAULT"
_fault_lock = threading.Lock()
_fault_hits: Counter[str] = Counter()




def fault(point: str) -> None:
    """The test-only fault hook described in the module docstring."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    action, _, rest = spec.partition(":")
    where, _, nth = rest.rpartition(":")
    if where != point:
        return
    with _fault_lock:
        _fault_hits[point] += 1
        if str(_fault_hits[point]) != nth:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "interrupt":
        signal.raise_signal(signal.SIGINT)
    elif action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _write_all(fd: int, data: bytes, name: str) -> None:
    """All of `data` (os.write may write less); the fault hook fires halfway through."""
    view = memoryview(data)
    half = len(view) // 2 if os.environ.get(FAULT_ENV) else len(view)
    _write_fully(fd, view[:half])
    fault(name)
    _write_fully(fd, view[half:])


def _write_fully(fd: int, part: memoryview) -> None:
    while part:
        part = part[os.write(fd, part):]


def umask() -> int:
    """The process's umask: from /proc where the kernel says it (Linux 4.7 on), else by
    setting it and putting it straight back (the only other way to read it)."""
    with contextlib.suppress(OSError, ValueError), \
            open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def folder_mode() -> int:
    """The mode `mkdir` gives a new folder (0755 under the usual umask): what abbench makes
    through a temporary folder (mkdtemp makes 0700) gets it too, so a run folder reads as
    the user's other folders do."""
    return 0o777 & ~umask()


def file_mode(path: Path) -> int:
    """The mode a file written whole over `path` gets: the permission bits of the file it
    replaces, as a shell's `>` keeps them; a new file the mode `open` would give it (0644
    under the usual umask), not mkstemp's 0600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~umask()


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to a temp file beside `path`, fsync it and rename it over `path`: a
    reader sees the old file or the new one, never half of one.

    What a user names is written as a shell's `>` writes it: a path that is a device, a
    fifo or a socket is written through, never renamed over (`--json /dev/null` stays
    `/dev/null`); a symbolic link stays a link and the file it names gets the text
    (written atomically beside that file); a folder is refused."""
    path = Path(path)
    if not _regular_or_missing(path):
        _write_through(path, text.encode("utf-8"))
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp",
                               dir=path.parent or ".")
    try:
        try:
            os.fchmod(fd, file_mode(path))
            _write_all(fd, text.encode("utf-8"), path.name)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def whole_file_target(path: str | os.PathLike[str]) -> Path:
    """Where a writer that builds a whole file beside its destination (a model, a route
    trace) renames it to: the file a symbolic link names (the link stays a link), else
    `path`. A folder, device, fifo or socket is refused with an `OSError` naming `path`:
    such a file is never renamed over, and these files are not streamed through one."""
    path = Path(path)
    if not _regular_or_missing(path):
        raise OSError(errno.EINVAL, "is not a regular file (a device, fifo or socket); "
                      "this file is written whole, to a regular file", str(path))
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _regular_or_missing(path: Path) -> bool:
    """Whether what `path` names (through a link) is a regular file or nothing; False for
    a device, fifo or socket; a folder raises `IsADirectoryError`. Errors name `path`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    return stat.S_ISREG(st.st_mode)


def _write_through(path: Path, data: bytes) -> None:
    """Write into a device, fifo or socket in place (non-blocking: a fifo nobody reads is
    refused, not waited on)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        _write_fully(fd, memoryview(data))
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        os.close(fd)


def check_own_file(path: str | os.PathLike[str]) -> None:
    """Refuse a file abbench appends to or truncates (a device history, a journal) when it
    is not abbench's to write: a symbolic link (it would write into whatever the link names,
    a user's notes file) or anything but a regular file. A missing file is fine: abbench
    creates it. Raises `OSError` naming the path."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, _LINK_REFUSED, str(path))
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, _NOT_REGULAR, str(path))


_LINK_REFUSED = ("is a symbolic link; abbench appends only to a file of its own there "
                 "(remove the link)")
_NOT_REGULAR = "is not a regular file; abbench appends only to a file of its own there"


def _open_own(path: Path, flags: int) -> int:
    """os.open for a file abbench owns: never through a link (O_NOFOLLOW, so a link made
    after any check is refused too), never a device or fifo (checked on the open file)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, _LINK_REFUSED, str(path)) from e
        raise OSError(e.errno, e.strerror, str(path)) from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, _NOT_REGULAR, str(path))
    return fd


def append_line(path: str | os.PathLike[str], line: str, fsync: bool = True) -> None:
    """Append one line (`line` ends with a newline) as a single locked `write()`.

    Safe for several processes appending to one file (a device's sentinel history): the
    file is opened O_APPEND and held under `flock` for the write, so lines never interleave.
    A line a crash left half-written (no newline at the end of the file) is cut off first,
    with a warning: readers skip a torn last line, and the next line must not glue onto it.
    A write that fails (ENOSPC) is undone the same way, so the file stays whole lines.
    """
    path = Path(path)
    data = line.encode("utf-8")
    fd = _open_own(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size, dropped = _cut_torn_tail(fd)
        if dropped:
            warnings.warn(f"{path}: dropped a torn last line ({dropped} bytes) that an "
                          "interrupted write left", stacklevel=3)
        try:
            _write_all(fd, data, path.name)
            if fsync:
                os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # back to whole lines
            raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        os.close(fd)  # releases the lock


class LineAppender:
    """Lines appended to a file only this process writes, many a second (a campaign's
    samples.jsonl, one line a sampler tick): the file is held open and each line is one
    `write()`, where `append_line` opens, locks, checks and closes it for every line (six
    system calls more, a sixth of a 10 Hz sampler's cost). As there: the file is abbench's
    own (no link, a regular file), a torn last line is cut off when it is first opened,
    and a line that fails to write (ENOSPC) is undone. Thread-safe; `close()` when done.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._size = 0  # where the file ends: this process is its only writer
        self._lock = threading.Lock()

    def append(self, line: str) -> None:
        """Append `line` (ending with a newline); an OSError names the file."""
        data = line.encode("utf-8")
        with self._lock:
            if self._fd is None:
                fd = _open_own(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
                try:
                    self._size, dropped = _cut_torn_tail(fd)
                except OSError as e:
                    os.close(fd)
                    raise OSError(e.errno, e.strerror, str(self.path)) from e
                if dropped:
                    warnings.warn(f"{self.path}: dropped a torn last line ({dropped} bytes) "
                                  "that an interrupted write left", stacklevel=2)
                self._fd = fd
            try:
                _write_all(self._fd, data, self.path.name)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)  # back to whole lines
                raise OSError(e.errno, e.strerror, str(self.path)) from e
            self._size += len(data)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def cut_torn_tail(path: str | os.PathLike[str]) -> int:
    """Cut a half-written last line (no newline after it) off a lines file, under the same
    lock appenders take; the bytes dropped (0: none, or no file)."""
    try:
        fd = _open_own(Path(path), os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _cut_torn_tail(fd)[1]
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int) -> tuple[int, int]:
    """Truncate the open file after its last newline: (size afterwards, bytes dropped).

    A last line without its newline that still parses as a JSON object was written whole
    (readers count it): it keeps its line and gets the newline instead."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size, 0
    keep = size
    while keep > 0:
        start = max(0, keep - 65536)
        nl = os.pread(fd, keep - start, start).rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        keep = start
    try:
        whole = isinstance(json.loads(os.pread(fd, size - keep, keep)), dict)
    except (ValueError, RecursionError):
        whole = False
    if whole:
        _write_fully(fd, memoryview(b"\n"))
        return size + 1, 0
    os.ftruncate(fd, keep)
    return keep, size - keep


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (another user's counts): what a killed process
    left, named by its pid (an import's staging folder, a cell's memory cgroup), may go
    once it does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
