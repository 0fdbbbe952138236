"""engine/ggml/: finding and checking ggml's library, its quantizer, graphs over our memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from abbench.engine import ggml
from abbench.engine.ggml import abi, library

# One row bound per type: |dequantize(quantize(a)) - a| on unit normals, with margin.
ROUND_TRIP = {ggml.Q8_0: 0.03, ggml.Q4_0: 0.5, ggml.Q4_K: 0.35, ggml.Q5_K: 0.2,
              ggml.Q6_K: 0.1, ggml.F16: 0.002}


def test_the_library_loads_and_passes_its_layout_check() -> None:
    lib = ggml.lib()
    assert (lib.folder / "libggml-cpu.so").exists()
    assert lib.cpu_features()  # names what the kernels were built for


def test_every_prototype_is_declared_on_its_library() -> None:
    g = ggml.lib()
    for which, name, restype, argtypes in abi.PROTOTYPES:
        fn = getattr(getattr(g, which), name)
        assert (fn.restype, fn.argtypes) == (restype, list(argtypes)), name


def test_a_folder_without_the_library_is_refused_with_its_paths(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setenv(ggml.LIB_ENV, str(tmp_path))
    with pytest.raises(ggml.GgmlUnavailable, match="libggml-base.so"):
        ggml.lib()


def test_a_library_whose_tensor_struct_differs_is_refused(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    folder = ggml.lib().folder
    for name in ("libggml-base.so", "libggml-cpu.so"):  # a fresh path: loaded anew
        shutil.copy(folder / name, tmp_path / name)
    # where the layout check reads it
    monkeypatch.setattr(library, "GGML_OBJECT_SIZE", ggml.GGML_OBJECT_SIZE + 8)
    with pytest.raises(ggml.GgmlUnavailable, match="struct ggml_tensor"):
        ggml.Lib(tmp_path)


@pytest.mark.parametrize("gtype", sorted(ROUND_TRIP))
def test_quantize_round_trips_through_ggufs_dequantize(gtype: int) -> None:
    a = np.random.default_rng(gtype).standard_normal((3, 512)).astype(np.float32)
    q = ggml.quantize(a, gtype)
    assert q.shape == (3, ggml.row_bytes(gtype, 512))
    back = dequantize(q, GGMLQuantizationType(gtype))
    assert np.abs(back - a).max() < ROUND_TRIP[gtype]
    assert ggml.valid_rows(gtype, q)


def test_quantize_refuses_rows_that_are_not_whole_blocks() -> None:
    with pytest.raises(ggml.EngineError, match="not whole"):
        ggml.quantize(np.zeros((2, 100), np.float32), ggml.Q4_K)


def test_invalid_quantized_data_is_seen() -> None:
    q = ggml.quantize(np.ones((1, 32), np.float32), ggml.Q8_0)
    q[0, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # the block's scale
    assert not ggml.valid_rows(ggml.Q8_0, q)


def test_mul_mat_over_our_memory_matches_the_dequantized_product() -> None:
    g = ggml.lib()
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    q = ggml.quantize(w, ggml.Q4_K)
    x = rng.standard_normal(256).astype(np.float32)
    y = np.zeros(96, np.float32)
    ctx = ggml.Context(g, 4, 16)
    wt = ctx.tensor(ggml.Q4_K, (256, 96), q.ctypes.data)
    xt = ctx.tensor(ggml.F32, (256, 1), x.ctypes.data)
    graph = ctx.graph([ctx.mul_mat(wt, xt, y.ctypes.data)], ggml.Threads(g, 2))
    graph.compute()
    ref = dequantize(q, GGMLQuantizationType.Q4_K) @ x
    # The input is quantized to Q8_K as llama.cpp does: close, not equal.
    assert np.abs(y - ref).max() < 0.02 * np.abs(ref).max()
    x[:] = -x  # a graph reads its inputs anew on every compute
    graph.compute()
    assert np.abs(y + ref).max() < 0.02 * np.abs(ref).max()


def test_shapes_that_ggml_would_abort_on_are_refused_first() -> None:
    g = ggml.lib()
    ctx = ggml.Context(g, 4, 16)
    a = ctx.tensor(ggml.Q8_0, (64, 4), 0x1000)
    b = ctx.tensor(ggml.F32, (32, 1), 0x2000)
    with pytest.raises(ggml.EngineError, match="mul_mat"):
        ctx.mul_mat(a, b, 0x3000)
    with pytest.raises(ggml.EngineError, match="blocks"):
        ctx.tensor(ggml.Q4_K, (100, 2), 0x1000)
