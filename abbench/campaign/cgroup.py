"""A cell's memory limit (`memory_limit_mib`): a memory cgroup of its own on this host,
made before the cell starts, joined by the cell's process before it execs, read when it
ends (the peak it reached, whether the kernel's OOM killer ended it) and removed.

A phone gives a process less memory than its model file: the page cache the model's mmap
fills is charged to the same limit as the process's own memory, so past it the kernel
drops pages and faults them in again, or kills. A memory cgroup does the same on a
laptop or a server: v1 (`memory.limit_in_bytes`, the controller's own mount) or v2
(`memory.max`, the unified hierarchy with the `memory` controller enabled). The group is
made under the campaign's own memory cgroup, so every limit above it still applies.

Making a group needs the controller and the right to write to it (root, or a delegated
subtree): `unavailable` says why not, so that the campaign file's key is refused before
anything runs. Swap is limited with memory where the kernel accounts it (v1
`memory.memsw.limit_in_bytes`, v2 `memory.swap.max` = 0): a phone's limit is not
extended by a disk.

The readers take a root folder so that tests run them against fixture trees.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from abbench.engine.streaming.memory import cgroup_key, cgroup_number
from abbench.engine.units import MIB
from abbench.errors import CellOutputError
from abbench.fsutil import process_alive
from abbench.records import MemoryUse

# The child joins its group before it becomes the cell: `$0` is the group's procs file.
JOIN = 'echo $$ > "$0" && exec "$@"'


@dataclass(frozen=True)
class Controller:
    """Where this host's memory controller is, and which version it is."""

    mount: Path  # /sys/fs/cgroup/memory (v1) or the cgroup2 mount (v2)
    own: str  # this process's group under it ("/process_api/x")
    v2: bool


@dataclass(frozen=True)
class CellGroup:
    """One cell's memory cgroup."""

    path: Path
    v2: bool
    limit_mib: float

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"


def controller(root: Path = Path("/")) -> Controller | str:
    """The memory controller this process's cgroup is under, or why there is none."""
    try:
        mounts = (root / "proc/self/mounts").read_text().splitlines()
        groups = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError as e:
        return f"cannot read /proc/self/mounts or /proc/self/cgroup ({e.strerror or e})"
    own_v1 = own_v2 = None
    for line in groups:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[1] == "":
            own_v2 = parts[2]
        elif len(parts) == 3 and "memory" in parts[1].split(","):
            own_v1 = parts[2]
    v2_mount = None
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        where = root / fields[1].lstrip("/")
        if fields[2] == "cgroup" and "memory" in fields[3].split(",") and own_v1 is not None:
            return Controller(where, own_v1, False)
        if fields[2] == "cgroup2" and v2_mount is None:
            v2_mount = where
    if v2_mount is not None and own_v2 is not None:
        try:
            enabled = (v2_mount / "cgroup.controllers").read_text().split()
        except OSError:
            enabled = []
        if "memory" in enabled:
            return Controller(v2_mount, own_v2, True)
        return (f"the cgroup v2 hierarchy at /{v2_mount.relative_to(root)} has no memory "
                "controller (its cgroup.controllers lacks `memory`)")
    return "this kernel has no memory cgroup controller mounted (neither v1 nor v2)"


def unavailable(root: Path = Path("/")) -> str | None:
    """Why a cell's memory limit cannot be set on this host, or None when it can: no
    controller, or no right to make a group under this process's own."""
    found = controller(root)
    if isinstance(found, str):
        return found
    parent = found.mount / found.own.strip("/")
    if not os.access(parent, os.W_OK):
        return (f"no right to make a memory cgroup under {parent} (run the campaign as root, "
                "or in a cgroup delegated to this user)")
    return None


def make(limit_mib: float, name: str, root: Path = Path("/")) -> CellGroup:
    """A new memory cgroup `name` under this process's own, limited to `limit_mib`.
    Raises CellOutputError (the cell fails, with the reason) where that is refused."""
    found = controller(root)
    if isinstance(found, str):
        raise CellOutputError(f"memory_limit_mib: {found}")
    parent = found.mount / found.own.strip("/")
    path = parent / name
    limit = int(limit_mib * MIB)
    remove_stale(parent)
    try:
        if path.is_dir():  # a group a killed campaign left: empty, or rmdir says why
            path.rmdir()
        if found.v2:
            _enable_memory(parent)
        path.mkdir()
        group = CellGroup(path, found.v2, limit_mib)
        if found.v2:
            _write(path / "memory.max", str(limit))
            _write(path / "memory.swap.max", "0", optional=True)
        else:
            _write(path / "memory.limit_in_bytes", str(limit))
            _write(path / "memory.memsw.limit_in_bytes", str(limit), optional=True)
    except OSError as e:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise CellOutputError(f"memory_limit_mib: could not make the memory cgroup {path} "
                              f"({e.strerror or e})") from None
    return group


def remove_stale(parent: Path) -> list[Path]:
    """Remove the groups campaigns that no longer run left under `parent` (killed before
    they removed their cell's group): `abbench-PID-...` whose PID is gone. A group still
    holding a process stays (rmdir refuses). Returns those removed."""
    gone = []
    for group in parent.glob("abbench-*-*"):
        pid = group.name.split("-")[1]
        if not pid.isdigit() or process_alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            group.rmdir()
            gone.append(group)
    return gone


def _enable_memory(parent: Path) -> None:
    """v2: the memory controller enabled for the parent's children (a no-op if it is)."""
    control = parent / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        _write(control, "+memory")


def _write(path: Path, value: str, optional: bool = False) -> None:
    if optional and not path.exists():
        return
    path.write_text(value)


def joined(group: CellGroup, argv: list[str]) -> list[str]:
    """`argv` started inside `group`: a shell writes its own pid to the group and execs
    the cell, so the cell's first instruction runs under the limit (same pid)."""
    return ["/bin/sh", "-c", JOIN, str(group.procs), *argv]


def use(group: CellGroup) -> MemoryUse:
    """What the cell's group recorded: its peak (None where the kernel keeps none: v2
    before Linux 5.19) and how many processes the OOM killer ended in it."""
    peak_file = "memory.peak" if group.v2 else "memory.max_usage_in_bytes"
    peak = cgroup_number(group.path / peak_file)
    events = "memory.events" if group.v2 else "memory.oom_control"
    return MemoryUse(limit_mib=group.limit_mib,
                     peak_mib=None if peak is None else peak / MIB,
                     oom_kills=cgroup_key(group.path / events, "oom_kill"))


def explained(error: str | None, used: MemoryUse) -> str | None:
    """A failed cell's `error` with the OOM kills its group saw, if any."""
    n = used.oom_kills
    if error is None or not n:
        return error
    return (f"{error}: the kernel's OOM killer ended {n} process{'es' if n > 1 else ''} in "
            f"it at its memory limit ({used.limit_mib:g} MiB, `memory_limit_mib`)")


def remove(group: CellGroup, wait_s: float = 2.0) -> None:
    """Remove the cell's group once its processes are gone (a killed process leaves it a
    moment later). One still busy after `wait_s` is left behind; `make` removes it if
    its name comes again."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            group.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)
