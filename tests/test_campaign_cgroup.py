"""A cell's memory limit (abbench/campaign/cgroup.py, docs/cells.md#memory-limits): the
controller found in fixture trees, the keys refused where it cannot be set, and on a host
with a memory controller (root here and in CI) a real group: a child past its limit is
OOM-killed and the campaign says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REFERENCE
from test_campaign_run import abbench, run_folder, write_campaign

from abbench.campaign import cgroup
from abbench.campaign.plan import describe
from abbench.campaign.schema import load_campaign
from abbench.errors import CampaignFileError
from abbench.records import MemoryUse, read_journal, read_plan

V1_MOUNTS = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
REAL = cgroup.unavailable()


def _tree(tmp: Path, mounts: str, groups: str, controllers: str | None = None) -> Path:
    (tmp / "proc/self").mkdir(parents=True)
    (tmp / "proc/self/mounts").write_text(mounts)
    (tmp / "proc/self/cgroup").write_text(groups)
    if controllers is not None:
        (tmp / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
        (tmp / "sys/fs/cgroup/cgroup.controllers").write_text(controllers)
    return tmp


def test_the_controller_is_found_in_v1_and_in_v2_with_memory(tmp_path: Path) -> None:
    v1 = cgroup.controller(_tree(tmp_path / "a", V1_MOUNTS, "4:memory:/user/x\n0::/\n"))
    assert v1 == cgroup.Controller(tmp_path / "a/sys/fs/cgroup/memory", "/user/x", False)
    v2 = cgroup.controller(_tree(tmp_path / "b", V2_MOUNTS, "0::/session\n", "cpu io memory"))
    assert v2 == cgroup.Controller(tmp_path / "b/sys/fs/cgroup", "/session", True)


def test_no_controller_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    no_memory = cgroup.controller(_tree(tmp_path / "a", V2_MOUNTS, "0::/\n", "cpu io pids"))
    assert isinstance(no_memory, str) and "no memory controller" in no_memory
    assert "no memory cgroup controller" in str(
        cgroup.controller(_tree(tmp_path / "b", "proc /proc proc rw 0 0\n", "0::/\n")))
    assert "cannot read" in str(cgroup.controller(tmp_path / "nothing"))


def test_unavailable_without_the_right_to_make_a_group(tmp_path: Path) -> None:
    root = _tree(tmp_path, V1_MOUNTS, "4:memory:/gone\n")
    why = cgroup.unavailable(root)  # the own group's folder is not there to write in
    assert why is not None and "no right to make a memory cgroup" in why


def test_use_reads_the_peak_and_the_oom_kills_of_each_version(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.max_usage_in_bytes").write_text(f"{300 * 2**20}\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cgroup.use(cgroup.CellGroup(v1, False, 256)) == MemoryUse(256, 300.0, 2)
    v2 = tmp_path / "v2"
    v2.mkdir()  # a kernel before 5.19 keeps no memory.peak: unknown, not 0
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 0\n")
    got = cgroup.use(cgroup.CellGroup(v2, True, 512))
    assert got == MemoryUse(512, None, 0) and not got.oom_killed


def test_groups_of_campaigns_that_no_longer_run_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f"abbench-{dead}-01-B"
    mine = tmp_path / f"abbench-{os.getpid()}-02-C"  # this campaign's: it runs
    busy = tmp_path / f"abbench-{dead}-03-D"  # rmdir refuses a group with a process
    for group in (left, mine, busy):
        group.mkdir()
    (busy / "cgroup.procs").write_text("1\n")
    assert cgroup.remove_stale(tmp_path) == [left]
    assert not left.exists() and mine.exists() and busy.exists()


def _allocate_in(limit_mib: float, mib: int, name: str
                 ) -> tuple[int, MemoryUse, cgroup.CellGroup]:
    """A child that allocates `mib` MiB, run in a new group of `limit_mib`: its exit
    status, what the group recorded, and the group (removed by then)."""
    group = cgroup.make(limit_mib, name)
    try:
        child = subprocess.run(cgroup.joined(group, [sys.executable, "-c",
                                                     f"b = bytearray({mib} * 2**20)"]))
        used = cgroup.use(group)
    finally:
        cgroup.remove(group)
    return child.returncode, used, group


@pytest.mark.skipif(REAL is not None, reason=f"no memory cgroup here: {REAL}")
def test_a_child_past_its_limit_is_oom_killed_in_its_own_group() -> None:
    code, used, group = _allocate_in(64, 256, "abbench-test-past")
    assert code == -9 and used.oom_killed and used.limit_mib == 64
    assert used.peak_mib is not None and used.peak_mib <= 64 + 1
    assert not group.path.exists()
    code, used, _ = _allocate_in(256, 32, "abbench-test-within")
    assert code == 0 and used.oom_kills == 0
    assert used.peak_mib is not None and 32 < used.peak_mib < 256


def _file(tmp: Path, body: str, transport: str = "local", campaign: str = "") -> Path:
    path = tmp / "cells.toml"
    path.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "m"
        {campaign}

        [device]
        transport = "{transport}"

        [workload]
        model = "synthetic:tiny"
        """) + textwrap.dedent(body))
    return path


def test_a_limit_on_a_remote_device_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = _file(tmp_path, "memory_limit_mib = 512\n\n[cells.A]\nmodel = \"/m.gguf\"\n",
                 "ssh:phone")
    with pytest.raises(CampaignFileError) as e:
        load_campaign(path)
    assert e.value.key == ("workload", "memory_limit_mib")
    assert "`ssh:phone` runs its cells there" in e.value.problem


def test_a_host_without_a_controller_refuses_the_key(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "unavailable", lambda: "this kernel has no memory cgroup "
                        "controller mounted (neither v1 nor v2)")
    with pytest.raises(CampaignFileError) as e:
        load_campaign(_file(tmp_path, "[cells.A]\nmemory_limit_mib = 300\n"))
    assert e.value.key == ("cells", "A", "memory_limit_mib")
    assert "cannot be set here: this kernel has no memory cgroup" in e.value.problem


@pytest.mark.parametrize("value", ["8", "-1", '"2G"', "nan", "inf", "true", "1e400"])
def test_a_limit_out_of_range_or_of_the_wrong_type_is_refused(tmp_path: Path,
                                                              value: str) -> None:
    with pytest.raises(CampaignFileError) as e:
        load_campaign(_file(tmp_path, f"[cells.A]\nmemory_limit_mib = {value}\n"))
    assert e.value.key[-1] == "memory_limit_mib"


@pytest.mark.skipif(REAL is not None, reason=f"no memory cgroup here: {REAL}")
def test_the_limit_is_part_of_the_arm_and_absent_keeps_the_old_identity(tmp_path: Path
                                                                       ) -> None:
    spec = load_campaign(_file(tmp_path, """\
        [cells.A]
        [cells.A-small]
        memory_limit_mib = 300
        """))
    a, small = spec.cells["A"].planned(), spec.cells["A-small"].planned()
    assert "memory_limit_mib" not in a.to_json() and a.memory_limit_mib is None
    assert small.memory_limit_mib == 300.0 and a.key != small.key
    with pytest.raises(CampaignFileError) as e:
        load_campaign(_file(tmp_path, """\
            [cells.A]
            memory_limit_mib = 300
            [cells.B]
            """, campaign='interleave = "slices"'))
    assert e.value.key == ("campaign", "interleave")
    assert "runs in a memory cgroup of its own" in e.value.problem


@pytest.mark.skipif(REAL is not None, reason=f"no memory cgroup here: {REAL}")
def test_the_printed_plan_names_each_cells_limit(tmp_path: Path) -> None:
    spec = load_campaign(_file(tmp_path, """\
        [cells.A]
        [cells.A-small]
        memory_limit_mib = 300
        """))
    assert "memory_limit_mib" not in describe(spec.cells["A"].planned())
    assert describe(spec.cells["A-small"].planned()).endswith(" memory_limit_mib=300")


def test_a_failure_names_the_oom_kills_only_where_there_were_some() -> None:
    assert cgroup.explained("exited with status 1", MemoryUse(64, 64.0, 0)) \
        == "exited with status 1"
    assert cgroup.explained(None, MemoryUse(64, 64.0, 3)) is None  # an ok cell
    assert cgroup.explained("killed by SIGKILL", MemoryUse(64, 64.0, 2)) == (
        "killed by SIGKILL: the kernel's OOM killer ended 2 processes in it at its memory "
        "limit (64 MiB, `memory_limit_mib`)")


@pytest.mark.skipif(REAL is not None, reason=f"no memory cgroup here: {REAL}")
def test_a_campaign_cell_past_its_limit_fails_with_the_oom_killer_named(
        tiny_model: Path, tmp_path: Path) -> None:
    src = REFERENCE / "v1-desktop-2026-07-24" / "pc-E-c5000-io4t4.csv"
    script = tmp_path / "run.py"
    script.write_text(f"import shutil\nshutil.copy({str(src)!r}, {str(tmp_path / 'o.csv')!r})\n")
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.roomy]
        memory_limit_mib = 1024

        [cells.tight]
        memory_limit_mib = 24

        [cells.ext]
        command = ["{sys.executable}", "{script}"]
        output = "bmoe-csv:{tmp_path / 'o.csv'}"
        memory_limit_mib = 128
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    folder = run_folder(tmp_path / "r")
    roomy, tight, ext = read_journal(folder)
    assert ext.status == "ok" and ext.memory is not None and ext.memory.limit_mib == 128
    assert ext.memory.peak_mib is not None and 0 < ext.memory.peak_mib <= 128
    assert roomy.status == "ok", roomy.error
    assert roomy.memory is not None and roomy.memory.limit_mib == 1024
    assert roomy.memory.oom_kills == 0 and roomy.memory.peak_mib is not None
    assert 24 < roomy.memory.peak_mib < 1024
    assert tight.status == "failed" and tight.memory is not None and tight.memory.oom_killed
    assert tight.error is not None and "killed by SIGKILL" in tight.error
    assert "the kernel's OOM killer ended 1 process in it at its memory limit (24 MiB" \
        in tight.error
    limits = [1024.0, 24.0, 128.0]
    assert [getattr(c.config, "memory_limit_mib", None) for c in read_plan(folder).cells] \
        == limits
    report = json.loads((folder / "report.json").read_text())
    assert [c["memory"]["limit_mib"] for c in report["cells"]] == limits
    md = (folder / "report.md").read_text()
    assert "cgroup peak / limit" in md and "/ 24 MiB, OOM-killed |" in md
    assert f"| {roomy.memory.peak_mib:.0f} / 1024 MiB |" in md
    assert "| memory " in p.stdout  # the terminal's table has the column too
    assert p.returncode != 2, p.stderr
