"""What a model file is, before a run loads it: its architecture and sizes (`abbench model
info`), which kernels would compute its experts, and the check that its vectors are finite.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from abbench.engine.arch import GRAPH_FOR_F32, GRAPHS, architecture
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import ggml
from abbench.engine.streaming.streamer import LayerExperts, expert_layout
from abbench.errors import EngineError


def model_info(mf: ModelFile) -> dict[str, Any]:
    """Architecture and sizes of a model file, as `abbench model info` prints them."""
    arch = architecture(mf.architecture, mf.path)
    args = arch.ModelArgs.from_file(mf)
    layout = expert_layout(mf, args.block_count, args.expert_count)
    with warnings.catch_warnings():  # a description: what a run would warn is its own
        warnings.simplefilter("ignore", RuntimeWarning)
        kernels = choose_kernels("auto", layout, mf.architecture in GRAPHS,
                                 mf.architecture in GRAPH_FOR_F32)
    expert_names = {t.name for le in layout for t in (le.gate, le.up, le.down)}
    expert_file_bytes = sum(mf.tensors[n].nbytes for n in expert_names)
    dense_bytes = sum(t.nbytes for n, t in mf.tensors.items() if n not in expert_names)
    types = sorted({t.type_name for t in mf.tensors.values()})
    info: dict[str, Any] = {
        "path": str(mf.path),
        "architecture": mf.architecture,
        "name": mf.get("general.name"),
        "file_bytes": mf.file_size,
        "alignment": mf.alignment,
        "tensor_types": types,
        "n_layer": args.block_count,
        "n_expert": args.expert_count,
        "n_expert_used": args.expert_used_count,
        "d_model": args.embedding_length,
        "expert_ff": args.expert_feed_forward_length,
        "n_head": args.head_count,
        "n_head_kv": args.head_count_kv,
        "head_dim": args.key_length,
        "vocab_size": args.vocab_size,
        "context_length": args.context_length,
        "dense_bytes": dense_bytes,
        "expert_file_bytes": expert_file_bytes,
        "expert_slice_bytes": {
            "gate": layout[0].gate.nbytes // args.expert_count,
            "up": layout[0].up.nbytes // args.expert_count,
            "down": layout[0].down.nbytes // args.expert_count,
        },
        "expert_bytes": layout[0].file_bytes,
        "expert_f32_bytes": layout[0].buffer_bytes,
        # What the engine computes the experts with by default (`--kernels auto`), and so
        # what one expert holds in the cache: the file's bytes with ggml, else F32.
        "kernels": kernels,
        "expert_resident_bytes": [le.file_bytes if kernels == "ggml" else le.buffer_bytes
                                  for le in layout],
        "routed_bytes_per_token": sum(le.file_bytes for le in layout) * args.expert_used_count,
        "sampling_temp": mf.get("general.sampling.temp"),
        "sampling_penalty_repeat": mf.get("general.sampling.penalty_repeat"),
        "sampling_penalty_last_n": mf.get("general.sampling.penalty_last_n"),
        "synthetic": {k.split(".", 2)[2]: v for k, v in mf.metadata.items()
                      if k.startswith("abbench.synthetic.")} or None,
    }
    return info


def choose_kernels(choice: str, layout: list[LayerExperts], graph: bool = True,
                   f32_graph: bool = False) -> str:
    """`ggml` or `numpy` for `--kernels` (auto: ggml where the experts are not F32 and the
    architecture has llama.cpp's graph here, `graph`, or F32 too where its graph is
    the faster, `f32_graph`)."""
    quantized = any(t.ggml_type != GGMLQuantizationType.F32
                    for le in layout for t in (le.gate, le.up, le.down))
    if choice == "numpy" or (choice == "auto" and not quantized and not f32_graph):
        return "numpy"
    if choice == "auto" and not graph:
        warnings.warn("no ggml graph of this architecture yet: the experts are converted to "
                      "F32 by numpy (the reference path: slow, and 3.8-7x the memory)",
                      RuntimeWarning, stacklevel=2)
        return "numpy"
    try:
        ggml.lib()
    except ggml.GgmlUnavailable as e:
        if choice == "ggml":
            raise
        warnings.warn(f"{e.message}: the experts are converted to F32 by numpy (the "
                      "reference path: slow, and 3.8-7x the memory)", RuntimeWarning,
                      stacklevel=2)
        return "numpy"
    return "ggml"


def check_vectors(mf: ModelFile) -> None:
    """Refuse a model whose vectors (the norms' weights: kilobytes) hold NaN or inf.
    The logits check in `Engine._step` finds NaN anywhere else, but with ggml kernels a
    NaN that a norm weight puts into a few values is lost when the next quantized matrix
    quantizes its input, and the run would decode finite garbage."""
    for name, info in mf.tensors.items():
        if len(info.shape) == 1 and not np.isfinite(mf.read_dense(name, True)).all():
            raise EngineError(f"{mf.path}: tensor `{name}` holds NaN or inf",
                              tip="no measurement comes of this file: check it against its "
                              "source (a checksum), or rebuild it")
