"""Synthetic MoE GGUF models of every architecture the engine decodes, whose routing
behaves like a trained model's.

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

The file is a complete GGUF: architecture metadata under `ARCH.*`, a byte-fallback
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

Architectures (`SynthSpec.arch`): the rows of the table (engine/architectures.py), each
with its writer `engine/synth/<package>.py` (`ARCH_WRITERS`): its `ARCH.*` keys
(`add_keys`) and its layers' tensors (`layer_tensors`); the vocabulary and output tensors,
the routing knobs, the sampling defaults and the writing are shared (`tensors.py`,
`vocab.py`, here).

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

import importlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf

from abbench.engine.architectures import TABLE
from abbench.engine.synth.spec import (
    ARCHS,
    MIXES,
    PRESETS,
    SHAPES,
    TENSOR_TYPES,
    TOKENIZERS,
    TYPES,
    SynthSpec,
    arch_preset,
    named,
    preset,
    preset_name,
    shape,
)
from abbench.engine.synth.tensors import (
    K_FALLBACK,
    LayerTensors,
    Make,
    add_tensors,
    layer_update_scale,
    tensor_type,
    use_more_bits,
)
from abbench.engine.synth.vocab import (
    BOS_ID,
    BPE_CORPUS,
    BPE_SPECIAL,
    BPE_VOCAB_SIZE,
    EOS_ID,
    GPT4O_BOS_ID,
    GPT4O_EOS_ID,
    GPT4O_SPECIAL,
    N_VOCAB,
    UNK_ID,
    VOCAB_SPECIAL,
    SynthVocab,
    add_vocab,
    vocab_of,
)
from abbench.errors import UsageError
from abbench.fsutil import file_mode, whole_file_target

# The face of the synthetic models: the spec (spec.py), vocabulary (vocab.py)
# and tensors (tensors.py) are read through this module's names.
__all__ = [
    "ALIGNMENT", "ARCHS", "ARCH_WRITERS", "BOS_ID", "BPE_CORPUS", "BPE_SPECIAL",
    "BPE_VOCAB_SIZE", "EOS_ID", "FILE_TYPES", "FORMAT_VERSION", "GPT4O_BOS_ID",
    "GPT4O_EOS_ID", "GPT4O_SPECIAL", "K_FALLBACK", "MIXES", "N_VOCAB", "PRESETS",
    "SAMPLING_PENALTY_LAST_N", "SAMPLING_PENALTY_REPEAT", "SHAPES", "TENSOR_TYPES",
    "TOKENIZERS", "TYPES", "UNK_ID", "VOCAB_SPECIAL", "ArchWriter", "Make", "SynthSpec",
    "SynthVocab", "UsageError", "arch_preset", "layer_update_scale", "named", "preset",
    "preset_name", "shape", "tensor_type", "use_more_bits", "write_model",
]

ALIGNMENT = 4096
# Bump when the generator's output changes for the same spec. It names every cached file:
# a bump rebuilds them all, so an architecture's new fields are left out of qwen3moe's
# files instead (`SynthSpec.described`).
FORMAT_VERSION = 3
SAMPLING_PENALTY_REPEAT = 1.1  # the sampling defaults written into every synthetic model
SAMPLING_PENALTY_LAST_N = 64

# `general.file_type` (llama.cpp's `llama_ftype`) by the experts' type (a plain K type
# is named as llama.cpp's mix of it that keeps most tensors in that type).
_FT = gguf.LlamaFileType
FILE_TYPES = {"F32": _FT.ALL_F32, "F16": _FT.MOSTLY_F16, "BF16": _FT.MOSTLY_BF16,
              "Q8_0": _FT.MOSTLY_Q8_0, "Q4_0": _FT.MOSTLY_Q4_0, "Q4_1": _FT.MOSTLY_Q4_1,
              "Q5_0": _FT.MOSTLY_Q5_0, "Q5_1": _FT.MOSTLY_Q5_1, "Q2_K": _FT.MOSTLY_Q2_K,
              "Q3_K": _FT.MOSTLY_Q3_K_S, "Q4_K": _FT.MOSTLY_Q4_K_S, "Q5_K": _FT.MOSTLY_Q5_K_S,
              "Q6_K": _FT.MOSTLY_Q6_K, "Q4_K_M": _FT.MOSTLY_Q4_K_M, "Q5_K_M": _FT.MOSTLY_Q5_K_M,
              "MXFP4": _FT.MOSTLY_MXFP4_MOE}


@dataclass(frozen=True)
class ArchWriter:
    """What one architecture writes of its own: its `ARCH.*` hyperparameter keys and its
    layers' tensors (the rest of the file is shared)."""

    keys: Callable[[gguf.GGUFWriter, SynthSpec], None]
    layer: LayerTensors


def _writer(package: str) -> ArchWriter:
    module = importlib.import_module(f"{__name__}.{package}")
    return ArchWriter(module.add_keys, module.layer_tensors)


# One writer per architecture, `engine/synth/<package>.py`, found through the table.
ARCH_WRITERS: dict[str, ArchWriter] = {a.name: _writer(a.package) for a in TABLE}


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
        w = gguf.GGUFWriter(tmp_name, spec.arch)
        vocab = vocab_of(spec.tokenizer)
        _add_metadata(w, spec, name, vocab)
        add_tensors(w, spec, len(vocab.tokens), ARCH_WRITERS[spec.arch].layer)
        w.close()
        # mkstemp makes the file 0600: give it the mode a plain create would (0644 under
        # the usual umask; a file written over keeps its own), so a llama.cpp or server
        # process of another user can read it.
        os.chmod(tmp_name, file_mode(path))
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _add_metadata(w: gguf.GGUFWriter, spec: SynthSpec, name: str, vocab: SynthVocab) -> None:
    """The header's key-value pairs, in the order files have always had them."""
    described = spec.described()
    w.add_custom_alignment(ALIGNMENT)
    w.add_name(name)
    w.add_file_type(FILE_TYPES[spec.expert_type])  # the experts hold nearly every byte
    w.add_description(f"abbench synthetic model: {described}")
    ARCH_WRITERS[spec.arch].keys(w, spec)
    w.add_sampling_temp(1.0)
    w.add_sampling_penalty_repeat(SAMPLING_PENALTY_REPEAT)
    w.add_sampling_penalty_last_n(SAMPLING_PENALTY_LAST_N)
    w.add_uint32("abbench.synthetic.format", FORMAT_VERSION)
    for key, value in described.items():
        if key == "tokenizer" and value == "llama":
            continue  # the default: files written before the option stay byte-identical
        if isinstance(value, str):
            w.add_string(f"abbench.synthetic.{key}", value)
        elif isinstance(value, int):
            w.add_int64(f"abbench.synthetic.{key}", value)
        else:
            w.add_float64(f"abbench.synthetic.{key}", float(value))
    add_vocab(w, vocab)
