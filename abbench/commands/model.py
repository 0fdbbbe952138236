"""`abbench model synth` and `abbench model info`: synthetic models, and what a model file
holds."""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path
from typing import Any

from abbench.engine import synth
from abbench.engine.architectures import TABLE
from abbench.engine.gguf.header import show
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.models import resolve_model
from abbench.engine.run.session import model_info
from abbench.errors import UsageError, WriteError
from abbench.textsafe import shown

UNREAD_SHOWN = 5  # unread metadata arrays named in `model info`'s text


HELP = "write synthetic models, describe model files"
DESCRIPTION = None


def add_arguments(model: argparse.ArgumentParser) -> None:
    msub = model.add_subparsers(dest="model_cmd", required=True, metavar="COMMAND")
    sy = msub.add_parser("synth", help="write a synthetic MoE GGUF model ("
                         + ", ".join(synth.ARCHS) + ")",
                         description="Write a synthetic MoE model whose routing behaves like a "
                         "trained model's, in architecture --arch. Presets: " + ", ".join(
                             f"{k} ({v.arch}: {v.n_layer} layers, {v.n_expert} experts, "
                             f"top-{v.n_expert_used}, d={v.d_model})"
                             for k, v in synth.PRESETS.items())
                         + " (--arch gpt-oss --preset tiny writes gpt-oss-tiny)")
    sy.add_argument("--arch", choices=list(synth.ARCHS),
                    help="architecture: " + "; ".join(
                        f"{a.name} ({a.summary}{', the default' if a is TABLE[0] else ''})"
                        for a in TABLE) + "; a --shape has its own")
    sy.add_argument("--preset", choices=list(dict.fromkeys(
        k.removeprefix(f"{v.arch}-") for k, v in synth.PRESETS.items())),
                    help="a synthetic geometry of --arch (default tiny; each architecture's: "
                    + "; ".join(f"{a.name}: {', '.join(a.presets)}" for a in TABLE) + ")")
    sy.add_argument("--shape", choices=list(synth.SHAPES),
                    help="a real model's geometry instead of a preset, at --layers layers")
    sy.add_argument("--layers", type=int, metavar="N",
                    help="layers of --shape, at most the real model's (default 4)")
    sy.add_argument("--seed", type=int, default=0)
    sy.add_argument("-o", "--output", required=True, metavar="FILE")
    for knob, default, text in (
        ("popularity-skew", None, "Zipf-like expert popularity strength"),
        ("update-early", None, "first layer's residual update size"),
        ("update-late", None, "last layers' residual update size"),
        ("router-scale", None, "spread of router logits"),
    ):
        sy.add_argument(f"--{knob}", type=float, default=default, help=text + " (preset default)")
    sy.add_argument("--expert-type", choices=list(synth.TYPES), metavar="TYPE",
                    help="storage type of expert tensors: "
                    f"{', '.join(synth.TENSOR_TYPES)}, or llama.cpp's mix "
                    f"{' or '.join(synth.MIXES)} (default F32); quantized by ggml as "
                    "llama-quantize quantizes")
    sy.add_argument("--dense-type", choices=list(synth.TYPES), metavar="TYPE",
                    help="storage type of large dense tensors (default F32; the same mix "
                    "when --expert-type is a mix)")
    sy.add_argument("--tokenizer", choices=list(synth.TOKENIZERS),
                    help="vocabulary: llama (SentencePiece with byte tokens, qwen3moe's default), "
                    "gpt2 (byte-level BPE of 512 tokens, Qwen's qwen2 pre-tokenizer) or gpt-4o "
                    "(byte-level BPE of 512 tokens, gpt-oss's harmony tokens and gpt-4o "
                    "pre-tokenizer, gpt-oss's default)")
    sy.set_defaults(func=cmd_model_synth)
    info = msub.add_parser("info", help="architecture and sizes of a model file")
    info.add_argument("model", help="a .gguf file or synthetic:PRESET")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_model_info)


def cmd_model_synth(a: argparse.Namespace) -> int:
    if a.shape and a.preset:
        raise UsageError("`--preset` and `--shape` are exclusive: give one")
    if a.layers is not None and not a.shape:
        raise UsageError("`--layers` sets the layer count of a `--shape`")
    if a.shape:
        spec = synth.shape(a.shape, 4 if a.layers is None else a.layers, a.seed)
        what = f"{a.shape} x {spec.n_layer} layers"
        if a.arch is not None and a.arch != spec.arch:
            raise UsageError(f"`--shape {a.shape}` is {spec.arch}, not {a.arch}",
                             tip="leave `--arch` out with `--shape`")
    else:
        arch = a.arch or TABLE[0].name
        spec = synth.arch_preset(arch, a.preset or "tiny", a.seed)
        what = synth.preset_name(arch, a.preset or "tiny")
    if a.expert_type in synth.MIXES and a.dense_type is None:
        a.dense_type = a.expert_type  # a Q4_K_M file: every matrix by the mix's rules
    overrides = {k: v for k, v in (
        ("popularity_skew", a.popularity_skew), ("update_early", a.update_early),
        ("update_late", a.update_late), ("router_scale", a.router_scale),
        ("expert_type", a.expert_type), ("dense_type", a.dense_type),
        ("tokenizer", a.tokenizer),
    ) if v is not None}
    if overrides:
        from dataclasses import replace

        spec = replace(spec, **overrides)
    out = Path(a.output)
    if not out.resolve().parent.is_dir():
        raise UsageError(f"`-o`: folder {out.resolve().parent} does not exist")
    print(f"writing {what} (seed {a.seed}, experts {spec.expert_type}) to {out} ...",
          file=sys.stderr, flush=True)
    try:
        synth.write_model(spec, out, name=f"abbench-synthetic-{(a.shape or what)}")
    except OSError as e:  # a folder that takes no files (/proc), a full disk
        then = ("give `-o` a regular file's path" if e.errno == errno.EINVAL
                else "give `-o` a writable folder")
        raise WriteError.from_os(e, then) from e
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


def _expert_bytes(info: dict[str, Any]) -> str:
    """One expert in the file and in the cache, as the default kernels hold it."""
    mib = 2**20
    held = set(info["expert_resident_bytes"])
    sizes = " / ".join(f"{b / mib:.3f}" for b in sorted(held))
    if info["kernels"] == "ggml":
        how = "the file's types, computed by ggml"
    else:
        how = "F32, converted by numpy" if info["expert_bytes"] != info["expert_f32_bytes"] \
            else "F32"
    return f"{info['expert_bytes'] / mib:.3f} MiB in the file, {sizes} MiB resident ({how})"


def _held(resident: list[int], n_expert: int, budget_mib: int) -> int:
    """How many experts a cache of `budget_mib` holds, at the layers' mean expert size."""
    mean = sum(resident) / len(resident)
    return min(n_expert * len(resident), int(budget_mib * 2**20 // mean))


def cmd_model_info(a: argparse.Namespace) -> int:
    mf = ModelFile(resolve_model(a.model))
    info = model_info(mf)
    # Metadata arrays past what abbench reads are walked over, never decoded: say so.
    info["unread_arrays"] = mf.unread_arrays()
    if a.json:
        print(json.dumps(info, indent=1))
        return 0
    mib = 2**20
    slices = info["expert_slice_bytes"]
    resident = info["expert_resident_bytes"]
    rows = [
        ("file", f"{info['path']} ({info['file_bytes'] / mib:.1f} MiB, "
                 f"alignment {info['alignment']})"),
        ("architecture", f"{info['architecture']} ({info['name'] or 'unnamed'})"),
        ("layers", info["n_layer"]),
        ("experts", f"{info['n_expert']} per layer, top-{info['n_expert_used']}"),
        ("d_model / expert ff", f"{info['d_model']} / {info['expert_ff']}"),
        ("heads", f"{info['n_head']} q, {info['n_head_kv']} kv, head dim {info['head_dim']}"),
        ("vocab / context", f"{info['vocab_size']} / {info['context_length']}"),
        ("tensor types", ", ".join(info["tensor_types"])),
        ("dense bytes", f"{info['dense_bytes'] / mib:.2f} MiB"),
        ("expert slice bytes", f"gate {slices['gate']}, up {slices['up']}, down {slices['down']}"),
        ("expert bytes", _expert_bytes(info)),
        ("all experts", f"{info['expert_file_bytes'] / mib:.1f} MiB in the file, "
                        f"{sum(resident) * info['n_expert'] / mib:.1f} MiB resident "
                        "(--resident)"),
        ("cache budgets", ", ".join(
            f"{budget} MiB holds {_held(resident, info['n_expert'], budget)} experts"
            for budget in (256, 1024, 4096)) + f" (of {info['n_expert'] * len(resident)})"),
        ("routed per token", f"{info['routed_bytes_per_token'] / mib:.1f} MiB"),
    ]
    number = (int, float)
    stored = []
    if isinstance(info["sampling_temp"], number):
        stored.append(f"temp {info['sampling_temp']:.7g}")
    if isinstance(info["sampling_penalty_repeat"], number):
        last_n = info["sampling_penalty_last_n"]
        stored.append(f"repeat penalty {info['sampling_penalty_repeat']:.7g}"
                      + (f" over the last {last_n} tokens" if isinstance(last_n, int) else ""))
    if stored:
        rows.append(("sampling defaults", ", ".join(stored)))
    unread = info["unread_arrays"]
    if unread:
        listed = [f"`{show(k)}` ({v})" for k, v in list(unread.items())[:UNREAD_SHOWN]]
        more = len(unread) - len(listed)
        rows.append(("metadata not read", ", ".join(listed) + (f" and {more} more" if more
                                                                else "")))
    if info["synthetic"]:
        rows.append(("synthetic", ", ".join(f"{k}={v}" for k, v in info["synthetic"].items())))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:  # the name, architecture and types are the file's words, not ours
        print(f"{k:<{width}}  {shown(v)}")
    return 0
