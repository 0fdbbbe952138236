"""Before the first cell on an adb/ssh device: the files it must hold (`[stage]`: the
model, the binaries), checked there by size and sha256 against the files here and with
`push = true` copied; and the storage each O_DIRECT reader's model is on, refused where
O_DIRECT is silently not O_DIRECT.

The phone-streaming engine's authors found it on Android (their docs/benchmark-method.md):
under `/storage/emulated` (and `/sdcard`) the filesystem is FUSE, where an O_DIRECT open
succeeds but the reads fall back to buffered I/O — the cell would run and measure the page
cache, not the flash path it asks for. Which filesystem holds a path is read from the
device's /proc/mounts (the longest mount point above the path, symlinks resolved there).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from abbench.campaign._check import fail
from abbench.errors import UsageError
from abbench.records import PlannedCell
from abbench.records.cell_config import BmoeConfig, CellConfig, EmbeddedConfig
from abbench.records.plan import StageSpec
from abbench.sensors import Device

HASH_TIMEOUT_S = 3600.0  # a phone hashing a 17 GiB model: minutes, not an hour
COPY_TIMEOUT_S = 4 * 3600.0
LIST_TIMEOUT_S = 60.0
_CHUNK = 8 << 20
MARK = "@@abbench-mounts@@"
# Filesystems where an O_DIRECT open succeeds and the reads are buffered anyway.
NOT_DIRECT = ("fuse",)  # fuse, fuseblk, fuse.sshfs, ...
Say = Callable[[str], None]


@dataclass(frozen=True)
class StageTable:
    """`[stage]`: files an adb/ssh device must hold before the first cell — each a path
    there and the file here it must equal (by size and sha256); `push`: copy what is
    missing or differs. Paths here are relative to the campaign file's folder."""

    push: bool = False
    files: dict[str, str] = field(default_factory=dict)  # path there -> path here

    def __post_init__(self) -> None:
        if not self.files:
            fail(("files",), "names no file",
                 tip='[stage.files] "/data/local/tmp/model.gguf" = "models/model.gguf"')
        for there, here in self.files.items():
            if not there.startswith("/") or any(c in there for c in "\n\x00"):
                fail(("files", there), "is not an absolute path on the device",
                     tip='e.g. "/data/local/tmp/model.gguf" = "models/model.gguf"')
            if not here or "\x00" in here:
                fail(("files", there), "must name a file here")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def parse_mounts(text: str) -> list[Mount]:
    """/proc/mounts' lines (`SOURCE POINT TYPE OPTIONS ...`), octal escapes (`\\040` for a
    space) undone; a line of fewer fields is skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            point = fields[1].encode().decode("unicode_escape", errors="replace")
            out.append(Mount(point, fields[2], fields[0]))
    return out


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path` (absolute): the longest mount point above it, the last
    one mounted there where several are."""
    best: Mount | None = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        if (path == point or path.startswith(point.rstrip("/") + "/")) and \
                (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def check_direct_storage(device: Device, readers: Iterable[tuple[str, str]]) -> None:
    """Each (cell, model path) that reads with O_DIRECT on the device, refused (UsageError,
    exit 2) where its storage is FUSE; a device whose mounts cannot be read is let be."""
    readers = sorted(set(readers))
    if not readers:
        return
    paths = [p for _, p in readers]
    script = (f"for p in {shlex.join(paths)}; do readlink -f \"$p\" 2>/dev/null || "
              f"echo \"$p\"; done; echo {MARK}; cat /proc/mounts")
    try:
        done = device.run(["sh", "-c", script], LIST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return
    resolved, sep, mounts_text = done.stdout.partition(MARK)
    if not sep:
        return
    real = resolved.split("\n")[:len(paths)]
    mounts = parse_mounts(mounts_text)
    for (cell, path), target in zip(readers, real + paths[len(real):], strict=True):
        m = mount_of(target.strip() or path, mounts)
        if m is not None and m.fstype.startswith(NOT_DIRECT):
            via = "" if target.strip() in ("", path) else f" (it is {target.strip()})"
            raise UsageError(
                f"cell `{cell}` reads {path}{via} with O_DIRECT, but on {device.name} it is "
                f"on {m.point}, a {m.fstype} filesystem: an O_DIRECT open succeeds there and "
                "the reads fall back to buffered I/O, so the cell would measure the page "
                "cache, not the flash path it asks for",
                tip="stage the model on a real filesystem (on Android /data/local/tmp), or "
                "run the cell without O_DIRECT (bmoe: `no_odirect = true`; embedded: "
                "`o_direct = false`) and say so")


def sha256_here(path: str, say: Say) -> str:
    size = os.path.getsize(path)
    if size > 1 << 30:
        say(f"stage: hashing {path} here ({size / 2**30:.1f} GiB)")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _there(device: Device, script: str, timeout: float) -> list[str]:
    try:
        done = device.run(["sh", "-c", script], timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(f"stage: {device.name} did not answer in {timeout:g} s") from None
    if done.returncode != 0:
        why = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise UsageError(f"stage: cannot read the files on {device.name}: {why[0]}")
    return done.stdout.splitlines()


def sizes_there(device: Device, paths: list[str]) -> dict[str, int | None]:
    """Each path's size on the device (None: no such file)."""
    script = (f"for p in {shlex.join(paths)}; do if [ -f \"$p\" ]; then wc -c < \"$p\"; "
              "else echo -; fi; done")
    lines = _there(device, script, LIST_TIMEOUT_S)
    out: dict[str, int | None] = {}
    for path, line in zip(paths, lines + ["-"] * len(paths), strict=False):
        out[path] = int(line.strip()) if line.strip().isdigit() else None
    return out


def sha256_there(device: Device, path: str) -> str:
    lines = _there(device, f"sha256sum {shlex.quote(path)}", HASH_TIMEOUT_S)
    word = lines[0].split()[0] if lines and lines[0].split() else ""
    if len(word) != 64:
        raise UsageError(f"stage: no sha256 of {path} on {device.name} (is `sha256sum` there?)")
    return word.lower()


def _state(device: Device, there: str, here: str, size: int | None, say: Say) -> str | None:
    """None where the file there is the file here, else how it differs."""
    mine = os.path.getsize(here)
    if size is None:
        return "missing"
    if size != mine:
        return f"{size} bytes there, {mine} here"
    say(f"stage: comparing {there} on {device.name} ({mine / 2**20:.0f} MiB) by sha256")
    if sha256_there(device, there) != sha256_here(here, say):
        return "the same size, another sha256"
    return None


def stage(device: Device, spec: StageSpec, say: Say) -> list[str]:
    """Check (and with `push`, copy) `spec`'s files on the device; what was done, one line
    each. Raises UsageError (exit 2) for a file that differs and is not pushed, or a copy
    that did not land whole."""
    files = list(spec.files)
    sizes = sizes_there(device, [there for there, _ in files])
    done, wrong = [], []
    for there, here in files:
        state = _state(device, there, here, sizes[there], say)
        if state is None:
            done.append(f"{there}: as {here}")
            continue
        if not spec.push:
            wrong.append(f"{there} ({state})")
            continue
        say(f"stage: copying {here} to {device.name}:{there} ({state})")
        copied = device.copy_in(here, there, COPY_TIMEOUT_S)
        if copied.returncode != 0:
            why = (copied.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise UsageError(f"stage: copying {here} to {device.name}:{there} failed: {why[0]}")
        if os.access(here, os.X_OK):
            device.run(["chmod", "755", there], LIST_TIMEOUT_S)
        if sha256_there(device, there) != sha256_here(here, say):
            raise UsageError(f"stage: {there} on {device.name} is not {here} after the copy")
        done.append(f"{there}: copied from {here} ({state} before)")
    if wrong:
        raise UsageError(f"stage: {device.name} does not hold the files the campaign needs: "
                         + "; ".join(wrong),
                         tip="`push = true` in [stage] copies them, or copy them yourself")
    return done


def reads_direct(config: CellConfig) -> bool:
    """Whether a cell reads its model with O_DIRECT: a streaming bmoe cell (unless
    `no_odirect`), an embedded one (unless `o_direct = false`)."""
    if isinstance(config, BmoeConfig):
        options = dict(config.options)
        return bool(options.get("moe_stream")) and not options.get("no_odirect")
    return isinstance(config, EmbeddedConfig) and config.resolved.get("o_direct", True) is True


def direct_readers(cells: Iterable[PlannedCell]) -> list[tuple[str, str]]:
    """(cell, model) for each cell that reads a model file with O_DIRECT."""
    return [(c.name, model) for c in cells if reads_direct(c.config)
            and (model := getattr(c.config, "model", None))
            and not model.startswith("synthetic:") and model.startswith("/")]


def stage_device(device: Device, spec: StageSpec | None, todo: Iterable[PlannedCell]) -> None:
    """On an adb/ssh device, before the first cell: `[stage]`'s files there (what it did
    on stderr), and no O_DIRECT reader's model on storage that drops O_DIRECT."""
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    if spec is not None:
        for line in stage(device, spec, say):
            say(f"stage: {line}")
    check_direct_storage(device, direct_readers(todo))
