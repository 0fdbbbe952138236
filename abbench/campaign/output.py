"""Reading what a cell produced: the engine's JSON, or an external command's output.

`output` of an external cell: `bmoe-csv:PATH` (a per-token CSV in the seed engine's layout,
with or without preamble and `# summary`), `json:PATH` (an engine run JSON), or
`stdout-summary` (the `generation:` line in the command's stdout). A PATH on a remote
device is read with `cat` over the device's transport.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

from abbench.errors import CellOutputError
from abbench.sensors import Device

GENERATION = re.compile(
    r"generation:\s*(\d+)\s+tokens,\s*([\d.]+)\s*s/token\s*\(([\d.]+)\s*tok/s\)"
)


def read_cell_output(
    cfg: dict[str, Any], out: Path, device: Device
) -> tuple[dict[str, Any], str | None]:
    if cfg.get("engine", "embedded") == "embedded":
        return _engine_json(out / "summary.json")
    kind, _, where = str(cfg["output"]).partition(":")
    if kind == "stdout-summary":
        text = (out / "stdout.txt").read_text(encoding="utf-8", errors="replace")
        m = GENERATION.search(text)
        if not m:
            raise CellOutputError("no `generation:` line in the command's stdout")
        return {"tokens": int(m[1]), "s/tok": float(m[2]), "tok/s": float(m[3])}, None
    text = _fetch(where, device)
    if kind == "json":
        (out / "summary.json").write_text(text, encoding="utf-8")
        return _engine_json(out / "summary.json")
    (out / "tokens.csv").write_text(text, encoding="utf-8")
    return summarize_bmoe_csv(text, where)


def _fetch(path: str, device: Device) -> str:
    if device.transport == "local":
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise CellOutputError(f"cannot read the cell's output {path}: {e.strerror}") from None
    done = device.run(["cat", path], timeout=60)
    if done.returncode != 0:
        raise CellOutputError(f"cannot read {path} on {device.name}: {done.stderr.strip()[:200]}")
    return done.stdout


def _engine_json(path: Path) -> tuple[dict[str, Any], str | None]:
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


def summarize_bmoe_csv(text: str, name: str) -> tuple[dict[str, Any], str | None]:
    """tok/s from a bmoe_metrics CSV: its `# summary` line, else the rows' wall times."""
    summary: dict[str, Any] = {}
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("# summary"):
            for pair in line[len("# summary"):].split():
                key, _, value = pair.partition("=")
                try:
                    summary[key] = float(value)
                except ValueError:
                    summary[key] = value
        elif not line.startswith("#") and line.strip():
            rows.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(rows)))
    walls, reads = [], []
    try:
        for row in reader:
            walls.append(float(row["wall_ms"]))
            if row.get("read_bytes") not in (None, ""):
                reads.append(int(float(row["read_bytes"])))
    except (KeyError, ValueError, TypeError) as e:
        raise CellOutputError(f"{name}: not a bmoe_metrics CSV ({e})") from None
    if "tok/s" not in summary:
        if not walls:
            raise CellOutputError(f"{name}: no token rows and no `# summary` line")
        summary["tokens"] = len(walls)
        summary["s/tok"] = sum(walls) / len(walls) / 1e3
        summary["tok/s"] = len(walls) / (sum(walls) / 1e3)
    summary.setdefault("tokens", len(walls))
    fp = None
    if reads:  # the work an external engine reports: bytes read per token
        fp = "sha256:" + hashlib.sha256(json.dumps(reads).encode()).hexdigest()
    return summary, fp
