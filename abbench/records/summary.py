"""The engine's run summary: its JSON document (`--json`, a cell's summary.json) and the
`generation:` console line, which the seed engine, abbench's engine and an external cell's
`output = "stdout-summary"` all print:

```
generation: 64 tokens, 0.105 s/token (9.524 tok/s)
```
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from abbench.errors import CellOutputError

JSON_FORMAT = "abbench-engine-run v1"
NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
GENERATION = re.compile(
    rf"generation:\s*{NUMBER}\s+tokens,\s*{NUMBER}\s*s/token\s*\(\s*{NUMBER}\s*tok/s\)")


def generation_line(tokens: int, s_per_token: float, tokens_per_s: float) -> str:
    return f"generation: {tokens} tokens, {s_per_token:.3f} s/token ({tokens_per_s:.3f} tok/s)"


def read_generation(text: str) -> dict[str, Any] | None:
    """tokens, s/tok and tok/s of the last `generation:` line in `text`; None without one."""
    found = list(GENERATION.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {"tokens": int(float(m[1])), "s/tok": float(m[2]), "tok/s": float(m[3])}


def read_engine_json(path: Path) -> tuple[dict[str, Any], str | None]:
    """The summary and fingerprint of an engine run JSON; CellOutputError when it is absent
    or not one."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        summary = doc["summary"]
        if not isinstance(summary, dict):
            raise TypeError("summary is not an object")
    except FileNotFoundError:
        raise CellOutputError(f"the cell wrote no {path.name}") from None
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CellOutputError(f"{path.name} is not an engine run JSON ({e})") from None
    fp = doc.get("fingerprint")
    return summary, fp if isinstance(fp, str) else None
