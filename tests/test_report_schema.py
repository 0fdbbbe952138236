"""report.json against its documentation: every key the report writes is documented in
docs/report.md, and every documented key is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from runs_helper import cell, make_run

from abbench.report import write_reports

DOC = Path(__file__).resolve().parents[1] / "docs" / "report.md"


def documented() -> tuple[set[str], dict[str, set[str]]]:
    """Top-level keys, and the documented fields of each `name[]` list."""
    rows = [ln for ln in DOC.read_text().split("## report.json keys")[1].splitlines()
            if ln.startswith("| `")]
    top: set[str] = set()
    lists: dict[str, set[str]] = {}
    for row in rows:
        key_cell, meaning = row.split("|")[1:3]
        names = re.findall(r"`([^`]+)`", key_cell)
        for name in names:
            if name.endswith("[]") and "." not in name:
                top.add(name[:-2])
                if meaning.strip().startswith("`"):
                    fields = re.findall(r"`([^`]+)`", meaning)[0].split()
                    lists[name[:-2]] = {f.removesuffix("[]") for f in fields}
            elif "." not in name:
                top.add(name)
    return top, lists


def test_report_json_matches_its_documentation(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 48), cell("B", 41)],
                   [{"candidate": "C", "baseline": "B", "min_effect": 0.03}])
    write_reports(run)
    doc = json.loads((run / "report.json").read_text())
    top, lists = documented()
    assert set(doc) == top, (set(doc) - top, top - set(doc))
    for name, fields in lists.items():
        for item in doc[name]:
            assert set(item) == fields, (name, set(item) ^ fields)
