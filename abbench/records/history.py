"""The device history (sentinels/DEVICE.jsonl: sentinel runs and repeats of one
configuration, appended by every campaign) and a run's noise-floor snapshot
(noise-floor.json)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from abbench.errors import BadField, RecordError
from abbench.records.jsonl import append_jsonl, numbered_jsonl, read_record
from abbench.records.schema import from_dict


@dataclass(frozen=True)
class NoiseFloor:
    """A device's cell-to-cell noise as its history gave it when a campaign began
    (`noise-floor.json`): the pooled variance of repeats' log tokens/s with its degrees of
    freedom, the mean token-level part, and what it was pooled from. `df` 0: no history."""

    variance: float = 0.0
    df: int = 0
    token_variance: float = 0.0
    repeats: int = 0  # cells behind it
    campaigns: tuple[str, ...] = ()  # run folder names, newest first
    history: str = ""  # the history file read (and the one the run's repeats go to)
    t_wall: float = 0.0
    device: str = ""
    simulated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "campaigns": list(self.campaigns)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NoiseFloor:
        return from_dict(cls, d)


@dataclass(frozen=True)
class RepeatRecord:
    """One repeat a campaign made, as the device history (`sentinels/DEVICE.jsonl`, lines
    with `kind` "repeat") keeps it: two cells of one configuration, the later one's log
    tokens/s minus the earlier one's, and whether they may count as cell-to-cell noise.

    Comparable repeats with equal work form groups (`group`, per run); consecutive members
    of a group are one record each, so a group's cells can be rebuilt from its records."""

    device: str
    run: str  # the run folder's name
    campaign: str
    t_wall: float  # the later cell's start
    config_key: str
    name: str  # the later cell's name
    first: str  # cell labels
    second: str
    log_ratio: float  # log(second tok/s) - log(first tok/s)
    token_variance_first: float  # moving-block variance of each cell's log tok/s (0: none)
    token_variance_second: float
    fingerprints_equal: bool
    matched: bool  # adjacent and thermally matched
    comparable: bool  # every device criterion held (adjacency and gap aside)
    group: int | None = None  # the repeat group within the run (None: not counted)
    simulated: bool = False
    kind: str = "repeat"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RepeatRecord:
        return from_dict(cls, d)


@dataclass(frozen=True)
class SentinelLine:
    """One sentinel run (or the run a sentinel repeats) as the device history keeps it: a
    line without `kind`, appended after the cell finished. `entry` is the cell's entry
    state as its record holds it (`EntryState.to_json`)."""

    device: str
    simulated: bool
    campaign: str
    run: str  # the run folder, as the campaign named it
    cell: str  # its label
    name: str
    config_key: str
    t_wall: float  # the cell's start (0: unknown)
    tokens_per_s: float
    fingerprint: str | None = None
    entry: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.tokens_per_s, (int, float)) and self.tokens_per_s > 0):
            raise BadField(("tokens_per_s",), f"must be a speed > 0 (got {self.tokens_per_s!r})")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any], device: str) -> SentinelLine:
        """A line as campaigns of every version wrote it: what older ones left out takes
        its default (`device`: the history's own)."""
        try:
            return cls(device=str(d.get("device") or device),
                       simulated=bool(d.get("simulated", False)),
                       campaign=str(d.get("campaign", "?")), run=str(d.get("run", "")),
                       cell=str(d.get("cell", "?")), name=str(d.get("name", "?")),
                       config_key=str(d["config_key"]), t_wall=float(d.get("t_wall") or 0.0),
                       tokens_per_s=float(d["tokens_per_s"]),
                       fingerprint=d.get("fingerprint"), entry=d.get("entry"))
        except KeyError as e:
            raise BadField("", f"no `{e.args[0]}`") from None
        except (TypeError, ValueError) as e:
            raise BadField("", str(e)) from None


def read_sentinels(path: Path) -> list[SentinelLine]:
    """The sentinel lines of a device history, oldest first as written; repeat lines and
    lines without a speed (older campaigns appended failed cells) are skipped, and a
    sentinel line that does not parse is a `RecordError` naming its line."""
    out = []
    for n, d in numbered_jsonl(path):
        if d.get("kind") == "repeat":
            continue
        tps = d.get("tokens_per_s")
        if not isinstance(tps, (int, float)) or isinstance(tps, bool) or not tps > 0:
            continue
        try:
            out.append(SentinelLine.from_json(d, path.stem))
        except BadField as e:
            raise RecordError(f"{path}:{n}: sentinel line is malformed ({e})") from None
    return out


def history_file(folder: Path, device: str) -> Path:
    """The device history file for a device name (what a folder name cannot hold → `_`)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", device) or "device"
    return folder / f"{name}.jsonl"


def read_repeats(path: Path) -> list[RepeatRecord]:
    """The repeat records of a device history; other lines (sentinel speeds) are skipped,
    and so is a repeat line that does not parse (a history is appended to by many
    campaigns and versions: one bad line must not hide the rest)."""
    out = []
    for _, d in numbered_jsonl(path):
        if d.get("kind") != "repeat":
            continue
        try:
            out.append(RepeatRecord.from_json(d))
        except BadField:
            continue
    return out


def append_repeats(path: Path, records: list[RepeatRecord]) -> int:
    """Append the repeats the history lacks (keyed by run and cell pair, so a resumed or
    re-reported campaign adds none twice); returns how many were appended."""
    have = {(r.run, r.first, r.second) for r in read_repeats(path)}
    new = [r for r in records if (r.run, r.first, r.second) not in have]
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
    for r in new:
        append_jsonl(path, r.to_json())
    return len(new)


NOISE_FLOOR_FILE = "noise-floor.json"


def read_noise_floor(run: Path) -> NoiseFloor | None:
    """The run's snapshot of its device's noise floor; None when there is none (runs from
    before it existed, imports). A snapshot that does not parse is an error."""
    return read_record(run / NOISE_FLOOR_FILE, NoiseFloor, "noise floor")
