"""P14 — a model larger than its memory: the engine streaming against llama.cpp's mmap and
against its own bound, at 12 and at 48 layers of Qwen3-30B-A3B's geometry (docs/benches.md).

The files: `synthetic:qwen3-30b-a3b-12L-Q4_K_M` (4.2 GiB) and `-48L-` (the whole model's
depth, about 17 GiB), what `abbench model synth --shape qwen3-30b-a3b --layers N
--expert-type Q4_K_M` writes, each built once into `$ABBENCH_CACHE` (the 48-layer one
takes most of an hour on 2 cores, the first time).

Each run is a child process in a memory cgroup of its own (abbench/campaign/cgroup.py, as a
campaign cell with `memory_limit_mib`), limited below the file: 2 GiB for 12 layers, 8 GiB
for 48. The page cache is charged to the same limit, as on a phone, so the file never
fits. Before each run the page cache is dropped (`sync; echo 3 > drop_caches`): every run
starts from the disk. Per depth and round:

- the engine streaming (`engine run --cache-mib C --overlap --io-lanes 4`, O_DIRECT),
  C = the limit less the dense weights and 1 GiB for the process: its decode tok/s, its
  misses per token, and its cgroup's peak (page cache included) against the limit;
- llama.cpp with mmap (`llama-bench -p 0 -n N --repack 0`: the weights stay in the
  page cache, read by faults) and with its default (`--repack 1` copies the weights to
  anonymous memory: past the limit the OOM killer ends it, reported as such);
- the engine's bound: the slower of the disk and the compute. The disk's: the misses per
  token the streaming run measured times one expert's bytes, over the raw O_DIRECT
  bandwidth of the same file (P1's reader: 4 lanes, one expert's slices at a time, random
  experts; measured before and after the run, averaged). The compute's: the seconds per
  token of a resident run of the same file (`--resident --no-repack`, no limit: every
  expert in memory, computed by the same kernels as a streamed one), which also gives the
  text the streaming run must reproduce byte for byte.

The engine and llama.cpp's mmap alternate (engine first in odd rounds, last in even).
Bars: at 48 layers in 8 GiB, engine / bound >= 0.8 and engine / mmap >= 10, peak within
the limit; at 12 layers in 2 GiB, engine / mmap >= 10. It needs root and a memory cgroup
controller (v1 or v2), and says why it cannot run otherwise.

    python benches/p14_past_memory.py                   # 12 and 48 layers, 2 rounds
    python benches/p14_past_memory.py --depths 12 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacpp import build  # noqa: E402  (tests/llamacpp.py: the pinned llama.cpp build)
from p10_p12_quantized import raw_bandwidth  # noqa: E402  (P1's raw O_DIRECT reader)

from abbench.campaign import cgroup  # noqa: E402
from abbench.engine.gguf.model_file import ModelFile  # noqa: E402
from abbench.engine.run.models import resolve_model  # noqa: E402
from abbench.engine.run.session import model_info  # noqa: E402
from abbench.records import MemoryUse  # noqa: E402

MIB = 2**20
LANES = 4
PROCESS_MIB = 1024  # what the engine's process holds besides dense weights and cache
# depth -> the memory limit (MiB) that depth runs in, and its bars
DEPTHS = {12: 2048, 48: 8192}
BARS = {12: {"mmap": 10.0}, 48: {"mmap": 10.0, "bound": 0.8}}


@dataclass(frozen=True)
class Limited:
    """One child run in its memory cgroup: its exit status, output and memory."""

    code: int
    stdout: str
    memory: MemoryUse

    @property
    def oom_killed(self) -> bool:
        return self.memory.oom_killed


def drop_caches() -> None:
    """Every run starts from the disk: the page cache written back and dropped."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def limited(argv: list[str], limit_mib: float, timeout: float = 3600) -> Limited:
    drop_caches()
    group = cgroup.make(limit_mib, f"abbench-p14-{os.getpid()}")
    try:
        p = subprocess.run(cgroup.joined(group, argv), capture_output=True, text=True,
                           timeout=timeout)
        used = cgroup.use(group)
    finally:
        cgroup.remove(group)
    if p.returncode != 0 and not used.oom_killed:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return Limited(p.returncode, p.stdout, used)


def engine_argv(model: Path, out: Path, tokens: int, threads: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "abbench", "engine", "run", "-m", str(model), "-n",
            str(tokens), "--threads", str(threads), "--ignore-eos", "-q", "--json", str(out),
            *flags]


def engine_doc(out: Path) -> dict[str, Any]:
    doc = json.loads(out.read_text())
    if doc["kernels"]["backend"] != "ggml":
        raise SystemExit(f"the engine computed with {doc['kernels']['backend']}, not ggml")
    return doc


def llama_bench(binary: Path, model: Path, threads: int, tokens: int, repack: int,
                limit_mib: float) -> tuple[float | None, Limited]:
    """llama-bench's decode tok/s in the limit (None: the OOM killer ended it)."""
    run = limited([str(binary), "-m", str(model), "-t", str(threads), "-r", "1", "-p", "0",
                   "-n", str(tokens), "--repack", str(repack), "-o", "json"], limit_mib)
    return (None if run.oom_killed else float(json.loads(run.stdout)[0]["avg_ts"])), run


def resident(model: Path, tokens: int, threads: int) -> dict[str, Any]:
    """A resident run of the file, no limit: the compute's seconds per token, and the
    text a streaming run must give."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        drop_caches()
        subprocess.run(engine_argv(model, out, tokens, threads, "--resident", "--no-repack"),
                       check=True, timeout=3600)
        return engine_doc(out)


def one_depth(depth: int, a: argparse.Namespace, binary: Path) -> dict[str, list[float]]:
    limit = DEPTHS[depth]
    t0 = time.monotonic()
    model = resolve_model(f"synthetic:qwen3-30b-a3b-{depth}L-Q4_K_M")
    info = model_info(ModelFile(model))
    experts, dense = info["expert_file_bytes"], info["dense_bytes"]
    per_expert = experts / (info["n_layer"] * info["n_expert"])
    cache_mib = limit - dense / MIB - PROCESS_MIB
    size = model.stat().st_size / MIB
    print(f"\n{model.name} ({time.monotonic() - t0:.0f} s to find or build): {depth} layers, "
          f"{size:.0f} MiB, experts {per_expert / MIB:.2f} MiB each, dense {dense / MIB:.0f} "
          f"MiB; limit {limit} MiB, engine cache {cache_mib:.0f} MiB; {a.threads} threads, "
          f"{a.tokens} tokens", flush=True)
    if size <= limit:
        raise SystemExit(f"the file ({size:.0f} MiB) fits its limit ({limit} MiB)")
    ratios: dict[str, list[float]] = {"mmap": [], "bound": [], "peak": []}
    for r in range(a.rounds):
        home = resident(model, a.tokens, a.threads)
        compute_s = 1 / home["summary"]["tok/s"]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.json"
            stream_argv = engine_argv(model, out, a.tokens, a.threads,
                                      f"--cache-mib={cache_mib:.0f}", "--overlap",
                                      f"--io-lanes={LANES}")
            bw = raw_bandwidth(model, 48)
            if r % 2:
                mmap, mrun = llama_bench(binary, model, a.threads, a.tokens, 0, limit)
                ours = limited(stream_argv, limit)
            else:
                ours = limited(stream_argv, limit)
                mmap, mrun = llama_bench(binary, model, a.threads, a.tokens, 0, limit)
            bw = (bw + raw_bandwidth(model, 48)) / 2
            if ours.oom_killed:
                raise SystemExit(f"the engine was OOM-killed in {limit} MiB: {ours.memory}")
            doc = engine_doc(out)
        repacked, rrun = llama_bench(binary, model, a.threads, a.tokens, 1, limit)
        s = doc["summary"]
        same = doc["output_ids"] == home["output_ids"] and doc["text"] == home["text"]
        if not same:
            raise SystemExit("the streaming run's text differs from the resident run's")
        misses = s["misses"] / s["tokens"]
        disk_s = misses * per_expert / MIB / bw
        bound_s = max(disk_s, compute_s)
        peak = ours.memory.peak_mib
        ratios["bound"].append(s["tok/s"] * bound_s)
        if mmap is not None:
            ratios["mmap"].append(s["tok/s"] / mmap)
        ratios["peak"].append(peak / limit if peak is not None else float("nan"))

        def shown(v: float | None, run: Limited) -> str:
            got = "OOM-killed" if v is None else f"{v:.2f} tok/s"
            peak = run.memory.peak_mib
            return got + (f" (peak {peak:.0f} MiB)" if peak is not None else "")

        print(f"round {r + 1}: engine {s['tok/s']:.2f} tok/s in {limit} MiB (peak "
              f"{peak if peak is None else round(peak)} MiB, {misses:.1f} misses/token; text "
              f"byte-equal to the resident run's) | llama.cpp mmap {shown(mmap, mrun)}, "
              f"default {shown(repacked, rrun)} | bound {1 / bound_s:.2f} tok/s: disk "
              f"{1 / disk_s:.2f} at {bw:.0f} MiB/s, compute {1 / compute_s:.2f} (resident) | "
              f"engine / mmap {ratios['mmap'][-1] if mmap is not None else float('nan'):.1f}x,"
              f" / bound {ratios['bound'][-1]:.3f}", flush=True)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=sorted(DEPTHS),
                    choices=sorted(DEPTHS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    if a.rounds < 1 or a.threads < 1 or a.tokens < 2:
        ap.error("--rounds, --threads >= 1, --tokens >= 2")
    why = cgroup.unavailable()
    if why is None and os.geteuid() != 0:
        why = "dropping the page cache before each run needs root"
    if why is not None:
        raise SystemExit(f"P14 cannot run here: {why}")
    binary = build() / "llama-bench"
    for depth in a.depths:
        ratios = one_depth(depth, a, binary)
        for name in ("mmap", "bound"):
            got = ratios[name]
            text = (f"median {statistics.median(got):.3f} (rounds {min(got):.3f}-"
                    f"{max(got):.3f})" if got else "none: llama.cpp never finished")
            bar = BARS[depth].get(name)
            print(f"P14 {depth} layers, engine / {name}: {text}  "
                  + (f"bar >= {bar:g}" if bar is not None else "(no bar at this depth)"))
        peaks = ratios["peak"]
        print(f"P14 {depth} layers, cgroup peak / limit: worst {max(peaks):.3f}  bar <= 1")
    print(f"\nllama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist); host {os.uname().machine}")


if __name__ == "__main__":
    main()
