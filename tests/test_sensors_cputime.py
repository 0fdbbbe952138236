"""sensors/cputime.py: /proc/stat and /proc/PID/stat read through a tree, and the foreign
load — busy cores that neither the cell nor the campaign took — as the counters advance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from abbench.records import keys
from abbench.sensors import Device, Sampler, open_device
from abbench.sensors.cputime import (
    CpuStat,
    ForeignLoad,
    collect_run_queue,
    descendants,
    local_user_hz,
    process_jiffies,
    read_cpu_stat,
)
from abbench.sensors.readers import REMOTE_GLOBS
from abbench.sensors.tree import LocalTree, SnapshotTree

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"
LAPTOP = FIXTURES / "linux-laptop"
PHONE = FIXTURES / "android-qwen"
HZ = 100


def stat_line(pid: int, utime: int, cutime: int = 0, comm: str = "python3") -> str:
    """A /proc/PID/stat line with `utime` and `cutime` (stime and cstime 0)."""
    return (f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194304 100 0 0 0 {utime} 0 {cutime} 0 "
            "20 0 1 0 100 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0\n")


class Proc:
    """A /proc whose counters a test sets between readings."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def glob(self, pattern: str) -> list[str]:
        return SnapshotTree(self.files).glob(pattern)

    def set(self, busy: int, procs: dict[str, tuple[int, int]],
            children: dict[int | str, list[int]] | None = None, running: int = 2) -> None:
        """Device busy ticks; {pid or "self": (utime, cutime)}; {pid: its children}."""
        self.files = {"/proc/stat": f"cpu  {busy} 0 0 99999 0 0 0 0 0 0\n"
                                    f"cpu0 {busy} 0 0 99999 0 0 0 0 0 0\n"
                                    f"procs_running {running}\nprocs_blocked 0\n"}
        for pid, (utime, cutime) in procs.items():
            number = 777 if pid == "self" else int(pid)
            self.files[f"/proc/{pid}/stat"] = stat_line(number, utime, cutime)
        for pid, kids in (children or {}).items():
            self.files[f"/proc/{pid}/task/{pid}/children"] = " ".join(map(str, kids)) + " "


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# --- the readers -------------------------------------------------------------------------

def test_proc_stat_of_the_fixture_trees() -> None:
    # linux-laptop: user 673058 + nice 1578 + system 180597 + irq 5127 + softirq 15611 + steal 0
    assert read_cpu_stat(LAPTOP) == CpuStat(875971, 1)
    phone = read_cpu_stat(PHONE)
    assert phone is not None and phone.runnable == 3
    assert collect_run_queue(LAPTOP) == {keys.RUNNABLE_TASKS: 1}


@pytest.mark.parametrize("root", [LAPTOP, PHONE], ids=lambda p: p.name)
def test_a_remote_snapshot_carries_proc_stat(root: Path) -> None:
    local = LocalTree(root)
    files = {p: local.read(p) or "" for pattern in REMOTE_GLOBS for p in local.glob(pattern)}
    assert read_cpu_stat(SnapshotTree(files)) == read_cpu_stat(root) is not None


def test_an_absent_or_malformed_proc_stat_reads_nothing(tmp_path: Path) -> None:
    assert read_cpu_stat(tmp_path) is None and collect_run_queue(tmp_path) == {}
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "stat").write_text("cpu  x y z\nprocs_running many\n")
    assert read_cpu_stat(tmp_path) is None and collect_run_queue(tmp_path) == {}
    # an old kernel's four fields: no irq, softirq or steal
    (tmp_path / "proc" / "stat").write_text("cpu  10 2 3 400\n")
    assert read_cpu_stat(tmp_path) == CpuStat(15, None)


def test_a_process_line_is_split_after_the_last_parenthesis() -> None:
    tree = SnapshotTree({"/proc/42/stat": stat_line(42, 17, 3, comm="a (b) c)"),
                         "/proc/43/stat": "43 (x) S 1\n"})
    assert process_jiffies(tree, 42) == 20
    assert process_jiffies(tree, 43) is None  # cut short
    assert process_jiffies(tree, 44) is None  # gone


def test_this_process_reads_its_own_time() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc")
    assert (process_jiffies("/", "self") or 0) >= 0
    assert local_user_hz() > 0


def test_descendants_follow_every_thread_and_stop_at_a_cycle() -> None:
    tree = SnapshotTree({"/proc/10/task/10/children": "11 ", "/proc/10/task/12/children": "13",
                         "/proc/11/task/11/children": "14 10", "/proc/14/task/14/children": ""})
    assert descendants(tree, 10) == [11, 13, 14]
    assert descendants(tree, 99) == []


# --- the foreign load --------------------------------------------------------------------

def test_foreign_load_subtracts_the_cell_its_children_and_the_campaign() -> None:
    proc, clock = Proc(), Clock()
    load = ForeignLoad(HZ, "self")
    proc.set(1000, {"self": (50, 0)})
    assert load.read(proc, clock) == {keys.RUNNABLE_TASKS: 2}  # the first reading: a baseline
    clock.t = 1.0
    proc.set(1030, {"self": (60, 0)})  # 30 busy, 10 the campaign's: 0.2 cores foreign
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.2
    load.watch([4242])  # the cell starts: the next reading is a baseline
    clock.t = 2.0
    proc.set(1200, {"self": (60, 0), "4242": (40, 0)})
    assert keys.FOREIGN_CORES not in load.read(proc, clock)
    # 1 s: the cell 120 ticks, the campaign 10, others 50 -> 0.5 cores
    clock.t = 3.0
    proc.set(1380, {"self": (70, 0), "4242": (160, 0)})
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.5
    # a child of the cell: 30 ticks; the cell 100, the campaign 5, others 25 -> 0.25
    clock.t = 4.0
    proc.set(1540, {"self": (75, 0), "4242": (260, 0), "4243": (30, 0)}, {4242: [4243]})
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.25
    # the child ends (20 more ticks) and the cell reaps it: its 50 move into the cell's
    # cutime; the cell 80 more, the campaign 5, others 40 -> 0.4
    clock.t = 5.0
    proc.set(1540 + 20 + 80 + 5 + 40, {"self": (80, 0), "4242": (340, 50)})
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.4
    # the cell ends (10 more ticks) and the campaign reaps it: 400 move into its cutime;
    # others 60 -> 0.6, with the cell's line gone
    clock.t = 6.0
    proc.set(1685 + 10 + 60, {"self": (80, 400)})
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.6
    load.watch([])  # forgotten: a baseline, then foreign load as before
    clock.t = 7.0
    proc.set(1755 + 30, {"self": (80, 400)})
    assert keys.FOREIGN_CORES not in load.read(proc, clock)
    clock.t = 7.5
    proc.set(1785 + 50, {"self": (80, 400)})
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 1.0


def test_the_campaigns_children_are_its_own_without_a_watch() -> None:
    proc, clock = Proc(), Clock()
    load = ForeignLoad(HZ, "self")
    proc.set(1000, {"self": (50, 0), "4242": (0, 0)}, {"self": [4242]})
    load.read(proc, clock)
    clock.t = 1.0  # the campaign's child 120 ticks, the campaign 10, others 50
    proc.set(1180, {"self": (60, 0), "4242": (120, 0)}, {"self": [4242]})
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.5


def test_foreign_load_is_clipped_at_zero_and_needs_time_to_pass() -> None:
    proc, clock = Proc(), Clock()
    load = ForeignLoad(HZ, "self")
    proc.set(1000, {"self": (50, 0)})
    load.read(proc, clock)
    clock.t = 1.0
    proc.set(1005, {"self": (60, 0)})  # the counters disagree by a few ticks
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.0
    proc.set(1100, {"self": (60, 0)})  # no time passed
    assert keys.FOREIGN_CORES not in load.read(proc, clock)


def test_a_cell_the_tree_never_shows_is_not_measured() -> None:
    """Over adb the campaign knows its local client's pid, which the device lacks."""
    proc, clock = Proc(), Clock()
    load = ForeignLoad(HZ, None)
    load.watch([31337])
    for t, busy in ((0.0, 1000), (1.0, 1100), (2.0, 1200)):
        clock.t = t
        proc.set(busy, {})
        assert load.read(proc, clock) == {keys.RUNNABLE_TASKS: 2}
    load.watch([])  # between cells: everything busy is foreign (nothing of ours runs there)
    for t, busy in ((3.0, 1300), (4.0, 1450)):
        clock.t = t
        proc.set(busy, {})
        values = load.read(proc, clock)
    assert values[keys.FOREIGN_CORES] == 1.5


def test_no_proc_stat_no_reading_and_the_campaign_line_going_is_a_gap() -> None:
    proc, clock = Proc(), Clock()
    load = ForeignLoad(HZ, "self")
    assert load.read(proc, clock) == {}
    proc.set(1000, {"self": (50, 0)})
    load.read(proc, clock)
    clock.t = 1.0
    proc.set(1100, {})  # the campaign's own line unreadable: unknown, not 1.0
    assert keys.FOREIGN_CORES not in load.read(proc, clock)
    clock.t = 2.0
    proc.set(1150, {})  # a baseline without it ...
    assert keys.FOREIGN_CORES not in load.read(proc, clock)
    clock.t = 3.0
    proc.set(1200, {})  # ... and readings again
    assert load.read(proc, clock)[keys.FOREIGN_CORES] == 0.5


# --- the device and the sampler ----------------------------------------------------------

class Stepping(Proc):
    """Every /proc/stat read is one more second: busy +180 ticks-per-100, of which the cell
    (pid 4242) took 120 and the campaign 10 — 0.5 foreign cores at 100 ticks a second."""

    def __init__(self, hz: int) -> None:
        super().__init__()
        self.hz = hz
        self.step = 0
        self._lock = threading.Lock()
        self._write()

    def _write(self) -> None:
        s, u = self.step, self.hz / 100
        self.set(round((1000 + 180 * s) * u), {"self": (round(10 * s * u), 0),
                                               "4242": (round(120 * s * u), 0)})

    def now(self) -> float:
        return float(self.step)

    def read(self, path: str) -> str | None:
        with self._lock:
            text = super().read(path)
            if path == "/proc/stat":
                self.step += 1
                self._write()
            return text


class Transport:
    kind, spec, on_host = "local", "local", False

    def __init__(self, tree: Any) -> None:
        self.tree = tree

    def snapshot(self) -> Any:
        return self.tree


def test_a_sampler_tick_counts_the_watched_cell_as_its_own() -> None:
    hz = local_user_hz()
    tree = Stepping(hz)
    device = Device(Transport(tree), "fake", clock=lambda: tree.step * 1.0)  # type: ignore[arg-type]
    device.watch(4242)
    got: list[dict[str, Any]] = []
    with Sampler(device, hz=200, sink=lambda m, w, v: got.append(v)):
        deadline = time.monotonic() + 5
        while len(got) < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
    assert len(got) >= 4
    assert keys.FOREIGN_CORES not in got[0]  # the baseline
    assert [v[keys.FOREIGN_CORES] for v in got[1:4]] == [0.5, 0.5, 0.5]
    assert all(v[keys.RUNNABLE_TASKS] == 2 for v in got)
    device.watch()  # forgotten: the cell's own 1.2 cores read as foreign from now on
    assert keys.FOREIGN_CORES not in device.sample()
    assert device.sample()[keys.FOREIGN_CORES] == 1.7


def test_a_fixture_device_describes_its_cpu_time() -> None:
    device = open_device("local", root=LAPTOP)
    rows = dict(device.describe())
    assert rows["CPU time"] == ("1 tasks runnable; foreign load from the second reading on "
                                "(/proc/stat)")
    assert device.sample()[keys.FOREIGN_CORES] == 0.0  # a tree that never moves
    rows = dict(open_device("local", root=FIXTURES / "laptop-power").describe())
    assert rows["CPU time"].startswith("missing: no readable /proc/stat")


def _spin() -> int:
    """The pid of a process spinning one core that is not this process's descendant (its
    parent shell exits at once)."""
    done = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' "
                           ">/dev/null 2>&1 </dev/null & echo $!"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_this_machine_attributes_a_watched_process_to_the_cell() -> None:
    """A process spinning: unwatched it is foreign load, watched it is the cell's (both
    over the same second, so other load on this machine counts in both alike)."""
    pid = _spin()
    try:
        tree = LocalTree("/")
        unwatched, watched = ForeignLoad(local_user_hz()), ForeignLoad(local_user_hz())
        watched.watch([pid])
        for load in (unwatched, watched):
            load.read(tree, time.monotonic)
        time.sleep(1.0)
        a, b = (load.read(tree, time.monotonic)[keys.FOREIGN_CORES]
                for load in (unwatched, watched))
    finally:
        os.kill(pid, signal.SIGKILL)
    assert a - b > 0.2, (a, b)  # it had a good part of a core


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_this_machine_counts_the_campaigns_own_children_as_its_own() -> None:
    """A cell is the campaign's child: its CPU is never foreign, watched or not."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        tree = LocalTree("/")
        ours, nothing = ForeignLoad(local_user_hz()), ForeignLoad(local_user_hz(), None)
        for load in (ours, nothing):
            load.read(tree, time.monotonic)
        time.sleep(1.0)
        foreign, busy = (load.read(tree, time.monotonic)[keys.FOREIGN_CORES]
                         for load in (ours, nothing))
    finally:
        child.kill()
        child.wait()
    assert busy - foreign > 0.2, (busy, foreign)  # the child's good part of a core


def test_a_remote_cells_group_time_is_summed_there_and_counted_as_its_own(
        tmp_path: Path) -> None:
    """The snapshot's segment sums the process group a remote cell's `pid` file names, on
    the device (here: this machine's sh and /proc); while watched, that sum is the own
    time, so a busy cell is not foreign load."""
    from abbench.sensors.cputime import GROUP_FILE, group_jiffies_script
    from abbench.sensors.tree import MARKER, parse_batch

    pid_file = tmp_path / "pid"
    script = group_jiffies_script(str(pid_file), MARKER)
    assert "\n" not in script
    assert parse_batch(subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                                      check=True).stdout).files == {}  # no cell yet
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        pid_file.write_text(f"{busy.pid} {busy.pid} 1\n")
        reads = []
        for _ in range(2):
            time.sleep(0.5)
            out = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                                 check=True).stdout
            reads.append(int(parse_batch(out).read(GROUP_FILE) or "-1"))
        assert 0 < reads[0] < reads[1]  # a core's worth of ticks, growing
        load = ForeignLoad(100.0, own=None)
        load.watch_group(True)
        clock = iter([0.0, 0.5]).__next__
        stat = "cpu  {} 0 0 1000 0 0 0 0 0 0\n"
        first = SnapshotTree({"/proc/stat": stat.format(1000), GROUP_FILE: "400\n"})
        second = SnapshotTree({"/proc/stat": stat.format(1050), GROUP_FILE: "450\n"})
        assert load.read(first, clock) == {}
        assert load.read(second, clock) == {keys.FOREIGN_CORES: 0.0}
        assert ForeignLoad(100.0, own=None).read(first, iter([0.0]).__next__) == {}
    finally:
        busy.kill()
        busy.wait()
