"""Synthetic gpt-oss models: every key and tensor llama.cpp's gpt-oss loader reads, with its
shape and type, the harmony vocabulary, determinism for a seed, and the CLI's `--arch`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from abbench.engine import synth
from abbench.engine.synth import gpt_oss as synth_gpt_oss
from abbench.errors import UsageError

TINY = synth.named("gpt-oss-tiny")
MXFP4 = gguf.GGMLQuantizationType.MXFP4
F32 = gguf.GGMLQuantizationType.F32


def field(r: GGUFReader, key: str) -> object:
    f = r.fields.get(key)
    assert f is not None, f"missing key `{key}`"
    return f.contents()


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tiny.gguf"
    synth.write_model(TINY, path, name="abbench-synthetic-gpt-oss-tiny")
    return path


def expected_tensors(spec: synth.SynthSpec, n_vocab: int) -> dict[str, tuple[tuple[int, ...],
                                                                             str]]:
    """llama.cpp's gpt-oss tensors (src/models/openai-moe.cpp), numpy shapes and types."""
    d, e, ff, h = spec.d_model, spec.n_expert, spec.expert_ff, spec.n_head
    q, kv = h * spec.head_dim, spec.n_head_kv * spec.head_dim
    out = {"token_embd.weight": ((n_vocab, d), "F32"), "output_norm.weight": ((d,), "F32"),
           "output.weight": ((n_vocab, d), "F32")}
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        out.update({
            b + "attn_norm.weight": ((d,), "F32"),
            b + "post_attention_norm.weight": ((d,), "F32"),
            b + "attn_q.weight": ((q, d), "F32"), b + "attn_q.bias": ((q,), "F32"),
            b + "attn_k.weight": ((kv, d), "F32"), b + "attn_k.bias": ((kv,), "F32"),
            b + "attn_v.weight": ((kv, d), "F32"), b + "attn_v.bias": ((kv,), "F32"),
            b + "attn_output.weight": ((d, q), "F32"), b + "attn_output.bias": ((d,), "F32"),
            b + "attn_sinks.weight": ((h,), "F32"),
            b + "ffn_gate_inp.weight": ((e, d), "F32"), b + "ffn_gate_inp.bias": ((e,), "F32"),
            b + "ffn_gate_exps.weight": ((e, ff, d), "MXFP4"),
            b + "ffn_gate_exps.bias": ((e, ff), "F32"),
            b + "ffn_up_exps.weight": ((e, ff, d), "MXFP4"),
            b + "ffn_up_exps.bias": ((e, ff), "F32"),
            b + "ffn_down_exps.weight": ((e, d, ff), "MXFP4"),
            b + "ffn_down_exps.bias": ((e, d), "F32"),
        })
    return out


# -- the file, as llama.cpp's gpt-oss loader reads it ------------------------------------


def test_every_key_llama_cpp_reads(tiny_gpt_oss: Path) -> None:
    r = GGUFReader(tiny_gpt_oss)
    assert field(r, "general.architecture") == "gpt-oss"
    assert field(r, "general.file_type") == gguf.LlamaFileType.MOSTLY_MXFP4_MOE == 38
    assert field(r, "general.alignment") == synth.ALIGNMENT
    want = {
        "block_count": 4, "context_length": 512, "embedding_length": 64,
        "feed_forward_length": 32, "expert_feed_forward_length": 32,
        "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 16, "attention.value_length": 16,
        "attention.sliding_window": 16, "expert_count": 8, "expert_used_count": 4,
        "rope.scaling.type": "yarn", "rope.scaling.original_context_length": 4096,
    }
    for key, value in want.items():
        assert field(r, f"gpt-oss.{key}") == value, key
    for key, value in (("rope.freq_base", 150000.0), ("rope.scaling.factor", 32.0),
                       ("attention.layer_norm_rms_epsilon", 1e-5)):
        assert field(r, f"gpt-oss.{key}") == pytest.approx(value, rel=1e-7), key
    # no key of another architecture
    assert not [k for k in r.fields if k.startswith("qwen3moe.")]
    assert field(r, "abbench.synthetic.arch") == "gpt-oss"
    assert field(r, "abbench.synthetic.sliding_window") == 16


def test_every_tensor_with_its_shape_and_type(tiny_gpt_oss: Path) -> None:
    r = GGUFReader(tiny_gpt_oss)
    n_vocab = len(field(r, "tokenizer.ggml.tokens"))  # type: ignore[arg-type]
    want = expected_tensors(TINY, n_vocab)
    got = {t.name: (tuple(int(n) for n in reversed(t.shape)), t.tensor_type.name)
           for t in r.tensors}
    assert got == want  # exactly these: llama.cpp refuses a file with any other tensor
    assert len(got) == 19 * TINY.n_layer + 3
    for t in r.tensors:
        assert t.data_offset % synth.ALIGNMENT == 0, t.name


def test_the_experts_are_mxfp4_as_ggml_and_gguf_quantize_it(tiny_gpt_oss: Path) -> None:
    from abbench.engine.kernels import ggml

    a = np.random.default_rng(7).standard_normal((8, 4, 64)).astype(np.float32) * 3
    assert np.array_equal(ggml.quantize(a, int(MXFP4)), gguf.quants.quantize(a, MXFP4))
    t = next(t for t in GGUFReader(tiny_gpt_oss).tensors
             if t.name == "blk.0.ffn_gate_exps.weight")
    w = gguf.quants.dequantize(np.array(t.data), MXFP4)  # (E, F, d)
    assert w.shape == (TINY.n_expert, TINY.expert_ff, TINY.d_model)
    sd = synth_gpt_oss.PRE_ACTIVATION / np.sqrt(TINY.d_model)
    assert np.isfinite(w).all() and 0.8 * sd < w.std() < 1.2 * sd


def test_gate_pre_activations_reach_the_swiglu_oai_clamps(tiny_gpt_oss: Path) -> None:
    """The ±7 clamps are exercised: a few of the gate/up pre-activations of real token
    rows (RMS-normed embeddings) lie past them, most well inside."""
    by_name = {t.name: t for t in GGUFReader(tiny_gpt_oss).tensors}
    embd = np.array(by_name["token_embd.weight"].data, np.float32)  # (V, d)
    x = embd / np.sqrt((embd ** 2).mean(axis=1, keepdims=True) + 1e-5)
    past = []
    for i in range(TINY.n_layer):
        for proj in ("gate", "up"):
            t = by_name[f"blk.{i}.ffn_{proj}_exps.weight"]
            w = gguf.quants.dequantize(np.array(t.data), MXFP4)  # (E, F, d)
            bias = np.array(by_name[f"blk.{i}.ffn_{proj}_exps.bias"].data)  # (E, F)
            pre = np.einsum("efd,vd->vef", w, x) + bias  # (V, E, F)
            past.append(float((np.abs(pre) > 7).mean()))
    assert 0.0005 < float(np.mean(past)) < 0.03, past


def test_sinks_and_biases_are_drawn_not_zero(tiny_gpt_oss: Path) -> None:
    by_name = {t.name: np.array(t.data) for t in GGUFReader(tiny_gpt_oss).tensors}
    sinks = by_name["blk.0.attn_sinks.weight"]
    assert sinks.shape == (TINY.n_head,) and np.abs(sinks).max() > 0.5
    for name in ("attn_q.bias", "attn_output.bias", "ffn_gate_inp.bias", "ffn_down_exps.bias"):
        assert np.abs(by_name[f"blk.1.{name}"]).max() > 0, name


def test_the_harmony_vocabulary(tiny_gpt_oss: Path) -> None:
    r = GGUFReader(tiny_gpt_oss)
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == "gpt-4o"
    tokens = field(r, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) == synth.BPE_VOCAB_SIZE
    assert tokens[:7] == synth.GPT4O_SPECIAL == [
        "<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>",
        "<|call|>"]
    types = field(r, "tokenizer.ggml.token_type")
    assert types[:7] == [gguf.TokenType.CONTROL] * 7  # type: ignore[index]
    assert field(r, "tokenizer.ggml.bos_token_id") == 0
    assert field(r, "tokenizer.ggml.eos_token_id") == 5
    assert field(r, "tokenizer.ggml.add_bos_token") is False
    assert len(field(r, "tokenizer.ggml.merges")) == len(tokens) - 7 - 256  # type: ignore[arg-type]


# -- determinism, names, the CLI ------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path, tiny_gpt_oss: Path) -> None:
    again = tmp_path / "again.gguf"
    synth.write_model(TINY, again, name="abbench-synthetic-gpt-oss-tiny")
    assert again.read_bytes() == tiny_gpt_oss.read_bytes()
    other = tmp_path / "seed1.gguf"
    synth.write_model(synth.named("gpt-oss-tiny", seed=1), other,
                      name="abbench-synthetic-gpt-oss-tiny")
    a = {t.name: np.array(t.data) for t in GGUFReader(tiny_gpt_oss).tensors}
    b = {t.name: np.array(t.data) for t in GGUFReader(other).tensors}
    assert a.keys() == b.keys()
    assert not np.array_equal(a["blk.0.attn_sinks.weight"], b["blk.0.attn_sinks.weight"])


def test_presets_and_shape_names() -> None:
    small = synth.named("gpt-oss-small")
    assert (small.arch, small.n_layer, small.n_expert, small.n_expert_used, small.d_model,
            small.n_head, small.n_head_kv, small.head_dim, small.expert_ff,
            small.sliding_window) == ("gpt-oss", 8, 16, 4, 256, 8, 2, 64, 128, 32)
    assert synth.arch_preset("gpt-oss", "tiny") == TINY
    assert synth.arch_preset("qwen3moe", "tiny") == synth.preset("tiny")
    with pytest.raises(UsageError, match="gpt-oss has no preset `default`"):
        synth.arch_preset("gpt-oss", "default")
    shaped = synth.named("gpt-oss-20b-2L-MXFP4")  # llama-quantize's MXFP4_MOE
    assert (shaped.arch, shaped.n_layer, shaped.expert_type, shaped.dense_type) == (
        "gpt-oss", 2, "MXFP4", "Q8_0")


def test_spec_validation() -> None:
    with pytest.raises(UsageError, match="sliding_window"):
        replace(TINY, sliding_window=0)
    with pytest.raises(UsageError, match="sliding_window"):
        replace(synth.preset("tiny"), sliding_window=16)
    with pytest.raises(UsageError, match="arch"):
        replace(TINY, arch="gemma3")


def abbench(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_model_synth_arch_gpt_oss(tmp_path: Path, tiny_gpt_oss: Path) -> None:
    out = tmp_path / "m.gguf"
    p = abbench("model", "synth", "--arch", "gpt-oss", "--preset", "tiny", "-o", out)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == tiny_gpt_oss.read_bytes()  # named as synthetic:gpt-oss-tiny
    bad = abbench("model", "synth", "--arch", "gpt-oss", "--preset", "default", "-o", out)
    assert bad.returncode == 2 and "gpt-oss has no preset `default`" in bad.stderr
    bad = abbench("model", "synth", "--arch", "qwen3moe", "--shape", "gpt-oss-20b", "-o", out)
    assert bad.returncode == 2 and "is gpt-oss, not qwen3moe" in bad.stderr
