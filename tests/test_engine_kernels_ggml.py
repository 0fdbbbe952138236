"""engine/kernels/ggml/: finding and checking ggml's library, its quantizer, graphs over our
memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from gguf.quants import quantize as gguf_quantize

from abbench.engine.kernels import ggml
from abbench.engine.kernels.ggml import abi, library

# One row bound per type: |dequantize(quantize(a)) - a| on unit normals, with margin.
# MXFP4's codes are 0, 0.5, 1, 1.5, 2, 3, 4, 6 times a power of two: a value just under
# the block's next power of two lands a quarter of it away.
ROUND_TRIP = {ggml.Q8_0: 0.03, ggml.Q4_0: 0.5, ggml.Q4_K: 0.35, ggml.Q5_K: 0.2,
              ggml.Q6_K: 0.1, ggml.F16: 0.002, ggml.MXFP4: 1.0}
ALPHA, LIMIT = 1.702, 7.0  # gpt-oss's SwiGLU constants, as llama.cpp passes them


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


# -- the types and ops gpt-oss's graph needs -------------------------------------------

def _tensor(ctx: ggml.Context, a: np.ndarray) -> int:
    """`a` (numpy shape, outermost first) as a ggml tensor over its memory."""
    gtype = {np.dtype(np.float32): ggml.F32, np.dtype(np.int32): ggml.I32}[a.dtype]
    return ctx.tensor(gtype, a.shape[::-1], a.ctypes.data)


def _compute(ctx: ggml.Context, *outputs: int) -> None:
    ctx.graph(list(outputs), ggml.Threads(ggml.lib(), 2)).compute()


def test_mxfp4_is_a_block_type_ggml_knows() -> None:
    assert ggml.type_name(ggml.MXFP4) == "mxfp4"
    assert ggml.block_size(ggml.MXFP4) == 32
    assert ggml.row_bytes(ggml.MXFP4, 256) == 8 * 17  # a scale byte and 16 of codes a block


def test_mxfp4_quantizes_as_ggufs_reference_does() -> None:
    a = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32) * 3
    a[0, :32] = 0.0  # an empty block: scale byte 0, every code 0
    q = ggml.quantize(a, ggml.MXFP4)
    assert np.array_equal(q, gguf_quantize(a, GGMLQuantizationType.MXFP4))


def test_mxfp4_experts_multiply_in_their_own_type() -> None:
    g = ggml.lib()
    rng = np.random.default_rng(4)
    n_exp, ff, d, t = 4, 64, 128, 2
    q = ggml.quantize(rng.standard_normal((n_exp, ff, d)).astype(np.float32), ggml.MXFP4)
    w = dequantize(q, GGMLQuantizationType.MXFP4)  # (n_exp, ff, d), exact in F32
    x = rng.standard_normal((t, d)).astype(np.float32)
    ids = np.array([[3, 1], [0, 3]], np.int32)  # (t, n_used)
    one, y = np.zeros((t, ff), np.float32), np.zeros((t, 2, ff), np.float32)
    ctx = ggml.Context(g, 8, 16)
    stack = ctx.tensor(ggml.MXFP4, (d, ff, n_exp), q.ctypes.data)
    xt = ctx.tensor(ggml.F32, (d, 1, t), x.ctypes.data)
    _compute(ctx, ctx.mul_mat(ctx.tensor(ggml.MXFP4, (d, ff), q[2].ctypes.data),
                              ctx.tensor(ggml.F32, (d, t), x.ctypes.data), one.ctypes.data),
             ctx.mul_mat_id(stack, xt, _tensor(ctx, ids), y.ctypes.data))
    # The input is quantized to Q8_0 per 32 values first (MXFP4's partner type): with it
    # quantized so, the products agree to float rounding.
    xq = dequantize(ggml.quantize(x, ggml.Q8_0), GGMLQuantizationType.Q8_0)
    ref = np.einsum("tjfd,td->tjf", w[ids].astype(np.float64), xq)
    assert np.abs(y - ref).max() < 1e-5 * np.abs(ref).max()
    assert np.abs(one - xq.astype(np.float64) @ w[2].T).max() < 1e-5 * np.abs(ref).max()


def test_mxfp4_repacked_gives_the_plain_product_to_rounding() -> None:
    g = ggml.lib()
    rng = np.random.default_rng(10)
    q = ggml.quantize(rng.standard_normal((64, 128)).astype(np.float32), ggml.MXFP4)
    x = rng.standard_normal(128).astype(np.float32)
    laid = np.zeros_like(q)
    ctx = ggml.Context(g, 6, 16)
    repacked = ctx.tensor(ggml.MXFP4, (128, 64), laid.ctypes.data)
    repacker = ggml.Repacker(g)
    if not repacker.attach(repacked):
        pytest.skip(f"this CPU ({g.cpu_features()}) has no repacked MXFP4 layout")
    repacker.write(repacked, q.ctypes.data)
    plain, packed = np.zeros(64, np.float32), np.zeros(64, np.float32)
    xt = ctx.tensor(ggml.F32, (128, 1), x.ctypes.data)
    _compute(ctx, ctx.mul_mat(ctx.tensor(ggml.MXFP4, (128, 64), q.ctypes.data), xt,
                              plain.ctypes.data), ctx.mul_mat(repacked, xt, packed.ctypes.data))
    assert not np.array_equal(laid, q)  # re-laid, and the same product
    assert np.abs(packed - plain).max() < 1e-5 * np.abs(plain).max()


def test_add_broadcasts_a_bias_and_add_id_adds_each_experts_row() -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 2, 8)).astype(np.float32)  # (t, n_used, n)
    bias = rng.standard_normal(8).astype(np.float32)
    stack = rng.standard_normal((5, 8)).astype(np.float32)  # (experts, n)
    ids = np.array([[4, 0], [2, 2], [1, 3]], np.int32)  # (t, n_used)
    ctx = ggml.Context(ggml.lib(), 12, 16, 4096)
    at = _tensor(ctx, a)
    added, by_id = ctx.add(at, _tensor(ctx, bias)), ctx.add_id(at, _tensor(ctx, stack),
                                                               _tensor(ctx, ids))
    _compute(ctx, added, by_id)
    # one rounding each: numpy's sums are the same numbers
    assert np.array_equal(ctx.array(added, a.shape, np.float32), a + bias)
    assert np.array_equal(ctx.array(by_id, a.shape, np.float32), a + stack[ids])
    with pytest.raises(ggml.EngineError, match="does not repeat"):
        ctx.add(at, _tensor(ctx, bias[:5].copy()))
    with pytest.raises(ggml.EngineError, match="add_id"):
        ctx.add_id(at, _tensor(ctx, stack), _tensor(ctx, ids[:2].copy()))


def test_swiglu_oai_clamps_and_gates_as_gpt_oss_does() -> None:
    rng = np.random.default_rng(6)
    gate = (rng.standard_normal((2, 3, 64)) * 5).astype(np.float32)  # many past +-7
    up = (rng.standard_normal((2, 3, 64)) * 5).astype(np.float32)
    gate[0, 0, :3] = (100.0, -100.0, 0.0)
    ctx = ggml.Context(ggml.lib(), 8, 8, 4096)
    act = ctx.swiglu_oai(_tensor(ctx, gate), _tensor(ctx, up), ALPHA, LIMIT)
    _compute(ctx, act)
    x = np.minimum(gate, LIMIT).astype(np.float64)  # the gate clamped above only
    y = np.clip(up, -LIMIT, LIMIT).astype(np.float64)
    ref = x / (1 + np.exp(-ALPHA * x)) * (y + 1)
    np.testing.assert_allclose(ctx.array(act, gate.shape, np.float32), ref, rtol=1e-6,
                               atol=1e-6)
    with pytest.raises(ggml.EngineError, match="one shape"):
        ctx.swiglu_oai(_tensor(ctx, gate), _tensor(ctx, up[:1].copy()), ALPHA, LIMIT)


def test_soft_max_with_sinks_gives_the_sink_mass_without_a_value() -> None:
    rng = np.random.default_rng(7)
    heads, t, n_kv, scale = 4, 3, 256, 0.125
    kq = (rng.standard_normal((heads, t, n_kv)) * 8).astype(np.float32)  # ggml (n_kv, t, h)
    mask = np.zeros((t, n_kv), np.float32)
    for i in range(t):
        mask[i, 10 + i:] = -np.inf  # query i sees cells 0 .. 9 + i
    sinks = np.array([-1.0, 0.0, 3.0, 30.0], np.float32)  # the last takes nearly all
    ctx = ggml.Context(ggml.lib(), 16, 16, 1 << 16)
    probs = ctx.soft_max_ext(_tensor(ctx, kq), _tensor(ctx, mask), scale)
    ctx.soft_max_add_sinks(probs, _tensor(ctx, sinks))
    _compute(ctx, probs)
    w = kq.astype(np.float64) * scale + mask  # (h, t, n_kv)
    top = np.maximum(w.max(-1), sinks[:, None])[..., None]  # the sink unscaled in the max
    e = np.exp(w - top)
    ref = e / (e.sum(-1, keepdims=True) + np.exp(sinks[:, None, None] - top))
    p = ctx.array(probs, kq.shape, np.float32)
    assert np.abs(p - ref).max() < 1e-6
    assert p[3].sum(-1).max() < 1e-6 < p[0].sum(-1).min() < 1.0
    with pytest.raises(ggml.EngineError, match="without sinks"):
        ctx.soft_max_add_sinks(probs, _tensor(ctx, sinks))
    with pytest.raises(ggml.EngineError, match="heads"):
        again = ctx.soft_max_ext(_tensor(ctx, kq), _tensor(ctx, mask), scale)
        ctx.soft_max_add_sinks(again, _tensor(ctx, sinks[:2].copy()))
    with pytest.raises(ggml.EngineError, match="mask"):
        ctx.soft_max_ext(_tensor(ctx, kq), _tensor(ctx, mask[:, :10].copy()), scale)


def test_top_k_get_rows_and_soft_max_weigh_the_chosen_experts() -> None:
    # gpt-oss's router: the k largest logits, their values gathered, a softmax over them
    rng = np.random.default_rng(8)
    t, n_exp, k = 3, 16, 4
    logits = rng.standard_normal((t, n_exp)).astype(np.float32)
    order = np.zeros((t, n_exp), np.int32)
    ctx = ggml.Context(ggml.lib(), 12, 16, 4096)
    lt = _tensor(ctx, logits)
    chosen = ctx.top_k(lt, k, order.ctypes.data)  # (k, t), a view
    picked = ctx.get_rows(ctx.op("reshape_3d", lt, 1, n_exp, t), chosen)  # (1, k, t)
    weights = ctx.soft_max_ext(ctx.op("reshape_2d", picked, k, t), None, 1.0)  # (k, t)
    _compute(ctx, weights)
    ref = np.argsort(-logits, axis=1, kind="stable")
    assert np.array_equal(order, ref)
    top = np.take_along_axis(logits, ref[:, :k], axis=1)
    assert np.array_equal(ctx.array(picked, (t, k), np.float32), top)
    e = np.exp(top.astype(np.float64) - top.max(1, keepdims=True))
    assert np.abs(ctx.array(weights, (t, k), np.float32) - e / e.sum(1, keepdims=True)).max() < 1e-6
    with pytest.raises(ggml.EngineError, match="top_k"):
        ctx.top_k(lt, n_exp + 1)


def test_get_rows_reads_a_quantized_table_as_gguf_dequantizes_it() -> None:
    table = ggml.quantize(np.random.default_rng(9).standard_normal((10, 64)).astype(
        np.float32), ggml.MXFP4)
    ids = np.array([7, 0, 7, 3], np.int32)
    ctx = ggml.Context(ggml.lib(), 8, 8, 4096)
    rows = ctx.get_rows(ctx.tensor(ggml.MXFP4, (64, 10), table.ctypes.data), _tensor(ctx, ids))
    _compute(ctx, rows)
    ref = dequantize(table, GGMLQuantizationType.MXFP4)[ids]  # MXFP4 values are exact F32
    assert np.array_equal(ctx.array(rows, (4, 64), np.float32), ref)
    with pytest.raises(ggml.EngineError, match="get_rows"):
        ctx.get_rows(_tensor(ctx, np.zeros((2, 10, 64), np.float32)), _tensor(ctx, ids))


def test_views_reshapes_and_cont_2d_lay_out_as_numpy() -> None:
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)  # ggml (5, 4, 3)
    ctx = ggml.Context(ggml.lib(), 12, 16, 4096)
    at, op = _tensor(ctx, a), ctx.op
    heads = op("cont_2d", op("permute", at, 0, 2, 1, 3), 15, 4)  # (5, 3, 4) → (15, 4)
    flat = op("reshape_1d", at, 60)
    tail = op("view_1d", flat, 7, 4 * 50)  # values 50 .. 56
    four = op("reshape_4d", at, 5, 2, 2, 3)
    _compute(ctx, heads, op("cont", tail), op("cont", four))
    assert np.array_equal(ctx.array(heads, (4, 15), np.float32),
                          a.transpose(1, 0, 2).reshape(4, 15))
    assert np.array_equal(ctx.array(tail, (7,), np.float32), np.arange(50, 57))
    assert tuple(ggml.TensorStruct.from_address(four).ne) == (5, 2, 2, 3)


# -- YaRN RoPE, against ggml's formula (ops.cpp's rope cache, ggml.c's correction dims) --

def _libm(name: str, n_args: int) -> Callable[..., float]:
    """libm's float function `name` (what ggml calls), not numpy's own."""
    fn = getattr(ctypes.CDLL(ctypes.util.find_library("m")), name)
    fn.argtypes, fn.restype = [ctypes.c_float] * n_args, ctypes.c_float
    return fn


POWF, LOGF = _libm("powf", 2), _libm("logf", 1)
F = np.float32


def _yarn_cos_sin(rope: ggml.Rope, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                    tuple[float, float]]:
    """cos and sin (positions, n_dims/2) as ggml's rope cache makes them, in float32 with
    libm's powf and logf (numpy's log differs in the last place), and the ramp's ends."""
    n = rope.n_dims
    theta_scale = F(POWF(rope.freq_base, float(F(-2.0) / F(n))))

    def corr_dim(beta: float) -> F:
        turns = F(rope.n_ctx_orig) / (F(beta) * F(2) * F(np.pi))
        return F(n) * F(LOGF(float(turns))) / (F(2) * F(LOGF(rope.freq_base)))

    low = max(F(0), np.floor(corr_dim(rope.beta_fast)))
    high = min(F(n - 1), np.ceil(corr_dim(rope.beta_slow)))
    mscale = F(rope.attn_factor) * (F(1) + F(0.1) * F(LOGF(float(F(1) / F(rope.freq_scale)))))
    cos, sin = np.zeros((len(positions), n // 2), F), np.zeros((len(positions), n // 2), F)
    for row, p in enumerate(positions):
        theta = F(p)
        for i in range(n // 2):
            ramp = F(1) - min(F(1), max(F(0), (F(i) - low) / max(F(0.001), high - low)))
            mix = ramp * F(rope.ext_factor)
            angle = F(rope.freq_scale) * theta * (F(1) - mix) + theta * mix
            cos[row, i] = F(np.cos(np.float64(angle))) * mscale
            sin[row, i] = F(np.sin(np.float64(angle))) * mscale
            theta = theta * theta_scale
    return cos, sin, (float(low), float(high))


@pytest.mark.parametrize(("n_dims", "head_dim", "ramp"), [(16, 20, (2, 5)), (64, 64, (8, 18))])
def test_rope_ext_with_yarn_matches_ggmls_formula(n_dims: int, head_dim: int,
                                                  ramp: tuple[int, int]) -> None:
    # gpt-oss's scalars (base 150000, factor 32 over 4096 positions); the ramp's ends are
    # the design's for a head of 16 (the tiny preset) and of 64 (the real model)
    rope = ggml.Rope(n_dims, ggml.ROPE_NEOX, 4096, 150000.0, 1 / 32, 1.0, 1.0, 32.0, 1.0)
    positions = np.array([0, 1, 7, 50, 130, 1000, 4000], np.int32)
    x = np.random.default_rng(n_dims).standard_normal(
        (len(positions), 3, head_dim)).astype(np.float32)  # (t, heads, head_dim)
    ctx = ggml.Context(ggml.lib(), 4, 8, 1 << 16)
    out = ctx.rope_ext(_tensor(ctx, x), _tensor(ctx, positions), rope)
    _compute(ctx, out)
    cos, sin, ends = _yarn_cos_sin(rope, positions)
    assert ends == ramp
    assert cos[0, 0].view(np.uint32) == 0x3FAC5C86  # position 0: YaRN's scale, 1 + 0.1 ln 32
    c, s, h = cos[:, None].astype(np.float64), sin[:, None].astype(np.float64), n_dims // 2
    x0, x1 = x[..., :h].astype(np.float64), x[..., h:n_dims].astype(np.float64)
    ref = np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c, x[..., n_dims:]], axis=-1)
    # the rotation's float32 rounding (measured: 3.5e-7 at most, |x| up to 4)
    assert np.abs(ctx.array(out, x.shape, np.float32) - ref).max() < 1e-6


def test_rope_scalars_and_shapes_ggml_would_abort_on_are_refused() -> None:
    with pytest.raises(ggml.EngineError, match="even"):
        ggml.Rope(15, ggml.ROPE_NEOX, 4096, 10000.0)
    with pytest.raises(ggml.EngineError, match="mode"):
        ggml.Rope(16, 8, 4096, 10000.0)
    with pytest.raises(ggml.EngineError, match="positive"):
        ggml.Rope(16, ggml.ROPE_NEOX, 4096, 10000.0, freq_scale=0.0)
    assert ggml.Rope(16, ggml.ROPE_NEOX, 4096, 1e4).args()[4:] == (1.0, 0.0, 1.0, 32.0, 1.0)
    ctx = ggml.Context(ggml.lib(), 8, 8, 4096)
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ggml.EngineError, match="rope_ext"):
        ctx.rope_ext(_tensor(ctx, x), _tensor(ctx, np.zeros(2, np.int32)),
                     ggml.Rope(16, ggml.ROPE_NEOX, 4096, 1e4))
    with pytest.raises(ggml.EngineError, match="rope_ext"):
        ctx.rope_ext(_tensor(ctx, x), _tensor(ctx, np.zeros(3, np.int32)),
                     ggml.Rope(8, ggml.ROPE_NEOX, 4096, 1e4))


def test_an_arena_hands_out_aligned_memory_once_each_until_reset() -> None:
    """`ggml.Arena`: 64-byte aligned pieces one after another, `ArenaFull` past its size,
    all of it again after `reset`; contexts made inside `scratch_from` take their results
    there, and only inside it."""
    arena = ggml.Arena(1 << 16)
    a, b = arena.take(100), arena.take(100)
    assert a.ctypes.data % 64 == 0 and b.ctypes.data - a.ctypes.data == 128
    with pytest.raises(ggml.ArenaFull):
        arena.take(1 << 16)
    arena.reset()
    assert arena.take(100).ctypes.data == a.ctypes.data
    g = ggml.lib()
    x = np.arange(8, dtype=np.float32)
    with ggml.scratch_from(arena):
        inside = ggml.Context(g, 4, 0, 1 << 10)
        t = inside.op("scale", inside.tensor(ggml.F32, (8,), x.ctypes.data), 2.0)
    start = a.ctypes.data
    assert start <= ggml.TensorStruct.from_address(t).data < start + (1 << 16)
    outside = ggml.Context(g, 4, 0, 1 << 10)
    u = outside.op("scale", outside.tensor(ggml.F32, (8,), x.ctypes.data), 2.0)
    assert not start <= ggml.TensorStruct.from_address(u).data < start + (1 << 16)
