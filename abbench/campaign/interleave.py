"""An interleaved pair (`[campaign] interleave = "slices"`): two embedded cells run side by
side as engine processes that take turns every `slice_tokens` decode tokens, so that a
burst of load, a heat step or a cap lands on both within seconds of each other.

Each process runs `abbench engine run ... --turn-tokens N` (`records.slices` is the
protocol). The first is started and prefills; then the second (the first waiting); then
they take turns — `go` to one, its `paused` line, `go` to the other, ... — until both are
done, one that has finished leaving the other to run its remaining turns one after
another. Only one runs at a time: the other is blocked reading its stdin with nothing in
flight (the engine settles its reads before it pauses), and on a simulated device only the
one whose turn it is is throttled (and heats the device). A process that has said `done`
has exited before the other's next turn. Both processes' CPU time counts as the pair's own
(`Device.watch`), never as foreign load.

Each cell keeps its folder as a cell run alone does (summary.json, tokens.csv, stdout.txt
— what the engine printed beside its turn lines —, stderr.txt, child.json), and its slices
(`slices.jsonl`: each turn's span, from the `go` to the turn line that ended it). The
pair's timeout is the sum of its cells'. A process that fails (exits, crashes, breaks the
protocol) fails its cell, and the other is stopped cleanly (end of file on its stdin: it
writes its outputs for the tokens done and exits) and recorded as failed, as it could not
finish its turns beside it; past the timeout, or on Ctrl-C, both are killed.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from abbench.campaign.child import ChildExit, exit_reason
from abbench.campaign.recovery import note_child
from abbench.engine.config import flag
from abbench.records.cell_config import EmbeddedConfig
from abbench.records.slices import DONE, GO, READY, SliceRecord, TurnLine, write_slices
from abbench.sensors import Device

POLL_S = 0.5  # how often a wait for a turn line looks whether the process has exited
# After its process exited, how long its last lines may take to arrive: a process it forked
# (the engine's compute partner) may hold its stdout open for a moment longer.
EXIT_GRACE_S = 1.0
FAILED_GRACE_S = 10.0  # how long a process that broke off its turns may take to exit


@dataclass(frozen=True)
class Arm:
    """One cell of a pair: its index and label, its command line (`turn_argv`: taking
    turns), its folder and its configuration."""

    index: int
    label: str
    argv: tuple[str, ...]
    out: Path
    config: EmbeddedConfig

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s


@dataclass(frozen=True)
class ArmRun:
    """How one arm's process ended, from its start to its exit, and its slices."""

    config: EmbeddedConfig
    ended: ChildExit
    t_start_wall: float
    t_end_wall: float
    t_start_mono: float
    t_end_mono: float
    slices: tuple[SliceRecord, ...]

    @property
    def span(self) -> tuple[float, float, float, float]:
        """Wall start and end, then monotonic start and end."""
        return self.t_start_wall, self.t_end_wall, self.t_start_mono, self.t_end_mono


def turn_argv(argv: list[str], slice_tokens: int) -> tuple[str, ...]:
    """An embedded cell's command line, taking turns every `slice_tokens` decode tokens."""
    return (*argv, f"{flag('turn_tokens')}={slice_tokens}")


class _Player:
    """An arm's process: its turn lines arrive through a queue that a reader thread fills,
    copying whatever else the process prints to its stdout.txt."""

    def __init__(self, arm: Arm) -> None:
        self.arm = arm
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: queue.Queue[TurnLine | None] = queue.Queue()
        self.tokens = 0  # decode tokens done, as its last turn line said
        self.slices: list[SliceRecord] = []
        self.ended: ChildExit | None = None
        self.t0 = (time.time(), time.monotonic())
        self.t1: tuple[float, float] | None = None
        self._files: list[IO[bytes]] = []
        self._reader: threading.Thread | None = None

    def launch(self) -> bool:
        """Start the process; False (and `ended` says why) when it cannot start."""
        out = self.arm.out
        self.t0 = (time.time(), time.monotonic())
        try:
            for name in ("stderr.txt", "stdout.txt"):
                self._files.append(open(out / name, "wb"))  # noqa: SIM115 — closed in close()
            self.proc = subprocess.Popen(list(self.arm.argv), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._files[0])
        except OSError as e:
            self.ended = ChildExit("failed", None, f"could not start: {e.strerror or e}")
            self.t1 = (time.time(), time.monotonic())
            return False
        note_child(out / "child.json", self.proc.pid)
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"abbench-turns-{self.arm.index}")
        self._reader.start()
        return True

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                line = TurnLine.parse(raw.decode("utf-8", errors="replace"))
                if line is None:
                    self._files[1].write(raw)
                else:
                    self.lines.put(line)
        except (OSError, ValueError):  # the pipe or the file closed under it: the end
            pass
        finally:
            self.lines.put(None)

    def next_line(self, deadline: float) -> TurnLine | None:
        """Its next turn line; None once it has ended without one (TimeoutExpired past
        `deadline`: the pair's time is up)."""
        assert self.proc is not None
        while (left := deadline - time.monotonic()) > 0:
            try:
                return self.lines.get(timeout=min(left, POLL_S))
            except queue.Empty:
                if self.proc.poll() is not None:
                    try:
                        return self.lines.get(timeout=EXIT_GRACE_S)
                    except queue.Empty:
                        return None
        raise subprocess.TimeoutExpired(self.arm.argv, 0)  # the pair's time is up

    def go(self) -> bool:
        """Tell it to take its turn; False where it is gone."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{GO}\n".encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def stop(self) -> None:
        """End of file on its stdin: it stops at its next pause, writing its outputs."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def wait(self, deadline: float) -> int:
        """Its exit status, once it has exited (TimeoutExpired past `deadline`)."""
        assert self.proc is not None
        code = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.t1 = self.t1 or (time.time(), time.monotonic())
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.t1 = self.t1 or (time.time(), time.monotonic())

    def close(self) -> None:
        """Release its pipes and files, its slices written to its folder."""
        self.stop()
        if self._reader is not None:
            self._reader.join(EXIT_GRACE_S)
            if not self._reader.is_alive() and self.proc is not None and self.proc.stdout:
                self.proc.stdout.close()  # else a process it forked holds it: left to it
        for f in self._files:
            f.close()
        if self.proc is not None:
            write_slices(self.arm.out, self.slices)

    def result(self) -> ArmRun:
        t1w, t1m = self.t1 or (time.time(), time.monotonic())
        ended = self.ended or ChildExit("failed", None, "its turns did not finish")
        return ArmRun(self.arm.config, ended, self.t0[0], t1w, self.t0[1], t1m,
                      tuple(self.slices))


class InterleavedPair:
    """The pair in flight (at most one at a time), so that whoever stops the campaign can
    kill it: its processes must never outlive the campaign. `on_turn` is told whose turn
    it is (a cell index; None once the pair has ended), for the sampler's tags."""

    def __init__(self, device: Device, on_turn: Callable[[int | None], None]) -> None:
        self.device = device
        self.on_turn = on_turn
        self._players: list[_Player] = []

    def run(self, first: Arm, second: Arm) -> tuple[ArmRun, ArmRun]:
        """Run both arms taking turns, `first` taking the first turn."""
        players = [_Player(first), _Player(second)]
        self._players = players
        timeout = first.timeout_s + second.timeout_s
        try:
            self._play(players[0], players[1], time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            for p in players:
                if p.ended is None:
                    p.ended = ChildExit("timeout", None, f"no result after the pair's "
                                        f"{timeout:g} s timeout")
        except BaseException:  # Ctrl-C: the processes must not outlive the campaign
            self.kill()
            raise
        finally:
            self.device.unthrottle()
            self.on_turn(None)
            self._players = []
            for p in players:
                p.close()
            self.device.watch()  # reaped by now: their time is in the campaign's cutime
        return players[0].result(), players[1].result()

    def kill(self) -> None:
        """SIGKILL both processes if they still run, and reap them."""
        self.device.unthrottle()  # a stopped process ignores SIGTERM: continue it first
        for p in self._players:
            p.kill()

    def _play(self, a: _Player, b: _Player, deadline: float) -> None:
        if not self._start(a, deadline):
            self._stop(b, a, deadline)
            return
        if not self._start(b, deadline):
            self._stop(a, b, deadline)
            return
        turn = 0
        while a.ended is None or b.ended is None:
            for me, other in ((a, b), (b, a)):
                if me.ended is not None:
                    continue
                if not self._turn(me, other, turn, deadline):
                    self._stop(other, me, deadline)
                    return
                turn += 1

    def _start(self, p: _Player, deadline: float) -> bool:
        """Start `p` and wait until it has prefilled (`ready`); False when it failed."""
        self.on_turn(p.arm.index)
        if not p.launch():
            return False
        assert p.proc is not None
        # both processes' CPU time is the pair's own, not foreign load, whoever's turn it is
        self.device.watch(*(q.proc.pid for q in self._players if q.proc is not None))
        self.device.throttle(p.proc.pid)
        line = p.next_line(deadline)
        self.device.unthrottle()
        if line is None or line.event != READY:
            p.ended = self._failed(p, deadline, "before its first turn")
            return False
        return True

    def _turn(self, me: _Player, other: _Player, turn: int, deadline: float) -> bool:
        """One turn of `me`, its slice recorded; False when it failed."""
        assert me.proc is not None
        self.on_turn(me.arm.index)
        t0w, t0m = time.time(), time.monotonic()
        self.device.throttle(me.proc.pid)
        line = me.next_line(deadline) if me.go() else None
        self.device.unthrottle()
        t1w, t1m = time.time(), time.monotonic()
        if line is None or line.event == READY or line.tokens < me.tokens:
            me.ended = self._failed(me, deadline, f"in its turn {len(me.slices) + 1}")
            return False
        me.slices.append(SliceRecord(
            cell=me.arm.index, partner=other.arm.index, slice=len(me.slices), turn=turn,
            tokens=line.tokens - me.tokens, t_start_mono=t0m, t_end_mono=t1m,
            t_start_wall=t0w, t_end_wall=t1w))
        me.tokens = line.tokens
        if line.event != DONE:
            return True
        code = me.wait(deadline)  # it writes its outputs: before the other's next turn
        me.ended = ChildExit("ok", code) if code == 0 else ChildExit("failed", code,
                                                                      exit_reason(code))
        return code == 0

    def _failed(self, p: _Player, deadline: float, when: str) -> ChildExit:
        """Why `p` failed, once it has exited (killed, if it runs on past a moment)."""
        p.stop()
        try:
            code = p.wait(min(deadline, time.monotonic() + FAILED_GRACE_S))
        except subprocess.TimeoutExpired:
            p.kill()
            assert p.proc is not None
            code = p.proc.returncode
        if code != 0:
            return ChildExit("failed", code, exit_reason(code))
        return ChildExit("failed", code, f"its engine broke off taking turns {when}")

    def _stop(self, p: _Player, failed: _Player, deadline: float) -> None:
        """`failed` failed: stop `p` cleanly (it cannot finish its turns without it)."""
        if p.ended is not None:
            return
        if p.proc is None:
            p.ended = ChildExit("failed", None, f"not started: {failed.arm.label}, which it "
                                "takes turns with, failed first")
            return
        p.stop()
        code = p.wait(deadline)
        p.ended = ChildExit("failed", code, f"stopped after {len(p.slices)} turns: "
                            f"{failed.arm.label}, which it takes turns with, failed")


__all__ = ["Arm", "ArmRun", "InterleavedPair", "turn_argv"]
