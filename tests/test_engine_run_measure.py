"""A pass's measures (`engine/run/measure.py`): the peak resident memory an engine reports
is its own, not the process's that started it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from abbench.engine.run.measure import peak_rss_mib, rss_mib

CHILD = "from abbench.engine.run.measure import peak_rss_mib; print(peak_rss_mib())"


def test_a_child_of_a_large_process_reports_its_own_peak() -> None:
    """Linux carries the parent's ru_maxrss into a child it forks and execs; VmHWM is the
    child's own. A parent holding 400 MiB starts a child that holds far less."""
    held = np.ones(400 * 2**20 // 8)  # (52428800,) touched: resident
    assert peak_rss_mib() > 400
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=120)
    assert float(out.stdout) < 300, out.stdout
    del held


def test_without_vmhwm_the_peak_is_ru_maxrss(tmp_path: Path) -> None:
    """Where /proc says nothing of VmHWM (another kernel), the peak is getrusage's."""
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t1000 kB\n")
    assert peak_rss_mib(str(status)) == peak_rss_mib(str(tmp_path / "absent")) > 0
    status.write_text("VmHWM:\t2048 kB\n")
    assert peak_rss_mib(str(status)) == 2.0


def test_resident_memory_now_follows_what_is_touched() -> None:
    before = rss_mib()
    held = np.ones(96 * 2**20 // 8)  # (12582912,) touched: resident
    assert rss_mib() - before > 90
    del held


def test_a_forked_child_reads_its_own_resident_memory() -> None:
    """The descriptor kept open names the parent's /proc/self/statm: a forked child opens
    its own, so its reading is what its own statm says, 128 MiB it alone touched
    included (the parent's would lack them)."""
    rss_mib()  # the descriptor open in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: touch 128 MiB, report, leave without cleanup handlers
        held = np.ones(128 * 2**20 // 8)
        with open("/proc/self/statm", "rb") as f:
            own = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        os.write(write, f"{rss_mib()} {own}".encode())
        del held
        os._exit(0)
    os.close(write)
    got, own = map(float, os.read(read, 128).split())
    os.waitpid(pid, 0)
    os.close(read)
    assert abs(got - own) < 16, (got, own)
