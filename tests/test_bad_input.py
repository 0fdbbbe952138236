"""Bad input through the CLI (docs/reliability.md#bad-input): cells.toml, GGUF files, bmoe
CSVs, `.metrics`, `.state`, driver and engine logs, route traces and run folders that are
malformed, truncated, empty, enormous or hostile each give exit status 2 and one `ERROR:`
line naming the file (and the key or line where there is one), no traceback, and write
nothing at all; hostile values that are valid (shell metacharacters in a command, a path, a
prompt, a file name) pass through literally and nothing runs them.

Each case builds its input in a fresh folder, runs `abbench.cli.main` from inside it (so
that a default output folder would land there too) and compares the whole folder before
and after. A few cases run `python -m abbench` for real where a child process is the point.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REFERENCE, run_main
from runs_helper import cell, make_run

from abbench.analysis import cells as cells_module
from abbench.engine import synth

REPO = Path(__file__).resolve().parents[1]
ROWS = "step,wall_ms,read_bytes\n1,10.5,100\n2,11.0,200\n3,10.8,100\n"
MEGA = 1_000_000  # characters in an enormous line
TRACE_LINES = (REFERENCE / "route-trace-2026-07-15" / "qwen.route.csv").read_text().split("\n")
TRACE = "\n".join(TRACE_LINES[:51 + 6 * 48 * 2]) + "\n"  # preamble, header, two tokens


@dataclass(frozen=True)
class Case:
    """Files to write (path relative to the case folder: text, bytes, or bytes made from
    the tiny model's), the command line (`{d}` is the case folder), and what the one
    `ERROR:` line must contain."""

    files: dict[str, str | bytes | Callable[[bytes], bytes]]
    argv: tuple[str, ...]
    expect: tuple[str, ...]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


def one_error(err: str) -> str:
    """The one `ERROR:` line; only `WARNING:` lines before it, at most a `TIP:` after."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("ERROR:")]
    assert len(at) == 1, err
    assert all(ln.startswith("WARNING:") for ln in lines[:at[0]]), err
    after = lines[at[0] + 1:]
    assert len(after) <= 1 and all(ln.startswith("TIP: ") for ln in after), err
    return lines[at[0]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    synth.write_model(synth.preset("tiny"), path)
    return path.read_bytes()


def exercise(case: Case, root: Path, tiny: bytes, capsys: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> str:
    """Write the case, run it, check exit 2, one ERROR line with the expected words, a
    short message, nothing written anywhere; returns the ERROR line."""
    for name, content in case.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content = content(tiny)
        if isinstance(content, str):
            content = content.encode("utf-8")
        path.write_bytes(content)
    (root / "cwd").mkdir(exist_ok=True)
    monkeypatch.chdir(root / "cwd")
    before = snapshot(root)
    t0 = time.perf_counter()
    rc, _, err = run_main([a.format(d=root) for a in case.argv], capsys)
    elapsed = time.perf_counter() - t0
    line = one_error(err)
    assert rc == 2, err
    for word in case.expect:
        assert word.format(d=root) in line, line
    assert len(line) < 500 + len(str(root)), line[:300]  # never the megabyte it was fed
    assert elapsed < 20, elapsed  # enormous claims fail fast
    assert snapshot(root) == before, "wrote files"
    assert not any(p.name.startswith("pwned") for p in root.rglob("*"))
    return line


# -- cells.toml: `abbench campaign FILE --dry-run` (and without --dry-run: no run folder) ----


def _campaign(text: str | bytes, *expect: str, dry: bool = True) -> Case:
    argv = ("campaign", "{d}/c.toml", *(("--dry-run",) if dry else ()), "--out", "{d}/out",
            "--sentinels", "{d}/sentinels")
    return Case({"c.toml": text}, argv, ("{d}/c.toml", *expect))


CELL = '[cells.a]\ncommand = ["true"]\n'
CAMPAIGN_CASES = {
    "empty": _campaign("", "no cells"),
    "truncated": _campaign('[campaign]\nname = "x"\n[cells.a]\ntokens = ', "c.toml:4:",
                           "invalid TOML"),
    "truncated-table": _campaign("[cells.a", "c.toml:1:", "invalid TOML"),
    "not-utf8": _campaign(b"[cells.a]\ntokens = \xff\n", "not UTF-8"),
    "cell-name-traversal": _campaign('[cells."../x"]\ncommand = ["true"]\n',
                                     "not a valid cell name"),
    "cell-name-slash": _campaign('[cells."a/b"]\ncommand = ["true"]\n', "not a valid cell name"),
    "campaign-name-traversal": _campaign('[campaign]\nname = "../../evil"\n' + CELL,
                                         "c.toml:2:", "not a valid campaign name"),
    "model-metacharacters": _campaign('[cells.a]\nmodel = "$(touch pwned).gguf"\n',
                                      "c.toml:2:", "`cells.a.model`", "no model file"),
    "command-not-a-list": _campaign('[cells.a]\ncommand = "sh -c \'touch pwned\'"\n',
                                    "c.toml:2:", "`cells.a.command`"),
    "wrong-type": _campaign('[workload]\ntokens = "many"\n' + CELL, "c.toml:2:",
                            "`workload.tokens`"),
    "unknown-key": _campaign("[cells.a]\ntokenz = 8\n", "c.toml:2:", "`cells.a.tokenz`"),
    "enormous-name": _campaign(f'[cells.{"a" * MEGA}]\ncommand = ["true"]\n',
                               "not a valid cell name"),
    "enormous-value": _campaign(f'[cells.a]\nmodel = "{"m" * MEGA}"\n', "no model file"),
    "enormous-nesting": _campaign("x = " + "[" * 100_000, "invalid TOML"),
    "enormous-file": _campaign("# padding\n" * 200_000 + "[cells.a]\nbogus\n", "c.toml:200002:"),
    "not-run-either": _campaign("[cells.a", "invalid TOML", dry=False),
}


@pytest.mark.parametrize("case", CAMPAIGN_CASES.values(), ids=CAMPAIGN_CASES.keys())
def test_bad_cells_toml(case: Case, tmp_path: Path, tiny: bytes,
                        capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    exercise(case, tmp_path, tiny, capsys, monkeypatch)


def test_campaign_file_that_is_a_folder(tmp_path: Path, tiny: bytes,
                                        capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.toml").mkdir()
    exercise(Case({}, ("campaign", "{d}/c.toml", "--dry-run"), ("c.toml", "cannot read")),
             tmp_path, tiny, capsys, monkeypatch)


# -- GGUF: `abbench model info FILE` and `abbench engine run -m FILE` ------------------------


def _u32(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<I", value) + data[at + 4:]


def _u64(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<Q", value) + data[at + 8:]


def _value_at(data: bytes, key: str) -> int:
    """Offset of a metadata value's type field (right after its key)."""
    return data.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key)


def _tensor_type_at(data: bytes, name: str) -> int:
    """Offset of a tensor table entry's type field."""
    at = data.rindex(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return at + 4 + 8 * n_dims


def _renamed_with_newline(t: bytes) -> bytes:
    """`token_embd.weight` renamed `token\\nembd.weight` (same length) and given type 99."""
    t = t.replace(b"token_embd.weight", b"token\nembd.weight")
    return _u32(t, _tensor_type_at(t, "token\nembd.weight"), 99)


def _mini_gguf(tensor: str, block_count: int = 2) -> bytes:
    """A GGUF of two metadata keys and one F32 tensor of 8 values named `tensor`."""
    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text.encode())) + text.encode()
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2)
    head += string("general.architecture") + struct.pack("<I", 8) + string("qwen3moe")
    head += string("qwen3moe.block_count") + struct.pack("<II", 4, block_count)
    head += string(tensor) + struct.pack("<IQIQ", 1, 8, 0, 0)
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * 32


def _gguf(content: str | bytes | Callable[[bytes], bytes], *expect: str,
          engine: bool = False) -> Case:
    argv = (("engine", "run", "-m", "{d}/m.gguf", "-n", "1", "--json", "{d}/out.json")
            if engine else ("model", "info", "{d}/m.gguf"))
    return Case({"m.gguf": content}, argv, ("{d}/m.gguf", *expect))


GGUF_CASES = {
    "empty": _gguf(b"", "empty file"),
    "wrong-magic": _gguf(lambda t: b"GGML" + t[4:], "not a GGUF file"),
    "magic-only": _gguf(b"GG", "truncated"),
    "truncated-header": _gguf(lambda t: t[:100], "truncated"),
    "truncated-tensor-table": _gguf(lambda t: t[:9000], "truncated"),
    "truncated-data": _gguf(lambda t: t[:-10], "truncated: tensor"),
    "truncated-data-engine": _gguf(lambda t: t[:-10], "truncated: tensor", engine=True),
    "version-99": _gguf(lambda t: _u32(t, 4, 99), "GGUF version 99"),
    "enormous-tensor-count": _gguf(lambda t: _u64(t, 8, 2**62), "4611686018427387904 tensors"),
    "enormous-metadata-count": _gguf(lambda t: _u64(t, 16, 2**62),
                                     "4611686018427387904 metadata entries"),
    "enormous-string": _gguf(lambda t: _u64(t, 24, 2**40), "1099511627808 needed"),
    "enormous-block-count": _gguf(
        lambda t: _u32(t, _value_at(t, "qwen3moe.block_count") + 4, 2**31 - 1),
        "`qwen3moe.block_count` is 2147483647"),
    "enormous-block-count-engine": _gguf(
        lambda t: _u32(t, _value_at(t, "qwen3moe.block_count") + 4, 2**31 - 1),
        "`qwen3moe.block_count` is 2147483647", engine=True),
    "unknown-value-type": _gguf(lambda t: _u32(t, _value_at(t, "general.name"), 99),
                                "`general.name`", "unknown type 99"),
    "unknown-tensor-type": _gguf(lambda t: _u32(t, _tensor_type_at(t, "token_embd.weight"), 99),
                                 "`token_embd.weight` has unknown type id 99"),
    "control-characters-in-name": _gguf(_renamed_with_newline, "`token\\nembd.weight`"),
    "missing-tensor": _gguf(lambda t: t.replace(b"output_norm.weight", b"output_norm.weighX"),
                            "missing tensor `output_norm.weight`"),
    "missing-tensor-engine": _gguf(
        lambda t: t.replace(b"output_norm.weight", b"output_norm.weighX"),
        "missing tensor `output_norm.weight`", engine=True),
    # A vocabulary that cannot spell one byte is read; only a text needing it fails.
    "no-byte-tokens-engine": Case({"m.gguf": lambda t: t.replace(b"<0x41>", b"<0x4Z>")},
                                  ("engine", "run", "-m", "{d}/m.gguf", "-n", "1", "-p", "A"),
                                  ("{d}/m.gguf", "byte 0x41", "<0x41>")),
    "enormous-layer-number": _gguf(_mini_gguf(f"blk.{'9' * 5000}.w"),
                                   "`qwen3moe.block_count` is 2", "for 1 layers"),
    "random-bytes": _gguf(b"GGUF" + bytes(range(256)) * 4, "{d}/m.gguf"),
}


@pytest.mark.parametrize("case", GGUF_CASES.values(), ids=GGUF_CASES.keys())
def test_bad_gguf(case: Case, tmp_path: Path, tiny: bytes, capsys: pytest.CaptureFixture[str],
                  monkeypatch: pytest.MonkeyPatch) -> None:
    exercise(case, tmp_path, tiny, capsys, monkeypatch)


@pytest.mark.parametrize("argv", [("model", "info", "{d}/m.gguf"),
                                  ("engine", "run", "-m", "{d}/m.gguf")])
def test_gguf_path_that_is_a_folder_or_absent(argv: tuple[str, ...], tmp_path: Path,
                                              tiny: bytes, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.gguf").mkdir()
    exercise(Case({}, argv, ("m.gguf", "is a folder")), tmp_path, tiny, capsys, monkeypatch)
    absent = tuple(a.replace("m.gguf", "$(touch pwned).gguf") for a in argv)
    exercise(Case({}, absent, ("$(touch pwned).gguf", "no such model file")), tmp_path, tiny,
             capsys, monkeypatch)


# -- foreign runs: `abbench import DIR` -------------------------------------------------------


def _import(files: dict[str, str | bytes], *expect: str) -> Case:
    return Case({f"src/{k}": v for k, v in files.items()},
                ("import", "{d}/src", "--out", "{d}/out"), expect)


IMPORT_CASES = {
    "csv-empty": _import({"a.csv": ""}, "src/a.csv:", "empty, or not a bmoe_metrics CSV"),
    "csv-header-only": _import({"a.csv": "step,wall_ms\n"}, "src/a.csv:", "no tokens/s"),
    "csv-truncated-row": _import({"a.csv": ROWS + "4,1"}, "src/a.csv:5:", "2 fields"),
    "csv-not-a-number": _import({"a.csv": ROWS + "4,fast,1\n"}, "src/a.csv:5:", "`wall_ms`",
                                "'fast' is not a number"),
    "csv-nan": _import({"a.csv": ROWS + "4,nan,1\n"}, "src/a.csv:5:", "not a finite number"),
    "csv-not-utf8": _import({"a.csv": b"step,wall_ms\n1,\xff\n"}, "src/a.csv:2:", "`wall_ms`"),
    "csv-duplicate-column": _import({"a.csv": "step,wall_ms,step\n1,2,3\n"}, "src/a.csv:1:",
                                    "`step` appears twice"),
    "csv-enormous-value": _import({"a.csv": ROWS + f"4,{'9x' * (MEGA // 2)},1\n"}, "src/a.csv:5:",
                                  "`wall_ms`", "is not a number"),
    "csv-enormous-header": _import({"a.csv": "step," + "w" * MEGA + "\n1,2\n"}, "src/a.csv:",
                                   "no tokens/s"),
    "csv-enormous-junk-header": _import({"a.csv": "step,wall ms" + "!" * MEGA + "\n1,2\n"},
                                        "src/a.csv:1:", "is not a column name"),
    "csv-enormous-summary": _import({"a.csv": ROWS + f"# summary tok/s={'9' * MEGA}\n"},
                                    "src/a.csv:5:", "`# summary` tok/s"),
    "engine-log-enormous": _import(
        {"a.log": f"generation: {'9' * 400} tokens, 1 s/token (1 tok/s)\n"}, "src/a.log:1:",
        "not a finite number"),
    "file-name-with-newline": _import({"a\nb.csv": "step,wall_ms\n1,x\n"}, "src/a\\nb.csv:2:",
                                      "'x' is not a number"),
    "no-runs": _import({"notes.txt": "hello"}, "{d}/src", "no runs here"),
}


# A folder whose run imports while one file beside it is odd: the odd file is reported in one
# WARNING line (and in the report) and left out, never the folder.
SOFT_IMPORT_CASES = {
    "metrics-not-a-number": _import({"a.csv": ROWS, "a.metrics": "cpu_temp_before_mC=hot\n"},
                                    "src/a.metrics:1:", "`cpu_temp_before_mC`"),
    "metrics-not-key-value": _import({"a.csv": ROWS, "a.metrics": "rm -rf /\n"},
                                     "src/a.metrics:1:", "is not key=value"),
    "metrics-enormous": _import({"a.csv": ROWS, "a.metrics": f"k={'1x' * (MEGA // 2)}\n"},
                                "src/a.metrics:1:", "`k`"),
    "state-text-before-section": _import({"a.csv": ROWS, "a.state": "policy0: hw_max=1\n"},
                                         "src/a.state:1:", "before the first"),
    "state-bad-policy": _import({"a.csv": ROWS, "a.state": "--- BEFORE ---\npolicy0: cur=1\n"},
                                "src/a.state:2:", "policy0"),
    "state-second-section": _import(
        {"a.csv": ROWS, "a.state": "--- BEFORE ---\n--- AFTER ---\n--- BEFORE ---\n"},
        "src/a.state:3:", "a second `--- BEFORE ---`"),
    "state-enormous": _import(
        {"a.csv": ROWS, "a.state": f"--- BEFORE ---\nmeminfo: MemFree: {'1' * MEGA} kB\n"},
        "src/a.state:2:", "meminfo MemFree"),
    "state-empty": _import({"a.csv": ROWS, "a.state": ""}, "src/a.state:", "no `--- BEFORE"),
    "driver-log-traversal": _import({"a.csv": ROWS, "d.log": "ENTRY STATE: cell=../../etc\n"},
                                    "d.log:1:", "names no run"),
    "driver-log-metacharacters": _import(
        {"a.csv": ROWS, "d.log": "ENTRY STATE: cell=a;$(touch${IFS}pwned)\n"}, "d.log:1:",
        "names no run"),
    "driver-log-metacharacters-spaced": _import(
        {"a.csv": ROWS, "d.log": "ENTRY STATE: cell=a;$(touch pwned)\n"}, "d.log:1:",
        "names no run"),
    "driver-log-enormous-cell": _import(
        {"a.csv": ROWS, "d.log": f"ENTRY STATE: cell={'a' * MEGA}\n"}, "d.log:1",
        "no run `aaaa"),
    "driver-log-bad-caps": _import({"a.csv": ROWS, "d.log": "ENTRY STATE: cell=a caps=fast\n"},
                                   "d.log:1:", "caps"),
    "driver-log-leaves-out": _import({"a.csv": ROWS, "b.csv": ROWS,
                                      "d.log": "ENTRY STATE: cell=a\n"}, "leaves out b"),
    "driver-log-leaves-out-newline-name": _import(
        {"a.csv": ROWS, "b\nc.csv": ROWS, "d.log": "ENTRY STATE: cell=a\n"},
        "leaves out b\\nc"),
}


@pytest.mark.parametrize("case", SOFT_IMPORT_CASES.values(), ids=SOFT_IMPORT_CASES.keys())
def test_odd_files_beside_a_run_are_warnings(case: Case, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    before = snapshot(tmp_path)
    rc, _, err = run_main([a.format(d=tmp_path) for a in case.argv] + ["--style", "plain"],
                          capsys)
    assert rc in (0, 3) and "Traceback" not in err and "ERROR:" not in err, err
    warned = [ln for ln in err.splitlines() if ln.startswith("WARNING:")
              and all(w.format(d=tmp_path) in ln for w in case.expect)]
    assert warned, err
    assert all(len(ln) < 500 + len(str(tmp_path)) for ln in err.splitlines()), err[:300]
    after = snapshot(tmp_path)
    assert all(k.startswith("out") for k in after.keys() - before.keys())
    assert all(after[k] == v for k, v in before.items())
    assert not any(p.name.startswith("pwned") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("case", IMPORT_CASES.values(), ids=IMPORT_CASES.keys())
def test_bad_foreign_runs(case: Case, tmp_path: Path, tiny: bytes,
                          capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    exercise(case, tmp_path, tiny, capsys, monkeypatch)


def test_import_of_no_folder_or_into_a_full_one(tmp_path: Path, tiny: bytes,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    exercise(Case({}, ("import", "{d}/absent", "--out", "{d}/out"), ("absent", "not a folder")),
             tmp_path, tiny, capsys, monkeypatch)
    exercise(Case({"src/a.csv": ROWS, "out/keep.txt": "mine"},
                  ("import", "{d}/src", "--out", "{d}/out"), ("out", "exists and is not empty")),
             tmp_path, tiny, capsys, monkeypatch)


# -- route traces: `abbench replay TRACE` -----------------------------------------------------


def _trace(text: str | bytes, *expect: str) -> Case:
    return Case({"t.route.csv": text}, ("replay", "{d}/t.route.csv"), ("{d}/t.route.csv", *expect))


TRACE_CASES = {
    "empty": _trace("", ":1:", "empty file"),
    "not-a-trace": _trace(ROWS, ":1:", "expected `# route_trace v1`"),
    "version-2": _trace(TRACE.replace("route_trace v1", "route_trace v2", 1), ":1:",
                        "unsupported version"),
    "preamble-only": _trace("\n".join(TRACE_LINES[:50]) + "\n", "no CSV header"),
    "header-only": _trace("\n".join(TRACE_LINES[:51]) + "\n", ":51:", "no rows"),
    "truncated-row": _trace(TRACE + "0,1,0,0,0,", ":628:", "6 fields, the header has 9"),
    "missing-layer-line": _trace(TRACE.replace("# layer=7 ", "# lay=7 ", 1), "`# layer=7"),
    "expert-out-of-range": _trace(TRACE + "0,1,2,0,0,128,0.1,0,0\n", ":628:", "`expert` is 128"),
    "negative-weight": _trace(TRACE + "0,1,2,0,0,1,-0.1,0,0\n", ":628:", "`weight`"),
    "not-utf8": _trace(TRACE.encode() + b"\xff\n", ":628:", "not UTF-8"),
    "misspelt-column": _trace(TRACE.replace("weight,", "wieght,", 1), ":51:",
                              "did you mean `wieght`"),
    "enormous-n-layer": _trace(TRACE.replace("n_layer=48", f"n_layer={'9' * 50}", 1), ":2:",
                               "`n_layer=9999"),
    "enormous-n-expert": _trace(TRACE.replace("n_expert=128", f"n_expert={2**40}", 1), ":2:",
                                "n_expert=1099511627776"),
    "enormous-line": _trace(TRACE + "x" * MEGA + "\n", ":628:", "1 fields"),
    "enormous-number": _trace(TRACE + f"0,1,2,0,0,{'9' * MEGA},0.1,0,0\n", ":628:",
                              "`expert` is `9999"),
}


@pytest.mark.parametrize("case", TRACE_CASES.values(), ids=TRACE_CASES.keys())
def test_bad_route_trace(case: Case, tmp_path: Path, tiny: bytes,
                         capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    exercise(case, tmp_path, tiny, capsys, monkeypatch)


def test_route_trace_that_is_a_folder_or_absent(tmp_path: Path, tiny: bytes,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.route.csv").mkdir()
    exercise(Case({}, ("replay", "{d}/t.route.csv"), ("t.route.csv", "cannot read")),
             tmp_path, tiny, capsys, monkeypatch)
    exercise(Case({}, ("replay", "{d}/absent.csv"), ("absent.csv", "cannot read")),
             tmp_path, tiny, capsys, monkeypatch)


# -- run folders: `abbench report RUN` --------------------------------------------------------


@pytest.fixture(scope="module")
def run_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A sound run folder (two cells, a decision, samples, status.json) as its files."""
    run = make_run(tmp_path_factory.mktemp("run"), [cell("B", 40, n=24), cell("C", 44, n=24)],
                   [{"candidate": "C", "baseline": "B", "min_effect": 0.03}])
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


def _edit(name: str, old: str, new: str) -> Callable[[dict[str, bytes]], None]:
    def edit(files: dict[str, bytes]) -> None:
        text = files[name].decode()
        assert old in text, (name, old)
        files[name] = text.replace(old, new, 1).encode()
    return edit


def _put(name: str, content: str | bytes | None) -> Callable[[dict[str, bytes]], None]:
    def put(files: dict[str, bytes]) -> None:
        if content is None:
            del files[name]
        else:
            files[name] = content.encode() if isinstance(content, str) else content
    return put


REPORT_CASES: dict[str, tuple[Callable[[dict[str, bytes]], None], tuple[str, ...]]] = {
    "no-plan": (_put("plan.json", None), ("not a run folder (no plan.json)",)),
    "plan-empty": (_put("plan.json", ""), ("run/plan.json", "malformed plan")),
    "plan-truncated": (lambda f: f.__setitem__("plan.json", f["plan.json"][:60]),
                       ("run/plan.json", "malformed plan")),
    "plan-not-an-object": (_put("plan.json", "[]"), ("run/plan.json", "expected an object")),
    "plan-garbage": (_put("plan.json", bytes(range(256))), ("run/plan.json", "malformed plan")),
    "plan-nested-deeply": (_put("plan.json", "[" * 100_000 + "]" * 100_000),
                           ("run/plan.json", "nested too deeply")),
    "plan-label-traversal": (_edit("plan.json", '"01-B"', '"../../etc"'),
                             ("run/plan.json", "`cells[0].label`", "not a folder name")),
    "plan-index-type": (_edit("plan.json", '"index": 1', '"index": "1"'),
                        ("run/plan.json", "`cells[1].index`: expected an integer, got a string")),
    "plan-index-order": (_edit("plan.json", '"index": 1', '"index": 7'),
                         ("run/plan.json", "`cells[1].index`: is 7, expected 1")),
    "plan-cells-null": (_edit("plan.json", '"cells": [', '"cells": [null, '),
                        ("run/plan.json", "`cells[0]`: expected an object, got null")),
    "plan-min-effect": (_edit("plan.json", '"min_effect": 0.03', '"min_effect": "3%"'),
                        ("run/plan.json", "`decisions[0].min_effect`")),
    "plan-match": (_edit("plan.json", '"probe_tol": 0.03', '"probe_tol": "tight"'),
                   ("run/plan.json", "`match.probe_tol`")),
    "plan-sentinel-of": (_edit("plan.json", '"sentinel_of": null', '"sentinel_of": 5'),
                         ("run/plan.json", "`cells[0].sentinel_of`: is 5")),
    "plan-decision-against-itself": (_edit("plan.json", '"candidate": "C"', '"candidate": "B"'),
                                     ("run/plan.json", "`decisions[0]`: compares `B` with itself")),
    "plan-enormous-number": (_edit("plan.json", '"spacing_s": 30', f'"spacing_s": {"9" * 5000}'),
                             ("run/plan.json", "malformed plan")),
    "journal-garbage-line": (_edit("journal.jsonl", "\n", "\nnot json\n"),
                             ("run/journal.jsonl:2:", "not a JSON line")),
    "journal-wrong-type": (_edit("journal.jsonl", '"status":"ok"', '"status":5'),
                           ("run/journal.jsonl:1:",
                            "`status`: expected a string, got an integer (5)")),
    "journal-entry-type": (_edit("journal.jsonl", '"cpu_temp_c":40.0', '"cpu_temp_c":"hot"'),
                           ("run/journal.jsonl:1:", "`entry.cpu_temp_c`")),
    "journal-enormous-reading": (_edit("journal.jsonl", '"cpu_temp_c":40.0',
                                      '"cpu_temp_c":1e308'),
                                ("run/journal.jsonl:1:",
                                 "`entry.cpu_temp_c`: 1e+308 is too large")),
    "journal-enormous-index": (_edit("journal.jsonl", '"index":0', f'"index":{10**40}'),
                               ("run/journal.jsonl:1:", "`index`: a 41-digit number is too large")),
    "journal-enormous-number": (_edit("journal.jsonl", '"index":0', f'"index":{"9" * 5000}'),
                                ("run/journal.jsonl:1:", "a number too long")),
    "journal-nan": (_edit("journal.jsonl", '"tokens_per_s":40', '"tokens_per_s":NaN'),
                    ("run/journal.jsonl:1:", "`tokens_per_s`: must be a finite number (got nan)")),
    "journal-label-traversal": (_edit("journal.jsonl", '"label":"01-B"', '"label":"../../x"'),
                                ("run/journal.jsonl:1:", "`label`", "not a folder name")),
    "journal-not-an-object": (_edit("journal.jsonl", "\n", "\n[1, 2]\n"),
                              ("run/journal.jsonl:2:", "expected a JSON object")),
    "samples-wrong-type": (_edit("samples.jsonl", "2000000", '"fast"'),
                           ("run/samples.jsonl:1:", "cap_khz")),
    "samples-enormous-reading": (_edit("samples.jsonl", '"mem.available_mib":8000.0',
                                       '"mem.available_mib":-1e308'),
                                 ("run/samples.jsonl:1:", "`values.\"mem.available_mib\"`")),
    "samples-garbage": (_put("samples.jsonl", b"\xff\xfe" * 50 + b"\n"),
                        ("run/samples.jsonl:1:", "not a JSON line")),
    "samples-enormous-line": (_put("samples.jsonl", "{" * MEGA + "\n"),
                              ("run/samples.jsonl:1:", "not a JSON line")),
}


@pytest.mark.parametrize("edit,expect", REPORT_CASES.values(), ids=REPORT_CASES.keys())
def test_bad_run_folder(edit: Callable[[dict[str, bytes]], None], expect: tuple[str, ...],
                        run_files: dict[str, bytes], tmp_path: Path, tiny: bytes,
                        capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    files = dict(run_files)
    edit(files)
    case = Case({f"run/{k}": v for k, v in files.items()},
                ("report", "{d}/run", "--style", "plain"), expect)
    exercise(case, tmp_path, tiny, capsys, monkeypatch)


def test_report_of_no_folder_or_a_file(tmp_path: Path, tiny: bytes,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    exercise(Case({}, ("report", "{d}/absent"), ("absent", "no such run folder")), tmp_path,
             tiny, capsys, monkeypatch)
    exercise(Case({"f": "x"}, ("report", "{d}/f"), ("f", "no such run folder")), tmp_path,
             tiny, capsys, monkeypatch)
    exercise(Case({"run/plan.json/x": "x"}, ("report", "{d}/run"), ("plan.json", "cannot read")),
             tmp_path, tiny, capsys, monkeypatch)


NO_PER_TOKEN = '{"summary": {"tok/s": 40}}'
# Until `analysis/cells.py` reads a cell's files through `records.read_cell_files`, these
# three stop the report (TypeError, RecursionError, csv.Error); the marker lifts itself then.
_UNTIL_READ_CELL_FILES = pytest.mark.xfail(
    not hasattr(cells_module, "read_cell_files"), strict=True,
    reason="analysis/cells.py reads summary.json and tokens.csv unchecked: it should call "
    "records.read_cell_files")
CELL_FILE_CASES = [
    pytest.param({"summary.json": '{"per_token": {"wall_ms": [{}]}}'},
                 id="per-token-not-numbers", marks=_UNTIL_READ_CELL_FILES),
    pytest.param({"summary.json": '{"per_token": ' + "[" * 100_000},
                 id="per-token-nested-deeply", marks=_UNTIL_READ_CELL_FILES),
    pytest.param({"summary.json": NO_PER_TOKEN,
                  "tokens.csv": "wall_ms,x\n1,2\n3,4\n5,6\nx" + "y" * MEGA + "\n"},
                 id="tokens-csv-enormous-field", marks=_UNTIL_READ_CELL_FILES),
    pytest.param({"summary.json": '{"per_token": {"wall_ms": 5, "hits": [true]}}'},
                 id="per-token-not-a-list"),
    pytest.param({"summary.json": b"\xff\x00garbage"}, id="summary-garbage"),
    pytest.param({"summary.json": '{"summary": [], "resolved": 3}'}, id="summary-not-an-object"),
    pytest.param({"summary.json": '{"fingerprint": [1, 2]}'}, id="fingerprint-not-a-string"),
    pytest.param({"summary.json": NO_PER_TOKEN, "tokens.csv": b"wall_ms\n\xff\xfe\n"},
                 id="tokens-csv-not-utf8"),
    pytest.param({"summary.json": NO_PER_TOKEN, "tokens.csv/x": "1"}, id="tokens-csv-is-a-folder"),
]


@pytest.mark.parametrize("changes", CELL_FILE_CASES)
def test_bad_cell_files_are_read_fail_soft(changes: dict[str, str | bytes],
                                           run_files: dict[str, bytes], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell's own files are what its engine or command wrote (anything, for an external
    one): what cannot be read is left out, as for a cell without it, and the report of the
    run goes on."""
    run = tmp_path / "run"
    files = {**run_files, **{f"cells/01-B/{k}": v.encode() if isinstance(v, str) else v
                             for k, v in changes.items()}}
    for k, v in files.items():
        (run / k).parent.mkdir(parents=True, exist_ok=True)
        (run / k).write_bytes(v)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main(["report", str(run), "--json"], capsys)
    assert "Traceback" not in err and rc in (0, 3), err
    assert json.loads(out)["cells"][1]["tokens_per_s"] is not None  # the other cell stands
    assert {p.name for p in tmp_path.iterdir()} == {"run"}  # wrote only inside the run


# -- hostile values that are valid: passed literally, never to a shell ------------------------

HOSTILE = ["$(touch pwned1)", "; touch pwned2", "`touch pwned3`", "| tee pwned4", "&& touch pwned5",
           "'\"", "\n touch pwned6"]


def _no_pwned(root: Path) -> None:
    assert not [p for p in root.rglob("pwned*")], "a value ran as a command"
    assert not [p for p in Path.cwd().glob("pwned*")], "a value ran as a command"


def test_external_command_runs_without_a_shell(tmp_path: Path) -> None:
    """An external cell's `command` array is the argv, as written: metacharacters reach the
    program literally, no shell sees them, and nothing is written outside --out."""
    script = ("import sys, json; print(json.dumps(sys.argv[1:])); "
              "print('generation: 4 tokens, 0.5 s/token (2.0 tok/s)')")
    (tmp_path / "c.toml").write_text(
        '[campaign]\nname = "hostile"\nspacing_s = 0\nwarmup_tokens = 0\n'
        f"[cells.x]\ncommand = {json.dumps([sys.executable, '-c', script, *HOSTILE])}\n"
        '[cells.y]\nmodel = "synthetic:tiny"\ntokens = 4\ncache_mib = 1\n'
        f"prompt = {json.dumps(''.join(HOSTILE))}\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", "c.toml", "--out", "out",
                        "--sentinels", "out/sentinels", "--no-live"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr
    (run,) = (tmp_path / "out").glob("hostile-*")
    stdout = (run / "cells" / "01-x" / "stdout.txt").read_text().splitlines()
    assert json.loads(stdout[0]) == HOSTILE
    engine = json.loads((run / "cells" / "02-y" / "summary.json").read_text())
    assert engine["config"]["prompt"] == "".join(HOSTILE)
    assert {q.name for q in tmp_path.iterdir()} == {"c.toml", "out"}
    _no_pwned(tmp_path)


def test_hostile_model_path_and_prompt_pass_literally(tmp_path: Path, tiny: bytes,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "in" / "$(touch pwned); `touch pwned`.gguf"
    model.parent.mkdir()
    model.write_bytes(tiny)
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    rc, _, err = run_main(["engine", "run", "-m", str(model), "-n", "2", "-p", "".join(HOSTILE),
                           "--json", "run.json"], capsys)
    assert rc == 0, err
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    assert doc["config"]["prompt"] == "".join(HOSTILE)
    assert {p.name for p in tmp_path.rglob("*")} == {"in", model.name, "out", "run.json"}
    _no_pwned(tmp_path)


def test_hostile_file_names_import_under_safe_labels(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    names = ["$(touch pwned)", "; rm -rf x", "`touch pwned`", "a..b", "-rf"]
    for name in names:
        (src / f"{name}.csv").write_text(ROWS)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    rc, _, err = run_main(["import", str(src), "--out", str(tmp_path / "out")], capsys)
    assert rc == 0, err
    labels = sorted(p.name for p in (tmp_path / "out" / "cells").iterdir())
    assert len(labels) == len(names) and all("/" not in la and la not in (".", "..")
                                              for la in labels)
    after = snapshot(tmp_path)
    assert all(k.startswith("out") for k in after.keys() - before.keys())
    assert all(after[k] == v for k, v in before.items())
    _no_pwned(tmp_path)


def test_hostile_trace_model_is_printed_not_run(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "t.route.csv"
    trace.write_text(TRACE.replace("model=/data/local", "model=$(touch pwned);`x`/data/local", 1))
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main(["replay", str(trace)], capsys)
    assert rc == 0, err
    assert {p.name for p in tmp_path.iterdir()} == {"t.route.csv"}
    _no_pwned(tmp_path)


def test_enormous_gguf_claims_fail_fast_in_a_real_process(tmp_path: Path, tiny: bytes) -> None:
    """2**62 tensors and a 2**40-byte string: refused from the header's own numbers before
    anything is allocated, in well under a second of work."""
    for name, data in (("t.gguf", _u64(tiny, 8, 2**62)), ("s.gguf", _u64(tiny, 24, 2**40))):
        path = tmp_path / name
        path.write_bytes(data)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "abbench", "model", "info", str(path)],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert p.returncode == 2 and time.perf_counter() - t0 < 20, p.stderr
        assert str(path) in one_error(p.stderr)


def test_reference_files_still_import(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds above refuse nothing real: every reference folder imports."""
    monkeypatch.chdir(tmp_path)
    for folder in sorted(p for p in REFERENCE.iterdir() if p.is_dir()):
        out = tmp_path / folder.name
        rc, _, err = run_main(["import", str(folder), "--out", str(out)], capsys)
        assert rc == 0, err
        shutil.rmtree(out)
