"""Turn-taking (`--turn-tokens N`): the engine's side of the protocol `records.slices`
defines. The run pauses after its prefill and after every N decode tokens, blocked on a
line from its driver, so that two runs can take turns on one device (a campaign's
`interleave = "slices"`).

A pause is outside every token's clock: `measure.measure_pass` times the forward pass and
its sampling only, and the session pauses between passes, after settling what the expert
side has in flight (`ExpertRunner.finish`: speculative reads cancelled or joined), so that
no read of the paused run goes on while the other runs.
"""

from __future__ import annotations

import sys
from typing import TextIO

from abbench.errors import UsageError
from abbench.records.slices import DONE, GO, PAUSED, READY, TurnLine, control_word


class TurnPipe:
    """The lines a run exchanges with its driver: turn lines out, `go`/`stop` in."""

    def __init__(self, inbox: TextIO, outbox: TextIO) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.stopped = False  # the driver said `stop`, closed the pipe, or went away

    @classmethod
    def stdio(cls) -> TurnPipe:
        """The protocol on this process's stdin and stdout."""
        return cls(sys.stdin, sys.stdout)

    def ready(self) -> bool:
        """Prefilled: wait for the first `go`. False: stop now."""
        return self._wait(TurnLine(READY, 0))

    def pause(self, tokens: int) -> bool:
        """`tokens` decoded so far: wait for the next `go`. False: stop now."""
        return self._wait(TurnLine(PAUSED, tokens))

    def done(self, tokens: int) -> None:
        """No more turns: say so, if the driver is still there to read it."""
        self._say(TurnLine(DONE, tokens))

    def _wait(self, line: TurnLine) -> bool:
        if self.stopped or not self._say(line):
            return False
        try:
            heard = self.inbox.readline()
        except (OSError, ValueError):  # a closed or broken stdin: as end of file
            heard = ""
        word = control_word(heard)
        if word is None:
            raise UsageError(f"--turn-tokens: expected `go` or `stop` on stdin, got "
                             f"{heard.strip()[:40]!r}",
                             tip="the driver answers each `abbench-turn` line with one "
                             "`go` line (docs/engine.md#turn-taking)")
        self.stopped = word != GO
        return not self.stopped

    def _say(self, line: TurnLine) -> bool:
        """Write `line` whole and flushed; False where the driver is gone."""
        try:
            self.outbox.write(line.text())
            self.outbox.flush()
        except (OSError, ValueError):  # a broken pipe, a closed stdout
            self.stopped = True
            return False
        return True


def slice_of(step: int, every: int) -> int:
    """The slice (0-based) decode step `step` (1-based) runs in, with a turn every `every`
    tokens."""
    return (step - 1) // every


__all__ = ["TurnPipe", "slice_of"]
