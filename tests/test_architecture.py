"""The layout's rules (DESIGN 2), checked on the source: data flows one way, and only the
commands compose campaign → analysis → report."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "abbench"


def imports_of(path: Path) -> set[str]:
    """The abbench modules a file imports (absolute imports; the package is absolute-only)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("abbench"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("abbench")}
    return out


def files(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def test_nothing_imports_the_commands_or_the_cli() -> None:
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("commands/") or rel in ("cli.py", "__main__.py"):
            continue
        bad = {m for m in imports_of(path) if m.startswith(("abbench.commands", "abbench.cli"))}
        assert not bad, (rel, bad)


@pytest.mark.parametrize(("package", "forbidden"), [
    ("analysis", ("abbench.campaign", "abbench.report", "abbench.engine", "abbench.importers")),
    ("campaign", ("abbench.analysis", "abbench.report")),
    ("report", ("abbench.campaign", "abbench.engine", "abbench.importers")),
    ("sensors", ("abbench.engine", "abbench.campaign", "abbench.analysis", "abbench.report")),
    ("engine", ("abbench.campaign", "abbench.analysis", "abbench.report", "abbench.sensors")),
])
def test_data_flows_one_way(package: str, forbidden: tuple[str, ...]) -> None:
    for path in files(package):
        bad = {m for m in imports_of(path) if m.startswith(forbidden)}
        assert not bad, (path.relative_to(PACKAGE).as_posix(), bad)
