"""The layout's rules (docs/architecture.md), checked on the source: data flows one way,
and only the commands compose campaign → analysis → report."""

from __future__ import annotations

import ast
import re
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


SAMPLE_KEY = re.compile(r"(temp|battery|mem|android|gpu|cpu|psi|load)\.[A-Za-z0-9_{}.]*\Z")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def sample_key_literals(path: Path) -> list[tuple[int, str]]:
    """String constants (and f-strings' leading text) spelled like a sample key."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and SAMPLE_KEY.match(str(first.value)):
                found.append((node.lineno, str(first.value)))
                skip |= {id(v) for v in node.values}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in skip and SAMPLE_KEY.match(node.value)):
            found.append((node.lineno, node.value))
    return found


def test_sample_keys_are_spelled_only_in_records_keys() -> None:
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel != "records/keys.py" and (found := sample_key_literals(path)):
            offenders[rel] = found
    assert not offenders, offenders


def test_the_key_check_finds_a_literal(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""Reads temp.cpu_c."""\nx = {"temp.cpu_c": 1}\ny = f"cpu.{p}.cap_khz"\n')
    assert sample_key_literals(bad) == [(3, "cpu."), (2, "temp.cpu_c")]


@pytest.mark.parametrize(("package", "allowed"), [
    ("records", ("abbench.errors", "abbench.fsutil", "abbench.records")),
    ("sim", ("abbench.errors", "abbench.fsutil", "abbench.records", "abbench.sensors",
             "abbench.sim")),
    ("fleet", ("abbench.errors", "abbench.fsutil", "abbench.records", "abbench.sensors",
               "abbench.sim", "abbench.fleet")),
])
def test_the_lower_layers_import_only_what_is_below_them(package: str,
                                                         allowed: tuple[str, ...]) -> None:
    for path in files(package):
        bad = {m for m in imports_of(path) if not m.startswith(allowed)}
        assert not bad, (path.relative_to(PACKAGE).as_posix(), bad)


def test_sensors_know_nothing_of_the_simulation() -> None:
    for path in files("sensors"):
        assert not {m for m in imports_of(path) if m.startswith("abbench.sim")}, path


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """module -> the abbench modules it imports (anywhere in the file): `from X import y`
    is an edge to X (its `__init__` runs first: `from abbench.report import text` inside
    the report package runs back into the package's face) and to X.y when that is a
    module."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("abbench"):
                edges.add(node.module)
                edges |= {sub for alias in node.names
                          if (sub := f"{node.module}.{alias.name}") in modules}
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_no_import_cycle() -> None:
    assert find_cycle(_graph()) is None


def test_the_cycle_check_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"p": {"p.x"}, "p.x": set()}) is None  # a package's face
    # a module importing its own package's face while the face imports it
    assert find_cycle({"p": {"p.x"}, "p.x": {"p"}}) == ["p", "p.x", "p"]


def _exception_classes(tree: ast.Module) -> list[str]:
    """Classes whose bases name an exception or warning (`...Error`, `Exception`,
    `...Warning`, `BadField`)."""
    def is_exception(base: ast.expr) -> bool:
        name = base.id if isinstance(base, ast.Name) else \
            base.attr if isinstance(base, ast.Attribute) else ""
        return name.endswith(("Error", "Exception", "Warning")) or name == "BadField"
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            and any(is_exception(b) for b in n.bases)]


def test_every_exception_class_is_in_errors() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        names = _exception_classes(ast.parse(path.read_text()))
        if names:
            found[str(path.relative_to(PACKAGE))] = names
    assert found == {}, f"exception classes outside abbench/errors.py: {found}"
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    assert {"AbbenchError", "BadField", "OrderWarning"} <= set(_exception_classes(tree))


def test_the_exception_check_finds_one() -> None:
    tree = ast.parse("class Oops(ValueError):\n    pass\nclass Fine:\n    pass\n")
    assert _exception_classes(tree) == ["Oops"]


def test_an_engine_cell_does_not_load_scipy(tiny_model: Path) -> None:
    """scipy (~25 MiB of RSS with its own OpenBLAS, ~0.3 s to import) is for the analysis:
    an embedded-engine cell, which runs the CLI in a child, must not pay for it (P6)."""
    import subprocess
    import sys

    code = ("import sys; from abbench.cli import main; "
            f"rc = main(['engine', 'run', '-m', {str(tiny_model)!r}, '-n', '4', '-q']); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'scipy'}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "0 []", p.stdout


def test_ray_is_imported_only_by_the_fleet_runner() -> None:
    """Ray is an extra (`.[fleet]`): nothing else may need it."""
    def imports_ray(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                return True
        return False

    users = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
             if imports_ray(path)}
    assert users == {"fleet/runner.py"}
