"""P7 and P8 — the embedded engine against llama.cpp on the same GGUF file and threads
(docs/benches.md: P7 resident decode tok/s >= 0.95, goal 1.0; P8 prefill tok/s of a 64-token
prompt >= 0.5).

llama.cpp is the one tests/llamacpp.py builds from the pinned source (built on first use,
then cached), run as its users run it: `llama-bench -t THREADS -r 1` with its defaults.
Its `tg N` test runs with `-d N` (its depth: N tokens in the context before it), so it
decodes N tokens where the engine decodes them, after an N-token prompt — without it, `tg
N` decodes after an empty context, and attention over N fewer cells made llama.cpp
1.16-1.20x faster on gpt-oss-small here (llama-bench at -d 0 against -d 64, two runs). Its
`pp N` test, in a second run at depth 0, prefills an N-token prompt in one batch. By
default each test is measured after a warm-up run of it (the whole prompt, one generated
token). The embedded engine runs the same file with
every expert resident (`--resident`) and THREADS compute threads, measured the same way:
one run of the same prompt as warm-up, then the measured run in the same engine — decode
tok/s over N decoded tokens, and prefill tok/s of a prompt of N token ids: N over its
time to first token (the prefill batch of N-1 tokens, then decode step 1 on the last).
The warm-up run's own figures are printed too (`cold`: the first pass after load, what
one campaign cell's TTFT includes — after the fork of the compute partner, its first
pass takes the page faults of every buffer it writes). Each round runs the engines
ABBA (embedded, llama.cpp, llama.cpp, embedded: the host's speed moves 10-30% over
seconds, and a drift linear over the round falls on both alike) and its ratio is the
means' ratio; each round is printed and the median of the rounds is the figure.

    python benches/p7_vs_llamacpp.py [--model synthetic:default] [--rounds 7] [--threads 2]
    python benches/p7_vs_llamacpp.py --arch gpt-oss [--rounds 3]
    python benches/p7_vs_llamacpp.py --arch qwen35moe --kernels ggml [--rounds 3]

What is compared with what (docs/benches.md, "P7 per architecture"): by default the same
computation on both sides, so that the ratio is the engines' and not their settings'.
- The engine's attention follows llama-bench's (`--engine-attention match`): with
  llama-bench's default flash attention over an F16 cache, the engine runs `--flash-attn`
  (the same computation, to the bit); with `--llama-flash-attn off` (llama-bench's `-fa
  0`: KQ, the masked softmax, KQV; its cache stays F16, as llama-bench takes no F32 cache
  type), the engine's default F32 attention. `--engine-attention f32|flash` sets it
  instead: `f32` against llama-bench's default compares each engine's default attention.
- The engine picks each token by the argmax with no penalty (`--sampler greedy`):
  llama-bench's `tg` test decodes and samples nothing, and the argmax is the least a
  decoder that must choose its next token does. `--sampler file` samples with the file's
  settings, as `abbench engine run` does.

`--decode-only` runs no llama-bench prefill test and prints no P8: on the real gpt-oss
shape (`--model synthetic:gpt-oss-20b-4L-MXFP4`) llama-bench's `pp` test dies of SIGSEGV
here with its repacked MXFP4 experts (`--repack 0` runs).

`--arch ARCH` measures that architecture on its small synthetic file (`synthetic:small`
for qwen3moe, `synthetic:ARCH-small` for the others), against the bar every architecture
must meet (>= 0.9, issue 31); `--model` names any other file. `--kernels` is the
engine's (auto: the numpy model for F32 experts, as the synthetic qwen35moe and gemma4
files have; `ggml`: the architecture's graph model, llama.cpp's graph on ggml's kernels).

The engine's GEMMs are numpy's OpenBLAS, which picks its kernels from the CPU when it
loads, unless `OPENBLAS_CORETYPE` names them. Some machines set it (with
`OPENBLAS_L2_SIZE`) for older OpenBLAS builds; on an AVX-512 CPU that pins a current numpy
to AVX2 kernels a user's machine would not run: measured here (a 1 MiB expert matrix times
its rows, as the engine multiplies it, two runs), 1.0-1.2x slower at 8 rows, 1.1-1.4x at
16 and 1.4-1.5x at 64. To
measure what users get, run the bench with both unset in that command alone:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/p7_vs_llamacpp.py

The first line printed names the kernels in use (threadpoolctl).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from threadpoolctl import threadpool_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from llamacpp import build  # noqa: E402  (tests/llamacpp.py: the pinned llama.cpp build)

from abbench.engine import synth  # noqa: E402
from abbench.engine.config import EngineConfig  # noqa: E402
from abbench.engine.run.models import resolve_model  # noqa: E402
from abbench.engine.run.session import Engine, RunResult  # noqa: E402
from abbench.engine.run.telemetry import summarize  # noqa: E402


def llama_bench(binary: Path, model: Path, threads: int, tokens: int,
                flash_attn: str = "auto", prefill: bool = True) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) of llama-bench: `tg tokens` at depth `tokens` (after a
    prompt of that many tokens, where the engine decodes them), then `pp tokens` (in a
    second run: -d applies to every test of a run); `flash_attn` its -fa (auto: its
    default, flash attention with an F16 cache on CPU). Its cache is F16 either way:
    llama-bench takes no F32 cache type (-ctk). prefill False: no `pp` test (its prefill
    tok/s NaN)."""
    fa = [] if flash_attn == "auto" else ["-fa", "0"]

    def rate(test: list[str], n_prompt: int, n_gen: int) -> float:
        out = subprocess.run([str(binary), "-m", str(model), "-t", str(threads), "-r", "1",
                              *test, "-o", "json", *fa],
                             capture_output=True, text=True, timeout=1200, check=True)
        return float(next(r["avg_ts"] for r in json.loads(out.stdout)
                          if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen))

    n = str(tokens)
    tg = rate(["-p", "0", "-n", n, "-d", n], 0, tokens)
    return tg, rate(["-p", n, "-n", "0"], tokens, 0) if prefill else float("nan")


def embedded(model: Path, threads: int, tokens: int, kernels: str = "auto",
             sampler: str = "file", flash_attn: bool = False
             ) -> tuple[tuple[float, float], tuple[float, float]]:
    """((decode tok/s, prefill tok/s) measured after a warm-up run, as llama-bench
    measures, and the same of the warm-up run itself) of one embedded engine, every expert
    resident; `sampler` file: the file's sampling settings, greedy: the argmax, no
    penalty; `flash_attn`: the engine's --flash-attn."""
    prompt = tuple(3 + (7 * i) % 256 for i in range(tokens))  # byte tokens: any text
    greedy = {"temp": 0.0, "repeat_penalty": 1.0} if sampler == "greedy" else {}
    cfg = EngineConfig(model=str(model), prompt_tokens=prompt, n_tokens=tokens,
                       resident=True, threads=threads, ignore_eos=True, kernels=kernels,
                       flash_attn=flash_attn, **greedy)  # type: ignore[arg-type]
    with Engine(cfg, model) as engine:
        cold = engine.run()
        warm = engine.run()  # the same prompt again: its KV positions are rewritten
    if warm.output_ids != cold.output_ids:
        raise SystemExit("the measured run decoded other tokens than the warm-up run")
    return rates(warm), rates(cold)


def rates(result: RunResult) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) of one run, as its summary gives them: the prompt but
    its last token is one prefill batch and the last runs as decode step 1, whose logits
    give the first token; all N prompt tokens over that time (the time to first token) is
    the rate comparable with llama.cpp's pp N."""
    s = summarize(result)
    return s.tok_per_s, s.prefill_tok_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: synthetic:default, or the "
                    "architecture's small synthetic file with --arch")
    ap.add_argument("--arch", choices=synth.ARCHS, default=None,
                    help="measure this architecture's small synthetic file (bar >= 0.9)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kernels", choices=("auto", "numpy", "ggml"), default="auto",
                    help="the engine's --kernels (auto: numpy for F32 experts)")
    ap.add_argument("--llama-flash-attn", choices=("auto", "off"), default="auto",
                    help="llama-bench's -fa: auto (its default: flash attention, F16 KV "
                    "cache) or off (the attention the engine computes: KQ, softmax, KQV)")
    ap.add_argument("--engine-attention", choices=("match", "f32", "flash"),
                    default="match",
                    help="the engine's attention: match (llama-bench's: --flash-attn "
                    "against its default, F32 against -fa 0), f32 (the engine's default) "
                    "or flash (--flash-attn)")
    ap.add_argument("--decode-only", action="store_true",
                    help="run no llama-bench prefill test and print no P8 (llama-bench's "
                    "pp test dies of SIGSEGV on the real gpt-oss shape's repacked MXFP4 "
                    "experts here)")
    ap.add_argument("--sampler", choices=("greedy", "file"), default="greedy",
                    help="how the engine picks each token: greedy (the argmax, no "
                    "penalty: llama-bench samples nothing) or file (the file's sampling "
                    "settings, as `abbench engine run` does)")
    a = ap.parse_args()
    if a.tokens < 2:
        ap.error("--tokens must be at least 2 (a prompt of one token has no prefill pass)")
    if a.rounds < 1 or a.threads < 1:
        ap.error("--rounds and --threads must be at least 1")
    if a.arch and a.model:
        ap.error("--arch picks the model: give --arch or --model, not both")
    flash = a.engine_attention == "flash" or (a.engine_attention == "match"
                                              and a.llama_flash_attn == "auto")
    if flash and a.kernels == "numpy":
        ap.error("--kernels numpy computes F32 attention only: add --engine-attention f32 "
                 "or --llama-flash-attn off")
    if a.arch:
        synth.arch_preset(a.arch, "small")  # an architecture without one: named, here
        a.model = f"synthetic:{synth.preset_name(a.arch, 'small')}"
    a.model = a.model or "synthetic:default"
    bar = "bar >= 0.9 (every architecture)" if a.arch else "bar >= 0.95 (goal 1.0)"
    binary = build() / "llama-bench"
    model = Path(resolve_model(a.model))
    print(f"model: {a.model} ({model}), {a.threads} threads, {a.tokens} tokens, "
          f"{a.rounds} alternating rounds, --kernels {a.kernels}; llama.cpp 0c1e570 "
          f"(llama-cpp-python sdist), flash attention {a.llama_flash_attn}; the "
          f"engine's attention: {'flash, F16 cache' if flash else 'F32'}, its "
          f"sampler: {a.sampler}")
    blas = [f"{i['internal_api']} {i.get('version')} {i.get('architecture')}"
            for i in threadpool_info() if i["user_api"] == "blas"]
    print(f"numpy BLAS: {', '.join(blas) or 'unknown'}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    p7, p8, p7_cold, p8_cold = [], [], [], []
    for i in range(a.rounds):
        # ABBA: a drift of the host's speed that is linear over the round falls on both
        first = embedded(model, a.threads, a.tokens, a.kernels, a.sampler, flash)
        theirs = mean(*(llama_bench(binary, model, a.threads, a.tokens, a.llama_flash_attn,
                                    not a.decode_only) for _ in range(2)))
        last = embedded(model, a.threads, a.tokens, a.kernels, a.sampler, flash)
        ours, cold = mean(first[0], last[0]), mean(first[1], last[1])
        p7.append(ours[0] / theirs[0])
        p8.append(ours[1] / theirs[1])
        p7_cold.append(cold[0] / theirs[0])
        p8_cold.append(cold[1] / theirs[1])
        prefill = ("" if a.decode_only else
                   f"   prefill {ours[1]:8.1f} vs {theirs[1]:8.1f} tok/s ({p8[-1]:.3f})")
        cold_prefill = "" if a.decode_only else f", prefill {cold[1]:8.1f} ({p8_cold[-1]:.3f})"
        print(f"round {i + 1}: decode {ours[0]:7.1f} vs {theirs[0]:7.1f} tok/s "
              f"({p7[-1]:.3f}){prefill}   cold: decode {cold[0]:7.1f} "
              f"({p7_cold[-1]:.3f}){cold_prefill}")
    print(f"P7 resident decode, embedded / llama.cpp, median of rounds: "
          f"{statistics.median(p7):.3f} (rounds {min(p7):.3f}-{max(p7):.3f})  {bar}; "
          f"cold {statistics.median(p7_cold):.3f}")
    if a.decode_only:
        return
    print(f"P8 prefill of {a.tokens} tokens, embedded / llama.cpp, median of rounds: "
          f"{statistics.median(p8):.3f} (rounds {min(p8):.3f}-{max(p8):.3f})  bar >= 0.5; "
          f"cold {statistics.median(p8_cold):.3f}")


def mean(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return (a[0] + b[0]) / 2, (a[1] + b[1]) / 2


if __name__ == "__main__":
    main()
