"""The reader lanes: direct and bounce-buffer reads, O_DIRECT fallback, layout, read errors."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine
from abbench.engine.streaming.streamer import (
    ALIGN,
    HUGE_PAGE,
    BufferArena,
    ExpertBuffer,
    LayerExperts,
    Slice,
    SliceReader,
    arena_copy,
    expert_layout,
)
from abbench.errors import EngineError, ModelFileError

FF, D = 16, 64  # one F32 projection = 4096 bytes, one O_DIRECT block
PROJ = FF * D * 4


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A file of 8 aligned blocks of float32s plus a ragged tail."""
    path = tmp_path_factory.mktemp("streamer") / "blob.bin"
    data = np.random.default_rng(0).standard_normal(8 * PROJ // 4 + 300).astype(np.float32)
    path.write_bytes(data.tobytes())
    return path, data


def file_floats(data: np.ndarray, offset: int, n: int) -> np.ndarray:
    return np.frombuffer(data.tobytes()[offset : offset + 4 * n], np.float32)


def expert_slices(offsets: tuple[int, int, int], ggml_type: T = T.F32) -> tuple[Slice, ...]:
    return (
        Slice(offsets[0], PROJ, ggml_type, (FF, D), 0),
        Slice(offsets[1], PROJ, ggml_type, (FF, D), PROJ),
        Slice(offsets[2], PROJ, ggml_type, (D, FF), 2 * PROJ),
    )


@pytest.fixture
def reader_factory() -> Iterator:
    readers: list[SliceReader] = []

    def make(path: Path, lanes: int = 2, o_direct: bool = True) -> SliceReader:
        r = SliceReader(path, lanes, o_direct)
        readers.append(r)
        return r

    yield make
    for r in readers:
        r.close()


def o_direct_supported(path: Path) -> bool:
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("o_direct", [True, False])
def test_aligned_f32_slices_land_in_the_buffer(
    blob: tuple[Path, np.ndarray], reader_factory, o_direct: bool
) -> None:
    path, data = blob
    if o_direct and not o_direct_supported(path):
        pytest.skip("filesystem refuses O_DIRECT")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning on a filesystem that accepts it
        reader = reader_factory(path, o_direct=o_direct)
    assert reader.o_direct is o_direct
    buf = ExpertBuffer(FF, D)
    offsets = (5 * PROJ, 0, 2 * PROJ)  # any order: each slice goes where `dest` says
    assert reader.read_now(expert_slices(offsets), buf) == 3 * PROJ
    np.testing.assert_array_equal(buf.gate_up[:FF].ravel(), file_floats(data, offsets[0], FF * D))
    np.testing.assert_array_equal(buf.gate_up[FF:].ravel(), file_floats(data, offsets[1], FF * D))
    np.testing.assert_array_equal(buf.down.ravel(), file_floats(data, offsets[2], FF * D))


@pytest.mark.parametrize("o_direct", [True, False])
def test_unaligned_f32_slices_go_through_the_bounce_buffer(
    blob: tuple[Path, np.ndarray], reader_factory, o_direct: bool
) -> None:
    path, data = blob
    reader = reader_factory(path, lanes=1, o_direct=o_direct and o_direct_supported(path))
    buf = ExpertBuffer(FF, D)
    offsets = (100, PROJ + 12, 8 * PROJ - PROJ + 300)  # last one ends in the ragged tail
    ticket = reader.submit(expert_slices(offsets), buf)
    ticket.wait()
    for s, got in zip(expert_slices(offsets), (buf.gate_up[:FF], buf.gate_up[FF:], buf.down)):
        np.testing.assert_array_equal(got.ravel(), file_floats(data, s.offset, FF * D))
    if reader.o_direct:  # whole blocks around each slice, cut at the end of the file
        size = path.stat().st_size
        want = sum(min(size, -(-(o + PROJ) // ALIGN) * ALIGN) - o // ALIGN * ALIGN
                   for o in offsets)
        assert ticket.nbytes == want > 3 * PROJ
    else:
        assert ticket.nbytes == 3 * PROJ
    assert ticket.t_done >= ticket.t_issued



@pytest.mark.parametrize("o_direct", [True, False])
def test_unaligned_f16_slices_are_converted(
    blob: tuple[Path, np.ndarray], reader_factory, o_direct: bool
) -> None:
    path, data = blob
    reader = reader_factory(path, lanes=1, o_direct=o_direct and o_direct_supported(path))
    half = PROJ // 2  # F16 bytes of one projection
    offsets = (6, 3 * PROJ + 2, 5 * PROJ)
    slices = tuple(dataclasses.replace(s, nbytes=half)
                   for s in expert_slices(offsets, ggml_type=T.F16))
    buf = ExpertBuffer(FF, D)
    ticket = reader.submit(slices, buf)
    ticket.wait()
    raw = data.tobytes()
    for s, got in zip(slices, (buf.gate_up[:FF], buf.gate_up[FF:], buf.down)):
        want = np.frombuffer(raw[s.offset : s.offset + half], np.float16).astype(np.float32)
        np.testing.assert_array_equal(got.ravel(), want)
    if not reader.o_direct:
        assert ticket.nbytes == 3 * half  # buffered: exactly the slices
    else:
        assert ticket.nbytes > 3 * half

def test_refused_o_direct_falls_back_with_one_warning(
    blob: tuple[Path, np.ndarray], reader_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = blob
    monkeypatch.setattr(SliceReader, "_o_direct_works", lambda self: False)
    with pytest.warns(RuntimeWarning, match="O_DIRECT refused .*o_direct=0") as caught:
        reader = reader_factory(path, lanes=3, o_direct=True)
    assert len(caught) == 1
    assert reader.o_direct is False
    buf = ExpertBuffer(FF, D)
    reader.read_now(expert_slices((0, PROJ, 2 * PROJ)), buf)
    np.testing.assert_array_equal(buf.floats, file_floats(data, 0, 3 * FF * D))


def test_platform_without_o_direct_falls_back(
    blob: tuple[Path, np.ndarray], reader_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = blob
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    with pytest.warns(RuntimeWarning, match="O_DIRECT refused"):
        reader = reader_factory(path, o_direct=True)
    assert reader.o_direct is False


def test_o_direct_off_asks_nothing_and_warns_nothing(
    blob: tuple[Path, np.ndarray], reader_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = blob

    def probe(self: SliceReader) -> bool:
        raise AssertionError("probed O_DIRECT although it was not asked for")

    monkeypatch.setattr(SliceReader, "_o_direct_works", probe)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader_factory(path, o_direct=False).o_direct is False


# -- on model files -------------------------------------------------------------------------


def test_expert_layout_of_the_tiny_model(tiny_model: Path) -> None:
    spec = synth.preset("tiny")
    mf = ModelFile(tiny_model)
    layout = expert_layout(mf, spec.n_layer, spec.n_expert)
    assert len(layout) == spec.n_layer
    ff, d = spec.expert_ff, spec.d_model
    for i, le in enumerate(layout):
        assert isinstance(le, LayerExperts)
        assert (le.ff, le.d) == (ff, d)
        assert le.gate.name == f"blk.{i}.ffn_gate_exps.weight"
        assert le.down.shape == (spec.n_expert, d, ff)
        assert le.buffer_bytes == 3 * ff * d * 4 == spec.expert_bytes
        assert le.file_bytes == le.buffer_bytes  # F32 on disk
        gate, up, down = le.slices(3)
        assert gate.offset == le.gate.offset + 3 * ff * d * 4
        assert (gate.dest, up.dest, down.dest) == (0, ff * d * 4, 2 * ff * d * 4)
        assert (gate.shape, up.shape, down.shape) == ((ff, d), (ff, d), (d, ff))
        assert all(s.offset % ALIGN == 0 and s.nbytes % ALIGN == 0 for s in (gate, up, down))


def test_expert_layout_refuses_a_wrong_expert_count(tiny_model: Path) -> None:
    with pytest.raises(ModelFileError, match="ffn_gate_exps.weight` has shape"):
        expert_layout(ModelFile(tiny_model), 2, 7)


def reference_expert(path: Path, layer: int, expert: int) -> tuple[np.ndarray, ...]:
    """The expert's three matrices as float32, read by llama.cpp's own reader."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    out = []
    for proj in ("gate", "up", "down"):
        t = tensors[f"blk.{layer}.ffn_{proj}_exps.weight"]
        out.append(np.asarray(t.data[expert]).astype(np.float32))
    return tuple(out)


def read_expert(reader: SliceReader, le: LayerExperts, expert: int) -> ExpertBuffer:
    buf = ExpertBuffer(le.ff, le.d)
    reader.read_now(le.slices(expert), buf)
    return buf


def check_expert(buf: ExpertBuffer, ref: tuple[np.ndarray, ...], ff: int) -> None:
    gate, up, down = ref
    np.testing.assert_array_equal(buf.gate_up[:ff], gate)
    np.testing.assert_array_equal(buf.gate_up[ff:], up)
    np.testing.assert_array_equal(buf.down, down)


@pytest.mark.parametrize("o_direct", [True, False])
def test_f32_experts_equal_the_file(tiny_model: Path, reader_factory, o_direct: bool) -> None:
    layout = expert_layout(ModelFile(tiny_model), 4, 8)
    reader = reader_factory(tiny_model, o_direct=o_direct and o_direct_supported(tiny_model))
    for layer, expert in ((0, 0), (3, 7), (2, 5)):
        le = layout[layer]
        check_expert(read_expert(reader, le, expert), reference_expert(tiny_model, layer, expert),
                     le.ff)


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("f16") / "tiny-f16.gguf"
    synth.write_model(dataclasses.replace(synth.preset("tiny"), expert_type="F16"), path)
    return path


@pytest.mark.parametrize("o_direct", [True, False])
def test_f16_experts_are_converted_to_f32(f16_model: Path, reader_factory, o_direct: bool) -> None:
    layout = expert_layout(ModelFile(f16_model), 4, 8)
    le = layout[1]
    assert le.gate.ggml_type == T.F16
    assert le.file_bytes == le.buffer_bytes // 2
    reader = reader_factory(f16_model, o_direct=o_direct and o_direct_supported(f16_model))
    for expert in (0, 6):
        ref = reference_expert(f16_model, 1, expert)
        assert all(r.dtype == np.float32 for r in ref)
        buf = ExpertBuffer(le.ff, le.d)
        ticket = reader.submit(le.slices(expert), buf)
        ticket.wait()
        assert ticket.nbytes >= le.file_bytes
        check_expert(buf, ref, le.ff)


# -- read errors ----------------------------------------------------------------------------


def truncated_copy(src: Path, dst: Path, size: int) -> Path:
    shutil.copyfile(src, dst)
    os.truncate(dst, size)
    return dst


@pytest.mark.parametrize("o_direct", [True, False])
@pytest.mark.parametrize("model", [
    "tiny_model",
    "f16_model",
])
def test_read_past_the_end_is_an_engine_error(
    request: pytest.FixtureRequest, tmp_path: Path, reader_factory, o_direct: bool, model: str
) -> None:
    src: Path = request.getfixturevalue(model)
    layout = expert_layout(ModelFile(src), 4, 8)
    le = layout[3]
    last = le.slices(7)
    cut = max(s.offset for s in last) + 100  # inside the expert's last slice
    path = truncated_copy(src, tmp_path / "cut.gguf", cut)
    reader = reader_factory(path, lanes=1, o_direct=o_direct and o_direct_supported(path))
    ticket = reader.submit(last, ExpertBuffer(le.ff, le.d))
    with pytest.raises(EngineError, match="expert read failed"):
        ticket.wait()
    assert ticket.error is not None
    # The lane survives a failed read: an expert before the cut still reads.
    check_expert(read_expert(reader, le, 0), reference_expert(src, 3, 0), le.ff)



def test_arena_buffers_are_page_aligned_disjoint_and_start_a_huge_page() -> None:
    arena = BufferArena(chunk_bytes=1 << 20)
    bufs = [ExpertBuffer(FF, D, arena) for _ in range(200)]  # 12 KiB each: several chunks
    spans = sorted((b.floats.ctypes.data, b.floats.ctypes.data + b.nbytes) for b in bufs)
    assert all(start % 4096 == 0 for start, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert bufs[0].floats.ctypes.data % HUGE_PAGE == 0
    assert len({id(b.mm) for b in bufs}) > 1  # it moved on to new chunks
    for i, b in enumerate(bufs):
        b.floats[:] = i
    assert all(float(b.floats[0]) == i and float(b.floats[-1]) == i for i, b in enumerate(bufs))


def test_arena_gives_an_oversized_buffer_its_own_chunk() -> None:
    arena = BufferArena(chunk_bytes=4096)
    mm, offset = arena.take(3 * 4096 + 1)
    assert len(mm) >= 4 * 4096 + offset
    assert arena.take(10)[0] is not mm  # the chunk is full: the next take starts another


def test_an_arena_copy_is_the_array_in_arena_memory() -> None:
    arena = BufferArena(chunk_bytes=1 << 20)
    a = np.arange(300 * 7, dtype=np.float32).reshape(300, 7)
    c = arena_copy(arena, a)
    np.testing.assert_array_equal(c, a)
    assert c.dtype == a.dtype and c.flags.c_contiguous and not np.shares_memory(a, c)
    start = ctypes.addressof(ctypes.c_char.from_buffer(arena._mm))  # type: ignore[arg-type]
    assert c.ctypes.data == start + (-start % HUGE_PAGE)  # the chunk's first huge page


@pytest.mark.parametrize("dense", ["pinned", "mmap"])
def test_pinned_dense_matrices_are_streamed_from_arena_memory(tiny_model: Path,
                                                              dense: str) -> None:
    cfg = EngineConfig(model=str(tiny_model), prompt_tokens=(3, 4), n_tokens=1, dense=dense,
                       predict_log=True)  # the fused routers too
    with Engine(cfg, tiny_model) as engine:
        mats = engine.model.gemv_matrices()
        assert any(lay.moe.router_and_next is not None for lay in engine.model.layers)
        if dense == "mmap":
            assert engine.model.arena is None
            return
        mm = engine.model.arena._mm  # one chunk holds all of the tiny model's
        start = ctypes.addressof(ctypes.c_char.from_buffer(mm))  # type: ignore[arg-type]
        for m in [*mats, *(lay.moe.router for lay in engine.model.layers)]:
            assert start <= m.ctypes.data and m.ctypes.data + m.nbytes <= start + len(mm)


def test_reads_land_in_arena_buffers(tmp_path: Path) -> None:
    """O_DIRECT (where the filesystem allows it) into arena memory reads the right bytes."""
    data = np.arange(3 * FF * D, dtype=np.float32)
    path = tmp_path / "experts.bin"
    path.write_bytes(data.tobytes())
    reader = SliceReader(path, lanes=2, o_direct=True)
    try:
        arena = BufferArena()
        bufs = [ExpertBuffer(FF, D, arena) for _ in range(3)]
        per = FF * D * 4
        for buf in bufs:
            slices = tuple(Slice(k * per, per, T.F32, (FF, D) if k < 2 else (D, FF), k * per)
                           for k in range(3))
            reader.read_now(slices, buf)
            np.testing.assert_array_equal(buf.floats, data)
    finally:
        reader.close()
