"""P2 — compute-bound decode against its roofline (docs/benches.md: bar >= 0.65).

Every expert resident (`--resident`), so a token does no I/O. The roofline of a token is the
weight bytes it touches — its routed experts plus the dense weights (the embedding counts as
one row), as the engine holds them — streamed through one large GEMV in the same process,
in the type the engine computes in: an F32 file's through BLAS on every thread (the engine
itself runs BLAS single-threaded, and with every expert resident splits each layer's GEMVs
and experts between the caller and a partner process: see engine/kernels/partner.py); a quantized
file's through ggml's kernel for its experts' type on the engine's threads, repacked where
the engine repacks (the roofline is per type: a Q4_K GEMV dequantizes as it streams).

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
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType
from threadpoolctl import threadpool_info, threadpool_limits

from abbench.engine.config import EngineConfig
from abbench.engine.kernels import ggml
from abbench.engine.kernels.partner import Partner
from abbench.engine.kernels.qcompute import QuantTeam, Weight
from abbench.engine.run.models import resolve_model
from abbench.engine.run.session import Engine, TokenRecord

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


def roofline_gemv(engine: Engine, nbytes: int, d: int, blas: int) -> Callable[[], None]:
    """One GEMV over `nbytes` of weights, the fastest way this machine multiplies the type
    the engine computes in: F32 by BLAS on every thread, or — where ggml computes the
    experts in the file's type — ggml's kernel for that type on the engine's threads,
    repacked as the engine's resident experts are (the roofline is per type)."""
    if engine.kernels != "ggml":
        big = np.full((nbytes // 4 // d, d), 0.01, np.float32)  # (rows, d)
        x = np.ones(d, np.float32)

        def f32() -> None:
            with threadpool_limits(limits=blas, user_api="blas"):
                big @ x

        return f32
    team = engine.runner.team
    assert isinstance(team, QuantTeam)
    gtype = int(GGMLQuantizationType[engine.runner.kernel_types["gate"][0]])
    block = ggml.quantize(np.random.default_rng(0).standard_normal((256, d)).astype(
        np.float32), gtype)  # (256, row bytes): tiled, its bytes fill the matrix
    rows = nbytes // block.shape[1] // 256 * 256
    w = np.tile(block, (rows // 256, 1))  # (rows, row bytes)
    weight = Weight(gtype, rows, d, w, False)
    if team.repacker is not None and engine.runner.repacked:
        packed = np.empty_like(w)
        probe = ggml.Context(team.g, 1)
        head = probe.tensor(gtype, (d, rows), packed.ctypes.data)
        if team.repacker.attach(head):
            team.repacker.write(head, w.ctypes.data)
            weight = Weight(gtype, rows, d, packed, True)
    ctx = ggml.Context(team.g, 4, 16)
    x = np.ones((1, d), np.float32)
    y = np.zeros((1, rows), np.float32)
    out = ctx.mul_mat(weight.tensor(ctx, team.repacker),
                      ctx.tensor(ggml.F32, (d, 1), x.ctypes.data), y.ctypes.data)
    graph = ctx.graph([out], team.threads_pool)
    keep = (ctx, weight, x, y)
    return lambda: graph.compute() if keep else None


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
        gemv = roofline_gemv(engine, nbytes, d, blas)
        roofs: list[float] = []
        blocks: list[list[float]] = []
        seen = [0]

        def roofline() -> None:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                gemv()
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
    kind = ("F32 by BLAS" if engine.kernels != "ggml" else
            f"{engine.runner.kernel_types['gate'][0]} by ggml"
            + (" (repacked)" if engine.runner.repacked else ""))
    print(f"roofline GEMV ({kind}): median {med_roof * 1e3:.2f} ms "
          f"({nbytes / med_roof / 1e9:.1f} GB/s)")
    print(f"decode token:  median {med_tok * 1e3:.2f} ms ({nbytes / med_tok / 1e9:.1f} GB/s)")
    print(f"block ratios: {' '.join(f'{r:.3f}' for r in ratios)}")
    print(f"P2 ratio (roofline / measured), median over blocks: "
          f"{statistics.median(ratios):.3f}  bar >= 0.65")


if __name__ == "__main__":
    main()
