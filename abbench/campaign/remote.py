"""A cell on an adb or ssh device: its folder there, its processes, what comes back.

A run has a folder on the device (`RemoteSpec.folder` / the run folder's name) and each
cell a folder in it, emptied before the cell starts: an output a cell writes there can
never be the previous cell's. The cell's command runs in that folder under a small `sh`
wrapper that records the process's pid, its process group and its start time in `pid`
and removes the file when the command returns, passing the command's own exit status on
(ssh returns it as its own; a wrapper that ended in `cat` used to hide it).

Killing the local `ssh`/`adb` client does not stop what it started: without a terminal
the remote command outlives its connection. So on a timeout, an interrupt, and before
every cell (`sweep`: what a lost connection or a killed campaign left), the process
group each remaining `pid` file names is killed there with SIGKILL and its absence
checked there; a cell whose process would not go says so. The start time guards against
a pid the kernel has since given to another process.

An embedded cell's engine writes its summary, tokens and route trace into the cell's
folder there; `pull` brings them back into the cell's folder here in one call.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from abbench import __version__
from abbench.errors import CellOutputError, UsageError
from abbench.records.plan import RemoteSpec
from abbench.sensors import Device

PID_FILE = "pid"
PULLED = "device"  # the folder in a cell's folder here that `[device] pull` fills
COMMANDS_TIMEOUT_S = 300.0
ENGINE_FILES = ("summary.json", "tokens.csv", "route.csv")
KILL_TIMEOUT_S = 30.0
PULL_TIMEOUT_S = 120.0
# A process's group and start time from /proc/PID/stat, whose second field (the command
# name, in parentheses) may hold spaces: the fields after the last `)` (state, ppid,
# pgrp, ..., starttime the 20th).
_STAT = "sed 's/.*) //' /proc/{pid}/stat | cut -d' ' -f{fields}"
# Shells and daemons a group may be led by that are not the cell's own: adbd or sshd
# (a device whose shell does not start a session per command) are never killed.
_KEEP = "adbd|sshd|init|systemd"

# The scripts below are one line each, `;`-separated, as the sampler's batch read is: old
# adb servers mangle newlines in a shell command.
# Kill what every `pid` file in "$@" records, and wait (5 s at most) until it is gone (a
# zombie is gone: its parent, killed too, leaves it to be reaped); prints `alive PID` for
# each process that would not go.
_SWEEP = "; ".join((  # one line, `;`-separated: old adb servers mangle newlines
    'running() { [ -r /proc/"$1"/stat ] || return 1; '
    "set -- $(sed 's/.*) //' /proc/\"$1\"/stat | cut -d' ' -f1,20) \"$2\"; "
    '[ "$1" != Z ] && [ "$2" = "$3" ]; }',
    "own=$(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f3)",
    'for f in "$@"; do [ -r "$f" ] || continue; read -r p g s < "$f" || continue; '
    'if running "$p" "$s"; then case "$(cat /proc/"$g"/comm 2>/dev/null)" in KEEP) ;; '
    '*) [ "$g" -gt 1 ] && [ "$g" != "$own" ] && kill -KILL -"$g" 2>/dev/null ;; esac; '
    'pkill -KILL -P "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; i=0; '
    'while running "$p" "$s" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done; '
    'if running "$p" "$s"; then echo "alive $p"; continue; fi; fi; rm -f "$f"; done',
)).replace("KEEP", _KEEP)


@dataclass(frozen=True)
class RemoteRun:
    """A campaign's run on an adb/ssh device: `folder` there holds its cells' folders."""

    device: Device
    spec: RemoteSpec
    run_name: str

    @property
    def folder(self) -> str:
        return f"{self.spec.folder.rstrip('/')}/{self.run_name}"

    def cell(self, label: str) -> RemoteCell:
        return RemoteCell(self.device, f"{self.folder}/{label}")

    def sweep(self) -> list[str]:
        """Kill whatever a cell of this run left running on the device (a lost connection,
        a killed campaign); returns the pids that would not go."""
        glob = f"{shlex.quote(self.folder)}/*/{PID_FILE}"
        return _sweep(self.device, glob)

    def sweep_note(self, label: str) -> str | None:
        """`sweep` before cell `label`, as a line for the campaign's notes where something
        is wrong (None: nothing was left, or all of it is gone)."""
        try:
            alive = self.sweep()
        except CellOutputError as e:  # the cell itself will fail on the same connection
            return f"{label}: leftovers on {self.device.name} not checked: {e.message}"
        if alive:
            return (f"{label}: {len(alive)} process(es) of earlier cells would not stop on "
                    f"{self.device.name}: {' '.join(alive)}")
        return None

    def before_cell(self, label: str) -> tuple[list[str], str | None]:
        """Before cell `label` (and its entry state): what earlier cells left killed, then
        `[device] prepare`. (notes for the campaign, why the cell cannot run or None)."""
        note = self.sweep_note(label)
        notes = [note] if note else []
        if not self.spec.prepare:
            return notes, None
        why = _commands(self.device, self.spec.prepare)
        return notes, (f"`[device] prepare` {why}" if why else None)

    def after_cell(self, label: str, out: Path) -> list[str]:
        """After cell `label`, whatever its end: `[device] pull` into `out/device`, then
        `[device] cleanup`; notes for the campaign where either went wrong."""
        notes = []
        if self.spec.pull:
            lost = self.cell(label).pull_into(out / PULLED, self.spec.pull, expand=True)
            if lost:
                notes.append(f"{label}: `[device] pull`: {lost}")
        if self.spec.cleanup:
            why = _commands(self.device, self.spec.cleanup)
            if why:
                notes.append(f"{label}: `[device] cleanup` {why}")
        return notes

    def check_abbench(self) -> str:
        """`abbench --version` on the device: its version, or a UsageError saying why it
        cannot run an embedded cell (none there, another version)."""
        return check_abbench(self.device, self.spec.abbench)

    def build_models(self, models: Iterable[str]) -> None:
        """Each synthetic model built on the device now (its own cache), not by the first
        cell that uses it."""
        for model in sorted(set(models)):
            try:
                done = self.device.run([*self.spec.abbench, "model", "info", model], 1800)
            except subprocess.TimeoutExpired:
                raise UsageError(f"{self.device.name}: building {model} there took more than "
                                 "30 minutes") from None
            if done.returncode != 0:
                raise UsageError(f"{self.device.name}: cannot build {model} there: "
                                 f"{_last_line(done.stderr, done.returncode)}")


@dataclass(frozen=True)
class RemoteCell:
    """One cell's folder on the device and the process its command runs as there."""

    device: Device
    folder: str

    @property
    def pid_file(self) -> str:
        return f"{self.folder}/{PID_FILE}"

    def launch(self, argv: list[str], remove: list[str] | None = None) -> list[str]:
        """The local argument list that runs `argv` on the device in the cell's folder
        (made empty first; the files `remove` deleted), its pid recorded, its exit status
        passed on."""
        d = shlex.quote(self.folder)
        start = _STAT.format(pid="$$", fields="3,20")
        stale = f"rm -f -- {shlex.join(remove)} && " if remove else ""
        script = (f"{stale}rm -rf {d} && mkdir -p {d} && cd {d} || exit 125; "
                  f"echo \"$$ $({start})\" > {PID_FILE}; "
                  f"{shlex.join(argv)}; rc=$?; rm -f {PID_FILE}; exit $rc")
        return self.device.shell(script)

    def kill(self) -> str | None:
        """Kill the cell's processes on the device; None once they are gone, else why not."""
        try:
            alive = _sweep(self.device, shlex.quote(f"{self.folder}/{PID_FILE}"))
        except CellOutputError as e:
            return e.message
        return (f"its process {', '.join(alive)} on {self.device.name} would not stop"
                if alive else None)

    def pull(self, names: Iterable[str], expand: bool = False) -> dict[str, bytes]:
        """The cell's files `names` (those that exist) from its folder there, in one call;
        `expand`: the names are patterns the device's shell expands (`[device] pull`,
        checked to hold no space or quote)."""
        listed = " ".join(names) if expand else shlex.join(list(names))
        script = (f"cd {shlex.quote(self.folder)} || exit 1; set -- {listed}; "
                  'for f in "$@"; do [ -f "$f" ] && printf "== %s %s\\n" "$f" "$(wc -c < "$f")"'
                  ' && cat "$f"; done; exit 0')
        done = _answer(self.device, script, PULL_TIMEOUT_S,
                       f"the cell's files did not come back from {self.device.name} in "
                       f"{PULL_TIMEOUT_S:g} s",
                       f"cannot read the cell's folder {self.folder} on {self.device.name}")
        return _unpack(done.stdout)

    def pull_into(self, out: Path, names: Iterable[str], expand: bool = False) -> str | None:
        """`pull` the files `names` into `out`; None, or why they did not come back."""
        try:
            files = self.pull(names, expand)
        except CellOutputError as e:
            return e.message
        for name, data in files.items():
            if ".." in Path(name).parts or Path(name).is_absolute():
                continue  # only ever the cell's own folder's files
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return None


def _commands(device: Device, commands: Iterable[tuple[str, ...]]) -> str | None:
    """`commands` in turn on the device in one call, stopping at the first that fails;
    None, or which one failed and why."""
    listed = list(commands)
    script = "; ".join(f'{shlex.join(argv)} >&2 || {{ echo "failed {i} $?"; exit 0; }}'
                       for i, argv in enumerate(listed))
    try:
        done = _there(device, script, COMMANDS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"did not finish in {COMMANDS_TIMEOUT_S:g} s on {device.name}"
    out, err = _text(done.stdout), _text(done.stderr)
    failed = [line.split() for line in out.splitlines() if line.startswith("failed ")]
    if failed:
        i, status = int(failed[0][1]), failed[0][2]
        return (f"command {i + 1} (`{shlex.join(listed[i])}`) exited with status {status} on "
                f"{device.name}: {_last_line(err, int(status))}")
    if done.returncode != 0:
        return f"could not run on {device.name}: {_last_line(err, done.returncode)}"
    return None


def _sweep(device: Device, pid_files: str) -> list[str]:
    """`_SWEEP` over `pid_files` (a quoted path or glob, expanded there)."""
    done = _answer(device, f"set -- {pid_files}; {_SWEEP}", KILL_TIMEOUT_S,
                   f"{device.name} did not answer in {KILL_TIMEOUT_S:g} s: its processes "
                   "could not be stopped",
                   f"cannot stop the cell's processes on {device.name}")
    return [line.split()[1] for line in _text(done.stdout).splitlines()
            if line.startswith("alive ")]


def _there(device: Device, script: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """`script` run with the device's `sh` (TimeoutExpired past `timeout` s)."""
    return subprocess.run(device.shell(script), capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def _answer(device: Device, script: str, timeout: float, late: str,
            failed: str) -> subprocess.CompletedProcess[bytes]:
    """`script` run there, which must finish in `timeout` s (else CellOutputError `late`)
    and succeed (else `failed: ` and the last line it said)."""
    try:
        done = _there(device, script, timeout)
    except subprocess.TimeoutExpired:
        raise CellOutputError(late) from None
    if done.returncode != 0:
        raise CellOutputError(f"{failed}: {_last_line(_text(done.stderr), done.returncode)}")
    return done


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


_HEADER = re.compile(rb"== (.*?) +(\d+)\n")  # some wc pad the count


def _unpack(data: bytes) -> dict[str, bytes]:
    """`== NAME SIZE` then SIZE bytes, for each file `pull` printed."""
    files: dict[str, bytes] = {}
    at = 0
    while at < len(data):
        m = _HEADER.match(data, at)
        if m is None:
            raise CellOutputError("the cell's files came back garbled")
        end = m.end() + int(m[2])
        if end > len(data):
            raise CellOutputError(f"{m[1].decode(errors='replace')} came back cut short")
        files[m[1].decode(errors="replace")] = data[m.end():end]
        at = end
    return files


def abbench_there(device: Device, abbench: tuple[str, ...]) -> tuple[str | None, str]:
    """(the version `abbench --version` gives on the device, or None; what was said)."""
    try:
        done = device.run([*abbench, "--version"], 60)
    except subprocess.TimeoutExpired:
        return None, "no answer in 60 s"
    except OSError as e:  # this machine's own shell: no such program
        return None, e.strerror or str(e)
    said = done.stdout.strip()
    if done.returncode != 0 or not re.fullmatch(r"abbench \S+", said):
        return None, _last_line(done.stderr, done.returncode)
    return said.split()[1], said


def check_abbench(device: Device, abbench: tuple[str, ...]) -> str:
    """The version of abbench on the device, which must be this one's."""
    shown = shlex.join(abbench)
    tip = (f"install abbench {__version__} there (`pip install` this checkout), or set "
           "`[device] abbench` to its path there")
    version, said = abbench_there(device, abbench)
    if version is None:
        raise UsageError(f"{device.name} cannot run abbench (`{shown} --version`: {said})",
                         tip=tip)
    if version != __version__:
        raise UsageError(f"{device.name} has abbench {version} ({shown}), this one is "
                         f"{__version__}: an embedded cell there would not run this engine",
                         tip=tip)
    return version


def _last_line(text: str, rc: int) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"exit status {rc}"
