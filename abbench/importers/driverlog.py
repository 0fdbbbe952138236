"""Reader for driver logs: the script that ran the runs, one `ENTRY STATE:` line per run.

No driver log ships in `reference/bmoe/`; this is the line format abbench reads (see
docs/import.md), one line per run in the order the runs were started:

```
[anything] ENTRY STATE: cell=NAME [t_wall=EPOCH_S] [cpu_temp_c=44.8] [battery_temp_c=38.1]
           [mem_available_mib=5626.7] [thermal_status=1]
           [caps=policy0:2188800/3321600,policy6:1651200/3801600]
```

`cell` names the run (its file name stem); `caps` gives per cpufreq policy the cap and,
after the slash, the hardware maximum (kHz). Every other key is optional and an absent one
is "not recorded"; unknown keys are skipped. Other lines of the log are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from abbench.importers.errors import ForeignRunError, number, quote, read_text

MARK = "ENTRY STATE:"
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*$")
FLOATS = ("t_wall", "cpu_temp_c", "battery_temp_c", "mem_available_mib")


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


def is_driver_log(text: str) -> bool:
    return MARK in text


def _caps(body: str, source: str | Path, n: int) -> tuple[dict[str, int], dict[str, int]]:
    caps, hw = {}, {}
    for item in filter(None, body.split(",")):
        policy, colon, freqs = item.partition(":")
        cap, slash, top = freqs.partition("/")
        if not colon or not policy:
            raise ForeignRunError(source, f"caps: {quote(item)} is not POLICY:CAP[/HW_MAX]", n)
        caps[policy] = _khz(cap, source, n)
        if slash:
            hw[policy] = _khz(top, source, n)
    return caps, hw


def _khz(text: str, source: str | Path, n: int) -> int:
    value = number(text, source, n, "caps")
    if value != int(value) or value < 0:
        raise ForeignRunError(source, f"caps: {quote(text)} is not a frequency in kHz", n)
    return int(value)


def parse_driver_log(text: str, source: str | Path = "<text>") -> list[DriverEntry]:
    entries: list[DriverEntry] = []
    for n, raw in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        if MARK not in raw:
            continue
        kv: dict[str, str] = {}
        for pair in raw.split(MARK, 1)[1].split():
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise ForeignRunError(source, f"`{MARK}` {quote(pair)} is not key=value", n)
            kv[key] = value
        cell = kv.get("cell", "")
        if not SAFE_NAME.match(cell) or cell in (".", ".."):
            raise ForeignRunError(source, f"`{MARK}` needs cell=NAME (letters, digits, . _ + -),"
                                  f" got {quote(cell)}", n)
        values = {k: number(kv[k], source, n, k) for k in FLOATS if kv.get(k)}
        caps, hw = _caps(kv.get("caps", ""), source, n)
        status = None
        if kv.get("thermal_status"):
            status = number(kv["thermal_status"], source, n, "thermal_status")
            if status != int(status):
                raise ForeignRunError(source, "thermal_status: not a whole number", n)
        entries.append(DriverEntry(cell=cell, line=n, caps_khz=caps, hw_max_khz=hw,
                                   thermal_status=None if status is None else int(status),
                                   **values))
    return entries


def read_driver_log(path: Path) -> list[DriverEntry]:
    return parse_driver_log(read_text(path), path)
