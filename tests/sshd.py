"""A real OpenSSH server on 127.0.0.1 for the remote-device tests: Debian's `sshd`
(`openssh-server`, which `.ci/run` installs), started as root at a free port with a host
key and a user key generated for it, no password, and a client configuration of its own
that abbench's ssh calls read through `ABBENCH_SSH_CONFIG` (`ssh -F`).

Nothing of the user's ~/.ssh is read or written. Without root or without `sshd` the tests
skip, saying why; with `ABBENCH_REQUIRE_SSHD=1` (as `.ci/run` sets it) they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HOST = "abbench-test"  # the alias the client configuration gives 127.0.0.1:PORT
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def unavailable() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if os.geteuid() != 0:
        return "the real sshd runs as root"
    if not os.access(SSHD, os.X_OK):
        return f"no {SSHD} (apt-get install openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no ssh client (apt-get install openssh-client)"
    return None


def need_sshd() -> None:
    why = unavailable()
    if why is not None:
        if os.environ.get("ABBENCH_REQUIRE_SSHD") == "1":
            pytest.fail(f"ABBENCH_REQUIRE_SSHD=1 but {why}")
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class SshServer:
    """The server, its keys, and the client configuration that reaches it as `HOST`."""

    root: Path
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def client_config(self) -> Path:
        return self.root / "ssh_config"

    def setup(self) -> None:
        host_pub = _keygen(self.root / "host_key")
        user_pub = _keygen(self.root / "user_key")
        _keygen(self.root / "stranger_key")  # a key the server does not know
        (self.root / "authorized_keys").write_text(user_pub + "\n")
        (self.root / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub}\n")
        (self.root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.root}/host_key\n"
            f"PidFile {self.root}/sshd.pid\nAuthorizedKeysFile {self.root}/authorized_keys\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\n"
            "StrictModes no\nPrintMotd no\nLogLevel ERROR\nMaxStartups 100\n")
        self.write_client(self.client_config, "user_key")

    def write_client(self, path: Path, key: str) -> Path:
        path.write_text(
            f"Host {HOST}\n  HostName 127.0.0.1\n  Port {self.port}\n"
            f"  User {pwd.getpwuid(os.geteuid()).pw_name}\n"
            f"  IdentityFile {self.root}/{key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.root}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  LogLevel ERROR\n  ConnectTimeout 10\n")
        return path

    def start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # its privilege separation
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                     stdin=subprocess.DEVNULL,
                                     stderr=open(self.root / "sshd.log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        raise RuntimeError("sshd did not listen in 20 s")

    def stop(self) -> None:
        """Stop the server and every session it holds open: the host is gone, as a phone
        off the network is (the commands those sessions started go on running)."""
        if self.proc is not None:
            for pid in self.session_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes under this server."""
        if self.proc is None:
            return []
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    found.append(int(stat.parent.name))
        return found


def processes_matching(text: str) -> list[str]:
    """Command lines of this machine's processes holding `text` (the server's side: the
    server is this machine), zombies left out."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in cmd and state != "Z" and proc.name != str(os.getpid()):
                found.append(cmd)
    return found
