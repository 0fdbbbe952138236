"""`abbench replay TRACE`: the offline answers of `analysis.replay`, printed as the replay
report (`report.replay`) or its JSON document."""

from __future__ import annotations

import argparse
import json
import sys

from abbench.analysis.replay import DROP_FACTORS, replay
from abbench.commands.args import drop_factor, mib
from abbench.records.route_trace import read_route_trace
from abbench.report.replay import render, to_json

HELP = "offline answers from a route trace: cache policies, predictors, drop trade"
DESCRIPTION = ("Replay a route_trace v1 file: hit % of LRU / LFU / Belady-optimal "
               "caches at given budgets, decode predictor accuracies (previous token at lags "
               "1/2/4/8, the run's and the prompt's hottest-k, random), and the drop policy's "
               "trade per threshold. Definitions: docs/replay.md.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help="a route_trace v1 file (.route.csv)")
    p.add_argument("--cache-mib", type=mib, nargs="+", action="extend", metavar="MIB",
                   help="cache budgets to replay (default: the trace's own, if its preamble "
                   "says, plus a doubling ladder from half a token's experts to all of them)")
    p.add_argument("--drop-factors", type=drop_factor, nargs="+", action="extend", metavar="F",
                   help="drop thresholds as F x uniform weight (F/k); default "
                   + " ".join(map(str, DROP_FACTORS)))
    p.add_argument("--json", action="store_true", help="print a JSON document instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    trace = read_route_trace(args.trace)
    result = replay(trace, args.cache_mib, args.drop_factors or DROP_FACTORS)
    if args.json:
        json.dump(to_json(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result))
    return 0


