"""`abbench engine run`: the embedded engine's decode.

`abbench.cli` mounts these; campaigns run `python -m abbench engine run ... --json FILE` in
a child process. Every flag maps to an `EngineConfig` field of the same name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from abbench.engine.config import EngineConfig, add_options, from_args
from abbench.engine.experts.predictor import control_warning
from abbench.engine.run.models import resolve_model
from abbench.engine.run.session import Engine
from abbench.engine.run.telemetry import summarize, summary_lines, write_csv, write_json
from abbench.errors import UsageError, WriteError
from abbench.textsafe import shown

HELP = "run the embedded MoE streaming engine"
DESCRIPTION = None


def add_arguments(engine: argparse.ArgumentParser) -> None:
    esub = engine.add_subparsers(dest="engine_cmd", required=True, metavar="COMMAND")
    run = esub.add_parser(
        "run",
        help="decode N tokens, streaming experts from the model file",
        description="Decode N tokens with the embedded numpy MoE engine, streaming expert "
        "weights from the GGUF file through an LRU cache. Prints the summary lines; "
        "--csv and --json write per-token telemetry.",
    )
    add_options(run)
    o = run.add_argument_group("output")
    o.add_argument("--csv", metavar="FILE", help="per-token rows, bmoe_metrics layout")
    o.add_argument("--json", metavar="FILE",
                   help="summary, resolved configuration, fingerprint and per-token arrays")
    o.add_argument("--show-text", action="store_true", help="print the generated text")
    o.add_argument("-q", "--quiet", action="store_true", help="no summary lines on stdout")
    run.set_defaults(func=run_engine)


def config_from_args(a: argparse.Namespace) -> EngineConfig:
    return from_args(a)


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
    # A destination that refuses the file (a full disk or device, a fifo nobody reads)
    # is one error after the run's own lines: what was measured is still printed.
    refused: OSError | None = None
    for where, write in ((a.csv, write_csv), (a.json, write_json)):
        if where:
            try:
                write(where, result)
            except OSError as e:
                refused = refused or e
    if a.show_text:  # the bytes as they are, as llama.cpp prints them
        sys.stdout.flush()
        sys.stdout.buffer.write(result.text_bytes + b"\n")
        sys.stdout.buffer.flush()
    if not a.quiet:
        for line in summary_lines(result, summarize(result)):
            print(line)
    if engine.predictor is not None and cfg.predict_log:
        problem = control_warning(engine.predictor.scores)
        if problem:
            print(f"WARNING: {shown(problem)}", file=sys.stderr)
    if refused is not None:
        raise WriteError.from_os(refused, "give another path")
    return 0


run = run_engine
