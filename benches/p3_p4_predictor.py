"""P3 and P4 — what the predictor costs per token (docs/benches.md: P3 <= 1.05, P4 <= 1.02).

P3: `--predict-log` (stale-gate, prev-token and control scored per layer) against the same
run without it. P4: `--predict-prefetch --predict-spec-max 0` (stale-gate prediction and
retention, no speculative reads) against the same run without it.

Both are measured inside one decode, token by token: the probe is switched on for odd
tokens and off for even ones (it never touches the loading path, so switching it changes
nothing but its own cost), and each "on" token is compared with the mean of its two "off"
neighbours; the median of those ratios is reported against the bar, with their quartiles
and the ratio of the mean "on" token to the mean "off" one beside it (the mean counts the
few tokens that compare a batch of `--predict-log` scores, every 64 tokens of a 16-layer
model: `RouteTally`). Every expert is resident, so no I/O hides the cost: this is the
strictest setting. A resident cache keeps no recency (it never evicts), so retention
there costs its bookkeeping only.

    python benches/p3_p4_predictor.py [--tokens 256] [--model synthetic:default]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from abbench.engine.config import EngineConfig
from abbench.engine.experts.predictor import RoutePredictor
from abbench.engine.run.models import resolve_model
from abbench.engine.run.session import Engine, TokenRecord


def measure(model: str, tokens: int, mode: str) -> tuple[list[float], list[float]]:
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
    return ratios, [statistics.mean(times[5:-1:2]), statistics.mean(times[4:-1:2])]


def summary(ratios: list[float], means: list[float]) -> str:
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    return (f"{med:.3f} (quartiles {q1:.3f}-{q3:.3f}; mean token on/off "
            f"{means[0] / means[1]:.3f}, {means[0]:.2f}/{means[1]:.2f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:default")
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    p3 = measure(a.model, a.tokens, "log")
    p4 = measure(a.model, a.tokens, "prefetch")
    print(f"model: {a.model}, resident, {a.tokens} tokens, probe on odd tokens, off on even")
    print(f"P3 ratio (with / without --predict-log), median of per-token ratios: "
          f"{summary(*p3)}  bar <= 1.05")
    print(f"P4 ratio (--predict-prefetch --predict-spec-max 0, with / without), median of "
          f"per-token ratios: {summary(*p4)}  bar <= 1.02")


if __name__ == "__main__":
    main()
