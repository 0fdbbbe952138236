"""The engine's qwen3moe forward pass against an independent numpy implementation.

The reference below reads the GGUF file with `gguf.GGUFReader` (not abbench's ModelFile),
works in float64, runs the whole sequence at once with a causal mask (not a KV cache), and
computes every expert from the file's 3-D expert tensors (no streaming, no cache). It is
written from the architecture's definition:

    h = embed(token)
    per layer:
        x = RMSNorm(h) → q, k, v projections → RMSNorm per head on q and k
        → NeoX RoPE (dimension i pairs with i + hd/2, theta_i = base^(-2i/hd))
        → causal GQA attention (query head j uses kv head j // (n_head / n_kv)), scale 1/sqrt(hd)
        → output projection; h += that
        x = RMSNorm(h) → router softmax → top-k → renormalise
        → sum_e w_e * down_e(silu(gate_e x) * up_e x); h += that
    logits = output(RMSNorm(h))

The synthetic models have all-ones norm weights, which would hide a norm applied to the
wrong tensor, so the comparison also runs on a copy of `tiny` whose norm weights are
random (each different) and whose RoPE base is changed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine
from abbench.engine.synth import preset, write_model
from abbench.engine.text.tokenizer import end_of_generation

ARCH = "qwen3moe"
N_POSITIONS = 20


@dataclass(frozen=True)
class Reference:
    n_layer: int
    d: int
    n_head: int
    n_kv: int
    hd: int
    k: int
    eps: float
    rope_base: float
    w: dict[str, np.ndarray]  # tensor name → float64 array in numpy order (outermost first)


def load(path: Path) -> Reference:
    reader = GGUFReader(path)

    def meta(key: str) -> float:
        return reader.fields[f"{ARCH}.{key}"].contents()  # type: ignore[no-any-return]

    assert reader.fields["general.architecture"].contents() == ARCH
    w = {}
    for t in reader.tensors:
        # GGUF lists dims innermost first (ggml `ne`); the reader's arrays are numpy order.
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = np.asarray(t.data)
        else:
            data = dequantize(t.data, t.tensor_type)
        assert data.shape == shape, f"{t.name}: {data.shape} vs ggml dims reversed {shape}"
        w[t.name] = data.astype(np.float64)
    ref = Reference(
        n_layer=int(meta("block_count")),
        d=int(meta("embedding_length")),
        n_head=int(meta("attention.head_count")),
        n_kv=int(meta("attention.head_count_kv")),
        hd=int(meta("attention.key_length")),
        k=int(meta("expert_used_count")),
        eps=float(meta("attention.layer_norm_rms_epsilon")),
        rope_base=float(meta("rope.freq_base")),
        w=w,
    )
    n_expert, ff = int(meta("expert_count")), int(meta("expert_feed_forward_length"))
    vocab, q_rows, kv_rows = w["token_embd.weight"].shape[0], ref.n_head * ref.hd, ref.n_kv * ref.hd
    expected = {
        "token_embd.weight": (vocab, ref.d),
        "output.weight": (vocab, ref.d),
        "blk.0.attn_q.weight": (q_rows, ref.d),
        "blk.0.attn_k.weight": (kv_rows, ref.d),
        "blk.0.attn_v.weight": (kv_rows, ref.d),
        "blk.0.attn_output.weight": (ref.d, q_rows),
        "blk.0.attn_q_norm.weight": (ref.hd,),
        "blk.0.ffn_gate_inp.weight": (n_expert, ref.d),
        "blk.0.ffn_gate_exps.weight": (n_expert, ff, ref.d),
        "blk.0.ffn_up_exps.weight": (n_expert, ff, ref.d),
        "blk.0.ffn_down_exps.weight": (n_expert, ref.d, ff),
    }
    for name, shape in expected.items():
        assert w[name].shape == shape, f"{name}: {w[name].shape}, expected {shape}"
    return ref


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Normalise over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_neox(x: np.ndarray, base: float) -> np.ndarray:
    """x: (T, heads, hd), position t at row t."""
    t_len, _, hd = x.shape
    half = hd // 2
    theta = base ** (-2.0 * np.arange(half) / hd)  # (half,)
    angle = np.arange(t_len)[:, None] * theta[None, :]  # (T, half)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # (T, 1, half)
    lo, hi = x[..., :half], x[..., half:]
    return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class Forward:
    logits: np.ndarray  # (T, vocab)
    experts: np.ndarray  # (T, n_layer, k) routed expert ids, highest weight first
    weights: np.ndarray  # (T, n_layer, k) renormalised routing weights
    margins: np.ndarray  # (T, n_layer) router probability gap between k-th and (k+1)-th


def forward(ref: Reference, tokens: list[int]) -> Forward:
    """The whole sequence at once; row t of the logits predicts token t + 1."""
    w, t_len = ref.w, len(tokens)
    h = w["token_embd.weight"][tokens]  # (T, d)
    group = ref.n_head // ref.n_kv
    kv_of_head = np.arange(ref.n_head) // group  # (n_head,)
    causal = np.tril(np.ones((t_len, t_len), dtype=bool))  # (T query, T key)
    experts = np.zeros((t_len, ref.n_layer, ref.k), np.int64)
    weights = np.zeros((t_len, ref.n_layer, ref.k))
    margins = np.zeros((t_len, ref.n_layer))
    for layer in range(ref.n_layer):
        b = f"blk.{layer}."
        x = rms_norm(h, w[b + "attn_norm.weight"], ref.eps)  # (T, d)
        q = (x @ w[b + "attn_q.weight"].T).reshape(t_len, ref.n_head, ref.hd)
        k = (x @ w[b + "attn_k.weight"].T).reshape(t_len, ref.n_kv, ref.hd)
        v = (x @ w[b + "attn_v.weight"].T).reshape(t_len, ref.n_kv, ref.hd)
        q = rope_neox(rms_norm(q, w[b + "attn_q_norm.weight"], ref.eps), ref.rope_base)
        k = rope_neox(rms_norm(k, w[b + "attn_k_norm.weight"], ref.eps), ref.rope_base)
        k, v = k[:, kv_of_head], v[:, kv_of_head]  # (T, n_head, hd): each query head's kv
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(ref.hd)  # (n_head, T, T)
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(t_len, ref.n_head * ref.hd)
        h = h + attn @ w[b + "attn_output.weight"].T

        x = rms_norm(h, w[b + "ffn_norm.weight"], ref.eps)  # (T, d)
        logits = x @ w[b + "ffn_gate_inp.weight"].T  # (T, n_expert)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        gate, up = w[b + "ffn_gate_exps.weight"], w[b + "ffn_up_exps.weight"]
        down = w[b + "ffn_down_exps.weight"]
        moe = np.zeros_like(h)
        for t in range(t_len):
            order = np.argsort(-p[t])
            top = order[: ref.k]
            margins[t, layer] = p[t, order[ref.k - 1]] - p[t, order[ref.k]]
            wt = p[t, top] / p[t, top].sum()
            experts[t, layer], weights[t, layer] = top, wt
            for e, we in zip(top, wt):
                moe[t] += we * (down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])))
        h = h + moe
    out = rms_norm(h, w["output_norm.weight"], ref.eps) @ w["output.weight"].T  # (T, vocab)
    return Forward(out, experts, weights, margins)


# -- models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def perturbed_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny` with random, distinct norm weights and RoPE base 500 (edited in place)."""
    path = tmp_path_factory.mktemp("perturbed") / "tiny-perturbed.gguf"
    shutil.copyfile(tiny_model, path)
    reader = GGUFReader(path, "r+")
    rng = np.random.default_rng(1)
    norms = [t for t in reader.tensors if t.name.endswith("norm.weight")]
    assert len(norms) == 4 * int(reader.fields[f"{ARCH}.block_count"].contents()) + 1
    for t in norms:
        assert t.tensor_type == GGMLQuantizationType.F32
        t.data[...] = rng.uniform(0.5, 1.5, t.data.shape).astype(np.float32)
    base = reader.fields[f"{ARCH}.rope.freq_base"]
    base.parts[base.data[0]][...] = 500.0
    reader.data.flush()
    del reader
    check = GGUFReader(path)
    assert check.fields[f"{ARCH}.rope.freq_base"].contents() == 500.0
    return path


@pytest.fixture(scope="module")
def wide_heads_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny` with heads of 32 dimensions: n_head * head_dim (128) is not d_model (64), as
    in real Qwen3-MoE files, so attention's output and the norms' outputs are vectors of
    different lengths in the team's input block (`Model.vector`)."""
    path = tmp_path_factory.mktemp("wide") / "tiny-wide-heads.gguf"
    write_model(replace(preset("tiny"), head_dim=32), path)
    return path


@pytest.fixture(params=["tiny", "tiny-perturbed", "tiny-wide-heads"])
def model(request: pytest.FixtureRequest) -> Path:
    name = {"tiny": "tiny_model", "tiny-perturbed": "perturbed_model",
            "tiny-wide-heads": "wide_heads_model"}[request.param]
    path: Path = request.getfixturevalue(name)
    return path


def sequence(ref: Reference, n: int) -> list[int]:
    vocab = ref.w["token_embd.weight"].shape[0]
    return [int(t) for t in np.random.default_rng(3).integers(0, vocab, n)]


# -- tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [{"cache_mib": 0}, {"resident": True}],
                         ids=["cache-off", "resident"])
def test_logits_match_reference(model: Path, streaming: dict[str, object]) -> None:
    ref = load(model)
    tokens = sequence(ref, N_POSITIONS)
    expected = forward(ref, tokens)
    cfg = EngineConfig(ignore_eos=True, model=str(model), prompt_tokens=tuple(tokens), n_tokens=1,
                       n_ctx=N_POSITIONS + 1, **streaming)  # type: ignore[arg-type]
    routed: list[tuple[int, np.ndarray, np.ndarray]] = []
    with Engine(cfg, model) as engine:

        def on_routing(
            layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int
        ) -> None:
            routed.append((layer, ids.copy(), weights.copy()))

        engine.model.routing_hook = on_routing
        logits = np.stack([engine.model.forward(tok, pos, 1) for pos, tok in enumerate(tokens)])

    assert logits.shape == expected.logits.shape
    scale = float(np.abs(expected.logits).max())
    for pos in range(N_POSITIONS):
        np.testing.assert_allclose(
            logits[pos], expected.logits[pos], rtol=1e-4, atol=1e-4 * scale,
            err_msg=f"{model.name}: logits at position {pos} (token {tokens[pos]})",
        )
    assert len(routed) == N_POSITIONS * ref.n_layer
    for i, (layer, ids, weights) in enumerate(routed):
        pos = i // ref.n_layer
        assert layer == i % ref.n_layer
        where = f"{model.name}: position {pos}, layer {layer}"
        assert expected.margins[pos, layer] > 1e-5, f"{where}: a near tie; pick other tokens"
        assert list(ids) == list(expected.experts[pos, layer]), (
            f"{where}: engine routed {list(ids)}, reference {list(expected.experts[pos, layer])}"
        )
        np.testing.assert_allclose(weights, expected.weights[pos, layer], rtol=1e-5, atol=1e-6,
                                   err_msg=where)


def test_greedy_run_matches_reference(model: Path) -> None:
    """A whole engine run (prefill, decode, sampling) picks the reference's argmax tokens."""
    ref = load(model)
    prompt = sequence(ref, 8)
    n = 12
    cfg = EngineConfig(ignore_eos=True, model=str(model), prompt_tokens=tuple(prompt),
                       n_tokens=n, temp=0.0,
                       repeat_penalty=1.0, cache_mib=0.1)  # plain argmax: no penalty
    with Engine(cfg, model) as engine:
        result = engine.run()
    assert sum(r.evictions for r in result.records) > 0
    out = list(result.output_ids)
    expected = forward(ref, prompt + out[:-1]).logits[len(prompt) - 1 :]  # (n, vocab)
    # --ignore-eos never samples an end-of-generation token (llama.cpp's logit bias)
    expected[:, sorted(end_of_generation(ModelFile(model)))] = -np.inf
    for i in range(n):
        best2 = np.sort(expected[i])[-2:]
        assert best2[1] - best2[0] > 1e-3, f"decode step {i + 1}: a near tie in the reference"
        assert out[i] == int(np.argmax(expected[i])), (
            f"{model.name}: decode step {i + 1}: engine {out[i]}, "
            f"reference {int(np.argmax(expected[i]))} (tokens so far {out[:i]})"
        )


def test_reference_sees_the_perturbation(tiny_model: Path, perturbed_model: Path) -> None:
    """The perturbed copy must actually change the numbers, or it tests nothing new."""
    a, b = load(tiny_model), load(perturbed_model)
    assert b.rope_base == 500.0 != a.rope_base
    tokens = sequence(a, 6)
    assert not np.allclose(forward(a, tokens).logits, forward(b, tokens).logits, atol=1e-2)
