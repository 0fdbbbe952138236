"""Reader for `.metrics` files: the device pressure a driver script recorded around a run
(scripts/bench-run.sh:39-49 of the phone-streaming engine), or a bmoe cell's wrapper
(`campaign.bmoe`) around its cell.

```
peak_rss_kb=5888168
mem_avail_before_kb=5761708
batt_temp_before_dC=381          deci-degrees Celsius
cpu_temp_before_mC=44800         milli-degrees Celsius
```

One `key=value` a line; blank lines and `#` comments are skipped; an empty value means
"not recorded" (None). A key that appears twice keeps its first value: the reference
files repeat their block when the driver appended twice. A `.metrics` file that is a
per-token CSV instead (the route-trace folder's) is for `bmoe_csv`, see
`looks_like_bmoe_csv`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from abbench.errors import ForeignRunError
from abbench.records.text import clip, number, quote, read_text


def parse_metrics(text: str, source: str | Path = "<text>") -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for n, raw in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or any(c.isspace() for c in key):
            raise ForeignRunError(source, f"{quote(line, 60)} is not key=value", n)
        parsed = None if value == "" else number(value, source, n, f"`{clip(key)}`")
        out.setdefault(key, parsed)
    return out


def read_metrics(path: Path) -> dict[str, float | None]:
    return parse_metrics(read_text(path), path)


@dataclass(frozen=True)
class Pressure:
    """A `.metrics` file's readings, each named and in the unit its key names (kB,
    milli- or deci-degrees Celsius), as bench-run.sh writes them (its lines 39-49); None:
    not recorded. Keys no field names are kept in `extra`."""

    # named as the files spell the keys (mC: milli-degrees, dC: deci-degrees Celsius)
    peak_rss_kb: float | None = None
    mem_avail_before_kb: float | None = None
    mem_avail_floor_kb: float | None = None
    mem_avail_after_kb: float | None = None
    cpu_temp_before_mC: float | None = None
    cpu_temp_max_mC: float | None = None
    cpu_temp_after_mC: float | None = None
    batt_temp_before_dC: float | None = None
    batt_temp_max_dC: float | None = None
    batt_temp_after_dC: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Mapping[str, float | None]) -> Pressure:
        """The readings of a parsed file (`parse_metrics`) or of a summary.json's
        `metrics` (None where a value is not a number)."""
        named = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in values.items() if k in named},
                   extra={k: v for k, v in values.items() if k not in named and v is not None})

    def __len__(self) -> int:
        """How many readings are recorded."""
        return sum(getattr(self, f.name) is not None for f in dataclasses.fields(self)
                   if f.name != "extra") + len(self.extra)
