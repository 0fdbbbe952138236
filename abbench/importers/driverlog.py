"""Reader for driver logs: the script that ran the runs, one `ENTRY STATE:` line per run.

Driver logs come in the field's own variants; every one of these is read:

```
09:01:12 ENTRY STATE: cell=NAME t_wall=1783846872 cpu_temp_c=44.8 battery_temp_c=38.1
         mem_available_mib=5626.7 thermal_status=1 caps=policy0:2188800/3321600,...
=============== qwen_base ===============
ENTRY STATE: batt=420 dC, memavail=6837980 kB, freq=1555200, waited=0s
[2026-07-12 09:30:12] ENTRY STATE: cell=gemma_sg cpu=47100 mC batt=41.1 C
=============== lru_a ===============
ENTRY: batt=354 dC lvl=86
3% cpu=42000 mC mem=6044032 kB freq=2265600
freq_cap=3033600/3321600 thermal=0
=== cell b1 ===
...
--- end b1 ---
```

- A `=== NAME ===` banner (three `=` or more each side) opens the *section* of the run it
  names: the lines up to the next banner, an end line `--- end NAME ---`, or the end of
  the file are that run's (what the engine printed for it: `discover` reads its
  configuration and summary from them). Every section is an entry of the log, in order,
  whether or not an entry line gives its readings; a section that names no run and holds
  no reading (`=== DONE ===`) is nothing.
- The run of an entry line is `cell=NAME` (or `name=`), else the section it stands in. A
  line naming neither is reported and skipped.
- `ENTRY:` is read as `ENTRY STATE:`, and `EXIT:` as `EXIT STATE:`. A line right after one
  of them that holds `key=value` items and no `:` continues it (a driver that printed a
  value with a line break inside, as the authors' 2026-07-20 cache-replay driver did).
- Between an end line and the next banner, a line of `key=value` items only is the next
  run's entry reading (`freq_cap=CAP/HW_MAX thermal=N`, the authors' 2026-07-20 sidecar
  driver): `freq_cap` gives the cap and the hardware maximum of the CPU, `thermal` the
  thermal status.
- Items are `key=value`, separated by spaces and/or commas; a value may carry its unit
  attached (`0s`) or as the next word (`420 dC`). Units: temperatures `C`, `dC`
  (deci-degrees), `mC` (milli); memory `kB`, `MB`/`MiB`, `GB`/`GiB`; frequency `Hz`, `kHz`,
  `MHz`, `GHz`; time `s`, `ms`. Without a unit a key's own convention holds (`*_c` °C,
  `*_mib` MiB, `memavail` kB as /proc/meminfo prints it, `batt` deci-degrees when above 200
  as `dumpsys battery` prints it, `freq`/`caps` kHz).
- `caps=POLICY:CAP[/HW_MAX],...` gives per cpufreq policy the cap and the hardware maximum;
  `freq=F` a cap of the CPU with no policy and no hardware maximum (policy `cpu`).
- `waited=S` is how long the driver's gate waited before the run.
- A timestamp at the start of the line (`2026-07-12 09:30:12`, `20260712-093012`) is the
  run's start when no `t_wall=` says it: its differences are exact, its zone unknown.
- `EXIT STATE:` (and `AFTER STATE:`) lines are the device after a run, in the same grammar:
  the run is `cell=NAME`, else the run of the last entry line above it (the one the driver
  was running). Each is kept with its entry line (`DriverEntry.after`); its time is when it
  was read, and the run's end when it is the exit line's.

```
ENTRY STATE: cell=qwen_sg t_wall=1783846872 caps=policy0:3300000/3300000
EXIT STATE: cell=qwen_sg t_wall=1783846931 cpu_temp_c=71.2 caps=policy0:1900000/3300000
```

A value that does not read is reported for its line and left out; unknown keys are kept
out silently. Nothing on such a line aborts the log, and no line aborts the folder.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from abbench.records import keys
from abbench.records.schema import is_number
from abbench.records.text import clip, quote, read_text

MARK = "ENTRY STATE:"
# The lines read after a run, each with the position its reading stands at (`keys`).
AFTER_MARKS = {"EXIT STATE:": keys.EXIT, "AFTER STATE:": keys.AFTER}
# Every mark a line may carry, the short forms read as the long ones.
MARKS = re.compile(r"(?<![A-Za-z_])(ENTRY STATE|ENTRY|EXIT STATE|EXIT|AFTER STATE):")
LONG = {"ENTRY": MARK, "ENTRY STATE": MARK, "EXIT": "EXIT STATE:", "EXIT STATE": "EXIT STATE:",
        "AFTER STATE": "AFTER STATE:"}
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*$")
BANNER = re.compile(r"^\s*={3,}\s*(\S(?:.*?\S)?)\s*={3,}\s*$")
SECTION_END = re.compile(r"^\s*-{3,}\s*end\s+(\S+)\s*-{3,}\s*$", re.IGNORECASE)
# A line that continues a mark line (items, no `:`), and one of items only.
CONTINUES = re.compile(r"^[^:]*(?:^|\s)[A-Za-z_][A-Za-z0-9_.]*=\S[^:]*$")
ONLY_ITEMS = re.compile(r"^\s*(?:[A-Za-z_][A-Za-z0-9_.]*=\S+\s*)+$")
# `freq_cap=CAP/HW_MAX`: the CPU's cap and its hardware maximum, kHz.
FREQ_PAIR = re.compile(r"^(\d+)/(\d+)$")
ITEM = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*([^\s,]*)(?:\s+([A-Za-z°%]+)(?=[\s,]|$))?")
VALUE = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)([A-Za-z°%]*)$")
CAPS = re.compile(r"(?<![A-Za-z0-9_])caps\s*=\s*(\S+)")
STAMP = re.compile(r"(?<!\d)(\d{4})-?(\d{2})-?(\d{2})[T _-]?(\d{2}):?(\d{2}):?(\d{2})(?!\d)")

TEMP_UNITS = {"c": 1.0, "°c": 1.0, "dc": 0.1, "mc": 0.001}
MEM_UNITS = {"kb": 1 / 1024, "kib": 1 / 1024, "mb": 1.0, "mib": 1.0, "gb": 1024.0,
             "gib": 1024.0, "b": 1 / 2**20}
FREQ_UNITS = {"hz": 1e-3, "khz": 1.0, "mhz": 1e3, "ghz": 1e6}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "min": 60.0}
CPU_KEYS = ("cpu_temp_c", "cpu_temp", "cpu", "soc", "cpu_c")
BATTERY_KEYS = ("battery_temp_c", "battery_temp", "batt", "battery", "batt_temp")
STATUS_KEYS = ("thermal_status", "status", "thermal")
MEM_KEYS = ("mem_available_mib", "memavail", "mem_available", "memavailable", "mem")
FREQ_KEYS = ("freq", "cap", "scaling_max", "scaling_max_freq", "freq_cap")


@dataclass(frozen=True)
class DriverEntry:
    cell: str
    line: int
    t_wall: float | None = None
    cpu_temp_c: float | None = None
    battery_temp_c: float | None = None
    mem_available_mib: float | None = None
    thermal_status: int | None = None
    caps_khz: dict[str, int] = field(default_factory=dict)
    hw_max_khz: dict[str, int] = field(default_factory=dict)
    source: str = ""  # the log's file name
    gate_waited_s: float | None = None
    t_wall_how: str = ""  # "t_wall=" | "line timestamp": how the start time was read
    named_by: str = "cell="  # "cell=" | "banner line N" | "entry line N" (an exit line)
    position: str = keys.BEFORE  # an entry line; `keys.EXIT`/`AFTER` for the lines after
    after: tuple[DriverEntry, ...] = ()  # the run's exit (and after) lines, in file order
    # a banner's section: its first and last line (what the engine printed for the run)
    body: tuple[int, int] | None = None
    read: bool = False  # an entry line (or a reading before the banner) gave its readings
    from_script: bool = False  # a driver script's run line: the order only, no readings

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.source else f"line {self.line}"


def is_driver_log(text: str) -> bool:
    """Whether a log is a driver's: it has entry lines, or banners that open sections."""
    return any(MARKS.search(line) or BANNER.match(line) for line in text.splitlines())


def has_entry_lines(text: str) -> bool:
    return any(MARKS.search(line) for line in text.splitlines())


def _scaled(value: float, unit: str, units: dict[str, float], default: float) -> float | None:
    if not unit:
        return value * default
    factor = units.get(unit.lower())
    return None if factor is None else value * factor


def _policies(body: str) -> tuple[dict[str, int], dict[str, int], list[str]]:
    caps, hw, bad = {}, {}, []
    for item in filter(None, body.split(",")):
        policy, colon, freqs = item.partition(":")
        cap, slash, top = freqs.partition("/")
        try:
            if not colon or not policy:
                raise ValueError
            caps[policy] = _khz(cap)
            if slash:
                hw[policy] = _khz(top)
        except ValueError:
            bad.append(f"caps: {quote(item)} is not POLICY:CAP[/HW_MAX] in kHz")
    return caps, hw, bad


def _khz(text: str) -> int:
    value = float(text)
    if not is_number(value) or value != int(value) or value < 0:
        raise ValueError(text)
    return int(value)


def _line_stamp(text: str) -> float | None:
    m = STAMP.search(text)
    if not m:
        return None
    try:  # the zone is not known: read as UTC, so differences between lines are exact
        year, month, day, hour, minute, second = (int(g) for g in m.groups())
        return datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def parse_driver_log(text: str, source: str | Path = "<text>",
                     notes: list[str] | None = None) -> list[DriverEntry]:
    """The log's entries in file order — every section and every entry line outside one —
    each with the exit lines of its run and its section's lines. What could not be read is
    appended to `notes` (one line each, naming the file and line) and left out."""
    name = Path(str(source)).name
    notes = notes if notes is not None else []
    entries: list[DriverEntry] = []
    section: int | None = None  # the entry of the section the line stands in
    between: tuple[str, int] | None = None  # a reading after an end line, for the next run
    lines = _joined(text.removeprefix("\ufeff").splitlines())
    last = 0
    for n, raw in lines:
        last = n
        mark = MARKS.search(raw)
        if mark is None:
            if m := BANNER.match(raw):
                _close(entries, section, n - 1)
                entries.append(DriverEntry(cell=m[1], line=n, source=name,
                                           named_by=f"banner line {n}", body=(n + 1, n)))
                section = len(entries) - 1
                if between is not None:
                    read = _items(between[0], f"{name}:{between[1]}", notes)
                    _enter(entries, section, read, between[1], "", name, notes)
                    between = None
            elif SECTION_END.match(raw):
                _close(entries, section, n - 1)
                section, between = None, None
            elif section is None and ONLY_ITEMS.match(raw):
                between = (raw, n)
            continue
        where = f"{name}:{n}"
        kind = LONG[mark[1]]
        prefix, body = raw[:mark.start()], raw[mark.end():]
        if kind != MARK:
            caps_text, kv = _items(body, where, notes, mark[0])
            cell = (kv.get("cell") or kv.get("name") or ("", ""))[0]
            _attach(entries, cell, DriverEntry(
                cell=cell, line=n, source=name, position=AFTER_MARKS[kind],
                **_readings(kv, caps_text, prefix, where, notes)), where, notes)
            continue
        caps_text, kv = _items(body, where, notes, mark[0])
        cell = (kv.get("cell") or kv.get("name") or ("", ""))[0]
        if section is not None and cell in ("", entries[section].cell) \
                and not _entered_inside(entries[section]):
            _enter(entries, section, (caps_text, kv), n, prefix, name, notes)
            continue
        if not SAFE_NAME.match(cell) or cell in (".", ".."):
            notes.append(f"{where}: `{MARK}` names no run (no cell=NAME and no "
                         f"`=== NAME ===` banner before it{f', got {quote(cell)}' if cell else ''}"
                         "): line skipped")
            continue
        entries.append(DriverEntry(cell=cell, line=n, source=name, read=True,
                                   **_readings(kv, caps_text, prefix, where, notes)))
    _close(entries, section, last)
    return entries


def _joined(lines: list[str]) -> list[tuple[int, str]]:
    """The lines with their numbers, each mark line joined with the lines that continue it
    (`CONTINUES`: items and no `:`, right after it)."""
    out: list[tuple[int, str]] = []
    open_mark = False
    for n, raw in enumerate(lines, 1):
        if open_mark and not MARKS.search(raw) and not BANNER.match(raw) \
                and CONTINUES.match(raw):
            out[-1] = (out[-1][0], f"{out[-1][1]} {raw.strip()}")
            continue
        open_mark = MARKS.search(raw) is not None
        out.append((n, raw))
    return out


def _entered_inside(e: DriverEntry) -> bool:
    """Whether a section's entry reading is an entry line inside it (not the reading before
    its banner, which an entry line inside replaces)."""
    return e.read and e.body is not None and e.line >= e.body[0]


def _close(entries: list[DriverEntry], section: int | None, end: int) -> None:
    if section is not None and entries[section].body is not None:
        first = entries[section].body[0]  # type: ignore[index]
        entries[section] = replace(entries[section], body=(first, max(first - 1, end)))


def _enter(entries: list[DriverEntry], section: int,
           read: tuple[str, dict[str, tuple[str, str]]], n: int, prefix: str, name: str,
           notes: list[str]) -> None:
    """A section's entry reading (`_items` of the entry line inside it, or of the items
    before its banner)."""
    where = f"{name}:{n}"
    caps_text, kv = read
    e = entries[section]
    entries[section] = replace(e, line=n, read=True,
                               **_readings(kv, caps_text, prefix, where, notes))


def _attach(entries: list[DriverEntry], cell: str, line: DriverEntry, where: str,
            notes: list[str]) -> None:
    """An exit (or after) line kept with its run's last entry line above it: the run it
    names, else the run that entry line started."""
    at = next((i for i in range(len(entries) - 1, -1, -1)
               if not cell or entries[i].cell == cell), None)
    if at is None:
        notes.append(f"{where}: {'run ' + quote(cell) if cell else 'an exit line'} has no "
                     f"`{MARK}` line above it: its reading is left out")
        return
    e = entries[at]
    named = "cell=" if cell else f"entry line {e.line}"
    entries[at] = replace(e, after=(*e.after, replace(line, cell=e.cell, named_by=named)))


def _items(body: str, where: str, notes: list[str],
           mark: str = MARK) -> tuple[str, dict[str, tuple[str, str]]]:
    """An entry line's text after the mark as its `caps=` value and its other items, each
    key (lower case; the first of a repeated key) with its value and unit."""
    caps_text = ""
    if m := CAPS.search(body):  # its value holds commas: read it before the rest
        caps_text, body = m[1], body[:m.start()] + " " + body[m.end():]
    kv: dict[str, tuple[str, str]] = {}
    for m in ITEM.finditer(body):
        kv.setdefault(m[1].lower(), (m[2], m[3] or ""))
    leftover = ITEM.sub("", body).replace(",", " ").split()
    if leftover:
        notes.append(f"{where}: `{mark}` {quote(' '.join(leftover))} is not key=value: "
                     "left out")
    return caps_text, kv


def _readings(kv: dict[str, tuple[str, str]], caps_text: str, prefix: str, where: str,
              notes: list[str]) -> dict[str, Any]:
    """An entry line's values as DriverEntry fields, in its units; what does not read is a
    note and left out."""

    def read(keys: tuple[str, ...], units: dict[str, float], default: float, what: str,
             per_key: dict[str, float] | None = None) -> float | None:
        return _read(kv, keys, units, default, what, where, notes, per_key)

    cpu = read(CPU_KEYS, TEMP_UNITS, 1.0, "the CPU temperature")
    bat = read(BATTERY_KEYS, TEMP_UNITS, 1.0, "the battery temperature")
    mem = read(MEM_KEYS, MEM_UNITS, 1.0, "MemAvailable",
               {"memavail": 1 / 1024, "memavailable": 1 / 1024})
    waited = read(("waited", "gate_waited_s", "wait"), TIME_UNITS, 1.0, "the gate wait")
    t_wall = read(("t_wall", "time", "ts", "epoch"), TIME_UNITS, 1.0, "the time of the line")
    how = "t_wall=" if t_wall is not None else ""
    if t_wall is None and (t_wall := _line_stamp(prefix)) is not None:
        how = "line timestamp"
    status = read(STATUS_KEYS, {}, 1.0, "the thermal status")
    if status is not None and status != int(status):
        notes.append(f"{where}: thermal_status {status:g} is not a whole number: left out")
        status = None
    caps, hw, bad = _policies(caps_text) if caps_text else ({}, {}, [])
    notes.extend(f"{where}: {b}: left out" for b in bad)
    pair = FREQ_PAIR.match(kv.get("freq_cap", ("", ""))[0])
    if pair and not caps:  # `freq_cap=CAP/HW_MAX` (kHz)
        caps, hw = {"cpu": int(pair[1])}, {"cpu": int(pair[2])}
    freq = None if pair else read(FREQ_KEYS, FREQ_UNITS, 1.0, "the CPU frequency cap")
    if freq is not None and not caps:
        caps = {"cpu": int(round(freq))}
    values = {k: v for k, v in (("cpu_temp_c", cpu), ("battery_temp_c", bat),
                                ("mem_available_mib", mem)) if v is not None}
    return {"t_wall": t_wall, "caps_khz": caps, "hw_max_khz": hw,
            "thermal_status": None if status is None else int(status),
            "gate_waited_s": waited, "t_wall_how": how, **values}


def _read(kv: dict[str, tuple[str, str]], keys: tuple[str, ...], units: dict[str, float],
          default: float, what: str, where: str, notes: list[str],
          per_key: dict[str, float] | None = None) -> float | None:
    """The first of `keys` on the line as a number in the unit asked for (`units`: factor
    per unit name; `default`, or `per_key`'s, without one); a note and None when it does
    not read."""
    for key in keys:
        if key not in kv:
            continue
        text_value, unit = kv[key]
        m = VALUE.match(text_value)
        if not m:
            notes.append(f"{where}: `{key}` {quote(text_value)} is not a number: {what} "
                         "left out")
            return None
        number, attached = float(m[1]), m[2] or unit
        scale = (per_key or {}).get(key, default)
        if key == "batt" and not attached and number > 200:
            scale = 0.1  # dumpsys battery: deci-degrees
        if not math.isfinite(number):
            notes.append(f"{where}: `{key}` {quote(text_value)} is not a finite number: "
                         f"{what} left out")
            return None
        out = _scaled(number, attached, units, scale)
        if out is None:
            notes.append(f"{where}: `{key}` unit {quote(attached)} is not one abbench reads "
                         f"for {what}: left out")
        elif not is_number(out):  # a record refuses past LIMIT, naming no file
            notes.append(f"{where}: `{key}` {quote(text_value)} is out of range: {what} "
                         "left out")
            return None
        return out
    return None


def merge_driver_logs(logs: list[tuple[str, list[DriverEntry]]],
                      notes: list[str]) -> tuple[list[DriverEntry], str]:
    """Several driver logs of one folder as one sequence, and how it was ordered: by every
    entry's start time when all have one, else log after log in file-name order (each
    log's lines in file order), which a note says."""
    entries = [e for _, es in logs for e in es]
    if len(logs) <= 1:
        return entries, "file order"
    if all(e.t_wall is not None for e in entries):
        return sorted(entries, key=lambda e: (e.t_wall, e.source, e.line)), "start times"
    names = ", ".join(clip(n) for n, _ in logs)
    notes.append(f"driver logs {names}: not every entry line has a time, so the logs are "
                 "taken one after another in file-name order")
    return entries, "file-name order of the logs"


def read_driver_log(path: Path) -> list[DriverEntry]:
    return parse_driver_log(read_text(path), path)
