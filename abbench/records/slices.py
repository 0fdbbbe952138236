"""Interleaved slices (`[campaign] interleave = "slices"`): the turn protocol between an
engine run that takes turns (`abbench engine run --turn-tokens N`) and whoever drives it,
and the slices a cell ran, as its folder keeps them (`cells/NN-NAME/slices.jsonl`).

The protocol, one line each way per turn, on the engine's stdin and stdout:

```
engine → driver   abbench-turn ready 0       prefilled, waiting for its first `go`
driver → engine   go                         decode the next N tokens
engine → driver   abbench-turn paused 16     N more tokens done (16 so far), in-flight reads
                                             settled; waiting for `go`
engine → driver   abbench-turn done 64       every token decoded (or an end-of-generation
                                             token, or `stop`): no more turns
driver → engine   stop, or end of file       stop now: the run writes its outputs for the
                                             tokens done so far and exits 0
```

The number is the decode tokens done so far. A driver reads lines that do not start with
`abbench-turn ` as the run's ordinary output.

slices.jsonl: one `SliceRecord` per slice the cell ran, in order; a slice is the tokens
whose per-token `slice` column (`records.tokens.SLICE`) holds its index.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from abbench.fsutil import atomic_write_text
from abbench.records.jsonl import read_jsonl_records
from abbench.records.schema import from_dict, show

TURN_PREFIX = "abbench-turn"
READY, PAUSED, DONE = "ready", "paused", "done"  # engine → driver
EVENTS = (READY, PAUSED, DONE)
GO, STOP = "go", "stop"  # driver → engine (end of file: stop)
SLICES_JSONL = "slices.jsonl"


@dataclass(frozen=True)
class TurnLine:
    """One line of the engine's side of the protocol: what it did, and the decode tokens it
    has done so far."""

    event: str  # READY | PAUSED | DONE
    tokens: int

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ValueError(f"a turn event is one of {', '.join(EVENTS)} (got {show(self.event)})")
        if self.tokens < 0:
            raise ValueError(f"tokens done must be >= 0 (got {self.tokens})")

    def text(self) -> str:
        return f"{TURN_PREFIX} {self.event} {self.tokens}\n"

    @classmethod
    def parse(cls, line: str) -> TurnLine | None:
        """The turn line `line` is; None for a line of the run's ordinary output (or one that
        names no event and a count)."""
        words = line.split()
        if len(words) != 3 or words[0] != TURN_PREFIX or words[1] not in EVENTS \
                or not words[2].isdigit():
            return None
        return cls(words[1], int(words[2]))


def control_word(line: str) -> str | None:
    """The driver's word on a line the engine read (`go` or `stop`); None for anything else.
    End of file ("") is `stop`."""
    if line == "":
        return STOP
    word = line.strip()
    return word if word in (GO, STOP) else None


@dataclass(frozen=True)
class SliceRecord:
    """One slice of an interleaved cell: its turn in the pair and when it ran. Its span runs
    from the driver's `go` to the engine's next turn line, read: no other slice of the pair
    overlaps it."""

    cell: int  # this cell's index in the plan
    partner: int  # the index of the cell it took turns with
    slice: int  # 0-based within this cell: its tokens' per-token `slice` value
    turn: int  # 0-based within the pair: the pair's slices in the order they ran
    tokens: int  # decode tokens this slice ran
    t_start_mono: float
    t_end_mono: float
    t_start_wall: float
    t_end_wall: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SliceRecord:
        return from_dict(cls, d)


def write_slices(cell_dir: Path, slices: list[SliceRecord]) -> None:
    """A cell's slices.jsonl, in one replace."""
    atomic_write_text(cell_dir / SLICES_JSONL, "".join(
        json.dumps(s.to_json(), separators=(",", ":"), allow_nan=False) + "\n"
        for s in slices))


def read_slices(cell_dir: Path) -> list[SliceRecord]:
    """A cell's slices ([] for a cell that did not take turns); a RecordError names the
    file and line of a malformed one."""
    return read_jsonl_records(cell_dir / SLICES_JSONL, SliceRecord.from_json, "slice")


__all__ = ["DONE", "EVENTS", "GO", "PAUSED", "READY", "SLICES_JSONL", "STOP", "TURN_PREFIX",
           "SliceRecord", "TurnLine", "control_word", "read_slices", "write_slices"]
