"""Reader for `.state` snapshots: an Android device's state before and after a run.

```
--- BEFORE ---
date: Wed Jul 15 09:05:49 CEST 2026                       `date`'s default output
policy0: scaling_max=2188800 hw_max=3321600 cur=806400    cpufreq policy, kHz: cap vs hw max
meminfo: MemFree: 1092976 kB MemAvailable: 6151240 kB Cached: 5031736 kB
battery_temp_dC:                                           empty: not recorded
Thermal Status: 1                                          `dumpsys thermalservice`
	Temperature{mValue=99.6, mType=0, mName=CPU0, mStatus=0}
--- AFTER ---
...
```

A section's first word says where its snapshot stands in the run (`Snapshot.position`):
`BEFORE` (`ENTRY`, `START`, `PRE`) the entry, `AFTER` (`END`, `POST`) after it, `EXIT` the
exit; any other name (`--- DURING ---`, `--- MID 2 ---`) is a reading during the run, and
may repeat (BEFORE and AFTER may not).

Lines of other kinds are skipped (devices print more than we use); a line of a known kind
that does not parse is an error naming the file and line. `Temperature` types follow
Android's `Temperature.TYPE_*` (0 CPU, 1 GPU, 2 battery, 3 skin).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError
from abbench.records import keys
from abbench.records.text import clip, number, quote, read_text

SECTION = re.compile(r"---\s*([A-Za-z][A-Za-z0-9_ +.:-]*?)\s*---$")
ONCE = ("BEFORE", "AFTER")  # the entry and the end: one of each
POLICY = re.compile(r"(policy\d+):\s*(.*)$")
TEMPERATURE = re.compile(r"Temperature\{(.*)\}$")
# `date` prints the zone's abbreviation; these are the ones whose offset is unambiguous.
# Any other leaves the snapshot's time unknown rather than guessed.
ZONES = {"UTC": 0, "GMT": 0, "WET": 0, "WEST": 1, "CET": 1, "CEST": 2, "EET": 2, "EEST": 3,
         "MSK": 3, "BST": 1, "IST": 5.5, "JST": 9, "KST": 9, "EST": -5, "EDT": -4,
         "CDT": -5, "MST": -7, "MDT": -6, "PST": -8, "PDT": -7}
TYPE_CPU, TYPE_BATTERY = 0, 2
# A section's position by its name's first word; any other name is a reading during the run.
POSITIONS = {"BEFORE": keys.BEFORE, "ENTRY": keys.BEFORE, "START": keys.BEFORE,
             "PRE": keys.BEFORE, "AFTER": keys.AFTER, "END": keys.AFTER, "POST": keys.AFTER,
             "EXIT": keys.EXIT}


@dataclass(frozen=True)
class Policy:
    scaling_max_khz: int | None  # the cap
    hw_max_khz: int | None
    cur_khz: int | None


@dataclass(frozen=True)
class Snapshot:
    section: str  # "BEFORE", "AFTER", "DURING", ... (upper case)
    line: int
    date: str | None = None
    t_wall: float | None = None  # None: no date, or a zone we do not know
    policies: dict[str, Policy] = field(default_factory=dict)
    meminfo_kb: dict[str, int] = field(default_factory=dict)
    battery_temp_dC: float | None = None
    thermal_status: int | None = None
    temperatures: dict[str, tuple[float, int]] = field(default_factory=dict)  # name: (C, type)

    @property
    def position(self) -> str:
        """Where the snapshot stands in its run (`keys.POSITIONS`), by its section's name."""
        first = re.split(r"[^A-Z]+", self.section, maxsplit=1)[0]
        return POSITIONS.get(first, keys.DURING)

    def hottest(self, kind: int) -> float | None:
        values = [c for c, t in self.temperatures.values() if t == kind]
        return max(values) if values else None

    @property
    def cpu_temp_c(self) -> float | None:
        return self.hottest(TYPE_CPU)

    @property
    def battery_temp_c(self) -> float | None:
        if self.battery_temp_dC is not None:
            return self.battery_temp_dC / 10
        return self.hottest(TYPE_BATTERY)

    @property
    def mem_available_mib(self) -> float | None:
        kb = self.meminfo_kb.get("MemAvailable")
        return None if kb is None else kb / 1024


@dataclass(frozen=True)
class DeviceState:
    source: str
    snapshots: tuple[Snapshot, ...]

    def section(self, name: str) -> Snapshot | None:
        return next((s for s in self.snapshots if s.section == name), None)

    @property
    def before(self) -> Snapshot | None:
        """The entry snapshot: the first of position before (`--- BEFORE ---`, `PRE` ...)."""
        return next((s for s in self.snapshots if s.position == keys.BEFORE), None)

    @property
    def after(self) -> Snapshot | None:
        """The end snapshot: the first of position after (`--- AFTER ---`, `END` ...)."""
        return next((s for s in self.snapshots if s.position == keys.AFTER), None)


def parse_date(text: str) -> float | None:
    """`Wed Jul 15 09:05:49 CEST 2026` → epoch seconds; None for an unknown zone."""
    parts = text.split()
    if len(parts) != 6 or parts[4] not in ZONES:
        return None
    try:
        naive = datetime.strptime(" ".join(parts[:4] + parts[5:]), "%a %b %d %H:%M:%S %Y")
    except ValueError:
        return None
    return naive.replace(tzinfo=timezone(timedelta(hours=ZONES[parts[4]]))).timestamp()


def _int(text: str, source: str | Path, n: int, what: str) -> int:
    value = number(text, source, n, what)
    if value != int(value) or value < 0:
        raise ForeignRunError(source, f"{what}: {quote(text)} is not a whole number >= 0", n)
    return int(value)


def _pairs(body: str, source: str | Path, n: int, what: str) -> dict[str, str]:
    out = {}
    for pair in body.replace(",", " ").split():
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ForeignRunError(source, f"{what}: {quote(pair)} is not key=value", n)
        out[key] = value
    return out


def _policy(body: str, source: str | Path, n: int, name: str) -> Policy:
    kv = _pairs(body, source, n, name)
    if not {"scaling_max", "hw_max"} & kv.keys():
        raise ForeignRunError(source, f"{name}: neither scaling_max= nor hw_max=", n)
    get = {k: _int(kv[k], source, n, f"{name} {k}") if kv.get(k) else None
           for k in ("scaling_max", "hw_max", "cur")}
    return Policy(get["scaling_max"], get["hw_max"], get["cur"])


def _meminfo(body: str, source: str | Path, n: int) -> dict[str, int]:
    tokens = body.split()
    out = {}
    i = 0
    while i < len(tokens):  # `Name: value kB` triples
        key = tokens[i]
        if not key.endswith(":") or i + 1 >= len(tokens):
            raise ForeignRunError(source, f"meminfo: expected `Name: value kB` at {quote(key)}", n)
        out[key[:-1]] = _int(tokens[i + 1], source, n, f"meminfo {clip(key[:-1])}")
        i += 3 if i + 2 < len(tokens) and tokens[i + 2] == "kB" else 2
    return out


def parse_state(text: str, source: str | Path = "<text>") -> DeviceState:
    snapshots: list[Snapshot] = []
    cur: dict[str, Any] | None = None

    def close() -> None:
        if cur is not None:
            snapshots.append(Snapshot(**cur))

    for n, raw in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if m := SECTION.match(line):
            close()
            name = m[1].upper()
            if name in ONCE and any(s.section == name for s in snapshots):
                raise ForeignRunError(source, f"a second `--- {name} ---` section", n)
            cur = {"section": name, "line": n}
            continue
        if cur is None:
            raise ForeignRunError(source, "text before the first `--- BEFORE ---` section", n)
        key, _, body = line.partition(":")
        body = body.strip()
        if key == "date":
            cur["date"], cur["t_wall"] = body, parse_date(body)
        elif m := POLICY.match(line):
            cur.setdefault("policies", {})[m[1]] = _policy(m[2], source, n, clip(m[1]))
        elif key == "meminfo":
            cur["meminfo_kb"] = _meminfo(body, source, n)
        elif key == "battery_temp_dC":
            cur["battery_temp_dC"] = number(body, source, n, key) if body else None
        elif key == "Thermal Status":
            cur["thermal_status"] = _int(body, source, n, key)
        elif m := TEMPERATURE.match(line):
            kv = _pairs(m[1], source, n, "Temperature")
            if "mValue" not in kv or "mName" not in kv:
                raise ForeignRunError(source, "Temperature{...} without mValue or mName", n)
            kind = number(kv.get("mType", "-1"), source, n, "mType")
            if kind != int(kind):
                raise ForeignRunError(
                    source, f"mType: {quote(kv['mType'])} is not a whole number", n)
            cur.setdefault("temperatures", {})[kv["mName"]] = (
                number(kv["mValue"], source, n, "mValue"), int(kind))
    close()
    if not snapshots:
        raise ForeignRunError(source, "no `--- BEFORE ---` / `--- AFTER ---` section "
                              "(empty, or not a .state snapshot)")
    return DeviceState(str(source), tuple(snapshots))


def read_state(path: Path) -> DeviceState:
    return parse_state(read_text(path), path)
