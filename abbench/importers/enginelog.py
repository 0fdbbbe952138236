"""Reader for the engine's own `.log` beside a headerless CSV: its summary lines (DESIGN 6.2).

```
generation: 256 tokens, 0.423 s/token (2.366 tok/s)
prefill: 34 tokens, 7.324 s (4.6 tok/s) | model load 18.554 s | TTFT 25.877 s
moe-cache: 53.0% hit, resident 1999.2 MiB
```

Only `generation:` is required of a run's summary; the rest fill what they can.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from abbench.importers.errors import number, read_text

NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
GENERATION = re.compile(rf"generation:\s*{NUM}\s+tokens,\s*{NUM}\s*s/token\s*\(\s*{NUM}\s*tok/s\)")
PREFILL = re.compile(rf"prefill:\s*{NUM}\s+tokens,\s*{NUM}\s*s\b.*?model load\s*{NUM}\s*s")
CACHE = re.compile(rf"moe-cache:\s*{NUM}%\s*hit")


def parse_engine_log(text: str, source: str | Path = "<text>") -> dict[str, Any]:
    """The summary a `.log` gives, in `# summary` keys; {} when it has no `generation:`."""
    out: dict[str, Any] = {}
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        if m := GENERATION.search(line):
            out["tokens"] = number(m[1], source, n, "generation tokens")
            out["s/tok"] = number(m[2], source, n, "generation s/token")
            out["tok/s"] = number(m[3], source, n, "generation tok/s")
        elif m := PREFILL.search(line):
            out["n_prompt"] = number(m[1], source, n, "prefill tokens")
            out["prefill_s"] = number(m[2], source, n, "prefill s")
            out["load_s"] = number(m[3], source, n, "model load s")
        elif m := CACHE.search(line):
            out["cache_hit_pct"] = number(m[1], source, n, "moe-cache hit")
    return out if "tok/s" in out else {}


def read_engine_log(path: Path) -> dict[str, Any]:
    return parse_engine_log(read_text(path), path)
