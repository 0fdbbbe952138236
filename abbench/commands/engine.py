"""`abbench engine run`: the embedded engine's decode.

`abbench.cli` mounts these; campaigns run `python -m abbench engine run ... --json FILE` in
a child process. Every flag maps to an `EngineConfig` field of the same name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from abbench.engine.config import DEFAULT_PROMPT, EngineConfig
from abbench.engine.models import resolve_model
from abbench.engine.predictor import control_warning
from abbench.engine.session import Engine
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


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    run.set_defaults(func=run_engine)


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


def run_engine(a: argparse.Namespace) -> int:
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


run = run_engine
