"""CPU time: the whole device's from /proc/stat, a process's from /proc/PID/stat, and the
foreign load — the busy cores that neither the cell nor the campaign took.

A burst of background work (an app update on a phone, another job on a shared machine)
that lands on one cell of a pair makes the pair's ratio a lie; the temperatures and caps
do not show it, CPU time does. Between two readings:

    foreign cores = (Δ device busy − Δ own) / (Δt · USER_HZ), clipped at 0

where "own" is the CPU time of the campaign's process tree where it runs on the device
(`/proc/self` and its live descendants: the sampler thread, a simulated device's throttle,
every cell it starts, the speed probe's worker) and of the watched processes' trees (the
cell's root process, `watch`). Threads are inside a process's times, reaped children in
its cutime/cstime, so the sum is continuous as processes come and go: a child that exits
moves from its own line into its reaper's cutime. Readings go through a `Tree`, so fixture
trees and adb/ssh snapshots serve as well as `/`. Every per-tick value covers the interval
since the previous reading, so the mean over the ticks inside any span (a cell, a slice of
one) is that span's foreign load.

Where it cannot be measured it is left out, never 0: no readable /proc/stat, or a watched
process that never appeared in the tree. A remote device's cell is watched as its process
group there, summed by the snapshot itself (`group_jiffies_script`), and not measured
until its `pid` file is there. The reading right after the watched set changes is
left out too: a process watched in mid-life brings CPU time from before the previous
reading, which belongs to no interval.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from abbench.records import keys
from abbench.sensors.readers import Root, fail_soft
from abbench.sensors.tree import Tree, as_tree

PROC_STAT = "/proc/stat"
# USER_HZ, the unit of /proc/stat and /proc/PID/stat: 100 on every Linux and Android ABI
# (the kernel scales its own tick to it); this machine's own value where it can be asked.
REMOTE_USER_HZ = 100
# /proc/stat's `cpu` line: user nice system idle iowait irq softirq steal guest guest_nice;
# busy is every field but idle and iowait (guest time is already inside user and nice).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
# /proc/PID/stat fields after `(comm)`: state is [0], utime..cstime are [11..14]
_TIMES = slice(11, 15)
MAX_DESCENDANTS = 256  # a fork bomb in an external cell must not stall the sampler
# A remote cell's CPU time, summed on the device over its process group (the pgid its
# `pid` file records) by the snapshot itself (`group_jiffies_script`): a pseudo-file.
GROUP_FILE = "/abbench/cell_jiffies"


def group_jiffies_script(pid_file: str, marker: str) -> str:
    """A one-line sh segment printing `marker GROUP_FILE` then the summed utime, stime,
    cutime and cstime of every process in the group `pid_file` names (nothing while the
    file is not there yet)."""
    return (f"if read -r p g s < {shlex.quote(pid_file)} 2>/dev/null; then t=0; "
            'for f in /proc/[0-9]*/stat; do read -r l < "$f" 2>/dev/null || continue; '
            'set -- ${l##*) }; [ "$3" = "$g" ] && t=$((t + ${12} + ${13} + ${14} + ${15})); '
            f'done; echo "{marker}{GROUP_FILE}"; echo "$t"; fi')


def local_user_hz() -> int:
    """This machine's clock tick (`getconf CLK_TCK`), REMOTE_USER_HZ where it cannot say."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        hz = os.sysconf("SC_CLK_TCK")
        if hz > 0:
            return hz
    return REMOTE_USER_HZ


@dataclass(frozen=True)
class CpuStat:
    busy_jiffies: int  # every CPU's busy time since boot, in USER_HZ ticks
    runnable: int | None  # tasks running or ready to run (procs_running) at the reading


def read_cpu_stat(root: Root = "/") -> CpuStat | None:
    """The aggregate `cpu` line and the run queue, None when unreadable.

    /proc/stat:
        cpu  4705 356 584 3699 23 23 0 0 0 0
        cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0
        intr 1462898 ...
        procs_running 2
        procs_blocked 0
    (the `cpu` fields in USER_HZ ticks, summed over every CPU; older kernels end at steal)
    """
    text = as_tree(root).read(PROC_STAT)
    if text is None:
        return None
    busy: int | None = None
    runnable: int | None = None
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            fields = rest.split()
            if len(fields) >= 4:  # user nice system idle, at least
                with contextlib.suppress(ValueError):
                    busy = sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
        elif name == "procs_running":
            with contextlib.suppress(ValueError):
                runnable = int(rest.strip())
    return None if busy is None else CpuStat(busy, runnable)


def process_jiffies(root: Root, pid: int | str) -> int | None:
    """utime + stime + cutime + cstime of a process (its threads and its reaped children),
    None when it is gone or unreadable.

    /proc/PID/stat:   "4242 (python3 -m x) S 4200 ... 17 12 3 1 20 0 ..."
    comm may hold spaces and parentheses: the fields are counted after the last `)`.
    """
    text = as_tree(root).read(f"/proc/{pid}/stat")
    if text is None:
        return None
    after = text.rpartition(")")[2].split()
    try:
        return sum(int(x) for x in after[_TIMES]) if len(after) >= _TIMES.stop else None
    except ValueError:
        return None


def descendants(root: Root, pid: int | str) -> list[int]:
    """The live descendants of `pid`, breadth first, at most MAX_DESCENDANTS.

    /proc/PID/task/TID/children:   "4243 4250 " (that thread's children; needs
    CONFIG_PROC_CHILDREN — without it a live child's CPU reads as foreign until reaped)
    """
    tree = as_tree(root)
    found: list[int] = []
    seen: set[int | str] = {pid}
    todo: list[int | str] = [pid]
    while todo and len(found) < MAX_DESCENDANTS:
        parent = todo.pop(0)
        # each thread's file, found by listing the threads (one listdir) and reading
        # past the ones that exit meanwhile: a glob through `*/children` costs twice that
        for task in tree.glob(f"/proc/{parent}/task/*"):
            for word in (tree.read(f"{task}/children") or "").split():
                if word.isdigit() and int(word) not in seen:
                    seen.add(int(word))
                    found.append(int(word))
                    todo.append(int(word))
    return found[:MAX_DESCENDANTS]


@fail_soft
def collect_run_queue(root: Root = "/") -> dict[str, Any]:
    """`load.runnable_tasks`: /proc/stat's procs_running (the cell's own threads included)."""
    stat = read_cpu_stat(root)
    if stat is None or stat.runnable is None:
        return {}
    return {keys.RUNNABLE_TASKS: stat.runnable}


class ForeignLoad:
    """The foreign load between consecutive readings of one device (not thread-safe: the
    device reads under its lock).

    `own` is the campaign process's /proc entry where the campaign runs on the device
    (`"self"`: it and its descendants are own), None where it does not (adb, ssh).
    `watch(pids)` names the cell's root processes, `watch(())` forgets them.
    """

    def __init__(self, user_hz: float, own: str | None = "self") -> None:
        if not user_hz > 0:
            raise ValueError(f"USER_HZ must be positive, got {user_hz}")
        self.user_hz = user_hz
        self.own = own
        self._roots: tuple[int, ...] = ()
        self._group = False  # a remote cell: its group's time is the snapshot's GROUP_FILE
        self._seen: set[int] = set()  # watched roots read at least once
        self._own_seen = False  # `own` read at the last reading (absent from a fixture tree)
        self._last: tuple[float, int, int] | None = None  # (t, busy, own) of the last reading

    def watch(self, pids: Iterable[int]) -> None:
        roots = tuple(dict.fromkeys(int(p) for p in pids))
        if roots != self._roots:
            self._roots = roots
            self._seen = set()
            self._last = None  # see the module docstring: the next reading is a baseline

    def watch_group(self, on: bool) -> None:
        """Count a remote cell's process group (the snapshot's GROUP_FILE) as own."""
        if on != self._group:
            self._group = on
            self._last = None  # the next reading is a baseline

    @fail_soft
    def read(self, root: Root, clock: Callable[[], float]) -> dict[str, Any]:
        """`load.runnable_tasks` and, from the second reading on, `load.foreign_cores`."""
        tree = as_tree(root)
        t = clock()
        stat = read_cpu_stat(tree)
        own = self._own_jiffies(tree) if stat is not None else None
        last = self._last
        self._last = None if stat is None or own is None else (t, stat.busy_jiffies, own)
        out: dict[str, Any] = {}
        if stat is not None and stat.runnable is not None:
            out[keys.RUNNABLE_TASKS] = stat.runnable
        if self._last is None or last is None or t <= last[0]:
            return out
        foreign = (self._last[1] - last[1]) - (self._last[2] - last[2])
        out[keys.FOREIGN_CORES] = round(max(0.0, foreign / ((t - last[0]) * self.user_hz)), 3)
        return out

    def _own_jiffies(self, tree: Tree) -> int | None:
        """The CPU time of the campaign's process tree (every cell it started included)
        and of the watched processes' trees; None while a watched root has never been seen
        (its CPU would read as foreign) or when the campaign's own line went unreadable."""
        counted: dict[int | str, int] = {}
        if self._group:  # None until the cell's `pid` file is there
            text = tree.read(GROUP_FILE)
            return int(text) if text is not None and text.strip().isdigit() else None
        if self.own is not None:
            mine = process_jiffies(tree, self.own)
            if mine is None and self._own_seen:  # unknown now; a baseline without it next
                self._own_seen = False
                return None
            self._own_seen = mine is not None
            if mine is not None:
                self._count(tree, self.own, mine, counted)
        for root in self._roots:
            if root in counted:  # the campaign's own child, as a cell is
                self._seen.add(root)
                continue
            mine = process_jiffies(tree, root)
            if mine is None:
                if root not in self._seen:
                    return None
                continue  # gone: reaped, its time is in its reaper's cutime
            self._seen.add(root)
            self._count(tree, root, mine, counted)
        return sum(counted.values())

    @staticmethod
    def _count(tree: Tree, root: int | str, jiffies: int,
               counted: dict[int | str, int]) -> None:
        counted[root] = jiffies
        for pid in descendants(tree, root):
            if pid not in counted:  # one root may descend from another
                counted[pid] = process_jiffies(tree, pid) or 0
