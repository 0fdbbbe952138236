"""A campaign's sentinel runs in the device history (`sentinels/DEVICE.jsonl`).

After each finished cell, a sentinel (a cell repeating an earlier one) and the cell it
repeats each append one line: the cell's speed, its work fingerprint and its entry state,
read by `abbench sentinels` to follow the device across campaigns. A resume first appends
the lines a kill between the journal line and the history line kept from being written.
The history is keyed by run folder and cell, so nothing is appended twice.
"""

from __future__ import annotations

from pathlib import Path

from abbench.errors import RecordError
from abbench.records import (
    CellRecord,
    Plan,
    PlannedCell,
    SentinelLine,
    append_jsonl,
    history_file,
    read_journal,
    read_jsonl,
)
from abbench.sensors import Device


def append_sentinel(sentinels_dir: Path, device: Device, plan: Plan, folder: Path,
                    cell: PlannedCell, record: CellRecord) -> None:
    """Append a finished cell's line if it is a sentinel or the cell one repeats (a failed
    cell has no speed to follow: it appends none)."""
    is_twin = any(c.sentinel_of == cell.index for c in plan.cells)
    if (cell.sentinel_of is None and not is_twin) or record.status != "ok" \
            or not (record.tokens_per_s or 0) > 0:
        return
    sentinels_dir.mkdir(parents=True, exist_ok=True)
    append_jsonl(history_file(sentinels_dir, device.name), SentinelLine(
        device=device.name, simulated=device.simulated, campaign=plan.campaign,
        run=str(folder), cell=cell.label, name=cell.name, config_key=cell.config.key,
        t_wall=record.t_start_wall, tokens_per_s=record.tokens_per_s,
        fingerprint=record.fingerprint, entry=record.entry.to_json()).to_json())


def resend_sentinels(sentinels_dir: Path, device: Device, plan: Plan, folder: Path) -> None:
    """Append the lines of journaled cells that the history lacks."""
    try:
        sent = {(Path(str(d.get("run"))).name, d.get("cell"))
                for d in read_jsonl(history_file(sentinels_dir, device.name))}
    except RecordError:
        return  # a history that does not parse is not ours to extend blindly
    by_index = {c.index: c for c in plan.cells}
    for record in read_journal(folder):
        if (folder.name, record.label) not in sent and record.index in by_index:
            append_sentinel(sentinels_dir, device, plan, folder, by_index[record.index], record)
