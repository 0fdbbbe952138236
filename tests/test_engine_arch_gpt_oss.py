"""gpt-oss (engine/arch/gpt_oss/args.py, gpt_oss.py): the header as llama.cpp reads it —
the sliding-window pattern, the YaRN scalars in llama.cpp's float32 arithmetic, the
sliding cache's size, a required key named when missing — and the numpy model's parts: its
YaRN tables against ggml's rope, the window, the sinks, batched prefill against token by
token; the graph model (gpt_oss_graph.py) against the numpy model, and its sliding layers'
ring of cells and their mask. Decoded text and logits against llama.cpp's are in
tests/test_llamacpp.py (slow)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from arch_helper import Without, check_batched_prefill, check_the_window, numpy_engine

from abbench.engine import synth
from abbench.engine.arch.gpt_oss import args as g
from abbench.engine.arch.gpt_oss import graph as gpt_oss_graph
from abbench.engine.arch.gpt_oss import model as gpt_oss
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import weighted_sum
from abbench.engine.run.session import PREFILL_BATCH, Engine
from abbench.errors import ModelFileError


def header(**keys: Any) -> SimpleNamespace:
    """A stand-in ModelFile: `gpt-oss.KEY` from `keys`, a list (a metadata array) only
    through `array` and a scalar only through `get`, as ModelFile keeps them apart."""
    values = {f"gpt-oss.{k.replace('__', '.')}": v for k, v in keys.items()}
    scalars = {k: v for k, v in values.items() if not isinstance(v, list)}
    arrays = {k: v for k, v in values.items() if isinstance(v, list)}
    return SimpleNamespace(path="m.gguf", get=lambda key, default=None: scalars.get(key, default),
                           array=arrays.get)


def test_the_default_pattern_slides_the_even_layers() -> None:
    assert g._swa_pattern(header(), "gpt-oss.", 5) == (True, False, True, False, True)


def test_a_pattern_of_n_attends_in_full_every_nth_layer_and_0_never() -> None:
    pattern = header(attention__sliding_window_pattern=3)
    assert g._swa_pattern(pattern, "gpt-oss.", 6) == (True, True, False, True, True, False)
    assert g._swa_pattern(header(attention__sliding_window_pattern=0), "gpt-oss.", 3) == \
        (True, True, True)


def test_a_pattern_as_a_bool_per_layer_is_read_as_it_is_and_must_cover_every_layer() -> None:
    flags = header(attention__sliding_window_pattern=[False, True, True])
    assert g._swa_pattern(flags, "gpt-oss.", 3) == (False, True, True)
    with pytest.raises(ModelFileError, match="sliding_window_pattern` has 3 values for 4"):
        g._swa_pattern(flags, "gpt-oss.", 4)


def test_yarn_at_factor_32_cancels_to_exactly_1() -> None:
    """llama.cpp's get_mscale(32) = 1.3465736 and its reciprocal multiply to 1.0f exactly
    (float32, C's logf): gpt-oss's real files pass attn_factor 1 to rope_ext."""
    assert g.yarn_attn_factor(1 / 32, 1.0) == 1.0
    mscale = np.float32(0.1) * g.logf(32.0) + np.float32(1.0)
    assert mscale == np.float32(1.3465736)


def test_no_extension_leaves_the_magnitude_to_the_file() -> None:
    assert g.yarn_attn_factor(1.0, 1.0) == pytest.approx(1 / (1 + 0.1 * np.log(1.0)))
    assert g.yarn_attn_factor(1.0, 0.5) == 0.5


def args(**kw: Any) -> g.ModelArgs:
    base: dict[str, Any] = dict(
        block_count=4, embedding_length=64, head_count=4, head_count_kv=2, key_length=16,
        value_length=16, layer_norm_rms_epsilon=1e-5, rope_freq_base=150000.0,
        rope_freq_base_swa=150000.0, rope_scaling_type="yarn", rope_scaling_factor=32.0,
        rope_scaling_original_context_length=4096, rope_scaling_attn_factor=1.0,
        sliding_window=16, swa_layers=(True, False, True, False), expert_count=8,
        expert_used_count=4, expert_feed_forward_length=32, context_length=512,
        vocab_size=512)
    return g.ModelArgs(**(base | kw))


def test_the_rope_scalars_of_a_yarn_file() -> None:
    r = args().rope(swa=True)
    assert (r.n_dims, r.n_ctx_orig, r.freq_base, r.mode) == (16, 4096, 150000.0, 2)
    assert (r.freq_scale, r.ext_factor, r.attn_factor) == (1 / 32, 1.0, 1.0)
    assert (r.beta_fast, r.beta_slow) == (32.0, 1.0)
    assert args(rope_freq_base_swa=10000.0).rope(swa=True).freq_base == 10000.0
    assert args(rope_freq_base_swa=10000.0).rope(swa=False).freq_base == 150000.0


def test_linear_and_no_scaling_have_no_extrapolation() -> None:
    linear = args(rope_scaling_type="linear", rope_scaling_factor=4.0).rope(swa=False)
    assert (linear.freq_scale, linear.ext_factor, linear.attn_factor) == (0.25, 0.0, 1.0)
    none = args(rope_scaling_type="none", rope_scaling_factor=4.0).rope(swa=False)
    assert (none.freq_scale, none.ext_factor) == (1.0, 0.0)


def test_the_sliding_cache_holds_the_window_and_a_batch_in_blocks_of_256() -> None:
    a = args()
    assert a.swa_cells(512) == 512  # the window and a batch (528) do not fit: the context
    assert a.swa_cells(4096, n_ubatch=512) == 768  # 16 + 512 = 528 -> 768
    assert a.swa_cells(100, n_ubatch=8) == 256


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tiny.gguf"
    synth.write_model(synth.named("gpt-oss-tiny"), path, name="gpt-oss-tiny")
    return path


def test_a_synthetic_file_reads_as_llama_cpp_reads_it(tiny_file: Path) -> None:
    a = g.ModelArgs.from_file(ModelFile(tiny_file))
    assert (a.block_count, a.expert_count, a.expert_used_count, a.sliding_window) == \
        (4, 8, 4, 16)
    assert a.swa_layers == (True, False, True, False)
    assert (a.rope_scaling_type, a.rope_scaling_factor) == ("yarn", 32.0)
    assert a.rope(swa=True).attn_factor == 1.0 and a.rope(swa=False).ext_factor == 1.0


@pytest.mark.parametrize("key", ["attention.sliding_window",
                                 "attention.layer_norm_rms_epsilon",
                                 "expert_feed_forward_length"])
def test_a_key_llama_cpp_requires_is_required_and_named(tiny_file: Path, key: str) -> None:
    with pytest.raises(ModelFileError, match=f"missing metadata key `gpt-oss.{key}`"):
        g.ModelArgs.from_file(Without(ModelFile(tiny_file), f"gpt-oss.{key}"))  # type: ignore[arg-type]


# --- the numpy model (engine/arch/gpt_oss/model.py) -------------------------------------------

def test_the_yarn_tables_are_ggmls_rope_to_float_rounding() -> None:
    """The numpy model's cos/sin (float64, then F32) rotate as ggml's rope_ext does with the
    same scalars (its own cosf/sinf/powf), on the tiny preset's head of 16 and a real one's
    of 64, where the ramp mixes interpolated and extrapolated angles."""
    for n_dims in (16, 64):
        rope = args(key_length=n_dims, value_length=n_dims).rope(swa=False)
        positions = np.array([0, 1, 7, 50, 130, 1000, 4000], np.int32)
        x = np.random.default_rng(n_dims).standard_normal(
            (len(positions), 2, n_dims)).astype(np.float32)  # (t, heads, hd)
        ctx = ggml.Context(ggml.lib(), 4, 8, 1 << 16)
        out = ctx.rope_ext(ctx.tensor(ggml.F32, x.shape[::-1], x.ctypes.data),
                           ctx.tensor(ggml.I32, positions.shape, positions.ctypes.data), rope)
        ctx.graph([out], ggml.Threads(ggml.lib(), 1)).compute()
        cos, sin = gpt_oss.yarn_tables(rope, 4001)
        mine = gpt_oss.rope_rows(x, cos[positions][:, None], sin[positions][:, None])
        assert np.abs(ctx.array(out, x.shape, np.float32) - mine).max() < 2e-6


@pytest.fixture(scope="module")
def tiny_engine(tiny_file: Path) -> Iterator[Engine]:
    with numpy_engine(tiny_file) as engine:
        yield engine


def test_a_sliding_layer_sees_only_its_window(tiny_engine: Engine) -> None:
    """Layer 0 slides (window 16): what is in its cache further back than the window does
    not change its output; layer 1 attends in full, and it does."""
    check_the_window(tiny_engine.model, 1)


def test_a_sink_takes_attention_mass_and_none_gives_plain_softmax(tiny_engine: Engine) -> None:
    att = tiny_engine.model.layers[1].attention
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, tiny_engine.model.args.embedding_length)).astype(np.float32)
    cos, sin = (t[3:4] for t in tiny_engine.model.tables[False])
    sinks = att.sinks.copy()
    try:
        att.sinks[:] = 80.0  # the sink outweighs every score: the heads output ~0
        assert np.abs(att(x, 3, cos, sin) - att.bo).max() < 1e-6
        att.sinks[:] = -1e30  # no sink: softmax over the keys alone
        no_sink = att(x, 3, cos, sin)
        att.sinks[:] = sinks
        assert not np.allclose(att(x, 3, cos, sin), no_sink, atol=1e-6)
    finally:
        att.sinks[:] = sinks


def test_batched_prefill_equals_token_by_token(tiny_file: Path) -> None:
    check_batched_prefill(tiny_file)


# --- the graph model (engine/arch/gpt_oss/graph.py) -------------------------------------
# On MXFP4 experts the graph model is llama.cpp to the bit (tests/test_llamacpp.py) and the
# numpy model is not: ggml quantizes the experts' input to Q8_0 blocks (0.3 % apart). So
# the two are compared on the same files with F32 experts, where both compute in F32.


@pytest.fixture(scope="module")
def f32_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gpt-oss-f32")
    files = {}
    for name in ("gpt-oss-tiny", "gpt-oss-small"):
        files[name] = folder / f"{name}-f32.gguf"
        synth.write_model(replace(synth.named(name), expert_type="F32"), files[name])
    return files


def _logits(path: Path, kernels: str, prompt: list[int], n: int,
            flash_attn: bool = False) -> np.ndarray:
    """The prompt (but its last token) prefilled in the engine's batches, then `n` greedy
    decode steps → their logits (n, vocab). Also tests/test_engine_arch_shared_graph.py's."""
    cfg = EngineConfig(model=str(path), prompt_tokens=tuple(prompt), n_tokens=n, temp=0.0,
                       ignore_eos=True, threads=1, resident=True, kernels=kernels,
                       repack=False, flash_attn=flash_attn)
    with Engine(cfg, path) as engine:
        assert (type(engine.model).__module__ == "abbench.engine.arch.gpt_oss.graph") == (
            kernels == "ggml")
        for start in range(0, len(prompt) - 1, PREFILL_BATCH):
            engine.model.prefill(prompt[start: min(start + PREFILL_BATCH, len(prompt) - 1)],
                                 start)
        out, token = [], prompt[-1]
        for i in range(n):
            out.append(engine.model.forward(token, len(prompt) - 1 + i, 1))
            token = int(np.argmax(out[-1]))
    return np.array(out)


@pytest.mark.parametrize("name,n_prompt", [("gpt-oss-tiny", 60), ("gpt-oss-small", 900)])
def test_the_graph_model_computes_what_the_numpy_model_computes(
        f32_files: dict[str, Path], name: str, n_prompt: int) -> None:
    """Past the sliding window (16, 32); on small past the end of the sliding layers' ring
    (768 cells: its second prefill batch wraps, and decode writes cell p mod 768)."""
    path = f32_files[name]
    vocab = ModelFile(path).tensor("token_embd.weight").shape[0]
    prompt = [int(t) for t in np.random.default_rng(3).integers(10, vocab, n_prompt)]
    graph, reference = _logits(path, "ggml", prompt, 8), _logits(path, "numpy", prompt, 8)
    assert np.abs(graph - reference).max() <= 1e-5 * np.abs(reference).max()


@contextmanager
def small_graph(f32_files: dict[str, Path]) -> Iterator[gpt_oss_graph.GraphModel]:
    """gpt-oss-small's graph model with a context of 1000 tokens and more."""
    path = f32_files["gpt-oss-small"]
    cfg = EngineConfig(model=str(path), prompt_tokens=(1,) * 1000, n_tokens=2, threads=1,
                       kernels="ggml", ignore_eos=True)
    with Engine(cfg, path) as engine:
        assert isinstance(engine.model, gpt_oss_graph.GraphModel)
        yield engine.model


def test_the_ring_holds_position_p_in_cell_p_mod_its_size_and_masks_beyond_the_window(
        f32_files: dict[str, Path]) -> None:
    with small_graph(f32_files) as model:
        size, window = model.sliding.swa_size, model.args.sliding_window
        assert (size, window, model.kv_size) == (768, 32, 1024)
        assert [c.cells for c in model.caches[:2]] == [768, 1024]  # layer 0 slides
        model._begin([1] * 3, 0)  # three tokens at 0..2: cells 0..2, the rest empty
        assert list(model.sliding.swa_pos[:4]) == [0, 1, 2, -1]
        swa = model.sliding.mask(True, 3, 256)
        assert (swa == model.sliding.mask(False, 3, 256)).all()  # within the window: causal
        assert (swa[2, :3] == 0).all() and np.isneginf(swa[0, 1:]).all()
        model._begin([1] * 512, 3)  # as the engine's batches: 512 at most
        model._begin([1] * 285, 515)
        model._begin([1] * 2, 800)  # positions 800, 801 land in cells 32, 33
        assert list(model.sliding.swa_pos[32:34]) == [800, 801]
        mask = model.sliding.mask(True, 2, size)  # a wrapped ring attends over all its cells
        seen = [np.flatnonzero(row == 0) for row in mask]  # cells each query sees
        assert list(model.sliding.swa_pos[seen[1]]) == list(range(801 - window + 1, 802))
        assert list(model.sliding.swa_pos[seen[0]]) == list(range(800 - window + 1, 801))


def test_decode_steps_move_the_masks_as_filling_them_anew_would(
        f32_files: dict[str, Path]) -> None:
    with small_graph(f32_files) as model:
        for pos in range(900):
            _, n_kv = model._begin([1], pos)
            if pos in (0, 31, 32, 255, 256, 700, 767, 768, 800, 899):
                stepped = [model.sliding.mask(swa, 1, n_kv[swa]).copy() for swa in (False, True)]
                model.sliding._fill_masks(np.array([pos], np.int32), n_kv)
                assert all((model.sliding.mask(swa, 1, n_kv[swa]) == m).all()
                           for swa, m in zip((False, True), stepped))


def test_a_decode_graph_finishes_the_layer_before_as_numpy_would_to_the_bit(
        tiny_file: Path) -> None:
    """The next layer's graph sums the experts' outputs times their weights in routing
    order, plus the layer's ffn_inp (`qcompute.weighted_sum`'s arithmetic); a dropped
    expert's row is zeros and changes no bit."""
    cfg = EngineConfig(model=str(tiny_file), prompt="Hello", n_tokens=4, threads=1,
                       kernels="ggml", ignore_eos=True)
    with Engine(cfg, tiny_file) as engine:
        model = engine.model
        assert isinstance(model, gpt_oss_graph.GraphModel)
        rng = np.random.default_rng(5)
        d = model.args.embedding_length
        residual = rng.standard_normal((1, d)).astype(np.float32)
        graph = gpt_oss_graph.LayerGraph(model, 1, 1, 256, 3, residual)
        for kept in (model.k, model.k - 1):
            y = rng.standard_normal((kept, d)).astype(np.float32) * 3  # (k', d)
            w = rng.random(kept).astype(np.float32)  # (k',)
            model.moe_y[...], model.moe_w[...] = 0.0, 0.0
            model.moe_y[:kept], model.moe_w[:kept] = y, w
            graph.graph.compute()
            assert np.array_equal(graph.h[0], weighted_sum(w, y) + residual[0])
