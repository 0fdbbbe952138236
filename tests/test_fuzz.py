"""Fuzzing every parser of outside input (docs/reliability.md#bad-input): cells.toml, GGUF
headers, bmoe CSVs, `.metrics`, `.state`, driver and engine logs, route traces, run folders
and `abbench import`.

Each fuzzer feeds its parser real files (the reference runs in `shared/reference/bmoe`, the
shipped campaigns, a synthetic GGUF) mutated by truncation, byte flips, insertions of hostile
tokens and random text, and also wholly random input, and asserts that nothing but one of
the project's `AbbenchError`s comes out: a clean parse, or a message the CLI prints as one
`ERROR:` line. A handful of cases go through the real CLI (`python -m abbench`) to check
exit status 2, one `ERROR:` line and no traceback.

Default runs draw a few dozen examples per fuzzer (the file takes well under a minute); the
`slow` variants, run by `.ci/run`, draw at least 1000 each. `--hypothesis-show-statistics`
prints how many each ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import REFERENCE
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from runs_helper import cell, make_run

from abbench.analysis import cells as cells_module
from abbench.analysis.campaign import analyze
from abbench.analysis.replay import DROP_FACTORS, replay
from abbench.campaign.plan import describe_plan, plan_campaign
from abbench.campaign.schema import load_campaign
from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine, model_info
from abbench.engine.text.tokenizer import tokenizer_for
from abbench.errors import AbbenchError
from abbench.importers import (
    import_folder,
    parse_driver_log,
    read_bmoe_csv,
    read_driver_log,
    read_engine_log,
    read_metrics,
    read_state,
)
from abbench.records.route_trace import read_route_trace
from abbench.records.text import read_text_lossy
from abbench.report import json_report, markdown
from abbench.report.html import render_html
from abbench.report.replay import render, to_json
from abbench.report.terminal import print_report

REPO = Path(__file__).resolve().parents[1]
HEADERLESS = REFERENCE / "headerless-2026-07-12"
ROUTE = REFERENCE / "route-trace-2026-07-15"
DESKTOP = REFERENCE / "v1-desktop-2026-07-24"

_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
           HealthCheck.data_too_large, HealthCheck.filter_too_much]


def fuzz(n: int, shrink: bool = True) -> Callable[[Any], Any]:
    phases = list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(max_examples=n, deadline=None, suppress_health_check=_HEALTH,
                    phases=phases)


DEFAULT, SLOW = 40, 1000


# -- mutations ---------------------------------------------------------------------------

# What hostile or broken input tends to contain: separators, non-numbers, huge numbers,
# encodings gone wrong, shell metacharacters, path traversal.
TOKENS = [b"", b"\x00", b"\xff\xfe", b"\xef\xbb\xbf", b",", b",,", b"=", b"==", b"#", b"# ",
          b"\n", b"\r\n", b"\r", b" ", b"\t", b":", b"/", b"{", b"}", b"nan", b"NaN", b"inf",
          b"-inf", b"-1", b"-0", b"0", b"1e400", b"1e-400", b"99999999999999999999999999",
          b"0x1F", b"1_000", b"\xe2\x80\xa8", b"\xc2\x85", b"../", b"../../etc/passwd",
          b"$(touch pwned)", b"`touch pwned`", b"; rm -rf x", b"| tee y", b"'\"", b"\\",
          b"# summary ", b"tok/s=", b"--- BEFORE ---", b"--- AFTER ---", b"policy0: ",
          b"meminfo: ", b"Thermal Status: ", b"Temperature{mValue=1, mName=x}",
          b"ENTRY STATE: cell=", b"generation: 1 tokens, 1 s/token (1 tok/s)",
          b"# route_trace v1", b"# layer=0 expert_bytes=", b"n_expert=", b"step,wall_ms",
          b"x" * 5000, b"9" * 5000, b"Infinity", b"-Infinity", b"0.5", b"1.2.3", b"true",
          b"null", b"[]", b'"n_gen": ', b'"samples_ns": [', b" ms / ", b" runs ",
          b"eval time = "]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed file after 1-6 edits: cut, byte flip, hostile token, random text or bytes,
    a line dropped, repeated or swapped."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["cut", "flip", "token", "text", "bytes", "delete",
                                   "line-drop", "line-dup", "line-swap"]))
        if op == "cut":
            del data[at:]
        elif op == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "text":
            data[at:at] = draw(st.text(max_size=12)).encode("utf-8")
        elif op == "bytes":
            data[at:at] = draw(st.binary(max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        elif op.startswith("line-"):
            lines = bytes(data).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if op == "line-drop":
                del lines[i]
            elif op == "line-dup":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """Mostly mutated seeds; also wholly random bytes and text, and the seeds' own lines
    in a random selection."""
    lines = sorted({ln for s in seeds for ln in s.split(b"\n")})
    return st.one_of(
        mutated(seeds), mutated(seeds), mutated(seeds),
        st.binary(max_size=300),
        st.text(max_size=300).map(lambda s: s.encode("utf-8")),
        st.lists(st.sampled_from(lines), max_size=30).map(b"\n".join),
    )


def clear(e: AbbenchError, names: Path | str | None = None,
          under: Path | None = None) -> None:
    """One short line (a hostile input's megabyte line is never echoed whole) that names
    the file it is about. Short but for the paths it names: `names` (which it must name)
    and any under the folder `under`, as often as it names them — an import that finds no
    run names the folder and up to three of its files, and the length of a test's tmp
    path is not the message's."""
    assert e.message and "\n" not in e.message, repr(e.message[:300])
    rest = e.message
    for path in (names, under):
        if path is not None:
            rest = rest.replace(str(path), "")
    assert len(rest) < 600, e.message[:300]
    if names is not None:
        assert str(names) in e.message, e.message[:300]


def survive(parse: Callable[[], Any]) -> Any:
    """Run a parser: a clean result, or an `AbbenchError` with a one-line message."""
    try:
        return parse()
    except AbbenchError as e:
        clear(e)
        return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


# -- bmoe CSV, .metrics, .state, driver and engine logs ---------------------------------

CSV_SEEDS = [p.read_bytes() for p in sorted(HEADERLESS.glob("*.csv"))[:1]] + [
    # the v1 files are 36 KB; their first rows and summary keep every example fast
    b"\n".join(p.read_bytes().split(b"\n")[:12] + p.read_bytes().split(b"\n")[-3:])
    for p in sorted(DESKTOP.glob("*.csv"))[:2]
] + [b"\n".join((ROUTE / "qwen.metrics").read_bytes().split(b"\n")[:20])]
METRICS_SEEDS = [p.read_bytes() for p in sorted(HEADERLESS.glob("*.metrics"))]
STATE_SEEDS = [(ROUTE / "qwen.state").read_bytes()]
ENGINE_LOG_SEEDS = [p.read_bytes() for p in sorted(HEADERLESS.glob("*.log"))]
# No driver log ships in the reference; this is docs/import.md's format.
DRIVER_LOG_SEEDS = [
    b"09:01:12 starting\n"
    b"09:01:12 ENTRY STATE: cell=qwen_c2000_l4 t_wall=1783846872 cpu_temp_c=44.8 "
    b"battery_temp_c=38.1 mem_available_mib=5626.7 thermal_status=1 "
    b"caps=policy0:2188800/3321600,policy6:1651200/3801600\n"
    b"09:05:40 ENTRY STATE: cell=qwen_c4000_l4 t_wall=1783847140 thermal_status=2\n"
    b"09:09:02 ENTRY STATE: cell=qwen_c4000_l4_ov caps=policy0:1900800\n",
    # the field's variants: banners naming the run, values with units, commas
    b"=============== qwen_c2000_l4 ===============\n"
    b"ENTRY STATE: batt=420 dC, memavail=6837980 kB, freq=1555200, waited=0s\n"
    b"=============== qwen_c4000_l4 ===============\n"
    b"ENTRY STATE: batt=43.1 C, cpu=47100 mC, memavail=6.1 GB, freq=1.9 GHz, waited=12s\n",
    # timestamps at the start of the line
    b"[2026-07-12 09:30:12] ENTRY STATE: cell=qwen_c2000_l4 cpu=44.8 C\n"
    b"[2026-07-12 09:35:40] ENTRY STATE: cell=qwen_c4000_l4 batt=381\n",
]
# ... and bytes that are not UTF-8, which only the importer's lossy reading takes
DRIVER_LOG_VARIANTS = [*DRIVER_LOG_SEEDS,
                       b"[2026-07-12 09:35:40] \xe4\xb8 ENTRY STATE: cell=qwen_c4000_l4 "
                       b"batt=381\n"]

FOREIGN = {
    "csv": (CSV_SEEDS, "run.csv", read_bmoe_csv),
    "metrics": (METRICS_SEEDS, "run.metrics", read_metrics),
    "state": (STATE_SEEDS, "run.state", read_state),
    "engine-log": (ENGINE_LOG_SEEDS, "run.log", read_engine_log),
    "driver-log": (DRIVER_LOG_SEEDS, "driver.log", read_driver_log),
    # as the importer reads it: any bytes (U+FFFD for what is not UTF-8), notes, no error
    "driver-log-lossy": (DRIVER_LOG_VARIANTS, "driver.log",
                         lambda path: parse_driver_log(read_text_lossy(path)[0], path, [])),
}


def _foreign(kind: str, folder: Path, data: bytes) -> None:
    _, name, read = FOREIGN[kind]
    path = _write(folder, name, data)
    try:
        read(path)
    except AbbenchError as e:
        assert e.message.startswith(str(path)), e.message[:300]  # names the file
        clear(e, path)


def test_foreign_seeds_parse_cleanly(scratch: Path) -> None:
    for seeds, name, read in FOREIGN.values():
        for data in seeds:
            read(_write(scratch, name, data))


@fuzz(DEFAULT)
@given(data=inputs(CSV_SEEDS))
def test_fuzz_bmoe_csv(scratch: Path, data: bytes) -> None:
    _foreign("csv", scratch, data)


@fuzz(DEFAULT)
@given(data=inputs(METRICS_SEEDS))
def test_fuzz_metrics(scratch: Path, data: bytes) -> None:
    _foreign("metrics", scratch, data)


@fuzz(DEFAULT)
@given(data=inputs(STATE_SEEDS))
def test_fuzz_state(scratch: Path, data: bytes) -> None:
    _foreign("state", scratch, data)


@fuzz(DEFAULT)
@given(data=inputs(ENGINE_LOG_SEEDS))
def test_fuzz_engine_log(scratch: Path, data: bytes) -> None:
    _foreign("engine-log", scratch, data)


@fuzz(DEFAULT)
@given(data=inputs(DRIVER_LOG_SEEDS))
def test_fuzz_driver_log(scratch: Path, data: bytes) -> None:
    _foreign("driver-log", scratch, data)


@fuzz(DEFAULT)
@given(data=inputs(DRIVER_LOG_VARIANTS))
def test_fuzz_driver_log_variants_lossy(scratch: Path, data: bytes) -> None:
    _foreign("driver-log-lossy", scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(DRIVER_LOG_VARIANTS))
def test_fuzz_driver_log_variants_lossy_slow(scratch: Path, data: bytes) -> None:
    _foreign("driver-log-lossy", scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(CSV_SEEDS))
def test_fuzz_bmoe_csv_slow(scratch: Path, data: bytes) -> None:
    _foreign("csv", scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(METRICS_SEEDS))
def test_fuzz_metrics_slow(scratch: Path, data: bytes) -> None:
    _foreign("metrics", scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(STATE_SEEDS))
def test_fuzz_state_slow(scratch: Path, data: bytes) -> None:
    _foreign("state", scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(ENGINE_LOG_SEEDS))
def test_fuzz_engine_log_slow(scratch: Path, data: bytes) -> None:
    _foreign("engine-log", scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(DRIVER_LOG_SEEDS))
def test_fuzz_driver_log_slow(scratch: Path, data: bytes) -> None:
    _foreign("driver-log", scratch, data)


# -- route trace, through the whole replay ------------------------------------------------

# The reference trace's preamble (48 layers), header and its first rows: the whole file is
# 1.3 MB, too slow to replay thousands of times.
_TRACE_LINES = (ROUTE / "qwen.route.csv").read_bytes().split(b"\n")


def _two_layer_trace() -> bytes:
    """The reference trace cut to its first two layers: a second shape of preamble."""
    head = _TRACE_LINES[1].replace(b"n_layer=48", b"n_layer=2")
    rows = [ln for ln in _TRACE_LINES[51:3000] if ln.split(b",")[3:4] in ([b"0"], [b"1"])]
    return b"\n".join([_TRACE_LINES[0], head, *_TRACE_LINES[2:4], _TRACE_LINES[50],
                       *rows[:200]])


TRACE_SEEDS = [b"\n".join(_TRACE_LINES[:51 + 6 * 48 * 3]), _two_layer_trace()]


def _trace(folder: Path, data: bytes) -> None:
    path = _write(folder, "fuzz.route.csv", data)
    try:
        trace = read_route_trace(path)
    except AbbenchError as e:
        clear(e, path)
        return
    result = replay(trace, None, DROP_FACTORS)
    json.dumps(to_json(result), allow_nan=False)
    render(result)


def test_trace_seeds_replay(scratch: Path) -> None:
    shapes = [(t.n_layer, t.rows) for t in (read_route_trace(_write(scratch, "seed.csv", data))
                                            for data in TRACE_SEEDS)]
    assert shapes == [(48, 6 * 48 * 3), (2, 200)]
    for data in TRACE_SEEDS:
        _trace(scratch, data)


@fuzz(DEFAULT)
@given(data=inputs(TRACE_SEEDS))
def test_fuzz_route_trace(scratch: Path, data: bytes) -> None:
    _trace(scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(TRACE_SEEDS))
def test_fuzz_route_trace_slow(scratch: Path, data: bytes) -> None:
    _trace(scratch, data)


# -- GGUF header and tensor table ----------------------------------------------------------


@dataclass(frozen=True)
class GgufSeed:
    """The tiny synthetic model's bytes and every integer field of its header as (offset,
    width): version, counts, string lengths, value types, array counts, dims, tensor types
    and offsets."""

    data: bytes = field(repr=False)
    fields: list[tuple[int, int]] = field(repr=False)


@pytest.fixture(scope="module")
def gguf_seed(tmp_path_factory: pytest.TempPathFactory) -> GgufSeed:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    synth.write_model(synth.preset("tiny"), path)
    data = path.read_bytes()
    return GgufSeed(data, _int_fields(data))


def _int_fields(data: bytes) -> list[tuple[int, int]]:
    fields: list[tuple[int, int]] = [(4, 4), (8, 8), (16, 8)]
    pos = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def u(width: int) -> int:
        nonlocal pos
        fields.append((pos, width))
        value = int.from_bytes(data[pos:pos + width], "little")
        pos += width
        return value

    def string() -> None:
        nonlocal pos
        n = u(8)
        pos += n

    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    for _ in range(n_kv):
        string()
        vtype = u(4)
        if vtype == 8:
            string()
        elif vtype == 9:
            itype, count = u(4), u(8)
            if itype == 8:  # the vocabulary: only its first lengths, or they crowd out
                for i in range(count):  # the rest of the header
                    if i < 3:
                        string()
                    else:
                        pos += 8 + int.from_bytes(data[pos:pos + 8], "little")
            else:
                pos += count * sizes[itype]
        elif vtype in (4, 5, 10, 11):  # integer values: counts, lengths, ids
            u(sizes[vtype])
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        string()
        for _ in range(u(4)):
            u(8)
        u(4)
        u(8)
    return fields


INTERESTING = [0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 32, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**40, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


@dataclass(frozen=True)
class GgufCase:
    """Edits to the seed model (offset, new bytes), then a cut; or `random` bytes after the
    magic. Small to print when a case fails, unlike the 1.2 MB file."""

    edits: tuple[tuple[int, bytes], ...] = ()
    cut: int | None = None
    random: bytes | None = None

    def apply(self, seed: bytes) -> bytes:
        if self.random is not None:
            return b"GGUF" + self.random
        out = bytearray(seed)
        for at, new in self.edits:
            out[at:at + len(new)] = new
        return bytes(out[:self.cut])


@st.composite
def gguf_cases(draw: st.DrawFn, fields: list[tuple[int, int]], size: int) -> GgufCase:
    header_end = fields[-1][0] + fields[-1][1]
    kind = draw(st.sampled_from(["field", "field", "flip", "cut", "random"]))
    if kind == "random":
        return GgufCase(random=draw(st.sampled_from([b"", struct.pack("<I", 3), b"\2\0\0\0"]))
                        + draw(st.binary(max_size=200)))
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        if kind == "field":
            at, width = draw(st.sampled_from(fields))
            value = draw(st.one_of(st.sampled_from(INTERESTING), st.integers(0, 2**64 - 1)))
            edits.append((at, (value % 2**(8 * width)).to_bytes(width, "little")))
        elif kind == "flip":
            edits.append((draw(st.integers(4, header_end + 64)),
                          bytes([draw(st.integers(0, 255))])))
    cut = None
    if kind == "cut" or draw(st.integers(0, 9)) == 0:
        cut = draw(st.integers(0, size))
    return GgufCase(tuple(edits), cut)


def gguf_inputs(seed: GgufSeed) -> st.SearchStrategy[GgufCase]:
    return gguf_cases(seed.fields, len(seed.data))


def _gguf(folder: Path, data: bytes) -> None:
    path = _write(folder, "fuzz.gguf", data)
    try:
        mf = ModelFile(path)
    except AbbenchError as e:
        assert e.message.startswith(str(path)), e.message[:300]
        clear(e, path)
        return
    try:
        opened = survive(lambda: model_info(mf)) is not None
        survive(lambda: tokenizer_for(mf).encode("hé $(x)"))
    finally:
        mf.close()
    if opened:  # what `abbench engine run -m FILE` does with it: load, decode a token
        survive(lambda: _decode_one(path))


def _decode_one(path: Path) -> None:
    config = EngineConfig(model=str(path), prompt="$(x)", n_tokens=1, cache_mib=1,
                          io_lanes=1, threads=1)
    with warnings.catch_warnings():  # a flipped weight overflows the matmuls: numbers, not
        warnings.simplefilter("ignore", RuntimeWarning)  # a parser's concern
        with Engine(config, path) as engine:
            engine.run()


def test_gguf_seed_opens(gguf_seed: GgufSeed, scratch: Path) -> None:
    assert len(gguf_seed.fields) > 100
    mf = ModelFile(_write(scratch, "seed.gguf", gguf_seed.data))
    try:
        assert model_info(mf)["n_layer"] == synth.preset("tiny").n_layer
    finally:
        mf.close()


@fuzz(DEFAULT)
@given(data=st.data())
def test_fuzz_gguf(gguf_seed: GgufSeed, scratch: Path,
                   data: st.DataObject) -> None:
    _gguf(scratch, data.draw(gguf_inputs(gguf_seed)).apply(gguf_seed.data))


@pytest.mark.slow
@fuzz(SLOW)
@given(data=st.data())
def test_fuzz_gguf_slow(gguf_seed: GgufSeed, scratch: Path,
                        data: st.DataObject) -> None:
    _gguf(scratch, data.draw(gguf_inputs(gguf_seed)).apply(gguf_seed.data))


# -- cells.toml ------------------------------------------------------------------------------

TOML_SEEDS = [p.read_bytes() for p in sorted((REPO / "cells").glob("*.toml"))] + [
    b'[campaign]\nname = "ext"\norder = ["a", "b", "a"]\n[device]\ntransport = "local"\n'
    b'[cells.a]\nengine = "external"\ncommand = ["sh", "-c", "echo $(touch pwned)"]\n'
    b'output = "stdout-summary"\n[cells.b]\nbase = "a"\ncommand = ["true", "; rm -rf x"]\n'
    b'[[sweep]]\ncell = "a"\nkey = "timeout_s"\nvalues = [1, 2]\n'
    b'[[decision]]\ncandidate = "b"\nbaseline = "a"\nmin_effect = 0.03\n',
]


def _campaign(folder: Path, data: bytes) -> None:
    path = _write(folder, "fuzz.toml", data)
    try:
        plan = plan_campaign(load_campaign(path))
    except AbbenchError as e:
        assert e.message.startswith(str(path)), e.message[:300]
        clear(e, path)
        return
    describe_plan(plan)
    json.dumps(plan.to_json(), allow_nan=False)


@fuzz(DEFAULT)
@given(data=inputs(TOML_SEEDS))
def test_fuzz_cells_toml(scratch: Path, data: bytes) -> None:
    _campaign(scratch, data)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=inputs(TOML_SEEDS))
def test_fuzz_cells_toml_slow(scratch: Path, data: bytes) -> None:
    _campaign(scratch, data)


# -- run folders, as `abbench report` reads them ----------------------------------------------

JSON_KEYS = ["index", "name", "label", "status", "cells", "entry", "gate", "summary",
             "per_token", "wall_ms", "tok/s", "t_wall", "t_mono", "values", "cell",
             "caps_khz", "hw_max_khz", "decisions", "candidate", "baseline", "min_effect",
             "match", "warmup_tokens", "sentinel_of", "config", "fingerprint", "state"]
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
              st.sampled_from([10**400, 1e308, -1e308, 0, -1, "", "../../x", "01-B"]),
              st.text(max_size=8), st.sampled_from(JSON_KEYS)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(JSON_KEYS) | st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _nodes(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):
            out += _nodes(v, (*path, i))
    return out


def _json_edit(draw: st.DrawFn, doc: Any) -> Any:
    """One node of a JSON document replaced by any JSON value, or removed."""
    path = draw(st.sampled_from(_nodes(doc)))
    if not path:
        return draw(JSON_VALUES)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(JSON_VALUES)
    return doc


class Edits(dict[str, "bytes | None"]):
    """New contents by file (None: removed), printed as where each first differs from the
    original: the files are too long to print whole."""

    def __init__(self, original: dict[str, bytes]) -> None:
        super().__init__()
        self.original = original

    def __repr__(self) -> str:
        parts = []
        for name, new in self.items():
            old = self.original[name]
            if new is None:
                parts.append(f"{name}: removed")
                continue
            at = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b),
                      min(len(old), len(new)))
            parts.append(f"{name}: {len(old)} -> {len(new)} bytes, from byte {at}: "
                         f"{new[max(0, at - 40):at + 80]!r}")
        return "Edits(" + "; ".join(parts) + ")"


@st.composite
def folder_edits(draw: st.DrawFn, files: dict[str, bytes]) -> Edits:
    """1-3 files of a run folder changed: JSON edited node by node, or bytes mutated, or the
    file removed (None)."""
    edits = Edits(files)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(files)))
        data = files[name]
        how = draw(st.sampled_from(["json", "json", "bytes", "remove"]))
        if how == "remove":
            edits[name] = None
        elif how == "json" and name.endswith((".json", ".jsonl")):
            lines = data.decode().split("\n") if name.endswith(".jsonl") else [data.decode()]
            docs = [i for i, ln in enumerate(lines) if ln.strip()]
            if docs:
                i = draw(st.sampled_from(docs))
                doc = _json_edit(draw, json.loads(lines[i]))
                lines[i] = json.dumps(doc)
            edits[name] = "\n".join(lines).encode()
        else:
            edits[name] = draw(mutated([data]))
    return edits


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


class Folders(dict[str, dict[str, bytes]]):
    """Run folders as {kind: {relative path: bytes}}, printed by their kinds only."""

    def __repr__(self) -> str:
        return f"Folders({', '.join(self)})"


@pytest.fixture(scope="module")
def run_folders(tmp_path_factory: pytest.TempPathFactory) -> Folders:
    """Three sound run folders as {relative path: bytes}: a campaign's (gate, decisions,
    samples, status.json), an import of the headerless reference runs, and an import of
    the route-trace folder (a .state, hence samples)."""
    base = tmp_path_factory.mktemp("runs")
    campaign = make_run(base / "c", [cell("B", 40, n=24), cell("C", 44, n=24),
                                          cell("B", 39, n=24, sentinel_of=0)],
                        [{"candidate": "C", "baseline": "B", "min_effect": 0.03}])
    with pytest.warns(UserWarning):
        headerless = import_folder(HEADERLESS, base / "h", decisions=[
            ("qwen_c4000_l4", "qwen_c2000_l4", 0.03)])
    routed = import_folder(ROUTE, base / "r")
    return Folders((name, _snapshot(run)) for name, run in
                   (("campaign", campaign), ("headerless", headerless), ("route", routed)))


def _report(folder: Path, files: dict[str, bytes], edits: dict[str, bytes | None],
            html: bool) -> None:
    """Write the edited folder and read it as `abbench report` does: analysis, report.json,
    report.md, the terminal report and (for some examples, it takes half a second) the
    HTML page."""
    run = folder / "run"
    shutil.rmtree(run, ignore_errors=True)
    for name, data in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        new = edits.get(name, data)
        if new is not None:
            (run / name).write_bytes(new)
    try:
        a = analyze(run)
    except AbbenchError as e:
        clear(e, run)
        return
    json.loads(json_report.dumps(a))
    markdown.render(a)
    with contextlib.redirect_stdout(io.StringIO()):
        print_report(a, "plain")
    if html:
        render_html(a, run)


def test_run_folder_seeds_report(run_folders: Folders, scratch: Path) -> None:
    for files in run_folders.values():
        _report(scratch, files, {}, html=True)


# The files `abbench.records` reads, and the cell's own files (summary.json, tokens.csv),
# which `analysis/cells.py` reads.
RECORDS = ("plan.json", "journal.jsonl", "samples.jsonl", "status.json")


@st.composite
def run_folder_cases(draw: st.DrawFn, folders: Folders, cell_files: bool
                     ) -> tuple[str, Edits, bool]:
    kind = draw(st.sampled_from(sorted(folders)))
    files = {k: v for k, v in folders[kind].items() if k.startswith("cells/") == cell_files}
    edits = draw(folder_edits(files))
    edits.original = folders[kind]
    return kind, edits, draw(st.integers(0, 9)) == 0


def _fuzz_run_folder(folders: Folders, scratch: Path, data: st.DataObject,
                     cell_files: bool) -> None:
    kind, edits, html = data.draw(run_folder_cases(folders, cell_files))
    _report(scratch, folders[kind], edits, html)


# Until `analysis/cells.py` reads a cell's files through `records.read_cell_files` (it
# trusts `per_token` to hold numbers: `"wall_ms": [{}]` is a TypeError), fuzzing them finds
# that; the marker lifts itself once it does.
_CELL_FILES_CHECKED = hasattr(cells_module, "read_cell_files")
_CELL_FILES_UNCHECKED = pytest.mark.xfail(
    not _CELL_FILES_CHECKED, strict=False,
    reason="analysis/cells.py reads summary.json per_token unchecked (see read_cell_files)")


@fuzz(DEFAULT)
@given(data=st.data())
def test_fuzz_run_folder_records(run_folders: Folders, scratch: Path,
                                 data: st.DataObject) -> None:
    _fuzz_run_folder(run_folders, scratch, data, cell_files=False)


@_CELL_FILES_UNCHECKED
@fuzz(DEFAULT, shrink=_CELL_FILES_CHECKED)  # shrinking a known failure takes minutes
@given(data=st.data())
def test_fuzz_run_folder_cell_files(run_folders: Folders, scratch: Path,
                                    data: st.DataObject) -> None:
    _fuzz_run_folder(run_folders, scratch, data, cell_files=True)


@pytest.mark.slow
@fuzz(SLOW)
@given(data=st.data())
def test_fuzz_run_folder_records_slow(run_folders: Folders, scratch: Path,
                                      data: st.DataObject) -> None:
    _fuzz_run_folder(run_folders, scratch, data, cell_files=False)


@pytest.mark.slow
@_CELL_FILES_UNCHECKED
@fuzz(SLOW, shrink=_CELL_FILES_CHECKED)
@given(data=st.data())
def test_fuzz_run_folder_cell_files_slow(run_folders: Folders, scratch: Path,
                                         data: st.DataObject) -> None:
    _fuzz_run_folder(run_folders, scratch, data, cell_files=True)


# -- `abbench import` of a mutated folder ----------------------------------------------------

IMPORT_FOLDERS = {
    "headerless": {p.name: p.read_bytes() for p in sorted(HEADERLESS.iterdir())},
    "route": {p.name: p.read_bytes()[:20000] if p.suffix == ".csv" else p.read_bytes()
              for p in sorted(ROUTE.iterdir())},
    "desktop": {p.name: p.read_bytes() for p in sorted(DESKTOP.iterdir())[:2]},
}
IMPORT_FOLDERS["headerless"]["driver.log"] = DRIVER_LOG_SEEDS[0]
# several driver logs in their variants, merged; an engine log that is not UTF-8
IMPORT_FOLDERS["merged"] = {
    **{k: v for k, v in IMPORT_FOLDERS["headerless"].items() if k != "driver.log"},
    "morning.log": DRIVER_LOG_SEEDS[1], "noon.log": DRIVER_LOG_SEEDS[2],
    "qwen_c4000_l4_ov.log": IMPORT_FOLDERS["headerless"]["qwen_c4000_l4_ov.log"]
    + b"prompt: [151644, '\xe4\xb8']\n",
}


@st.composite
def import_cases(draw: st.DrawFn) -> tuple[str, Edits, str]:
    kind = draw(st.sampled_from(sorted(IMPORT_FOLDERS)))
    files = IMPORT_FOLDERS[kind]
    edits = draw(folder_edits(files))
    extra = draw(st.sampled_from(["", "", "a\nb.csv", "a b;$(touch pwned).csv",
                                  "`touch pwned`.metrics", "-rf.csv", ".hidden.csv"]))
    return kind, edits, extra


def _import(folder: Path, kind: str, edits: dict[str, bytes | None], extra: str) -> None:
    root = folder / "import"
    shutil.rmtree(root, ignore_errors=True)
    src, out = root / "src", root / "out" / "run"
    src.mkdir(parents=True)
    (root / "out").mkdir()
    for name, data in IMPORT_FOLDERS[kind].items():
        new = edits.get(name, data)
        if new is not None:
            (src / name).write_bytes(new)
    if extra:  # a hostile file name beside the runs
        (src / extra).write_bytes(CSV_SEEDS[0])
    before = _snapshot(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import_folder(src, out)
    except AbbenchError as e:
        clear(e, under=root)
        assert _snapshot(root) == before  # nothing written, nothing left behind
        return
    after = _snapshot(root)
    written = {k for k in after if k not in before or after[k] != before[k]}
    assert all(k.startswith("out/run/") for k in written), written
    assert not any(p.name == "pwned" for p in root.rglob("*")), "a name ran as a command"
    survive(lambda: analyze(out))


@fuzz(DEFAULT)
@given(case=import_cases())
def test_fuzz_import(scratch: Path, case: tuple[str, dict[str, bytes | None], str]) -> None:
    _import(scratch, *case)


@pytest.mark.slow
@fuzz(SLOW)
@given(case=import_cases())
def test_fuzz_import_slow(scratch: Path, case: tuple[str, dict[str, bytes | None], str]) -> None:
    _import(scratch, *case)


# -- the real CLI, for a handful of cases --------------------------------------------------


def abbench(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def one_error(p: subprocess.CompletedProcess[str], names: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1 and names in errors[0], p.stderr
    assert "Traceback" not in p.stderr


@settings(max_examples=3, deadline=None, suppress_health_check=_HEALTH, database=None)
@given(data=st.data())
def test_cli_on_fuzzed_files(gguf_seed: GgufSeed,
                             tmp_path_factory: pytest.TempPathFactory,
                             data: st.DataObject) -> None:
    """Mutated inputs that the parsers reject, through `python -m abbench`: exit status 2,
    one `ERROR:` line naming the file, no traceback, nothing written beside them."""
    folder = tmp_path_factory.mktemp("cli")
    cases: list[tuple[list[str], str, Path]] = []
    gguf = data.draw(gguf_inputs(gguf_seed).map(lambda c: c.apply(gguf_seed.data)).filter(
        lambda b: _rejects_gguf(folder, b)))
    cases.append((["model", "info", str(_write(folder, "m.gguf", gguf))], "m.gguf", folder))
    trace = data.draw(mutated(TRACE_SEEDS).filter(lambda b: _rejects_trace(folder, b)))
    cases.append((["replay", str(_write(folder, "t.route.csv", trace))], "t.route.csv", folder))
    src = folder / "src"
    src.mkdir()
    bad = data.draw(mutated(CSV_SEEDS).filter(lambda b: _rejects_import(folder, b)))
    _write(src, "run.csv", bad)
    cases.append((["import", str(src), "--out", str(folder / "out")], "run.csv", folder))
    for argv, names, cwd in cases:
        before = _snapshot(folder)
        one_error(abbench(*argv, cwd=cwd), names)
        assert _snapshot(folder) == before


def _rejects_gguf(folder: Path, data: bytes) -> bool:
    try:
        mf = ModelFile(_write(folder, "probe.gguf", data))
    except AbbenchError:
        return True
    try:
        return survive(lambda: model_info(mf)) is None
    finally:
        mf.close()


def _rejects_import(folder: Path, data: bytes) -> bool:
    """Whether a folder holding only `run.csv` fails to import, for a reason naming it. The
    folder import reads a file that is not UTF-8 with replacement characters (a run's own
    reader refuses it), so its own verdict, not `read_bmoe_csv`'s, picks the CLI's cases."""
    probe = folder / "probe-src"
    shutil.rmtree(probe, ignore_errors=True)
    probe.mkdir()
    _write(probe, "run.csv", data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import_folder(probe, folder / "probe-out")
    except AbbenchError as e:
        return "run.csv" in str(e)
    else:
        shutil.rmtree(folder / "probe-out")
        return False
    finally:
        shutil.rmtree(probe)


def _rejects_trace(folder: Path, data: bytes) -> bool:
    return survive(lambda: read_route_trace(_write(folder, "probe.route.csv", data))) is None


# -- what llama.cpp's tools print (records/llamacpp.py) -------------------------------------

LLAMA = REPO / "tests" / "fixtures" / "llamacpp"
BENCH_SEEDS = [(LLAMA / "bench-tiny.jsonl").read_bytes()]
PERF_SEEDS = [(LLAMA / "completion-tiny.stderr").read_bytes()]


def _llama_outputs(bench: bytes, stderr: bytes) -> None:
    """A llama.cpp cell's output parses to a summary with a positive finite tok/s, or is
    a CellOutputError (a failed cell with its reason), never anything else."""
    from abbench.errors import CellOutputError
    from abbench.records.llamacpp import bench_summary, completion_summary, parse_bench_jsonl

    for parse in (lambda: bench_summary(parse_bench_jsonl(bench.decode("utf-8", "replace"))),
                  lambda: completion_summary(bench, stderr.decode("utf-8", "replace"))):
        try:
            summary = parse()[0]
        except CellOutputError:
            continue
        tps = summary["tok/s"]
        assert isinstance(tps, float) and 0 < tps < float("inf"), summary
        json.dumps(summary, allow_nan=False)


@fuzz(DEFAULT)
@given(bench=inputs(BENCH_SEEDS), stderr=inputs(PERF_SEEDS))
def test_fuzz_llama_cpp_outputs(bench: bytes, stderr: bytes) -> None:
    _llama_outputs(bench, stderr)


@pytest.mark.slow
@fuzz(SLOW)
@given(bench=inputs(BENCH_SEEDS), stderr=inputs(PERF_SEEDS))
def test_fuzz_llama_cpp_outputs_slow(bench: bytes, stderr: bytes) -> None:
    _llama_outputs(bench, stderr)
