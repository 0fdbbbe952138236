"""Kernels: one MoE layer of quantized experts, each way the engine could compute it.

The work: 8 of 128 experts of the Qwen3-30B-A3B geometry (gate and up 768x2048, down
2048x768) on one input vector, chosen at random each call from a stack as large as a
real layer's (so the weights stream from memory, not a cache), in Q4_K (and Q8_0).
Each way runs in turn, round after round (the host's speed moves between seconds), and
the median of each is printed with its speed over ggml's plain kernel in the same run:

- numpy reference: each expert's three matrices dequantized by `gguf.quants` after the
  read, then F32 GEMVs (what the engine did before it computed in the file's types);
- numpy F32: the same GEMVs on weights dequantized once (an F32 copy 7x, Q8_0 3.8x, the
  file's size: the memory a cache would need), one BLAS thread a GEMV as the numpy engine
  runs them (its own threads split the experts; here they run one after another, so
  this way uses one core where ggml's use two);
- ggml plain: llama.cpp's `mul_mat_id` graph over the file's bytes (`--no-repack`);
- ggml repacked: the same over weights re-laid for the repacked kernels (`--repack`),
  where this CPU has a layout for the type.

    python benches/kernels.py [--rounds 7] [--threads 2] [--types Q4_K Q8_0]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from threadpoolctl import threadpool_limits

from abbench.engine.kernels import ggml
from abbench.engine.kernels.compute import Job
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.streaming.slots import Part, RawSlot, SlotLayout, SlotPool

D, FF, N_EXPERT, K = 2048, 768, 128, 8


def stack(gtype: int, rng: np.random.Generator) -> SlotPool:
    """A pool of N_EXPERT random experts in `gtype`."""
    def part(rows: int, cols: int) -> Part:
        return Part(gtype, rows, cols, rows * ggml.row_bytes(gtype, cols))

    pool = SlotPool(SlotLayout(part(FF, D), part(FF, D), part(D, FF)), N_EXPERT)
    lay = pool.layout
    for _ in range(N_EXPERT):
        slot = pool.new()
        for p, offset in zip((lay.gate, lay.up, lay.down), lay.offsets):
            w = rng.standard_normal((p.rows, p.cols)).astype(np.float32) / np.sqrt(p.cols)
            slot.data[offset : offset + p.nbytes] = ggml.quantize(w, gtype).ravel()
    return pool


def ways(gtype: int, threads: int, rng: np.random.Generator
         ) -> dict[str, Callable[[list[int], np.ndarray], None]]:
    pool = stack(gtype, rng)
    lay = pool.layout
    qtype = GGMLQuantizationType(gtype)

    def parts(e: int) -> list[np.ndarray]:
        slot = RawSlot(pool, e)
        return [slot.data[o : o + p.nbytes].reshape(p.rows, -1)
                for p, o in zip((lay.gate, lay.up, lay.down), lay.offsets)]

    f32 = [[dequantize(q, qtype) for q in parts(e)] for e in range(N_EXPERT)]

    def swiglu_f32(g: np.ndarray, u: np.ndarray) -> np.ndarray:
        return g / (1 + np.exp(-g)) * u

    def reference(ids: list[int], x: np.ndarray) -> None:
        for e in ids:
            g, u, d = (dequantize(q, qtype) for q in parts(e))
            d @ swiglu_f32(g @ x, u @ x)

    def numpy_f32(ids: list[int], x: np.ndarray) -> None:
        for e in ids:
            g, u, d = f32[e]
            d @ swiglu_f32(g @ x, u @ x)

    plain_team = QuantTeam(threads)
    out = np.zeros((K, D), np.float32)

    def plain(ids: list[int], x: np.ndarray) -> None:
        plain_team.run([Job(j, RawSlot(pool, e), None) for j, e in enumerate(ids)], x, out)

    result = {"numpy reference": reference, "numpy F32": numpy_f32, "ggml plain": plain}
    team = QuantTeam(threads, repack=True)
    packed = stack(gtype, np.random.default_rng(0))
    team.repack_pool(packed)
    if any(packed.repack):
        for e in range(N_EXPERT):
            team.repack_slot(RawSlot(packed, e))

        def repacked(ids: list[int], x: np.ndarray) -> None:
            team.run([Job(j, RawSlot(packed, e), None) for j, e in enumerate(ids)], x, out)

        result["ggml repacked"] = repacked
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q8_0"])
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    print(f"ggml {ggml.lib().cpu_features()}, {a.threads} threads; one layer: {K} of "
          f"{N_EXPERT} experts (gate, up {FF}x{D}; down {D}x{FF}), {a.rounds} rounds")
    # One BLAS thread, as in the engine; and a pause before each way, so that no thread
    # pool of the way before is still spinning on the cores (OpenBLAS's and ggml's spin
    # after their work: two at once double each other's time on 2 cores).
    with threadpool_limits(limits=1, user_api="blas"):
        for name in a.types:
            gtype = int(GGMLQuantizationType[name])
            fns = ways(gtype, a.threads, rng)
            layer_bytes = K * 3 * FF * ggml.row_bytes(gtype, D)
            times: dict[str, list[float]] = {k: [] for k in fns}
            x = rng.standard_normal(D).astype(np.float32)
            for _ in range(a.rounds):
                for way, fn in fns.items():
                    time.sleep(0.3)
                    calls = 2 if way == "numpy reference" else a.calls
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn(rng.choice(N_EXPERT, K, replace=False).tolist(), x)
                    times[way].append((time.perf_counter() - t0) / calls)
            base = statistics.median(times["ggml plain"])
            print(f"{name}: {layer_bytes / 2**20:.1f} MiB of the file's bytes a layer")
            for way, t in times.items():
                m = statistics.median(t)
                print(f"  {way:16s} {m * 1e3:8.2f} ms  {layer_bytes / m / 1e9:5.1f} GB/s "
                      f" x ggml plain {base / m:.2f}")


if __name__ == "__main__":
    main()
