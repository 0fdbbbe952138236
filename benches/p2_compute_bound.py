"""P2 — compute-bound decode against its roofline (DESIGN 9: bar >= 0.65).

Every expert resident (`--resident`), so a token does no I/O. The roofline of a token is the
weight bytes it touches — its routed experts plus the dense weights (the embedding counts as
one row) — streamed through one large F32 GEMV in the same process. After every decoded
token the bench times that GEMV (best of 3), so each token has a roofline measured next to
it; the ratio roofline / token time is taken per token and its median reported, which keeps
a shared machine's drift out of the figure.

    python benches/p2_compute_bound.py [--tokens 64] [--model synthetic:default]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from abbench.engine.config import EngineConfig
from abbench.engine.models import resolve_model
from abbench.engine.session import Engine, TokenRecord

MIB = 2**20
SETTLE_S = 0.15


def touched_bytes(info: dict) -> int:
    """Weight bytes one decode token reads: routed experts (F32) + dense (embedding: one row)."""
    embd_bytes = info["vocab_size"] * info["d_model"] * 4
    dense = info["dense_bytes"] - embd_bytes + info["d_model"] * 4
    experts = info["n_layer"] * info["n_expert_used"] * info["expert_f32_bytes"]
    return dense + experts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:default")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    cfg = EngineConfig(model=a.model, n_tokens=a.tokens + a.warmup, resident=True,
                       threads=a.threads)
    with Engine(cfg, resolve_model(a.model)) as engine:
        nbytes = touched_bytes(engine.info)
        d = engine.info["d_model"]
        big = np.full((nbytes // 4 // d, d), 0.01, np.float32)  # (rows, d) the roofline GEMV
        x = np.ones(d, np.float32)
        roof: list[float] = []
        blas_threads = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

        def gemv_after(rec: TokenRecord) -> None:
            # The engine runs BLAS single-threaded; the roofline gets every BLAS thread.
            with threadpool_limits(limits=blas_threads, user_api="blas"):
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    big @ x
                    best = min(best, time.perf_counter() - t0)
            roof.append(best)
            # OpenBLAS's idle workers busy-wait for ~0.1 s after a threaded call and would
            # take a core from the next token; sleeping instead would let the core clock
            # down. So keep this core busy until they have gone to sleep.
            until = time.perf_counter() + SETTLE_S
            while time.perf_counter() < until:
                pass

        result = engine.run(on_token=gemv_after)
    toks = [r.wall_ms / 1e3 for r in result.decode][a.warmup:]
    roofs = roof[a.warmup:]
    ratios = [r / t for r, t in zip(roofs, toks)]
    med_tok, med_roof = statistics.median(toks), statistics.median(roofs)
    print(f"model: {a.model}, {result.threads} threads, {len(toks)} tokens after "
          f"{a.warmup} warm-up")
    print(f"bytes touched per token: {nbytes / MIB:.1f} MiB "
          f"(experts {engine.info['n_layer']}x{engine.info['n_expert_used']}x"
          f"{engine.info['expert_f32_bytes'] / MIB:.2f} MiB + dense)")
    print(f"roofline GEMV: median {med_roof * 1e3:.2f} ms ({nbytes / med_roof / 1e9:.1f} GB/s)")
    print(f"decode token:  median {med_tok * 1e3:.2f} ms ({nbytes / med_tok / 1e9:.1f} GB/s)")
    print(f"P2 ratio (roofline / measured), median of per-token ratios: "
          f"{statistics.median(ratios):.3f}  [p10 {np.percentile(ratios, 10):.3f}, "
          f"p90 {np.percentile(ratios, 90):.3f}]  bar >= 0.65")


if __name__ == "__main__":
    main()
