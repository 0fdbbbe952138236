"""How readings and commands reach a device: this machine, `adb -s SERIAL shell`, `ssh HOST`.

A transport answers two things: `snapshot()`, the tree readers read one sample from (this
machine's own files, or every sensor file of a remote device fetched in ONE batched shell
call), and `run(argv, timeout)`, a command on the device. Commands are argument lists,
never `shell=True`; on a remote device the argument list is quoted with `shlex.join`,
since adb and ssh hand the command line to the device's shell.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from typing import Protocol

from abbench.errors import SnapshotError, UsageError
from abbench.sensors.android import DUMPSYS
from abbench.sensors.cputime import group_jiffies_script
from abbench.sensors.readers import REMOTE_GLOBS
from abbench.sensors.tree import MARKER, LocalTree, Tree, batch_script, parse_batch

# Every sensor file and both dumpsys services, in one shell call. Fixed text (checked by
# batch_script): no user value is ever part of it.
SNAPSHOT_SCRIPT = batch_script(REMOTE_GLOBS, DUMPSYS)
SNAPSHOT_TIMEOUT_S = 10.0
CHECK_TIMEOUT_S = 15.0
# Never a password prompt; a host that stops answering (a phone off the network, sshd
# gone) ends the call in about 30 s instead of leaving it open for the TCP timeout.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ServerAliveInterval=10",
               "-o", "ServerAliveCountMax=3")
# An ssh client configuration of the campaign's own (`ssh -F PATH`): host aliases, ports
# and keys that are not in ~/.ssh/config (a lab's shared file; the tests' own server).
SSH_CONFIG_ENV = "ABBENCH_SSH_CONFIG"


class Transport(Protocol):
    kind: str       # "local", "adb" or "ssh"
    spec: str       # as given to open_device: "local", "adb:SERIAL", "ssh:HOST"
    on_host: bool   # True when the device is this machine's own `/` (psutil, NVML apply)

    def snapshot(self) -> Tree: ...

    def command(self, argv: Sequence[str]) -> list[str]: ...

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]: ...

    def shell(self, script: str) -> list[str]: ...


class LocalTransport:
    """This machine; `root` points readers at another tree (fixtures, the simulated device)."""

    kind = "local"
    spec = "local"

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.tree = LocalTree(root)
        self.on_host = self.tree.root.resolve() == LocalTree("/").root.resolve()

    def snapshot(self) -> Tree:
        return self.tree

    def command(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def shell(self, script: str) -> list[str]:
        return ["sh", "-c", script]


def check_name(kind: str, name: str) -> str:
    """A serial or host name that adb/ssh cannot mistake for an option."""
    if not name or name.startswith("-") or re.search(r"[\s\x00-\x1f\x7f]", name):
        what = "serial" if kind == "adb" else "host"
        raise UsageError(f"`{kind}:{name}` is not a valid {what}: it must be non-empty, "
                         "without spaces, and not start with `-`",
                         tip=f"give the transport as {kind}:{what.upper()}")
    return name


class _RemoteShell:
    """What adb and ssh share: a command line for the device's shell, and the batch read."""

    kind = ""
    spec = ""
    on_host = False
    group_pid_file: str | None = None  # a remote cell's `pid` file: its CPU time read too

    def shell_argv(self, command: str) -> list[str]:
        """The local argv that runs `command` (a shell command line) on the device."""
        raise NotImplementedError

    def _exec(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, check=False, errors="replace")
        except FileNotFoundError:
            raise UsageError(f"`{argv[0]}` is not on PATH; the {self.kind} transport needs it",
                             tip=f"install {argv[0]} or use --transport local") from None

    def command(self, argv: Sequence[str]) -> list[str]:
        return self.shell_argv(shlex.join(argv))

    def shell(self, script: str) -> list[str]:
        """The local argv that runs `script` with the device's POSIX `sh` (a login shell
        may be another: fish)."""
        return self.shell_argv(shlex.join(["sh", "-c", script]))

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return self._exec(self.command(argv), timeout)

    def copy_in(self, here: str, there: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Copy the file `here` to `there` on the device: into `there.part`, renamed once
        whole (a copy cut short never passes for the file)."""
        with open(here, "rb") as source:
            try:
                done = subprocess.run(self.copy_argv(here, there + ".part"), stdin=source,
                                      capture_output=True, timeout=timeout, check=False)
            except FileNotFoundError:
                raise UsageError(f"the {self.kind} transport needs `{self.kind}` on PATH")\
                    from None
        if done.returncode != 0:
            return subprocess.CompletedProcess(done.args, done.returncode, "",
                                               done.stderr.decode(errors="replace"))
        return self.run(["mv", "-f", there + ".part", there], timeout)

    def copy_argv(self, here: str, there: str) -> list[str]:
        """The local argv that writes the file on stdin (or `here`) to `there`."""
        return self.shell_argv(shlex.join(["sh", "-c", 'cat > "$1"', "sh", there]))

    def snapshot(self) -> Tree:
        try:
            done = self._exec(self.shell_argv(self.snapshot_command()), SNAPSHOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SnapshotError(f"{self.spec}: no answer in {SNAPSHOT_TIMEOUT_S:g} s") from None
        tree = parse_batch(done.stdout)
        if done.returncode != 0 and not tree.files:
            tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise SnapshotError(f"{self.spec}: exit status {done.returncode}: {tail[0]}")
        return tree

    def snapshot_command(self) -> str:
        return self.snapshot_script()

    def snapshot_script(self) -> str:
        """The batch read, and the cell's process group's CPU time while one runs."""
        if self.group_pid_file is None:
            return SNAPSHOT_SCRIPT
        return f"{SNAPSHOT_SCRIPT}; {group_jiffies_script(self.group_pid_file, MARKER)}"


class AdbTransport(_RemoteShell):
    """An Android device: `adb -s SERIAL shell COMMAND` (adb hands COMMAND to the device's sh)."""

    kind = "adb"

    def __init__(self, serial: str) -> None:
        self.serial = check_name("adb", serial)
        self.spec = f"adb:{serial}"

    def shell_argv(self, command: str) -> list[str]:
        return ["adb", "-s", self.serial, "shell", command]

    def copy_argv(self, here: str, there: str) -> list[str]:
        # `adb shell` of older servers has no clean stdin (a pty): `adb push` copies
        return ["adb", "-s", self.serial, "push", here, there]

    def check(self) -> None:
        """Fail now, clearly, if adb is missing or the device is not attached and authorised."""
        done = self._exec(["adb", "-s", self.serial, "get-state"], CHECK_TIMEOUT_S)
        state = done.stdout.strip()
        if done.returncode != 0 or state != "device":
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [state or "no answer"]
            raise UsageError(f"adb device `{self.serial}` is not ready: {why[0]}",
                             tip="`adb devices -l` lists the attached serials; accept the "
                             "USB debugging prompt on the device")


class SshTransport(_RemoteShell):
    """A Linux host: `ssh -o BatchMode=yes HOST COMMAND` (never prompts for a password;
    `-F $ABBENCH_SSH_CONFIG` where that is set)."""

    kind = "ssh"

    def __init__(self, host: str) -> None:
        self.host = check_name("ssh", host)
        self.spec = f"ssh:{host}"

    def shell_argv(self, command: str) -> list[str]:
        config = os.environ.get(SSH_CONFIG_ENV)
        return ["ssh", *(("-F", config) if config else ()), *SSH_OPTIONS, self.host, command]

    def snapshot_command(self) -> str:
        # The remote login shell may not be POSIX (fish): hand the script to sh explicitly.
        return shlex.join(["sh", "-c", self.snapshot_script()])

    def check(self) -> None:
        """Fail now, clearly, if ssh is missing or the host does not accept us."""
        try:
            done = self.run(["true"], CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UsageError(f"ssh host `{self.host}` did not answer in "
                             f"{CHECK_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            why = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            raise UsageError(f"ssh host `{self.host}` is not reachable: {why[0]}",
                             tip="the ssh transport needs key-based login (BatchMode): "
                             f"check `ssh {self.host} true`")

