"""A synthetic model's tensors: each kind's generator (vocabulary matrices, router,
attention, experts), the storage type llama-quantize would give each, and their writing
into the file one tensor at a time. The layers here are qwen3moe's; another
architecture's (`gpt_oss.py`) come from its own `LayerTensors`, built from the same
generators.

The generators draw one `rng` in file order, so a spec and seed give the same bytes: the
routing knobs they implement are explained in `synth.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import gguf
import numpy as np

from abbench.engine.synth.spec import MIXES, SynthSpec

Make = Callable[[], np.ndarray]
Planned = tuple[str, tuple[int, ...], str, Make]  # (name, F32 shape, storage type, make)
# An architecture's tensors of one layer, in file order: (spec, rng, layer, router) ->
# its Planned tensors; `router` is the layer's router matrix (the routing knobs).
LayerTensors = Callable[[SynthSpec, np.random.Generator, int, Make], Iterator[Planned]]

RHO = 0.25  # share of an embedding's energy along the common direction

# What llama-quantize writes instead of a K type whose 256-value blocks do not divide a
# tensor's rows (small synthetic shapes have such rows).
K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama-quantize's choice of the layers whose attn_v and ffn_down get more bits."""
    return (layer < n_layer // 8 or layer >= 7 * n_layer // 8
            or (layer - n_layer // 8) % 3 == 2)


def tensor_type(spec: SynthSpec, name: str, declared: str, cols: int) -> str:
    """The storage type of tensor `name` (rows of `cols` values): `declared` (F32 for norms
    and routers, else the spec's dense or expert type) unless that names a mix, which
    decides per tensor; a K type that does not divide the rows falls back as
    llama-quantize's does."""
    chosen = declared
    if declared in MIXES:
        base, more = MIXES[declared]
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        more_bits = name == "output.weight" or (
            (name.endswith("attn_v.weight") or "ffn_down" in name)
            and use_more_bits(layer, spec.n_layer))
        chosen = more if more_bits else base
    if chosen in K_FALLBACK and cols % 256:
        return K_FALLBACK[chosen]
    return chosen


def layer_update_scale(spec: SynthSpec, layer: int) -> float:
    """Residual update size at `layer`, decaying from update_early to update_late."""
    w = np.exp(-layer / max(spec.update_decay_layers, 1e-9))
    return float(spec.update_late + (spec.update_early - spec.update_late) * w)


# -- writing ------------------------------------------------------------------------------


def add_tensors(w: gguf.GGUFWriter, spec: SynthSpec, n_vocab: int,
                layer_tensors: LayerTensors) -> None:
    """Every tensor's info first (the header needs them), then each tensor generated,
    converted and written in the file's order: one tensor in memory at a time."""
    rng = np.random.default_rng(spec.seed)
    plan = [(n, sh, tensor_type(spec, n, t, sh[-1]), make)
            for n, sh, t, make in tensors(spec, rng, n_vocab, layer_tensors)]
    for name, shape, type_name, _ in plan:
        _add_info(w, name, shape, type_name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, type_name, make in plan:
        a = make()
        if a.shape != shape:
            raise AssertionError(f"{name}: generated {a.shape}, planned {shape}")
        w.write_tensor_data(_quantize(a, type_name)[0])
        del a


def _add_info(w: gguf.GGUFWriter, name: str, shape: tuple[int, ...], type_name: str) -> None:
    """Tensor `name`'s entry in the header: its shape and bytes as stored in `type_name`."""
    qtype = gguf.GGMLQuantizationType[type_name]
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * math.prod(shape))
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor_info(name, shape, np.dtype(np.float16), 2 * math.prod(shape))
    else:
        byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), math.prod(byte_shape),
                          raw_dtype=qtype)


def _quantize(a: np.ndarray, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    qtype = gguf.GGMLQuantizationType[type_name]
    if qtype == gguf.GGMLQuantizationType.F32:
        return a.astype(np.float32, copy=False), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return a.astype(np.float16), None
    if qtype == gguf.GGMLQuantizationType.BF16:
        return gguf.quants.quantize(a.astype(np.float32), qtype), qtype
    from abbench.engine.kernels import ggml  # ggml's own quantizer, as llama-quantize runs it

    return ggml.quantize(a, int(qtype)), qtype


# -- the tensors, in file order -----------------------------------------------------------


def tensors(spec: SynthSpec, rng: np.random.Generator, n_vocab: int,
            layer_tensors: LayerTensors) -> Iterator[Planned]:
    """(name, F32 shape, storage type, make) for every tensor in file order. `make()`
    generates the tensor in F32; calling them in order draws `rng` in a fixed order, so a
    spec and seed give the same bytes."""
    # The shared direction every token's residual stream carries (popularity skew): the
    # one draw made while planning, before any `make()`.
    common = rng.standard_normal(spec.d_model).astype(np.float32)  # (d,)
    common /= np.linalg.norm(common)
    yield from _vocab_tensors(spec, rng, n_vocab, common)
    router = router_of(spec, rng, common)
    for i in range(spec.n_layer):
        yield from layer_tensors(spec, rng, i, router)


def _vocab_tensors(spec: SynthSpec, rng: np.random.Generator, n_vocab: int,
                   common: np.ndarray) -> Iterator[Planned]:
    """The token embedding (every row carrying `common`), the output norm and matrix."""
    d, dense = spec.d_model, spec.dense_type

    def embedding() -> np.ndarray:
        embd = rng.standard_normal((n_vocab, d)).astype(np.float32) * np.sqrt(1 - RHO)
        return embd + common * np.sqrt(RHO * d)  # (vocab, d), rows of norm ~ sqrt(d)

    yield "token_embd.weight", (n_vocab, d), dense, embedding
    yield "output_norm.weight", (d,), "F32", ones(d)
    yield "output.weight", (n_vocab, d), dense, lambda: (
        rng.standard_normal((n_vocab, d)).astype(np.float32) / np.sqrt(d) * 2.0)


def router_of(spec: SynthSpec, rng: np.random.Generator, common: np.ndarray) -> Make:
    """Each layer's router: random rows plus a component along `common` that biases each
    expert's logit by a Zipf-like ladder over a fresh permutation of the experts."""
    d = spec.d_model
    ranks = np.arange(1, spec.n_expert + 1, dtype=np.float64)
    ladder = -np.log(ranks)  # Zipf-like: logit bias ~ -log(rank)
    ladder = (ladder - ladder.mean()) * spec.popularity_skew

    def router() -> np.ndarray:
        w = rng.standard_normal((spec.n_expert, d)).astype(np.float32)
        w *= spec.router_scale / np.sqrt(d)
        bias = ladder[rng.permutation(spec.n_expert)]  # (n_expert,) logit bias per expert
        # x·common ≈ sqrt(rho*d) after RMSNorm, so this adds ~`bias` to each logit.
        w += (bias[:, None] / np.sqrt(RHO * d)).astype(np.float32) * common[None, :]
        return w

    return router


def attention_tensors(spec: SynthSpec, rng: np.random.Generator, b: str, upd: float,
                      gated: bool = False) -> Iterator[Planned]:
    """q, k, v and output projections, no biases, the output sized to `upd`; `gated`: the
    q projection makes each head's output gate too (its hd query rows, then hd rows of
    gate: qwen35moe's full attention)."""
    d, dense = spec.d_model, spec.dense_type
    q_rows, kv_rows = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    q_out = 2 * q_rows if gated else q_rows
    yield b + "attn_q.weight", (q_out, d), dense, projection(rng, q_out, d, over=np.sqrt(d))
    yield b + "attn_k.weight", (kv_rows, d), dense, projection(rng, kv_rows, d,
                                                              over=np.sqrt(d))
    yield b + "attn_v.weight", (kv_rows, d), dense, projection(rng, kv_rows, d,
                                                              over=np.sqrt(d))
    # Attention outputs have unit-scale components, as does the residual stream: size
    # the projection so the update is `upd` of the stream.
    yield b + "attn_output.weight", (d, q_rows), dense, projection(
        rng, d, q_rows, upd / np.sqrt(q_rows))


def swiglu_experts(spec: SynthSpec, rng: np.random.Generator, b: str,
                   upd: float) -> Iterator[Planned]:
    """Stacked SwiGLU experts (gate, up, down), the down projection sized to `upd`."""
    d, ff, e, experts = spec.d_model, spec.expert_ff, spec.n_expert, spec.expert_type
    yield b + "ffn_gate_exps.weight", (e, ff, d), experts, experts_of(
        rng, e, ff, d, 1.0 / np.sqrt(d))
    yield b + "ffn_up_exps.weight", (e, ff, d), experts, experts_of(
        rng, e, ff, d, 1.0 / np.sqrt(d))
    # silu(g)*u has rms ~0.6 for unit-variance g and u; scale the update to `upd`.
    yield b + "ffn_down_exps.weight", (e, d, ff), experts, experts_of(
        rng, e, d, ff, upd / (0.6 * np.sqrt(ff)))


def projection(rng: np.random.Generator, rows: int, cols: int, scale: float = 1.0,
                over: float = 1.0) -> Make:
    """(rows, cols) unit normals * scale / over."""
    return lambda: rng.standard_normal((rows, cols)).astype(np.float32) * scale / over


def experts_of(rng: np.random.Generator, n_expert: int, rows: int, cols: int,
                scale: float) -> Make:
    """(n_expert, rows, cols) unit normals * scale, drawn in F32."""
    def make() -> np.ndarray:
        a = rng.standard_normal((n_expert, rows, cols), dtype=np.float32)
        a *= scale
        return a
    return make


def ones(n: int) -> Make:
    return lambda: np.ones(n, np.float32)


def size_keys(w: gguf.GGUFWriter, spec: SynthSpec, dense_ff: int) -> None:
    """The sizes, in the order every architecture here writes them: layers, context,
    width, the dense FFN's width (`dense_ff`) and the experts', heads and KV heads."""
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.d_model)
    w.add_feed_forward_length(dense_ff)
    w.add_expert_feed_forward_length(spec.expert_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)


def transformer_keys(w: gguf.GGUFWriter, spec: SynthSpec, rope_freq_base: float,
                     rms_eps: float) -> None:
    """The hyperparameters every architecture here writes, in the order qwen3moe's files
    have always had them (its bytes are pinned): sizes, heads, RoPE base, RMS epsilon."""
    hd = spec.head_dim
    size_keys(w, spec, spec.expert_ff)
    # always written: head_dim * n_head need not be d (gpt-oss-20b: 64 x 64 with d = 2880)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(rope_freq_base)
    w.add_layer_norm_rms_eps(rms_eps)


def moe_keys(w: gguf.GGUFWriter, spec: SynthSpec, rope_freq_base: float,
             rms_eps: float) -> None:
    """`transformer_keys`, then the experts' count and top-k."""
    transformer_keys(w, spec, rope_freq_base, rms_eps)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)


def plain_layer(spec: SynthSpec, rng: np.random.Generator, layer: int, router: Make,
                q_norm: tuple[int, Make], k_norm: tuple[int, Make]) -> Iterator[Planned]:
    """A layer of the plain skeleton (qwen3moe's) in file order: its norms, the q and k
    norms given (their sizes and values), the attention, the router, SwiGLU experts."""
    b = f"blk.{layer}."
    d = spec.d_model
    upd = layer_update_scale(spec, layer)
    yield b + "attn_norm.weight", (d,), "F32", ones(d)
    yield b + "ffn_norm.weight", (d,), "F32", ones(d)
    yield b + "attn_q_norm.weight", (q_norm[0],), "F32", q_norm[1]
    yield b + "attn_k_norm.weight", (k_norm[0],), "F32", k_norm[1]
    yield from attention_tensors(spec, rng, b, upd)
    yield b + "ffn_gate_inp.weight", (spec.n_expert, d), "F32", router
    yield from swiglu_experts(spec, rng, b, upd)
