"""P10, P11, P12 — the engine on a quantized file of a real model's geometry .

The file: `synthetic:qwen3-30b-a3b-4L-Q4_K_M` (and Q8_0), what `abbench model synth --shape
qwen3-30b-a3b --layers 4 --expert-type Q4_K_M` writes, built once into `$ABBENCH_CACHE`.
Every run is a child process (`python -m abbench engine run ... --json`), as a campaign
cell runs it, with THREADS compute threads; llama.cpp is the build tests/llamacpp.py
makes from the pinned source.

- P10: resident decode (`--resident`, `-n N`), decode tok/s of the engine over
  `llama-bench -p 0 -n N -t THREADS -r 1` (its defaults otherwise: a warm-up run first).
  Bar >= 0.8, goal >= 1.0.
- P11: the same file streaming through a cache of 25% of its experts (`--cache-mib`,
  `--overlap`, 4 lanes, O_DIRECT): decode tok/s over the bound the disk sets, the
  inverse of (misses per token x bytes per expert / raw O_DIRECT bandwidth + the resident
  run's seconds per token). The raw bandwidth is measured as P1 measures it (RawLanes:
  4 lanes, own descriptors, preadv of one expert's slices at a time, into arena memory)
  over random experts of the file the streaming run reads them from (the model, or with
  `--prelaid` the copy, whose disk blocks the host may cache or not as it does the
  model's), before and after it in the same round. Bar >= 0.7.
- P12: peak RSS of the P10 and P11 runs (the child's `getrusage` high-water mark) against
  the bytes they must hold: (peak - 100 MiB) / (dense bytes + expert bytes held: all of
  them for P10, the cache budget for P11). Bar <= 1.10.

Each round runs ABBA (engine, llama-bench, llama-bench, engine; the host's speed moves
10-30% over seconds) for P10, then P11's engine run between two raw-bandwidth passes; the
printed figure is the median of the rounds' ratios, with their range.

    python benches/p10_p12_quantized.py [--types Q4_K_M Q8_0] [--rounds 5] [--layers 4]
        [--prelaid | --relay auto|lanes|off]

`--prelaid`: P11's streaming runs read the experts from the copy laid out for the
repacked kernels (docs/engine.md, `--prelaid`), written once before the rounds, rather
than re-laying each expert they read. `--relay`: the streaming runs' `--relay` (default:
the engine's, `auto`); each round says which experts its streaming run re-laid.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacpp import build  # noqa: E402  (tests/llamacpp.py: the pinned llama.cpp build)
from p1_io_bound import RawLanes  # noqa: E402  (P1's raw O_DIRECT reader)

from abbench.engine import synth  # noqa: E402
from abbench.engine.gguf.model_file import ModelFile  # noqa: E402
from abbench.engine.run.models import resolve_model  # noqa: E402
from abbench.engine.run.session import model_info  # noqa: E402
from abbench.engine.streaming.prelaid import Prelaid, opened  # noqa: E402
from abbench.engine.streaming.streamer import LayerExperts, Slice, expert_layout  # noqa: E402

MIB = 2**20
LANES = 4


def model_file(shape: str, layers: int, expert_type: str) -> Path:
    """The quantized file, `synthetic:SHAPE-NL-TYPE` (built once into the model cache; a
    few minutes for 4 layers of Q4_K_M)."""
    return resolve_model(f"synthetic:{shape}-{layers}L-{expert_type}")


def engine(model: Path, threads: int, tokens: int, *flags: str) -> dict[str, Any]:
    """One engine run in a child process: its JSON summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        subprocess.run([sys.executable, "-m", "abbench", "engine", "run", "-m", str(model),
                        "-n", str(tokens), "--threads", str(threads), "--ignore-eos", "-q",
                        "--json", str(out), *flags], check=True, timeout=1800)
        doc = json.loads(out.read_text())
    if doc["kernels"]["backend"] != "ggml":
        raise SystemExit(f"the engine computed with {doc['kernels']['backend']}, not ggml")
    repacked = doc["kernels"].get("repacked", {})
    relaid = repacked.get("experts", [])
    return dict(doc["summary"]) | {"relaid": ",".join(relaid) or "none",
                                   "prelaid": repacked.get("prelaid")}


def llama_bench(binary: Path, model: Path, threads: int, tokens: int) -> float:
    out = subprocess.run([str(binary), "-m", str(model), "-t", str(threads), "-r", "1",
                          "-p", "0", "-n", str(tokens), "-o", "json"],
                         capture_output=True, text=True, timeout=1800, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


@dataclass(frozen=True)
class ExpertReads:
    """Where a streaming run reads its experts — the model, or its pre-laid copy — and each
    expert's reads there, as the engine's runner issues them (`slices`)."""

    path: Path
    layout: tuple[LayerExperts, ...]
    n_expert: int
    copy: Prelaid | None = None

    @classmethod
    def of(cls, model: Path, copy: Path | None = None) -> ExpertReads:
        mf = ModelFile(model)
        info = model_info(mf)
        layout = tuple(expert_layout(mf, info["n_layer"], info["n_expert"]))
        if copy is None:
            return cls(model, layout, info["n_expert"])
        return cls(copy, layout, info["n_expert"], opened(copy, layout))

    @property
    def n_layer(self) -> int:
        return len(self.layout)

    @property
    def largest_slice(self) -> int:
        """The bytes of the largest read (a layer's parts may be of other types)."""
        return max(s.nbytes for layer in range(self.n_layer) for s in self.slices(layer, 0))

    def slices(self, layer: int, expert: int) -> list[Slice]:
        if self.copy is not None:
            return list(self.copy.slices(layer, expert))
        return list(self.layout[layer].slices(expert, raw=True))

    def lanes(self) -> RawLanes:
        """P1's reader over this file, its buffers the largest read's size."""
        return RawLanes(str(self.path), LANES, self.largest_slice, 64 * self.largest_slice)


def raw_bandwidth(reads: ExpertReads, n_experts: int) -> float:
    """MiB/s of reading `n_experts` random experts' slices, one expert's three slices at a
    time on LANES lanes (as a miss is read), into arena memory of the cache's kind."""
    rng = random.Random(0)
    picks = [(rng.randrange(reads.n_layer), rng.randrange(reads.n_expert))
             for _ in range(n_experts)]
    lanes = reads.lanes()
    seconds = 0.0
    total = 0
    for layer, e in picks:
        slices = reads.slices(layer, e)
        seconds += lanes.read_batch(slices)
        total += sum(s.nbytes for s in slices)
    lanes.close()
    return total / MIB / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=list(synth.SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--types", nargs="+", default=["Q4_K_M", "Q8_0"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cache-share", type=float, default=0.25)
    ap.add_argument("--prelaid", action="store_true",
                    help="P11's runs read the experts from the copy pre-laid for the "
                    "repacked kernels (engine run --prelaid; written before the rounds)")
    ap.add_argument("--relay", choices=["auto", "lanes", "off"], default=None,
                    help="P11's runs re-lay streamed experts on the reader lanes or keep "
                    "the file's layout (engine run --relay; default: the engine's, auto)")
    a = ap.parse_args()
    if a.prelaid and a.relay is not None:
        ap.error("--prelaid reads experts already laid out: no --relay with it")
    if a.rounds < 1 or a.threads < 1 or a.tokens < 2 or not 0 < a.cache_share < 1:
        ap.error("--rounds, --threads >= 1, --tokens >= 2, 0 < --cache-share < 1")
    binary = build() / "llama-bench"
    for expert_type in a.types:
        model = model_file(a.shape, a.layers, expert_type)
        info = model_info(ModelFile(model))
        experts = info["expert_file_bytes"]
        dense_mib = info["dense_bytes"] / MIB
        per_expert = experts / (info["n_layer"] * info["n_expert"])
        cache_mib = a.cache_share * experts / MIB
        print(f"\n{model.name}: {info['n_layer']} layers x {info['n_expert']} experts, "
              f"{experts / MIB:.0f} MiB of experts ({per_expert / MIB:.2f} MiB each), dense "
              f"{dense_mib:.1f} MiB; {a.threads} threads, {a.tokens} tokens, {a.rounds} rounds;"
              f" P11 cache {cache_mib:.0f} MiB ({a.cache_share:.0%})")
        p10, p11, p12 = [], [], []
        extra = ("--prelaid",) if a.prelaid else (f"--relay={a.relay}",) if a.relay else ()
        copy = None
        if a.prelaid:  # the copy written (or found) before anything is timed
            copy = Path(engine(model, a.threads, 2, "--prelaid", "--cache-mib=64")["prelaid"])
        reads = ExpertReads.of(model, copy)  # the raw bandwidth of the file streamed from
        for i in range(a.rounds):
            first = engine(model, a.threads, a.tokens, "--resident")
            theirs = (llama_bench(binary, model, a.threads, a.tokens)
                      + llama_bench(binary, model, a.threads, a.tokens)) / 2
            last = engine(model, a.threads, a.tokens, "--resident")
            ours = (first["tok/s"] + last["tok/s"]) / 2
            p10.append(ours / theirs)
            bw = raw_bandwidth(reads, 48)
            stream = engine(model, a.threads, a.tokens, f"--cache-mib={cache_mib:.3f}",
                            "--overlap", f"--io-lanes={LANES}", *extra)
            bw = (bw + raw_bandwidth(reads, 48)) / 2
            misses = stream["misses"] / stream["tokens"]
            bound_s = misses * per_expert / MIB / bw + 1 / ours
            p11.append(stream["tok/s"] * bound_s)
            held = {"P10": (max(first["peak_rss_MiB"], last["peak_rss_MiB"]),
                            experts / MIB),
                    "P11": (stream["peak_rss_MiB"], cache_mib)}
            ratios = {k: (peak - 100) / (dense_mib + h) for k, (peak, h) in held.items()}
            p12.append(max(ratios.values()))
            print(f"round {i + 1}: P10 resident {ours:6.1f} vs llama-bench {theirs:6.1f} tok/s "
                  f"({p10[-1]:.3f}) | P11 streaming {stream['tok/s']:6.2f} tok/s, "
                  f"{misses:.1f} misses/token, re-laid {stream['relaid']}, raw {bw:.0f} "
                  f"MiB/s, bound "
                  f"{1 / bound_s:6.2f} tok/s ({p11[-1]:.3f}) | P12 peak RSS "
                  f"{held['P10'][0]:.0f} / {held['P11'][0]:.0f} MiB "
                  f"({ratios['P10']:.3f} / {ratios['P11']:.3f})", flush=True)
        for name, values, bar in (("P10 resident decode / llama-bench", p10, ">= 0.8"),
                                  ("P11 streaming / disk bound", p11, ">= 0.7"),
                                  ("P12 (peak RSS - 100 MiB) / (dense + held), worst", p12,
                                   "<= 1.10")):
            print(f"{expert_type} {name}: median {statistics.median(values):.3f} "
                  f"(rounds {min(values):.3f}-{max(values):.3f})  bar {bar}")
    print(f"\nllama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist); host {os.uname().machine}")


if __name__ == "__main__":
    main()
