"""The layout's rules (docs/architecture.md), checked on the source: data flows one way,
and only the commands compose campaign → analysis → report."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from abbench.records import cell_doc, tokens

PACKAGE = Path(__file__).resolve().parents[1] / "abbench"


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """`path`'s syntax tree, parsed once for every test that reads it (read, never changed)."""
    return ast.parse(path.read_text())


def imports_of(path: Path) -> set[str]:
    """The abbench modules a file imports (absolute imports; the package is absolute-only)."""
    out = set()
    for node in ast.walk(_parsed(path)):
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
    tree = _parsed(path)
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


CELL_KEYS = frozenset({*tokens.CSV_COLUMNS, *tokens.PER_TOKEN_COLUMNS,
                       *tokens.PREFILL_COLUMNS, *tokens.TURN_COLUMNS,
                       *cell_doc.TOP_LEVEL_KEYS})
# Modules whose own format has a key spelled like a cell's: these names there are that
# format's keys, not a cell's.
OWN_FORMATS = {
    "analysis/tells.py": {"model"},  # a configuration's `model`
    "campaign/bmoe.py": {"model"},  # bmoe-cli's `--model`, as a `bmoe` table key
    "campaign/resolve.py": {"model", "tokens"},  # cells.toml's keys
    "campaign/cell_spec.py": {"model", "tokens"},  # cells.toml's keys
    "campaign/tables.py": {"model", "tokens"},  # cells.toml's keys
    "commands/calibrate.py": {"model", "tokens"},  # the calibration's cells.toml keys
    "commands/sensors.py": {"samples"},  # its JSON output
    "engine/config.py": {"model"},  # the engine's configuration
    "engine/synth/vocab.py": {"model"},  # a tokenizer.json's `model`
    "engine/run/telemetry.py": {"model"},  # the bmoe CSV preamble's `model=`
    "engine/streaming/prelaid.py": {"format", "model"},  # the pre-laid copy's header
    "importers/identity.py": {"model"},  # a configuration's `model`
    "report/fleet.py": {"format"},  # the fleet report's JSON
    "report/json_report.py": {"fingerprint", "format", "notes", "samples", "tokens",
                              "wall_ms"},  # report.json (docs/report.md)
    "report/replay.py": {"format", "hits", "model", "read_bytes"},  # docs/replay.md
}


def cell_key_literals(path: Path) -> list[tuple[int, str]]:
    """String constants naming a per-token column or a summary.json top-level key where a
    key is used — a subscript, the first argument of `.get(...)`, a dict display's key —
    so that prose and labels do not count."""
    found = []
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Subscript):
            used = [node.slice]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args):
            used = [node.args[0]]
        elif isinstance(node, ast.Dict):
            used = [k for k in node.keys if k is not None]
        else:
            continue
        found += [(k.lineno, k.value) for k in used if isinstance(k, ast.Constant)
                  and isinstance(k.value, str) and k.value in CELL_KEYS]
    return sorted(found)


def test_cell_keys_are_spelled_only_in_records() -> None:
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        own = OWN_FORMATS.get(rel, set())
        found = [(n, k) for n, k in cell_key_literals(path) if k not in own]
        if not rel.startswith("records/") and found:
            offenders[rel] = found
    assert not offenders, offenders


def test_the_cell_key_check_finds_a_literal(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""Reads per_token and wall_ms."""\n'
                   'x = doc["summary"]\ny = cols.get("wall_ms", [])\nz = {"per_token": {}}\n'
                   'print("wall_ms", f"{doc}[summary]")\nw = mean("read_bytes")\n'
                   'v = doc.get(SUMMARY)\nu = doc["summary_of"]\n')
    assert cell_key_literals(bad) == [(2, "summary"), (3, "wall_ms"), (4, "per_token")]


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
        for node in ast.walk(_parsed(path)):
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
        names = _exception_classes(_parsed(path))
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
        for node in ast.walk(_parsed(path)):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                return True
        return False

    users = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
             if imports_ray(path)}
    assert users == {"fleet/runner.py"}


MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of the functions in a file longer than `limit`, def line to last line."""
    return [(n.name, n.end_lineno - n.lineno + 1)
            for n in ast.walk(_parsed(path))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno is not None and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_is_over_60_lines_and_no_module_over_450() -> None:
    # Past these sizes a reader cannot hold a function's or a module's parts at once: split
    # along a seam (docs/architecture.md, the rules).
    long = {rel: found for p in PACKAGE.rglob("*.py")
            if (found := long_functions(p)) and (rel := p.relative_to(PACKAGE).as_posix())}
    large = {p.relative_to(PACKAGE).as_posix(): n for p in PACKAGE.rglob("*.py")
             if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {} and large == {}, (long, large)


def test_the_size_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    path = tmp_path / "long.py"
    path.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_functions(path) == [("long", 61)]


def test_only_ggml_touches_ctypes_in_the_engine() -> None:
    """docs/architecture.md: `engine/kernels/ggml/` is the one engine package that calls
    foreign functions (a numpy array's `.ctypes.data` pointer is numpy's, not an import)."""
    offenders = []
    for path in (PACKAGE / "engine").rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = _parsed(path)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if not rel.startswith("engine/kernels/ggml/") and any(m.split(".")[0] == "ctypes"
                                                                for m in names):
            offenders.append(rel)
    assert not offenders, offenders


# The engine's parts, lowest first (docs/architecture.md draws them): a module imports its
# own part and the parts of the layers below, never a part beside it or above it.
ENGINE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("units", "architectures"),
    ("config",),
    ("gguf",),
    ("text", "streaming"),
    ("kernels",),
    ("experts",),
    ("synth", "arch"),
    ("run",),
)
_RANK = {part: i for i, layer in enumerate(ENGINE_LAYERS) for part in layer}


def engine_arrows_up(root: Path) -> list[tuple[str, str]]:
    """(module, what it imports) for every engine import that goes sideways or up."""
    bad = []
    for path in sorted((root / "engine").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        mine = rel[1]
        for m in imports_of(path):
            parts = m.split(".")
            if parts[:2] != ["abbench", "engine"] or len(parts) < 3:
                continue
            theirs = parts[2]
            if theirs != mine and not _RANK[theirs] < _RANK[mine]:
                bad.append(("/".join(rel), m))
    return bad


def test_the_engine_imports_only_downward() -> None:
    assert {p.name.removesuffix(".py") for p in (PACKAGE / "engine").iterdir()
            if p.name != "__pycache__"} == set(_RANK)
    assert engine_arrows_up(PACKAGE) == []


def test_the_engine_layer_check_finds_an_arrow_up(tmp_path: Path) -> None:
    (tmp_path / "engine" / "gguf").mkdir(parents=True)
    (tmp_path / "engine" / "gguf" / "header.py").write_text(
        "from abbench.engine.units import MIB\nfrom abbench.engine.run.session import X\n")
    assert engine_arrows_up(tmp_path) == [("engine/gguf/header", "abbench.engine.run.session")]


def test_the_architectures_import_only_the_shared_skeleton() -> None:
    """An architecture's package imports `arch/shared/` and the layers below, never
    another architecture's package: each is one row of the table (engine/architectures.py)
    and its own folder."""
    bad = {}
    for path in (PACKAGE / "engine" / "arch").rglob("*.py"):
        rel = path.relative_to(PACKAGE / "engine" / "arch").parts
        if len(rel) < 2 or rel[0] == "shared":
            continue
        other = {m for m in imports_of(path) if m.startswith("abbench.engine.arch.")
                 and m.split(".")[3] not in ("shared", rel[0])}
        if other:
            bad["/".join(rel)] = sorted(other)
    assert bad == {}


def _own_classes() -> set[str]:
    return {n.name for p in PACKAGE.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.ClassDef)}


def split_classes(path: Path, own: set[str]) -> list[str]:
    """Classes in a file built from two or more of the project's own classes: one class
    whose parts are mixins in other places (their state declared again in each)."""
    return [n.name for n in ast.walk(_parsed(path))
            if isinstance(n, ast.ClassDef)
            and sum(isinstance(b, ast.Name) and b.id in own for b in n.bases) >= 2]


def test_no_class_is_split_across_mixins() -> None:
    own = _own_classes()
    split = {p.relative_to(PACKAGE).as_posix(): found for p in PACKAGE.rglob("*.py")
             if (found := split_classes(p, own))}
    assert split == {}


def test_the_split_class_check_finds_one(tmp_path: Path) -> None:
    path = tmp_path / "runner.py"
    path.write_text("class Runner(BatchPrefill, Speculation):\n    pass\n"
                    "class Fine(Protocol):\n    pass\n")
    assert split_classes(path, {"BatchPrefill", "Speculation", "Runner"}) == ["Runner"]


def unmirrored_engine_tests(tests: Path, engine: Path) -> list[str]:
    """`test_engine_*.py` files whose name is no engine module's or package's path
    (`test_engine_streaming_cache` for engine/streaming/cache.py): the engine's tests
    mirror its modules, so a reader finds a module's tests by its path."""
    paths = {"_".join(p.relative_to(engine).with_suffix("").parts) for p in engine.rglob("*.py")
             if "__pycache__" not in p.parts}
    paths |= {p.removesuffix("___init__") for p in paths if p.endswith("___init__")}
    return sorted(t.name for t in tests.glob("test_engine_*.py")
                  if t.stem.removeprefix("test_engine_") not in paths)


def test_the_engine_tests_mirror_its_modules() -> None:
    assert unmirrored_engine_tests(Path(__file__).parent, PACKAGE / "engine") == []


def test_the_mirror_check_finds_a_stray_name(tmp_path: Path) -> None:
    (tmp_path / "engine" / "streaming").mkdir(parents=True)
    (tmp_path / "engine" / "streaming" / "__init__.py").touch()
    (tmp_path / "engine" / "streaming" / "cache.py").touch()
    for name in ("streaming", "streaming_cache", "cache"):
        (tmp_path / f"test_engine_{name}.py").touch()
    assert unmirrored_engine_tests(tmp_path, tmp_path / "engine") == ["test_engine_cache.py"]
