"""GGUF files built to cost time or memory (issue 33, classes 5 and 6), and a property
test over generated headers.

Every file here is valid GGUF as far as its bytes go: what makes it hostile is what its
header claims. A metadata array of a million empty strings, tensors far larger than the
vocabulary or laid over each other, a context no memory holds. Each goes through the real
command line (`python -m abbench`) as a fresh child whose own peak RSS and CPU time come
back from `os.wait4`: it works, or it is one `ERROR:` line and exit status 2, quickly and
in bounded memory. Large claims are backed by sparse files (`os.truncate`), which take no
disk space.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_main
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from abbench.engine import synth
from abbench.engine.gguf import model_file as gguf_file
from abbench.engine.gguf.model_file import MAX_VOCAB, ModelFile
from abbench.engine.run.models import check_context_memory
from abbench.engine.streaming import streamer
from abbench.errors import ConfigError, EngineError, ModelFileError

MIB = 2**20
# What any command may cost on one of these files (the bound), and the wall-clock
# limit past which a child is killed as hung: CPU time is the measure (the machine may be
# shared), the wall limit only ends a child that would never finish.
MAX_RSS_MIB, MAX_CPU_S, HUNG_S = 512, 5.0, 60.0

# -- a GGUF file as parts: edit them, put them together again ------------------------------


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


@dataclass
class Tensor:
    name: str
    dims: list[int]  # innermost first, as the file stores them
    type_id: int
    offset: int  # from the data start


@dataclass
class Parts:
    """A GGUF file as its metadata entries (key -> value type and encoded value), tensor
    table and data; `counts` overrides the header's counts (a lie), `length` makes the file
    that long (sparse past its bytes)."""

    kvs: dict[str, tuple[int, bytes]]
    tensors: list[Tensor]
    data: bytes
    alignment: int
    counts: tuple[int | None, int | None] = (None, None)
    length: int | None = None

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def __repr__(self) -> str:  # what a failing example shows: no megabytes of values
        kvs = {k: (GGUFValueType(t).name if t in iter(GGUFValueType) else t, len(v))
               for k, (t, v) in self.kvs.items()}
        return (f"Parts(kvs={kvs}, tensors={self.tensors}, data={len(self.data)} bytes, "
                f"counts={self.counts}, length={self.length})")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis's printer
        p.text(repr(self))

    def write(self, path: Path) -> Path:
        n_tensors = len(self.tensors) if self.counts[0] is None else self.counts[0]
        n_kv = len(self.kvs) if self.counts[1] is None else self.counts[1]
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv))
        for key, (vtype, value) in self.kvs.items():
            out += string(key) + struct.pack("<I", vtype) + value
        for t in self.tensors:
            out += string(t.name) + struct.pack("<I", len(t.dims))
            out += struct.pack(f"<{len(t.dims)}Q", *t.dims) + struct.pack("<IQ", t.type_id,
                                                                        t.offset)
        out += b"\0" * (-len(out) % self.alignment)
        path.write_bytes(bytes(out) + self.data)
        if self.length is not None and self.length > path.stat().st_size:
            os.truncate(path, self.length)
        return path

    def data_end(self, t: Tensor) -> int:
        """Where `t`'s data would end, counted from the data start."""
        block, size = GGML_SIZES.get(t.type_id, (1, 1))
        n = 1
        for d in t.dims:
            n *= d
        return t.offset + n // block * size


GGML_SIZES = {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}


def parts_of(path: Path) -> Parts:
    """The parts of a (well-formed) GGUF file, read with gguf's own reader."""
    r = GGUFReader(path)
    raw = path.read_bytes()
    kvs: dict[str, tuple[int, bytes]] = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        start = int(f.offset) + 8 + len(key.encode()) + 4
        end = int(f.offset) + sum(int(p.nbytes) for p in f.parts)
        kvs[key] = (int(f.types[0]), raw[start:end])
    data_start = int(r.data_offset)
    tensors = [Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type),
                      int(t.data_offset) - data_start) for t in r.tensors]
    return Parts(kvs, tensors, raw[data_start:], int(r.alignment))


def u32(value: int) -> tuple[int, bytes]:
    return int(GGUFValueType.UINT32), struct.pack("<I", value)


def string_array(count: int, length: int = 0) -> tuple[int, bytes]:
    """An array of `count` strings of `length` bytes each."""
    item = string(b"x" * length)
    return int(GGUFValueType.ARRAY), struct.pack("<IQ", GGUFValueType.STRING, count) + \
        item * count


def f32_array(count: int) -> tuple[int, bytes]:
    return int(GGUFValueType.ARRAY), struct.pack("<IQ", GGUFValueType.FLOAT32, count) + \
        b"\0" * (4 * count)


@pytest.fixture(scope="module")
def tiny_parts(tiny_model: Path) -> Parts:
    return parts_of(tiny_model)


def fresh(parts: Parts) -> Parts:
    """A copy to edit."""
    return replace(parts, kvs=dict(parts.kvs),
                   tensors=[replace(t, dims=list(t.dims)) for t in parts.tensors])


# -- the real command line, one fresh child each ----------------------------------------


@dataclass(frozen=True)
class Child:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    cpu_s: float  # user + system, every thread
    rss_mib: float  # peak resident set (ru_maxrss)
    hung: bool


# `python -m abbench`, writing its peak RSS (VmHWM, KiB) to argv[1] as it exits. Not
# ru_maxrss: Linux carries the high-water mark of the process that forked the child across
# exec, so in a long test session every child would read as large as pytest itself.
PEAK_LAUNCHER = """
import atexit, runpy, sys
def peak(path=sys.argv.pop(1)):
    with open('/proc/self/status') as f:
        kib = next(line.split()[1] for line in f if line.startswith('VmHWM:'))
    with open(path, 'w') as f:
        f.write(kib)
atexit.register(peak)
sys.argv[0] = 'abbench'
runpy.run_module('abbench', run_name='__main__', alter_sys=True)
"""


def spawn(*args: str | os.PathLike[str]) -> Callable[[], Child]:
    """Start `python -m abbench ARGS`; the returned call waits for it (`os.wait4`: the
    child's own rusage, not the sum over every child so far)."""
    argv = tuple(map(str, args))
    # Files, not pipes: nobody reads a pipe while the child runs. `wait` closes them.
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    peak = tempfile.NamedTemporaryFile(delete=False)  # noqa: SIM115
    peak.close()
    p = subprocess.Popen([sys.executable, "-c", PEAK_LAUNCHER, peak.name, *argv], stdout=out,
                         stderr=err, stdin=subprocess.DEVNULL)
    timer = threading.Timer(HUNG_S, p.kill)
    timer.start()

    def wait() -> Child:
        _, status, usage = os.wait4(p.pid, 0)
        hung = not timer.is_alive()
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="replace"))
            f.close()
        written = Path(peak.name).read_text()
        Path(peak.name).unlink()
        # A child killed before its exit hook wrote nothing: ru_maxrss, an upper bound
        kib = int(written) if written else usage.ru_maxrss
        return Child(argv, p.returncode, texts[0], texts[1],
                     usage.ru_utime + usage.ru_stime, kib / 1024, hung)

    return wait


def cli(*args: str | os.PathLike[str]) -> Child:
    return spawn(*args)()


def check_bounded(c: Child) -> None:
    """It finished, within the CPU time and memory any file may cost."""
    assert not c.hung, f"{c.argv}: still running after {HUNG_S} s"
    assert c.cpu_s < MAX_CPU_S, f"{c.argv}: {c.cpu_s:.1f} s of CPU"
    assert c.rss_mib < MAX_RSS_MIB, f"{c.argv}: peak RSS {c.rss_mib:.0f} MiB"


def one_error(c: Child, *named: str) -> str:
    """Exit 2 and one `ERROR:` line naming `named` (only `WARNING:` lines before it, at
    most a `TIP:` after); no traceback."""
    assert "Traceback" not in c.out + c.err, c.err[-3000:]
    assert c.rc == 2, (c.argv, c.rc, c.err[-3000:])
    lines = c.err.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("ERROR:")]
    assert len(at) == 1, c.err[-3000:]
    assert all(line.startswith("WARNING:") for line in lines[: at[0]]), c.err[-3000:]
    after = lines[at[0] + 1 :]
    assert len(after) <= 1 and all(line.startswith("TIP: ") for line in after), c.err
    for name in named:
        assert name in lines[at[0]], (name, lines[at[0]])
    return lines[at[0]]


def engine_run(path: Path, *extra: str) -> tuple[str, ...]:
    return ("engine", "run", "-m", str(path), "-n", "1", "-p", "hi", *extra)


# -- class 5: resource bombs inside valid files ------------------------------------------


def test_a_million_string_array_is_stepped_over_not_read(
    tiny_parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """`model info` decoded every item of every array (through `gguf.GGUFReader`, ~1.6
    KiB an item): this 9 MB file took 17 s and 1.6 GiB. Now the array is walked over by
    its lengths, named as not read, and the model runs."""
    parts = fresh(tiny_parts)
    parts.kvs = {"junk.strings": string_array(1_000_000), **parts.kvs}
    path = parts.write(tmp_path / "strings.gguf")
    waits = [spawn("model", "info", path), spawn(*engine_run(path))]
    info, run = (w() for w in waits)
    for c in (info, run):
        assert c.rc == 0, c.err[-2000:]
        check_bounded(c)
        assert c.rss_mib < 256, c.rss_mib  # what the tiny model costs, not the array
    assert "metadata not read    `junk.strings` (1000000 strings)" in info.out, info.out
    rc, out, _ = run_main(["model", "info", "--json", str(path)], capsys)
    assert rc == 0 and '"junk.strings": "1000000 strings"' in out
    mf = ModelFile(path)
    try:
        with pytest.raises(ModelFileError, match="`junk.strings` holds 1000000 strings"):
            mf.array("junk.strings")
        assert mf.array("tokenizer.ggml.token_type") == [int(t) for t in np.frombuffer(
            tiny_parts.kvs["tokenizer.ggml.token_type"][1][12:], "<i4")]
    finally:
        mf.close()


@pytest.mark.parametrize(("key", "value", "named"), [
    ("tokenizer.ggml.tokens", string_array(MAX_VOCAB + 1),
     f"`tokenizer.ggml.tokens` holds {MAX_VOCAB + 1} strings, more than abbench reads"),
    ("tokenizer.ggml.scores", f32_array(258),
     "`tokenizer.ggml.scores` has 258 entries for 259 tokens"),
], ids=["vocabulary-over-the-limit", "scores-disagree-with-tokens"])
def test_tokenizer_arrays_are_bounded_and_agree(
    key: str, value: tuple[int, bytes], named: str, tiny_parts: Parts, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    parts = fresh(tiny_parts)
    parts.kvs[key] = value
    path = parts.write(tmp_path / "vocab.gguf")
    for argv in (["model", "info", str(path)], list(engine_run(path))):
        rc, out, err = run_main(argv, capsys)
        assert rc == 2 and out == "", err
        assert err.startswith(f"ERROR: {path}: metadata {named}"), err
        assert "Traceback" not in err


def test_an_embedding_larger_than_the_vocabulary_is_refused_before_it_is_read(
    tiny_parts: Parts, tmp_path: Path,
) -> None:
    """A million-row embedding (and output) for a 259-token vocabulary, each at the end
    of a sparse file where it overlaps nothing: it was read and converted (0.8 GiB peak,
    8M rows: 6 GiB) and the model ran, exit 0."""
    parts = fresh(tiny_parts)
    rows, d = 1_000_000, 64
    end = len(parts.data)
    for name in ("token_embd.weight", "output.weight"):
        t = parts.tensor(name)
        t.dims[1], t.offset = rows, end
        end += rows * d * 4
    parts.length = 2**20 + end  # past the header: holes, no disk space
    path = parts.write(tmp_path / "embd.gguf")
    waits = [spawn("model", "info", path), spawn(*engine_run(path))]
    for c in (w() for w in waits):
        check_bounded(c)
        one_error(c, str(path), "tensor `token_embd.weight` has 1000000 rows, but the "
                  "vocabulary (`tokenizer.ggml.tokens`) has 259 tokens")
        assert c.rss_mib < 256, c.rss_mib


def test_an_embedding_without_a_vocabulary_is_bounded(tiny_parts: Parts, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    parts = fresh(tiny_parts)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        del parts.kvs[key]
    parts.tensors = [t for t in parts.tensors if t.name != "output.weight"]
    t = parts.tensor("token_embd.weight")
    t.dims[1], t.offset = MAX_VOCAB + 1, len(parts.data)
    parts.length = 2**20 + len(parts.data) + (MAX_VOCAB + 1) * 64 * 4
    path = parts.write(tmp_path / "no-vocab.gguf")
    rc, _, err = run_main(["engine", "run", "-m", str(path), "-n", "1", "--prompt-tokens",
                           "1"], capsys)
    assert rc == 2, err
    assert err.startswith(f"ERROR: {path}: tensor `token_embd.weight` has {MAX_VOCAB + 1} "
                          f"rows, more tokens than abbench reads ({MAX_VOCAB})"), err


def test_overlapping_tensors_are_refused(tiny_parts: Parts, tmp_path: Path) -> None:
    """`output.weight` laid over `token_embd.weight` (same shape, same bytes): it loaded
    and ran, exit 0, the output matrix read from the embedding's bytes."""
    parts = fresh(tiny_parts)
    parts.tensor("output.weight").offset = parts.tensor("token_embd.weight").offset
    path = parts.write(tmp_path / "overlap.gguf")
    waits = [spawn("model", "info", path), spawn(*engine_run(path))]
    for c in (w() for w in waits):
        check_bounded(c)
        one_error(c, str(path), "tensors `token_embd.weight` and `output.weight` overlap")


def test_a_tensor_off_the_alignment_is_refused(tiny_parts: Parts, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """An offset moved by 4 bytes: every weight of the tensor read one place over, and
    the model ran, exit 0. gguf's writer (and llama.cpp's reader) keep offsets aligned."""
    parts = fresh(tiny_parts)
    moved = parts.tensor("blk.1.attn_q.weight")
    moved.offset += 4
    path = parts.write(tmp_path / "moved.gguf")
    rc, _, err = run_main(list(engine_run(path)), capsys)
    assert rc == 2, err
    assert err.startswith(f"ERROR: {path}: tensor `blk.1.attn_q.weight` starts at data "
                          f"offset {moved.offset}, not a multiple of the alignment (4096)"), err


def test_expert_tensors_are_checked_against_the_header(tiny_parts: Parts, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """The header says experts of ff 16; the tensors hold ff 32. The engine took ff from
    the tensors, so a header's numbers did not bound what an expert costs."""
    parts = fresh(tiny_parts)
    parts.kvs["qwen3moe.expert_feed_forward_length"] = u32(16)
    path = parts.write(tmp_path / "ff.gguf")
    for argv in (["model", "info", str(path)], list(engine_run(path))):
        rc, _, err = run_main(argv, capsys)
        assert rc == 2, err
        assert err.startswith(f"ERROR: {path}: tensor `blk.0.ffn_gate_exps.weight` has "
                              "shape (8, 32, 64), but the header implies (8, 16, 64)"), err


def test_a_context_no_memory_holds_is_one_error(tmp_path: Path) -> None:
    """A model whose context is 4e9 positions, run with all of it: numpy's MemoryError
    traceback for a 477 GiB KV cache (exit 1). Now the need is checked against the memory
    available before anything is allocated."""
    path = tmp_path / "long.gguf"
    synth.write_model(replace(synth.preset("tiny"), context_length=4_000_000_000), path)
    c = cli(*engine_run(path, "--n-ctx", "4000000000"))
    check_bounded(c)
    line = one_error(c, str(path), "a context of 4000000000 positions needs")
    assert "GiB of memory available" in line
    assert "TIP: give `--n-ctx` (or prompt + `-n`) at most" in c.err


def test_the_context_check_counts_what_the_context_allocates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Memory:
        available = 1 << 30

    monkeypatch.setattr("psutil.virtual_memory", lambda: Memory())
    check_context_memory("m.gguf", 1000, 1 << 30)  # exactly what is there: it fits
    with pytest.raises(ConfigError) as e:
        check_context_memory("m.gguf", 1000, (1 << 30) + 1)
    assert e.value.message.startswith("m.gguf: a context of 1000 positions needs 1.0 GiB")
    assert e.value.tip is not None and e.value.tip.endswith("at most 999 on this machine now")


# -- class 6: tensors over 2 GiB are read in more than one call ------------------------------


class ShortReads:
    """A file whose every `readinto` returns at most `cap` bytes, as Linux returns at
    most 0x7ffff000 (~2 GiB) per read: the same short reads, on a tensor of kilobytes."""

    def __init__(self, f: object, cap: int) -> None:
        self.f, self.cap, self.calls = f, cap, 0

    def readinto(self, view: memoryview) -> int:
        self.calls += 1
        return self.f.readinto(view[: self.cap])  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.f, name)

    def __enter__(self) -> ShortReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()  # type: ignore[attr-defined]


def test_read_raw_loops_over_short_reads(tiny_model: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read returns at most 1000 bytes: the whole tensor arrives all the same (one
    call read 1000 and called the file truncated); a file cut while open is still named."""
    opened: list[ShortReads] = []

    def short_open(path: object, mode: str = "r", buffering: int = -1) -> ShortReads:
        opened.append(ShortReads(open(path, mode, buffering=buffering), 1000))  # noqa: SIM115
        return opened[-1]

    path = tmp_path / "copy.gguf"
    path.write_bytes(tiny_model.read_bytes())
    mf = ModelFile(path)
    try:
        info = mf.tensor("token_embd.weight")  # 66304 bytes: 67 reads of at most 1000
        want = path.read_bytes()[info.offset : info.offset + info.nbytes]
        monkeypatch.setattr(gguf_file, "open", short_open, raising=False)
        raw = mf.read_raw("token_embd.weight")
        assert opened[0].calls == -(-info.nbytes // 1000)
        assert raw.tobytes() == want
        os.truncate(path, info.offset + 5000)  # shortened after it was opened
        with pytest.raises(ModelFileError, match="truncated while reading tensor "
                                                 "`token_embd.weight`"):
            mf.read_raw("token_embd.weight")
    finally:
        monkeypatch.undo()
        mf.close()


def test_expert_reads_loop_over_short_reads(tiny_model: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The expert lanes' `preadv` loop: the same short reads, the whole slice arrives."""
    preadv = os.preadv
    calls = []

    def short_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(offset)
        return preadv(fd, [memoryview(buffers[0])[:1000]], offset)

    monkeypatch.setattr(streamer.os, "preadv", short_preadv)
    want = tiny_model.read_bytes()[12288 : 12288 + 66304]
    dest = np.zeros(66304, np.uint8)
    fd = os.open(tiny_model, os.O_RDONLY)
    try:
        assert streamer._pread_full(fd, dest, 12288) == 66304
        with pytest.raises(EngineError, match="unexpected end of file"):
            streamer._pread_full(fd, np.zeros(100, np.uint8), os.fstat(fd).st_size - 50)
    finally:
        os.close(fd)
    assert dest.tobytes() == want and len(calls) >= 67


# -- the property: any header, any command: works or one error, bounded ---------------------

# Values a count, a dimension or a hyperparameter takes: the edges, and the huge.
NUMBERS = [0, 1, 2, 3, 7, 16, 64, 259, 4096, 65_537, 2**20 + 1, 2**31 - 1, 2**32 - 1,
           2**32, 2**62, 2**64 - 1]
FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.5, 1e-30, 1e30]  # stored as F32 or F64
HYPERPARAMETERS = [
    "qwen3moe.block_count", "qwen3moe.context_length", "qwen3moe.embedding_length",
    "qwen3moe.expert_feed_forward_length", "qwen3moe.attention.head_count",
    "qwen3moe.attention.head_count_kv", "qwen3moe.attention.key_length",
    "qwen3moe.expert_count", "qwen3moe.expert_used_count", "general.alignment",
    "qwen3moe.rope.freq_base", "qwen3moe.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token", "general.sampling.temp",
    "general.sampling.penalty_repeat", "general.sampling.penalty_last_n",
]
SCALAR_FORMATS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
                  GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I",
                  GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f",
                  GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
                  GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


def scalar(vtype: GGUFValueType, n: float) -> tuple[int, bytes]:
    """`n` stored as `vtype` (wrapped into its range, as a careless writer would)."""
    fmt = SCALAR_FORMATS[vtype]
    if fmt in "fd":
        return int(vtype), struct.pack("<" + fmt, float(n))
    n = int(n) if math.isfinite(n) else 0
    if fmt == "?":
        return int(vtype), bytes([n & 1])
    bits = struct.calcsize(fmt) * 8
    n &= (1 << bits) - 1
    if fmt.islower() and n >= 1 << (bits - 1):
        n -= 1 << bits
    return int(vtype), struct.pack("<" + fmt, n)


@st.composite
def edits(draw: st.DrawFn, parts: Parts) -> Parts:
    """One to four edits of the tiny model: a metadata array or string of any length
    (its bytes present, or cut short), a hyperparameter of any value and type, a tensor's
    dimensions, type and offset, the header's counts; maybe a sparse tail backing what the
    tensors now claim."""
    p = fresh(parts)
    names = [t.name for t in p.tensors]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["array", "string", "scalar", "dims", "type", "offset",
                                     "counts", "vocabulary", "drop"]))
        if kind == "array":
            itype = draw(st.sampled_from(list(GGUFValueType)))
            count = draw(st.sampled_from([0, 1, 300, 70_000, 1_000_000]))
            if itype == GGUFValueType.STRING:
                items = string(b"y" * draw(st.integers(0, 3))) * count
            elif itype in SCALAR_FORMATS:
                items = b"\1" * (count * struct.calcsize(SCALAR_FORMATS[itype]))
            else:
                items = b"\0" * 64  # arrays of arrays, or of an unknown type
            if draw(st.booleans()):
                items = items[: draw(st.integers(0, len(items)))]  # claims more than it has
            key = draw(st.sampled_from(["junk.array", "tokenizer.ggml.merges"]))
            p.kvs[key] = (int(GGUFValueType.ARRAY), struct.pack("<IQ", itype, count) + items)
        elif kind == "string":
            length = draw(st.sampled_from([0, 5, 70_000, 2**40]))
            text = b"z" * min(length, 70_000)
            key = draw(st.sampled_from(["general.name", "junk.text", "tokenizer.ggml.model"]))
            p.kvs[key] = (int(GGUFValueType.STRING), struct.pack("<Q", length) + text)
        elif kind == "scalar":
            key = draw(st.sampled_from(HYPERPARAMETERS))
            vtype = draw(st.sampled_from([GGUFValueType.UINT32, *SCALAR_FORMATS,
                                          GGUFValueType.STRING]))
            if vtype == GGUFValueType.STRING:
                p.kvs[key] = (int(vtype), string(draw(st.sampled_from(["4", "x"]))))
            else:
                p.kvs[key] = scalar(vtype, draw(st.sampled_from(NUMBERS + FLOATS)))
        elif kind == "dims":
            t = p.tensor(draw(st.sampled_from(names)))
            t.dims[draw(st.integers(0, len(t.dims) - 1))] = draw(st.sampled_from(NUMBERS))
        elif kind == "type":
            p.tensor(draw(st.sampled_from(names))).type_id = draw(st.sampled_from(
                [*(int(t) for t in GGMLQuantizationType), 99]))
        elif kind == "offset":
            t = p.tensor(draw(st.sampled_from(names)))
            other = p.tensor(draw(st.sampled_from(names)))
            t.offset = draw(st.sampled_from([0, other.offset, t.offset + 1,
                                             t.offset + p.alignment, len(p.data), 2**40]))
        elif kind == "counts":
            delta = draw(st.sampled_from([-1, 1, 2**32]))
            p.counts = (len(p.tensors) + delta, None) if draw(st.booleans()) else \
                (None, len(p.kvs) + delta)
        elif kind == "vocabulary":
            key = draw(st.sampled_from(["tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                        "tokenizer.ggml.token_type"]))
            count = draw(st.sampled_from([0, 258, 260, 70_000]))
            p.kvs[key] = string_array(count, 1) if key.endswith("tokens") else f32_array(count)
        elif kind == "drop" and names:
            name = draw(st.sampled_from(names))
            p.tensors = [t for t in p.tensors if t.name != name]
            names.remove(name)
    if draw(st.booleans()):  # back every claim that a sparse file of <= 4 GiB can back
        end = max((p.data_end(t) for t in p.tensors), default=0)
        if end <= 4 << 30:
            p.length = 2**20 + end
    return p


@pytest.fixture(scope="module")
def property_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("generated-gguf")


# 14 examples, two fresh children each: ~30 s on 2 cores. No shrinking: each attempt costs
# two children; the example as drawn is printed whole (`Parts.__repr__`).
@settings(max_examples=14, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_header_works_or_is_one_error_in_bounded_time_and_memory(
    data: st.DataObject, tiny_parts: Parts, property_folder: Path,
) -> None:
    """`model info` and `engine run` on a generated file each exit 0, or exit 2 with one
    `ERROR:` line and no traceback; each within 5 s of CPU and 512 MiB of peak RSS."""
    path = data.draw(edits(tiny_parts)).write(property_folder / "generated.gguf")
    waits = [spawn("model", "info", path), spawn(*engine_run(path))]
    for c in (w() for w in waits):
        check_bounded(c)
        if c.rc != 0:
            one_error(c)
    path.unlink()
