"""P2 — compute-bound decode against its roofline (DESIGN 9: bar >= 0.65).

Every expert resident (`--resident`), so a token does no I/O. The roofline of a token is the
weight bytes it touches — its routed experts plus the dense weights (the embedding counts as
one row) — streamed through one large F32 GEMV in the same process, with every BLAS thread
(the engine itself runs BLAS single-threaded, and with every expert resident splits each
layer's GEMVs and experts between the caller and a partner process: see engine/partner.py).

The two are measured side by side: decode runs in blocks of `--block` tokens, and between
blocks the roofline GEMV is timed (best of 3). Each block's ratio is the mean of the
rooflines before and after it over the block's median token time; the median block ratio
is the result, so a shared machine's drift cancels. The first tokens after a roofline are
not counted: its 200+ MiB stream flushes the CPU caches that steady decode keeps warm (the
dense weights, popular experts), and OpenBLAS's idle workers busy-wait for a while after a
threaded call (the bench keeps its own core busy until they sleep: an idle core clocks down).

    python benches/p2_compute_bound.py [--blocks 8] [--block 8] [--model synthetic:default]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from abbench.engine.config import EngineConfig
from abbench.engine.models import resolve_model
from abbench.engine.partner import Partner
from abbench.engine.session import Engine, TokenRecord

MIB = 2**20
SETTLE_S = 0.15  # OpenBLAS's worker spin time after a threaded call is ~0.1 s
SKIP_AFTER_ROOFLINE = 6  # the roofline GEMV flushes the caches the decode had warmed


def touched_bytes(info: dict) -> int:
    """Weight bytes one decode token reads, as the engine holds them: the routed experts
    (F32, or the file's bytes where ggml computes them in the file's types: the roofline
    is per type) + dense (embedding: one row)."""
    embd_bytes = info["vocab_size"] * info["d_model"] * 4
    dense = info["dense_bytes"] - embd_bytes + info["d_model"] * 4
    experts = info["n_expert_used"] * sum(info["expert_resident_bytes"])
    return dense + experts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:default")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block", type=int, default=16, help="tokens counted per block")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    n = a.warmup + a.blocks * (a.block + SKIP_AFTER_ROOFLINE)
    cfg = EngineConfig(ignore_eos=True, model=a.model, n_tokens=n, resident=True, threads=a.threads)
    blas = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
    with Engine(cfg, resolve_model(a.model)) as engine:
        info = engine.info
        partnered = isinstance(engine.runner.team, Partner)
        nbytes = touched_bytes(info)
        d = info["d_model"]
        big = np.full((nbytes // 4 // d, d), 0.01, np.float32)  # (rows, d) the roofline GEMV
        x = np.ones(d, np.float32)
        roofs: list[float] = []
        blocks: list[list[float]] = []
        seen = [0]

        def roofline() -> None:
            with threadpool_limits(limits=blas, user_api="blas"):
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    big @ x
                    best = min(best, time.perf_counter() - t0)
            roofs.append(best)
            until = time.perf_counter() + SETTLE_S
            while time.perf_counter() < until:
                pass

        def after(rec: TokenRecord) -> None:
            seen[0] += 1
            i = seen[0] - a.warmup
            if i <= 0:
                if i == 0:
                    roofline()
                    blocks.append([])
                return
            pos = (i - 1) % (a.block + SKIP_AFTER_ROOFLINE)
            if pos >= SKIP_AFTER_ROOFLINE:
                blocks[-1].append(rec.wall_ms / 1e3)
            if pos == a.block + SKIP_AFTER_ROOFLINE - 1:
                roofline()
                if len(blocks) < a.blocks:
                    blocks.append([])

        result = engine.run(on_token=after)
    ratios, medians = [], []
    for k, toks in enumerate(blocks):
        if not toks or k + 1 >= len(roofs):
            continue
        med = statistics.median(toks)
        medians.append(med)
        ratios.append((roofs[k] + roofs[k + 1]) / 2 / med)
    team = "the caller + a partner process" if partnered else f"{result.threads} compute threads"
    print(f"model: {a.model}, {team} (BLAS 1 in the engine, {blas} for the roofline), "
          f"{len(ratios)} blocks of {a.block} tokens")
    per_expert = sum(info["expert_resident_bytes"]) / info["n_layer"]
    experts = info["n_expert_used"] * sum(info["expert_resident_bytes"])
    print(f"bytes touched per token: {nbytes / MIB:.1f} MiB (experts {info['n_layer']}x"
          f"{info['n_expert_used']}x{per_expert / MIB:.2f} MiB as held ({info['kernels']}) "
          f"+ dense {(nbytes - experts) / MIB:.1f})")
    med_roof, med_tok = statistics.median(roofs), statistics.median(medians)
    print(f"roofline GEMV: median {med_roof * 1e3:.2f} ms ({nbytes / med_roof / 1e9:.1f} GB/s)")
    print(f"decode token:  median {med_tok * 1e3:.2f} ms ({nbytes / med_tok / 1e9:.1f} GB/s)")
    print(f"block ratios: {' '.join(f'{r:.3f}' for r in ratios)}")
    print(f"P2 ratio (roofline / measured), median over blocks: "
          f"{statistics.median(ratios):.3f}  bar >= 0.65")


if __name__ == "__main__":
    main()
