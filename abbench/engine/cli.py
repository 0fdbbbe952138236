"""The engine's own commands: `engine run`, `model synth`, `model info`.

`abbench.cli` mounts these; campaigns run `python -m abbench engine run ... --json FILE` in
a child process. Every flag maps to an `EngineConfig` field of the same name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from abbench.engine import synth
from abbench.engine.config import DEFAULT_PROMPT, EngineConfig
from abbench.engine.gguf_file import ModelFile
from abbench.engine.models import resolve_model
from abbench.engine.predictor import control_warning
from abbench.engine.session import Engine, model_info
from abbench.engine.telemetry import summarize, summary_lines, write_csv, write_json
from abbench.errors import UsageError


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids, got `{text}`"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


def add_engine_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    engine = sub.add_parser("engine", help="run the embedded MoE streaming engine")
    esub = engine.add_subparsers(dest="engine_cmd", required=True, metavar="COMMAND")
    run = esub.add_parser(
        "run",
        help="decode N tokens, streaming experts from the model file",
        description="Decode N tokens with the embedded numpy MoE engine, streaming expert "
        "weights from the GGUF file through an LRU cache. Prints the summary lines; "
        "--csv and --json write per-token telemetry.",
    )
    m = run.add_argument_group("model and workload")
    m.add_argument("-m", "--model", required=True,
                   help="a .gguf file, or synthetic:tiny|small|default[@SEED] (built once)")
    m.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="prompt text (byte vocabularies)")
    m.add_argument("--prompt-tokens", type=_token_ids, metavar="IDS",
                   help="prompt as comma-separated token ids (overrides --prompt)")
    m.add_argument("-n", "--n-tokens", type=int, default=64, metavar="N",
                   help="tokens to decode (default 64)")
    m.add_argument("--temp", type=float, default=None,
                   help="sampling temperature; 0 = greedy (default: the model's "
                   "general.sampling.temp, 1.0 on synthetic models, else greedy)")
    m.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    m.add_argument("--repeat-penalty", type=float, default=None, metavar="P",
                   help="divide the positive logits (multiply the negative ones) of tokens "
                   "among the last --repeat-last-n by P; 1 = off (default: the model's "
                   "general.sampling.penalty_repeat, 1.1 on synthetic models, else 1)")
    m.add_argument("--repeat-last-n", type=int, default=None, metavar="N",
                   help="how many of the context's last tokens the penalty covers, prompt "
                   "included (default: the model's general.sampling.penalty_last_n, else 64)")
    m.add_argument("--n-expert-used", type=int, metavar="K",
                   help="override the model's top-k")
    m.add_argument("--n-ctx", type=int, help="KV cache length (default: prompt + N)")
    m.add_argument("--stop-at-eos", action="store_true",
                   help="stop at the end-of-sequence token (default: always decode N)")
    s = run.add_argument_group("streaming")
    s.add_argument("--dense", choices=["pinned", "mmap"], default="pinned",
                   help="dense weights read into anonymous memory at load (pinned, default) "
                   "or left to the page cache (mmap)")
    s.add_argument("--resident", action="store_true",
                   help="load every expert at startup (the reference for the gates)")
    s.add_argument("--cache-mib", type=float, default=256.0, metavar="MIB",
                   help="LRU expert cache budget in MiB; 0 = no cache (default 256)")
    s.add_argument("--io-lanes", type=int, default=4, metavar="N",
                   help="reader threads, each with its own descriptor (default 4)")
    s.add_argument("--o-direct", action=argparse.BooleanOptionalAction, default=True,
                   help="bypass the page cache for expert reads (default on; falls back "
                   "with a warning where the filesystem refuses)")
    s.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=False,
                   help="compute resident experts while missing ones load (default off)")
    s.add_argument("--threads", type=int, default=0, metavar="N",
                   help="expert compute threads (default: one per core, up to 8)")
    pol = run.add_argument_group("policies (all off by default)")
    pol.add_argument("--drop-cold-experts", type=float, metavar="F",
                     help="in decode, skip a routed expert that is not resident and whose "
                     "weight is below F/k (0 < F <= 1; the top expert is never skipped; "
                     "needs the cache)")
    pol.add_argument("--drop-in-prefill", action="store_true",
                     help="drop during prefill too")
    pol.add_argument("--drop-no-renorm", action="store_true",
                     help="do not renormalise the surviving experts' weights")
    pol.add_argument("--prefetch", type=int, default=0, metavar="K",
                     help="after each layer's load, speculatively read the experts the "
                     "previous token routed at the next K layers (needs the cache)")
    pol.add_argument("--prefetch-sync", action="store_true",
                     help="complete speculative reads at once (deterministic; for tests)")
    pol.add_argument("--predict-log", action="store_true",
                     help="score the stale-gate, previous-token and control predictors per "
                     "layer (reads the same bytes; do not read tok/s off a probed run)")
    pol.add_argument("--predict-prefetch", action="store_true",
                     help="speculate the stale-gate prediction of the next layer "
                     "(exclusive with --prefetch; needs the cache)")
    pol.add_argument("--predict-spec-max", type=int, default=2, metavar="N",
                     help="speculate at most the top N predicted misses per layer, 0..8; "
                     "0 = retention only (default 2)")
    pol.add_argument("--route-trace", metavar="FILE",
                     help="write one row per routed expert (route_trace v1)")
    o = run.add_argument_group("output")
    o.add_argument("--csv", metavar="FILE", help="per-token rows, bmoe_metrics layout")
    o.add_argument("--json", metavar="FILE",
                   help="summary, resolved configuration, fingerprint and per-token arrays")
    o.add_argument("--show-text", action="store_true", help="print the generated text")
    o.add_argument("-q", "--quiet", action="store_true", help="no summary lines on stdout")
    run.set_defaults(func=cmd_engine_run)


def add_model_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    model = sub.add_parser("model", help="write synthetic models, describe model files")
    msub = model.add_subparsers(dest="model_cmd", required=True, metavar="COMMAND")
    sy = msub.add_parser("synth", help="write a synthetic qwen3moe GGUF model",
                         description="Write a synthetic qwen3moe model whose routing behaves "
                         "like a trained model's. Presets: " + ", ".join(
                             f"{k} ({v.n_layer} layers, {v.n_expert} experts, top-{v.n_expert_used}"
                             f", d={v.d_model})" for k, v in synth.PRESETS.items()))
    sy.add_argument("--preset", default="tiny", choices=list(synth.PRESETS))
    sy.add_argument("--seed", type=int, default=0)
    sy.add_argument("-o", "--output", required=True, metavar="FILE")
    for knob, default, text in (
        ("popularity-skew", None, "Zipf-like expert popularity strength"),
        ("update-early", None, "first layer's residual update size"),
        ("update-late", None, "last layers' residual update size"),
        ("router-scale", None, "spread of router logits"),
    ):
        sy.add_argument(f"--{knob}", type=float, default=default, help=text + " (preset default)")
    sy.add_argument("--expert-type", choices=["F32", "F16", "BF16", "Q8_0"],
                    help="storage type of expert tensors (default F32)")
    sy.add_argument("--dense-type", choices=["F32", "F16", "BF16", "Q8_0"],
                    help="storage type of large dense tensors (default F32)")
    sy.set_defaults(func=cmd_model_synth)
    info = msub.add_parser("info", help="architecture and sizes of a model file")
    info.add_argument("model", help="a .gguf file or synthetic:PRESET")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_model_info)


def config_from_args(a: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=a.model, prompt=a.prompt, prompt_tokens=a.prompt_tokens, n_tokens=a.n_tokens,
        temp=a.temp, seed=a.seed, repeat_penalty=a.repeat_penalty,
        repeat_last_n=a.repeat_last_n, n_expert_used=a.n_expert_used, n_ctx=a.n_ctx,
        stop_at_eos=a.stop_at_eos, dense=a.dense, resident=a.resident, cache_mib=a.cache_mib,
        io_lanes=a.io_lanes, o_direct=a.o_direct, overlap=a.overlap, threads=a.threads,
        drop_cold_experts=a.drop_cold_experts, drop_in_prefill=a.drop_in_prefill,
        drop_no_renorm=a.drop_no_renorm, prefetch=a.prefetch, prefetch_sync=a.prefetch_sync,
        predict_log=a.predict_log, predict_prefetch=a.predict_prefetch,
        predict_spec_max=a.predict_spec_max, route_trace=a.route_trace,
    )


def _check_writable(path: str | None, flag: str) -> None:
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"`{flag}`: folder {parent} does not exist")


def cmd_engine_run(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    _check_writable(a.csv, "--csv")
    _check_writable(a.json, "--json")
    _check_writable(a.route_trace, "--route-trace")
    path = resolve_model(cfg.model)
    with Engine(cfg, path) as engine:
        result = engine.run()
    if a.csv:
        write_csv(a.csv, result)
    if a.json:
        write_json(a.json, result)
    if a.show_text:
        print(result.text)
    if not a.quiet:
        for line in summary_lines(result, summarize(result)):
            print(line)
    if engine.predictor is not None and cfg.predict_log:
        problem = control_warning(engine.predictor.scores)
        if problem:
            print(f"WARNING: {problem}", file=sys.stderr)
    return 0


def cmd_model_synth(a: argparse.Namespace) -> int:
    spec = synth.preset(a.preset, a.seed)
    overrides = {k: v for k, v in (
        ("popularity_skew", a.popularity_skew), ("update_early", a.update_early),
        ("update_late", a.update_late), ("router_scale", a.router_scale),
        ("expert_type", a.expert_type), ("dense_type", a.dense_type),
    ) if v is not None}
    if overrides:
        from dataclasses import replace

        spec = replace(spec, **overrides)
    out = Path(a.output)
    if not out.resolve().parent.is_dir():
        raise UsageError(f"`-o`: folder {out.resolve().parent} does not exist")
    print(f"writing {a.preset} (seed {a.seed}) to {out} ...", file=sys.stderr, flush=True)
    synth.write_model(spec, out, name=f"abbench-synthetic-{a.preset}")
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


def cmd_model_info(a: argparse.Namespace) -> int:
    mf = ModelFile(resolve_model(a.model))
    info = model_info(mf)
    if a.json:
        print(json.dumps(info, indent=1))
        return 0
    mib = 2**20
    slices = info["expert_slice_bytes"]
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
        ("expert bytes", f"{info['expert_bytes'] / mib:.3f} MiB in the file, "
                         f"{info['expert_f32_bytes'] / mib:.3f} MiB resident (F32)"),
        ("all experts", f"{info['expert_file_bytes'] / mib:.1f} MiB"),
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
    if info["synthetic"]:
        rows.append(("synthetic", ", ".join(f"{k}={v}" for k, v in info["synthetic"].items())))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
