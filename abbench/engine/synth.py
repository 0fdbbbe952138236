"""Synthetic `qwen3moe` GGUF models whose routing behaves like a trained model's.

Random weights route uniformly and make every predictor look the same. Three knobs give
the routing the shape the seed measured on real models:

- `popularity_skew`: every token's residual stream shares a common direction (the mean of
  the token embeddings), and each layer's router rows get a component along it whose size
  follows a Zipf-like ladder over a random permutation of the experts. Some experts are
  hot, most are cold — so an LRU cache's hit rate rises with its size.
- `update_early` / `update_late`: the size of each layer's residual update (attention and
  expert outputs) relative to the residual stream, decaying geometrically from the first
  layer to the last over `update_decay_layers`. Small updates are what make layer l+1's
  routing predictable from layer l's input (the stale-gate predictor); larger early updates
  make the first layers less predictable than the last, as on real models.
- `router_scale`: the spread of router logits, which sets how peaked routing weights are.

The file is a complete GGUF: architecture metadata under `qwen3moe.*`, a byte-fallback
SentencePiece-style vocabulary (`<unk>`, `<s>`, `</s>`, then `<0x00>`..`<0xFF>`) with the
standard `tokenizer.ggml.*` keys — or, with `tokenizer = "gpt2"`, a byte-level BPE
vocabulary of 512 tokens trained (Hugging Face `tokenizers`, deterministic) on the text the
package ships in `data/bpe-corpus.txt`, with Qwen's `qwen2` pre-tokenizer — and sampling
defaults: `general.sampling.temp = 1.0`, because a random model decoded greedily falls
into a short loop (seeded sampling keeps synthetic text varied), and llama.cpp's
long-standing repetition penalty (`general.sampling.penalty_repeat = 1.1` over
`penalty_last_n = 64` tokens), because without it a popular token repeats back to back,
and a token following itself routes to the experts it just used, so a streaming decode
reads nothing for it.
Tensors are 4096-byte aligned and experts stored in F32 by default, so O_DIRECT reads land
straight in the buffer the GEMV uses.

Files of the types the field ships: `expert_type` (and `dense_type`) may be any type ggml
quantizes to without an importance matrix (Q8_0, Q4_0, Q4_K, Q6_K, ...), quantized by
ggml's own `ggml_quantize_chunk` — what `llama-quantize` calls — or one of llama.cpp's
mixes, `Q4_K_M` and `Q5_K_M`, which follow `llama-quantize`'s rules for them: `attn_v`
and `ffn_down` (the experts' too) in Q6_K on the layers its `use_more_bits` picks (the
first and last eighth, and every third between), `output` in Q6_K, every other matrix in
Q4_K (Q5_K); norms and routers stay F32. `SHAPES` has real models' geometries
(`qwen3-30b-a3b`: 128 experts, top-8, d_model 2048, expert ff 768) at a layer count of
one's choosing.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import gguf
import numpy as np

from abbench.errors import UsageError
from abbench.fsutil import whole_file_target

TOKENIZERS = ("llama", "gpt2")
VOCAB_SPECIAL = ["<unk>", "<s>", "</s>"]
BPE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Qwen's names; 0 is BOS/EOS
BPE_VOCAB_SIZE = 512
BPE_CORPUS = Path(__file__).with_name("data") / "bpe-corpus.txt"
N_VOCAB = len(VOCAB_SPECIAL) + 256  # the SentencePiece vocabulary's size
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0
ALIGNMENT = 4096
FORMAT_VERSION = 3  # bump when the generator's output changes for the same spec
SAMPLING_PENALTY_REPEAT = 1.1  # the sampling defaults written into every synthetic model
SAMPLING_PENALTY_LAST_N = 64

# Tensor types written as they are; the mixes below choose among them per tensor.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                "Q4_K", "Q5_K", "Q6_K")
# llama.cpp's mixes: (the base type, the type of the tensors it gives more bits)
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}
TYPES = TENSOR_TYPES + tuple(MIXES)


@dataclass(frozen=True)
class SynthSpec:
    n_layer: int
    n_expert: int
    n_expert_used: int
    d_model: int
    n_head: int
    n_head_kv: int
    head_dim: int
    expert_ff: int
    context_length: int = 2048
    seed: int = 0
    popularity_skew: float = 1.0
    update_early: float = 0.35
    update_late: float = 0.08
    update_decay_layers: float = 3.0
    router_scale: float = 1.0
    dense_type: str = "F32"
    expert_type: str = "F32"
    tokenizer: str = "llama"  # "llama" (SentencePiece, byte fallback) or "gpt2" (BPE)

    def __post_init__(self) -> None:
        for key in ("expert_type", "dense_type"):
            if getattr(self, key) not in TYPES:
                raise UsageError(f"{key} must be one of {', '.join(TYPES)} "
                                 f"(got {getattr(self, key)!r})")
        if self.tokenizer not in TOKENIZERS:
            raise UsageError(f"tokenizer must be one of {', '.join(TOKENIZERS)} "
                             f"(got {self.tokenizer!r})")
        if self.n_expert_used > self.n_expert:
            raise UsageError("n_expert_used must not exceed n_expert")
        if self.n_head % self.n_head_kv:
            raise UsageError("n_head must be a multiple of n_head_kv")
        if self.head_dim % 2:
            raise UsageError("head_dim must be even (RoPE)")

    @property
    def expert_bytes(self) -> int:
        return 3 * self.expert_ff * self.d_model * 4


PRESETS: dict[str, SynthSpec] = {
    # a few MiB: unit tests and gates
    "tiny": SynthSpec(n_layer=4, n_expert=8, n_expert_used=2, d_model=64, n_head=4,
                      n_head_kv=2, head_dim=16, expert_ff=32, context_length=512),
    # tens of MiB: CI end-to-end
    "small": SynthSpec(n_layer=8, n_expert=16, n_expert_used=4, d_model=256, n_head=4,
                       n_head_kv=2, head_dim=64, expert_ff=128, context_length=1024),
    # ~1.5 GiB: 16 layers x 64 experts of 1.5 MiB, top-8 — a few hundred MiB of cache streams
    "default": SynthSpec(n_layer=16, n_expert=64, n_expert_used=8, d_model=512, n_head=8,
                         n_head_kv=2, head_dim=64, expert_ff=256, context_length=2048),
}


# Real models' geometries, written with `n_layer` chosen by the caller (`shape()`).
SHAPES: dict[str, SynthSpec] = {
    # Qwen3-30B-A3B: 48 layers of 128 experts (top-8) in the real model
    "qwen3-30b-a3b": SynthSpec(n_layer=48, n_expert=128, n_expert_used=8, d_model=2048,
                               n_head=32, n_head_kv=4, head_dim=128, expert_ff=768,
                               context_length=4096, tokenizer="gpt2"),
}


def shape(name: str, n_layer: int, seed: int = 0) -> SynthSpec:
    if name not in SHAPES:
        raise UsageError(f"unknown model shape `{name}`", tip=f"shapes: {', '.join(SHAPES)}")
    real = SHAPES[name].n_layer  # more layers than the model has is no model, only disk
    if not 1 <= n_layer <= real:
        raise UsageError(f"`--layers` must be in 1 .. {real}, the layers {name} has "
                         f"(got {n_layer})")
    return replace(SHAPES[name], n_layer=n_layer, seed=seed)


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama-quantize's choice of the layers whose attn_v and ffn_down get more bits."""
    return (layer < n_layer // 8 or layer >= 7 * n_layer // 8
            or (layer - n_layer // 8) % 3 == 2)


# What llama-quantize writes instead of a K type whose 256-value blocks do not divide a
# tensor's rows (small synthetic shapes have such rows).
K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


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


_SHAPED = re.compile(r"(?P<shape>.+)-(?P<layers>[0-9]+)L-(?P<type>[A-Z0-9_]+)\Z")


def named(name: str, seed: int = 0) -> SynthSpec:
    """A preset (`default`), or a shape at a layer count in a type, every matrix in it
    (`qwen3-30b-a3b-4L-Q4_K_M`: as llama-quantize writes a Q4_K_M file)."""
    m = _SHAPED.match(name)
    if name in PRESETS or m is None or m["shape"] not in SHAPES:
        return preset(name, seed)
    if m["type"] not in TYPES:
        raise UsageError(f"unknown type `{m['type']}` in `{name}`",
                         tip=f"types: {', '.join(TYPES)}")
    return replace(shape(m["shape"], int(m["layers"]), seed), expert_type=m["type"],
                   dense_type=m["type"])


def preset(name: str, seed: int = 0) -> SynthSpec:
    if name not in PRESETS:
        raise UsageError(
            f"unknown synthetic preset `{name}`",
            tip=f"presets: {', '.join(PRESETS)}; or a real shape as SHAPE-NL-TYPE, e.g. "
            f"qwen3-30b-a3b-4L-Q4_K_M (shapes: {', '.join(SHAPES)})")
    return replace(PRESETS[name], seed=seed)


def layer_update_scale(spec: SynthSpec, layer: int) -> float:
    """Residual update size at `layer`, decaying from update_early to update_late."""
    w = np.exp(-layer / max(spec.update_decay_layers, 1e-9))
    return float(spec.update_late + (spec.update_early - spec.update_late) * w)


def _quantize(a: np.ndarray, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    qtype = gguf.GGMLQuantizationType[type_name]
    if qtype == gguf.GGMLQuantizationType.F32:
        return a.astype(np.float32, copy=False), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return a.astype(np.float16), None
    if qtype == gguf.GGMLQuantizationType.BF16:
        return gguf.quants.quantize(a.astype(np.float32), qtype), qtype
    from abbench.engine import ggml  # ggml's own quantizer, as llama-quantize runs it

    return ggml.quantize(a, int(qtype)), qtype


def write_model(spec: SynthSpec, path: str | os.PathLike[str], name: str = "synthetic") -> None:
    """Write the model to `path` atomically (temp file in the same folder, then rename)."""
    asked = Path(path)
    path = whole_file_target(asked)  # a link's file; never a device renamed over
    try:
        tmp_fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".part",
                                            dir=path.parent)
    except OSError as e:  # named as the file asked for, not the temp file beside it
        raise OSError(e.errno, e.strerror, str(asked)) from e
    os.close(tmp_fd)
    try:
        w = gguf.GGUFWriter(tmp_name, "qwen3moe")
        vocab = _vocab(spec.tokenizer)
        _add_metadata(w, spec, name, vocab)
        _add_tensors(w, spec, len(vocab.tokens))
        w.close()
        # mkstemp makes the file 0600: give it the mode a plain create would (0644 under
        # the usual umask), so a llama.cpp or server process of another user can read it.
        os.chmod(tmp_name, 0o666 & ~_umask())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _add_metadata(w: gguf.GGUFWriter, spec: SynthSpec, name: str, vocab: SynthVocab) -> None:
    """The header's key-value pairs, in the order files have always had them."""
    d, hd, ff = spec.d_model, spec.head_dim, spec.expert_ff
    w.add_custom_alignment(ALIGNMENT)
    w.add_name(name)
    w.add_file_type(FILE_TYPES[spec.expert_type])  # the experts hold nearly every byte
    w.add_description(f"abbench synthetic model: {asdict(spec)}")
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_expert_feed_forward_length(ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_sampling_temp(1.0)
    w.add_sampling_penalty_repeat(SAMPLING_PENALTY_REPEAT)
    w.add_sampling_penalty_last_n(SAMPLING_PENALTY_LAST_N)
    w.add_uint32("abbench.synthetic.format", FORMAT_VERSION)
    for key, value in asdict(spec).items():
        if key == "tokenizer" and value == "llama":
            continue  # the default: files written before the option stay byte-identical
        if isinstance(value, str):
            w.add_string(f"abbench.synthetic.{key}", value)
        elif isinstance(value, int):
            w.add_int64(f"abbench.synthetic.{key}", value)
        else:
            w.add_float64(f"abbench.synthetic.{key}", float(value))
    _add_vocab(w, vocab)


def _add_tensors(w: gguf.GGUFWriter, spec: SynthSpec, n_vocab: int) -> None:
    """Every tensor's info first (the header needs them), then each tensor generated,
    converted and written in the file's order: one tensor in memory at a time."""
    rng = np.random.default_rng(spec.seed)
    plan = [(n, sh, tensor_type(spec, n, t, sh[-1]), make)
            for n, sh, t, make in _tensors(spec, rng, n_vocab)]
    for name_, shape, type_name, _ in plan:
        qtype = gguf.GGMLQuantizationType[type_name]
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(name_, shape, np.dtype(np.float32), 4 * math.prod(shape))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor_info(name_, shape, np.dtype(np.float16), 2 * math.prod(shape))
        else:
            byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name_, byte_shape, np.dtype(np.uint8), math.prod(byte_shape),
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name_, shape, type_name, make in plan:
        a = make()
        if a.shape != shape:
            raise AssertionError(f"{name_}: generated {a.shape}, planned {shape}")
        w.write_tensor_data(_quantize(a, type_name)[0])
        del a


Make = Callable[[], np.ndarray]

# `general.file_type` (llama.cpp's `llama_ftype`) by the experts' type (a plain K type
# is named as llama.cpp's mix of it that keeps most tensors in that type).
_FT = gguf.LlamaFileType
FILE_TYPES = {"F32": _FT.ALL_F32, "F16": _FT.MOSTLY_F16, "BF16": _FT.MOSTLY_BF16,
              "Q8_0": _FT.MOSTLY_Q8_0, "Q4_0": _FT.MOSTLY_Q4_0, "Q4_1": _FT.MOSTLY_Q4_1,
              "Q5_0": _FT.MOSTLY_Q5_0, "Q5_1": _FT.MOSTLY_Q5_1, "Q2_K": _FT.MOSTLY_Q2_K,
              "Q3_K": _FT.MOSTLY_Q3_K_S, "Q4_K": _FT.MOSTLY_Q4_K_S, "Q5_K": _FT.MOSTLY_Q5_K_S,
              "Q6_K": _FT.MOSTLY_Q6_K, "Q4_K_M": _FT.MOSTLY_Q4_K_M, "Q5_K_M": _FT.MOSTLY_Q5_K_M}


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


def _tensors(spec: SynthSpec, rng: np.random.Generator, n_vocab: int
             ) -> Iterator[tuple[str, tuple[int, ...], str, Make]]:
    """(name, F32 shape, storage type, make) for every tensor in file order. `make()`
    generates the tensor in F32; calling them in order draws `rng` in a fixed order, so a
    spec and seed give the same bytes."""
    d, hd, ff = spec.d_model, spec.head_dim, spec.expert_ff
    q_rows, kv_rows = spec.n_head * hd, spec.n_head_kv * hd
    dense, experts = spec.dense_type, spec.expert_type

    def projection(rows: int, cols: int, scale: float = 1.0, over: float = 1.0) -> Make:
        """(rows, cols) unit normals * scale / over."""
        return lambda: rng.standard_normal((rows, cols)).astype(np.float32) * scale / over

    def experts_of(rows: int, cols: int, scale: float) -> Make:  # (n_expert, rows, cols)
        def make() -> np.ndarray:
            a = rng.standard_normal((spec.n_expert, rows, cols), dtype=np.float32)
            a *= scale
            return a
        return make

    def ones(n: int) -> Make:
        return lambda: np.ones(n, np.float32)

    # The shared direction every token's residual stream carries (popularity skew).
    common = rng.standard_normal(d).astype(np.float32)
    common /= np.linalg.norm(common)
    rho = 0.25  # share of an embedding's energy along `common`

    def embedding() -> np.ndarray:
        embd = rng.standard_normal((n_vocab, d)).astype(np.float32) * np.sqrt(1 - rho)
        return embd + common * np.sqrt(rho * d)  # (vocab, d), rows of norm ~ sqrt(d)

    yield "token_embd.weight", (n_vocab, d), dense, embedding
    yield "output_norm.weight", (d,), "F32", ones(d)
    yield "output.weight", (n_vocab, d), dense, lambda: (
        rng.standard_normal((n_vocab, d)).astype(np.float32) / np.sqrt(d) * 2.0)
    ranks = np.arange(1, spec.n_expert + 1, dtype=np.float64)
    ladder = -np.log(ranks)  # Zipf-like: logit bias ~ -log(rank)
    ladder = (ladder - ladder.mean()) * spec.popularity_skew

    def router() -> np.ndarray:
        w = rng.standard_normal((spec.n_expert, d)).astype(np.float32)
        w *= spec.router_scale / np.sqrt(d)
        bias = ladder[rng.permutation(spec.n_expert)]  # (n_expert,) logit bias per expert
        # x·common ≈ sqrt(rho*d) after RMSNorm, so this adds ~`bias` to each logit.
        w += (bias[:, None] / np.sqrt(rho * d)).astype(np.float32) * common[None, :]
        return w

    for i in range(spec.n_layer):
        b = f"blk.{i}."
        upd = layer_update_scale(spec, i)
        yield b + "attn_norm.weight", (d,), "F32", ones(d)
        yield b + "ffn_norm.weight", (d,), "F32", ones(d)
        yield b + "attn_q_norm.weight", (hd,), "F32", ones(hd)
        yield b + "attn_k_norm.weight", (hd,), "F32", ones(hd)
        yield b + "attn_q.weight", (q_rows, d), dense, projection(q_rows, d, over=np.sqrt(d))
        yield b + "attn_k.weight", (kv_rows, d), dense, projection(kv_rows, d, over=np.sqrt(d))
        yield b + "attn_v.weight", (kv_rows, d), dense, projection(kv_rows, d, over=np.sqrt(d))
        # Attention outputs have unit-scale components, as does the residual stream: size
        # the projection so the update is `upd` of the stream.
        yield b + "attn_output.weight", (d, q_rows), dense, projection(
            d, q_rows, upd / np.sqrt(q_rows))
        yield b + "ffn_gate_inp.weight", (spec.n_expert, d), "F32", router
        yield b + "ffn_gate_exps.weight", (spec.n_expert, ff, d), experts, experts_of(
            ff, d, 1.0 / np.sqrt(d))
        yield b + "ffn_up_exps.weight", (spec.n_expert, ff, d), experts, experts_of(
            ff, d, 1.0 / np.sqrt(d))
        # silu(g)*u has rms ~0.6 for unit-variance g and u; scale the update to `upd`.
        yield b + "ffn_down_exps.weight", (spec.n_expert, d, ff), experts, experts_of(
            d, ff, upd / (0.6 * np.sqrt(ff)))

@dataclass(frozen=True)
class SynthVocab:
    model: str  # tokenizer.ggml.model
    tokens: list[str]
    types: list[gguf.TokenType]
    merges: list[str]  # BPE only


def _vocab(kind: str) -> SynthVocab:
    if kind == "llama":
        tokens = VOCAB_SPECIAL + [f"<0x{b:02X}>" for b in range(256)]
        types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        return SynthVocab("llama", tokens, types + [gguf.TokenType.BYTE] * 256, [])
    return _bpe_vocab()


def _bpe_vocab() -> SynthVocab:
    """A byte-level BPE vocabulary trained on the shipped corpus: the special tokens, the
    256 characters of the byte alphabet, then one token per merge, in merge order."""
    import json

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from abbench.engine.tokenizer import PRE_TOKENIZERS

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZERS["qwen2"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, special_tokens=BPE_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator([BPE_CORPUS.read_text(encoding="utf-8")], trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise AssertionError("the trained BPE vocabulary's ids are not 0..n-1")
    tokens = [t for t, _ in by_id]
    types = [gguf.TokenType.CONTROL if t in BPE_SPECIAL else gguf.TokenType.NORMAL
             for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return SynthVocab("gpt2", tokens, types, merges)


def _add_vocab(w: gguf.GGUFWriter, vocab: SynthVocab) -> None:
    w.add_tokenizer_model(vocab.model)
    w.add_token_list(vocab.tokens)
    w.add_token_types([int(t) for t in vocab.types])
    if vocab.model == "gpt2":  # as Qwen's files: BOS = EOS = <|endoftext|>, no BOS added
        w.add_tokenizer_pre("qwen2")
        w.add_token_merges(vocab.merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
        w.add_add_bos_token(False)
        return
    w.add_tokenizer_pre("default")
    w.add_token_scores([0.0] * len(vocab.tokens))
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
