"""`[stage]` and the O_DIRECT storage check (campaign/stage.py): the table's checks, the
mount that holds a path, and the check/push logic on a device whose commands run in this
machine's shell. Over a real ssh server, with a real FUSE mount: tests/test_remote_ssh.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from test_campaign_run import abbench

from abbench.campaign.plan import plan_campaign
from abbench.campaign.schema import load_campaign, resolved_toml
from abbench.campaign.stage import check_direct_storage, mount_of, parse_mounts, stage
from abbench.errors import UsageError
from abbench.records.plan import Plan, StageSpec

# /proc/mounts lines in the kernel's format (fs/proc_namespace.c `show_vfsmnt`: source,
# mount point and type with space, tab, newline and backslash as octal escapes, options,
# "0 0"), for an Android-shaped table: the emulated storage on FUSE as the phone engine's
# authors describe it (their docs/benchmark-method.md), /data on f2fs, an app's own folder
# bind-mounted back to /data. This machine's own /proc/mounts is read below too.
ANDROID_MOUNTS = textwrap.dedent("""\
    /dev/block/dm-8 / ext4 ro,seclabel,nodev,relatime 0 0
    tmpfs /dev tmpfs rw,seclabel,nosuid,relatime,mode=755 0 0
    /dev/block/dm-50 /data f2fs rw,lazytime,seclabel,nosuid,nodev,noatime 0 0
    /dev/fuse /storage/emulated fuse rw,lazytime,nosuid,nodev,noexec,allow_other 0 0
    /dev/block/dm-50 /storage/emulated/0/Android/data f2fs rw,lazytime,nosuid 0 0
    /dev/fuse /mnt/my\\040card fuse rw,nosuid,nodev 0 0
    """)



def test_the_mount_holding_a_path_is_the_longest_point_above_it() -> None:
    mounts = parse_mounts(ANDROID_MOUNTS)
    assert mount_of("/data/local/tmp/q.gguf", mounts).fstype == "f2fs"
    assert mount_of("/storage/emulated/0/Download/q.gguf", mounts).fstype == "fuse"
    assert mount_of("/storage/emulated/0/Android/data/x/q.gguf", mounts).fstype == "f2fs"
    assert mount_of("/storage/emulatedX/q.gguf", mounts).fstype == "ext4"  # not a prefix
    assert mount_of("/mnt/my card/q.gguf", mounts).point == "/mnt/my card"
    here = parse_mounts(Path("/proc/mounts").read_text())
    assert mount_of("/proc/self", here).fstype == "proc"


class ShellDevice:
    """A device whose commands run in this machine's sh: the stage logic without a
    transport (the transport's own part runs over the real sshd)."""

    name = "shell-device"

    def __init__(self, mounts: str | None = None) -> None:
        self.mounts, self.copies = mounts, 0

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        if self.mounts is not None and argv[:2] == ["sh", "-c"]:
            argv = ["sh", "-c", argv[2].replace("cat /proc/mounts", "cat " + self.mounts)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def copy_in(self, here: str, there: str, timeout: float) -> subprocess.CompletedProcess[str]:
        self.copies += 1
        shutil.copyfile(here, there)
        return subprocess.CompletedProcess([], 0, "", "")


def test_stage_checks_by_size_and_sha256_and_pushes_what_differs(tmp_path: Path) -> None:
    here, there = tmp_path / "model.gguf", tmp_path / "device" / "model.gguf"
    there.parent.mkdir()
    here.write_bytes(b"GGUF" + bytes(5000))
    device = ShellDevice()
    spec = StageSpec(push=False, files=((str(there), str(here)),))
    with pytest.raises(UsageError) as e:
        stage(device, spec, print)
    assert f"{there} (missing)" in e.value.message and "push = true" in (e.value.tip or "")
    there.write_bytes(b"GGUF" + bytes(4999) + b"\1")  # the same size, one byte off
    with pytest.raises(UsageError) as e:
        stage(device, spec, print)
    assert "the same size, another sha256" in e.value.message
    done = stage(device, StageSpec(push=True, files=spec.files), print)
    assert device.copies == 1 and "copied from" in done[0]
    assert hashlib.sha256(there.read_bytes()).digest() == hashlib.sha256(here.read_bytes()).digest()
    assert stage(device, spec, print) == [f"{there}: as {here}"] and device.copies == 1


def test_a_model_on_fuse_is_refused_for_o_direct_readers(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(ANDROID_MOUNTS)
    device = ShellDevice(str(mounts))
    check_direct_storage(device, [("B", "/data/local/tmp/q.gguf")])
    with pytest.raises(UsageError) as e:
        check_direct_storage(device, [("B", "/storage/emulated/0/Download/q.gguf")])
    assert "cell `B` reads /storage/emulated/0/Download/q.gguf with O_DIRECT" in e.value.message
    assert "/storage/emulated, a fuse filesystem" in e.value.message
    assert "/data/local/tmp" in (e.value.tip or "")


def _stage_campaign(tmp: Path, stage_table: str, transport: str = "ssh:lab") -> Path:
    (tmp / "models").mkdir(exist_ok=True)
    (tmp / "models" / "q.gguf").write_bytes(b"GGUF")
    path = tmp / "cells.toml"
    path.write_text(textwrap.dedent(f"""\
        [device]
        transport = "{transport}"

        [workload]
        model = "/data/local/tmp/q.gguf"

        [cells.a]
        command = ["true"]
        """) + textwrap.dedent(stage_table))
    return path


def test_the_stage_table_resolves_paths_here_and_reads_back(tmp_path: Path) -> None:
    path = _stage_campaign(tmp_path, """
        [stage]
        push = true
        [stage.files]
        "/data/local/tmp/q.gguf" = "models/q.gguf"
        """)
    spec = load_campaign(path)
    assert spec.stage is not None
    assert spec.stage.files == {"/data/local/tmp/q.gguf": str(tmp_path / "models" / "q.gguf")}
    again = tmp_path / "again.toml"
    again.write_text(resolved_toml(spec))
    assert load_campaign(again).stage == spec.stage
    plan = plan_campaign(spec)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))).stage == plan.stage == StageSpec(
        True, (("/data/local/tmp/q.gguf", str(tmp_path / "models" / "q.gguf")),))


@pytest.mark.parametrize(("table", "transport", "says"), [
    ('[stage.files]\n"/x/q.gguf" = "models/missing.gguf"\n', "ssh:lab",
     "`stage.files.\"/x/q.gguf\"`: no file here at"),
    ('[stage.files]\n"x/q.gguf" = "models/q.gguf"\n', "ssh:lab",
     "is not an absolute path on the device"),
    ("[stage]\npush = true\n", "ssh:lab", "`stage.files`: names no file"),
    ('[stage.files]\n"/x/q.gguf" = "models/q.gguf"\n', "local", "applies to adb:/ssh: devices"),
])
def test_stage_mistakes_are_one_error_naming_the_key(tmp_path: Path, table: str,
                                                     transport: str, says: str) -> None:
    path = _stage_campaign(tmp_path, table, transport)
    p = abbench("campaign", path, "--out", tmp_path / "r", "--dry-run")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert says in p.stderr, p.stderr
