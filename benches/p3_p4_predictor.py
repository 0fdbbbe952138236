"""P3 and P4 — what the predictor costs per token (DESIGN 9: P3 <= 1.05, P4 <= 1.02).

P3: `--predict-log` (stale-gate, prev-token and control scored per layer) against the same
run without it. P4: `--predict-prefetch --predict-spec-max 0` (stale-gate prediction and
retention, no speculative reads) against the same run without it.

Both are measured inside one decode, token by token: the probe is switched on for odd
tokens and off for even ones (it never touches the loading path, so switching it changes
nothing but its own cost), and each "on" token is compared with the mean of its two "off"
neighbours; the median of those ratios is reported. Every expert is resident, so no I/O
hides the cost: this is the strictest setting. Retention only reorders the LRU, which in a
resident run changes no read.

    python benches/p3_p4_predictor.py [--tokens 96] [--model synthetic:default]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from abbench.engine.config import EngineConfig
from abbench.engine.models import resolve_model
from abbench.engine.predictor import RoutePredictor
from abbench.engine.session import Engine, TokenRecord


def measure(model: str, tokens: int, mode: str) -> tuple[float, list[float]]:
    cfg = EngineConfig(ignore_eos=True, model=model, n_tokens=tokens, resident=True,
                       predict_log=mode == "log", predict_prefetch=mode == "prefetch",
                       predict_spec_max=0)
    with Engine(cfg, resolve_model(model)) as engine:
        predictor = engine.predictor
        assert isinstance(predictor, RoutePredictor)
        runner = engine.runner
        on_policies = runner.policies
        off_policies = replace(on_policies, predict_prefetch=False)
        times: list[float] = []
        seen = [0]

        def switch(rec: TokenRecord) -> None:
            times.append(rec.wall_ms)
            seen[0] += 1
            on = seen[0] % 2 == 1  # the next token
            engine.model.routing_hook = predictor if on else None
            runner.policies = on_policies if on else off_policies

        engine.model.routing_hook = None
        runner.policies = off_policies
        engine.run(on_token=switch)
    # times[0] ran with the probe off, times[1] on, ...; skip warm-up
    ratios = []
    for i in range(5, len(times) - 1, 2):
        ratios.append(times[i] / ((times[i - 1] + times[i + 1]) / 2))
    on = statistics.median(times[5::2])
    off = statistics.median(times[4::2])
    return statistics.median(ratios), [on, off]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:default")
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    p3, (on3, off3) = measure(a.model, a.tokens, "log")
    p4, (on4, off4) = measure(a.model, a.tokens, "prefetch")
    print(f"model: {a.model}, resident, {a.tokens} tokens, probe on odd tokens, off on even")
    print(f"--predict-log: median token {on3:.2f} ms on, {off3:.2f} ms off")
    print(f"P3 ratio (with / without --predict-log), median of per-token ratios: {p3:.3f}  "
          f"bar <= 1.05")
    print(f"--predict-prefetch --predict-spec-max 0: median token {on4:.2f} ms on, "
          f"{off4:.2f} ms off")
    print(f"P4 ratio (with / without), median of per-token ratios: {p4:.3f}  bar <= 1.02")


if __name__ == "__main__":
    main()
