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
  page cache, read by faults; given up after `--mmap-timeout` s, when the ratio is a lower
  bound: its tokens over that time) and with its default (`--repack 1` copies the
  repackable weights to anonymous memory, which cannot leave the limit: the OOM killer
  ends it or the rest thrashes; given up after three times the mmap run's time, at least
  120 s and at most `--mmap-timeout`), each outcome reported as such;
- the engine's bound: the slower of the disk and the compute. The disk's: the misses per
  token the streaming run measured times one expert's bytes, over the raw O_DIRECT
  bandwidth of the same file (P1's reader: 4 lanes, one expert's slices at a time, random
  experts; measured before and after the run, averaged). The compute's: the seconds per
  token of a resident run of the same file (`--resident`, no limit: every expert in
  memory), which also gives the text the streaming run must reproduce byte for byte. Both
  decode greedily (`--temp 0`). Streamed experts are re-laid for the repacked kernels as
  resident ones are (`--relay lanes`, whatever the engine's `auto` would choose on this
  machine, or `--prelaid`), so the two runs compute the same bits (tested on a small
  file); before that they rounded differently in the last bits, and a temperature-1 draw
  over this synthetic model's near-flat distribution differed from the first token while
  the argmax held. Greedy keeps the comparison to the text either way;
- what reading costs the compute on this machine: the resident run again, beside a
  reader (another process, P1's reader) reading random experts of the file at the rate
  the streaming run read them (its expert reads per token x one expert's bytes x its
  tok/s). Its seconds per token in place of the resident run's give a second bound,
  printed beside the first; the bar is against the first. On a VM whose disk is served
  by the host, reads cost the guest's cores time it cannot see (docs/benches.md, P14).

Every run decodes 256 tokens (`--tokens`), the field's protocol: a shorter run measures
the cache filling, where nearly every routed expert is read for the first time, and is a
floor rather than a result. The streaming run sits between the two resident runs; the
engine's three runs and llama.cpp's two alternate (the engine's first in odd rounds, last
in even).
Bars: at 48 layers in 8 GiB, engine / bound >= 0.8 and engine / mmap >= 10, peak within
the limit; at 12 layers in 2 GiB, engine / mmap >= 10. It needs root and a memory cgroup
controller (v1 or v2), and says why it cannot run otherwise.

    python benches/p14_past_memory.py                   # 12 and 48 layers, 2 rounds
    python benches/p14_past_memory.py --depths 12 --rounds 1
    python benches/p14_past_memory.py --depths 48 --prelaid --speculate 4

`--prelaid`: the streaming runs read the copy laid out for the repacked kernels.
`--speculate N`: they also read ahead the stale gate's prediction of the next layer's
experts (`--predict-prefetch --predict-spec-max N`); the bound's disk then counts every
expert read, the misses and the speculative reads.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacpp import build  # noqa: E402  (tests/llamacpp.py: the pinned llama.cpp build)
from p10_p12_quantized import LANES, ExpertReads, raw_bandwidth  # noqa: E402  (P1's reader)

from abbench.campaign import cgroup  # noqa: E402
from abbench.engine.gguf.model_file import ModelFile  # noqa: E402
from abbench.engine.run.models import resolve_model  # noqa: E402
from abbench.engine.run.session import model_info  # noqa: E402
from abbench.records import MemoryUse  # noqa: E402

MIB = 2**20
PROCESS_MIB = 1024  # what the engine's process holds besides dense weights and cache
# depth -> the memory limit (MiB) that depth runs in, and its bars
DEPTHS = {12: 2048, 48: 8192}
BARS = {12: {"mmap": 10.0}, 48: {"mmap": 10.0, "bound": 0.8}}
LABELS = {"mmap": "engine / mmap", "bound": "engine / bound",
          "beside": "engine / bound with the resident run beside the engine's reads",
          "toll": "what those reads cost the resident run (its time beside them / alone)"}


@dataclass(frozen=True)
class Limited:
    """One child run in its memory cgroup: its exit status (None: killed at its timeout),
    output, memory and wall seconds."""

    code: int | None
    stdout: str
    memory: MemoryUse
    seconds: float

    @property
    def oom_killed(self) -> bool:
        return self.memory.oom_killed

    @property
    def finished(self) -> bool:
        return self.code == 0

    def outcome(self, tok_s: float | None) -> str:
        """"1.00 tok/s (peak 2048 MiB)", "OOM-killed (...)" or "gave up after 300 s (...)"."""
        if self.code is None:
            got = f"gave up after {self.seconds:.0f} s"
        elif self.oom_killed:
            got = "OOM-killed"
        else:
            got = f"{tok_s:.2f} tok/s"
        peak = self.memory.peak_mib
        return got + (f" (peak {peak:.0f} MiB)" if peak is not None else "")


def drop_caches() -> None:
    """Every run starts from the disk: the page cache written back and dropped."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def limited(argv: list[str], limit_mib: float, timeout: float = 3600) -> Limited:
    """`argv` from a dropped page cache, in a new memory cgroup of `limit_mib`; killed
    past `timeout` s (a run that thrashes in the limit may take hours)."""
    drop_caches()
    group = cgroup.make(limit_mib, f"abbench-p14-{os.getpid()}")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cgroup.joined(group, argv), capture_output=True, text=True,
                           timeout=timeout)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:  # run() killed it
        code, out, err = None, "", ""
    finally:
        used = cgroup.use(group)
        cgroup.remove(group)
    if code not in (0, None) and not used.oom_killed:
        raise SystemExit(f"{argv[0]} failed ({code}):\n{err[-2000:]}")
    return Limited(code, out, used, time.monotonic() - t0)


def engine_argv(model: Path, out: Path, tokens: int, threads: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "abbench", "engine", "run", "-m", str(model), "-n",
            str(tokens), "--threads", str(threads), "--ignore-eos", "--temp", "0", "-q",
            "--json", str(out), *flags]


def engine_doc(out: Path) -> dict[str, Any]:
    doc = json.loads(out.read_text())
    if doc["kernels"]["backend"] != "ggml":
        raise SystemExit(f"the engine computed with {doc['kernels']['backend']}, not ggml")
    return doc


def llama_bench(binary: Path, model: Path, threads: int, tokens: int, repack: int,
                limit_mib: float, timeout: float) -> tuple[float | None, Limited]:
    """llama-bench's decode tok/s in the limit (None: OOM-killed, or given up)."""
    run = limited([str(binary), "-m", str(model), "-t", str(threads), "-r", "1", "-p", "0",
                   "-n", str(tokens), "--repack", str(repack), "-o", "json"], limit_mib,
                  timeout)
    return (float(json.loads(run.stdout)[0]["avg_ts"]) if run.finished else None), run


def resident(model: Path, tokens: int, threads: int,
             beside: tuple[ExpertReads, float] | None = None) -> dict[str, Any]:
    """A resident run of the file, no limit: the compute's seconds per token, and the
    text a streaming run must give. beside: (where the streaming run read, MiB/s): with a
    reader beside it reading random experts there at that rate (`paced_reads`), from its
    start to its end."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        drop_caches()
        reader = None if beside is None else subprocess.Popen(
            [sys.executable, __file__, "--read-beside", str(model),
             "-" if beside[0].path == model else str(beside[0].path), f"{beside[1]:.3f}"])
        try:
            subprocess.run(engine_argv(model, out, tokens, threads, "--resident"),
                           check=True, timeout=3600)
        finally:
            if reader is not None:
                reader.kill()
                reader.wait()
        return engine_doc(out)


def paced_reads(reads: ExpertReads, mib_s: float) -> None:
    """Read random experts of `reads` with O_DIRECT at `mib_s` MiB/s, one expert's slices
    at a time on LANES lanes (P1's reader, as a miss is read), until killed or orphaned
    (the bench itself killed: nothing would end this process otherwise)."""
    parent = os.getppid()
    lanes = reads.lanes()
    rng = random.Random(1)
    t0, total = time.monotonic(), 0
    while os.getppid() == parent:
        slices = reads.slices(rng.randrange(reads.n_layer), rng.randrange(reads.n_expert))
        lanes.read_batch(slices)
        total += sum(s.nbytes for s in slices)
        ahead = t0 + total / MIB / mib_s - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    lanes.close()


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
    copy = None
    if a.prelaid:  # the copy written (or found) outside the limit, before anything is timed
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(engine_argv(model, Path(tmp) / "run.json", 2, a.threads,
                                       "--prelaid", "--cache-mib=64"), check=True)
            copy = Path(engine_doc(Path(tmp) / "run.json")["kernels"]["repacked"]["prelaid"])
        print(f"the pre-laid copy ready ({time.monotonic() - t0:.0f} s)", flush=True)
    reads = ExpertReads.of(model, copy)  # the disk's bandwidth: of the file streamed from
    # "mmap_given_up": 1 for a round whose mmap ratio is a lower bound (llama.cpp given up)
    ratios: dict[str, list[float]] = {"mmap": [], "bound": [], "beside": [], "toll": [],
                                      "peak": [], "mmap_given_up": []}
    for r in range(a.rounds):
        for name, value in one_round(r, model, reads, limit, cache_mib, per_expert, a,
                                     binary).items():
            ratios[name].append(value)
    return ratios


def one_round(r: int, model: Path, reads: ExpertReads, limit: float, cache_mib: float,
              per_expert: float, a: argparse.Namespace, binary: Path) -> dict[str, float]:
    """One round, each figure printed as it is measured: → its ratios. The streaming run
    sits between the resident run its bound divides by and the resident run beside its
    reads (minutes apart at most: little of the host's drift comes between them);
    llama.cpp's runs come after those three in odd rounds and before them in even ones."""
    if r % 2:
        mmap, runs = llama_side(model, limit, a, binary)
    home, doc, engine_run, bw, beside = engine_side(r, model, reads, limit, cache_mib,
                                                    per_expert, a)
    if not r % 2:
        mmap, runs = llama_side(model, limit, a, binary)
    runs["engine"] = engine_run
    s = doc["summary"]
    if doc["output_ids"] != home["output_ids"] or doc["text"] != home["text"]:
        raise SystemExit("the streaming run's text differs from the resident run's")
    misses, reads = _reads(s)
    compute_s = 1 / home["summary"]["tok/s"]
    disk_s = reads * per_expert / MIB / bw
    bound_s = max(disk_s, compute_s)
    beside_s = max(disk_s, 1 / beside["summary"]["tok/s"])
    peak = runs["engine"].memory.peak_mib
    got = {"bound": s["tok/s"] * bound_s, "beside": s["tok/s"] * beside_s,
           "toll": home["summary"]["tok/s"] / beside["summary"]["tok/s"],
           "peak": peak / limit if peak is not None else float("nan")}
    # llama.cpp given up: it ran slower than its tokens over the timeout (a bound)
    floor = mmap if mmap is not None else a.tokens / runs["mmap"].seconds
    got["mmap"] = s["tok/s"] / floor
    got["mmap_given_up"] = float(mmap is None)
    print(f"  text byte-equal to the resident run's; {misses:.1f} misses/token, "
          f"{reads:.1f} reads/token | bound "
          f"{1 / bound_s:.2f} tok/s: disk {1 / disk_s:.2f} at {bw:.0f} MiB/s, compute "
          f"{1 / compute_s:.2f} (resident) | engine / mmap "
          f"{'' if mmap is not None else '> '}{got['mmap']:.1f}x, / bound {got['bound']:.3f}"
          f" | the resident run beside the engine's reads {1 / beside_s:.2f} tok/s (the "
          f"reads cost it {got['toll']:.3f}x its time), engine / that {got['beside']:.3f}",
          flush=True)
    return got


def _reads(summary: dict[str, Any]) -> tuple[float, float]:
    """→ (misses, expert reads) per token; every read counts against the disk: the
    misses, and what speculation read."""
    misses = summary["misses"] / summary["tokens"]
    return misses, misses + (summary.get("spec_experts") or 0) / summary["tokens"]


Doc = dict[str, Any]  # an engine run's JSON


def engine_side(r: int, model: Path, reads: ExpertReads, limit: float, cache_mib: float,
                per_expert: float, a: argparse.Namespace
                ) -> tuple[Doc, Doc, Limited, float, Doc]:
    """The resident run, the streaming run in its limit between two raw-bandwidth passes,
    then the resident run again beside a reader reading what the streaming run read, as
    fast as it read it → (resident doc, streaming doc, its run, MiB/s, beside doc)."""
    home = resident(model, a.tokens, a.threads)
    print(f"round {r + 1}: resident (no limit) {home['summary']['tok/s']:.2f} tok/s",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        stream = engine_argv(model, out, a.tokens, a.threads, f"--cache-mib={cache_mib:.0f}",
                             "--overlap", f"--io-lanes={LANES}",
                             "--prelaid" if a.prelaid else "--relay=lanes",
                             *(("--predict-prefetch", f"--predict-spec-max={a.speculate}")
                               if a.speculate else ()))
        bw = raw_bandwidth(reads, 48)
        run = limited(stream, limit)
        if run.oom_killed:
            raise SystemExit(f"the engine was OOM-killed in {limit} MiB")
        doc = engine_doc(out)
        bw = (bw + raw_bandwidth(reads, 48)) / 2
    print(f"  engine in {limit} MiB: {run.outcome(doc['summary']['tok/s'])}", flush=True)
    s = doc["summary"]
    mib_s = _reads(s)[1] * per_expert / MIB * s["tok/s"]
    beside = resident(model, a.tokens, a.threads, (reads, mib_s))
    print(f"  resident beside {mib_s:.0f} MiB/s of reads: {beside['summary']['tok/s']:.2f} "
          "tok/s", flush=True)
    return home, doc, run, bw, beside


def llama_side(model: Path, limit: float, a: argparse.Namespace,
               binary: Path) -> tuple[float | None, dict[str, Limited]]:
    """llama.cpp with mmap, then with its default, in the limit → (mmap tok/s or None,
    their runs)."""
    mmap, mrun = llama_bench(binary, model, a.threads, a.tokens, 0, limit, a.mmap_timeout)
    print(f"  llama.cpp mmap (--repack 0) in {limit} MiB: {mrun.outcome(mmap)}", flush=True)
    repacked, rrun = llama_bench(binary, model, a.threads, a.tokens, 1, limit,
                                 min(a.mmap_timeout, max(120.0, 3 * mrun.seconds)))
    print(f"  llama.cpp default (--repack 1) in {limit} MiB: {rrun.outcome(repacked)}",
          flush=True)
    return mmap, {"mmap": mrun, "default": rrun}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=sorted(DEPTHS),
                    choices=sorted(DEPTHS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256,
                    help="tokens each run decodes (default 256, the field's protocol: "
                    "fewer measure the cache filling)")
    ap.add_argument("--mmap-timeout", type=float, default=600.0,
                    help="seconds after which llama.cpp's runs are given up (then the mmap "
                    "ratio is a lower bound: its tokens over this time); its default's run "
                    "is given up after three times its mmap run's, at least 120 s, at most "
                    "this")
    ap.add_argument("--prelaid", action="store_true",
                    help="the streaming runs read the experts from the copy pre-laid for "
                    "the repacked kernels (engine run --prelaid; written before the rounds, "
                    "outside the limit)")
    ap.add_argument("--speculate", type=int, default=0, metavar="N",
                    help="the streaming runs read ahead what the stale gate predicts for "
                    "the next layer (engine run --predict-prefetch --predict-spec-max N); "
                    "the bound's disk counts those reads too")
    ap.add_argument("--read-beside", nargs=3, metavar=("MODEL", "COPY", "MIB_S"),
                    help=argparse.SUPPRESS)  # the reader beside a resident run
    a = ap.parse_args()
    if a.read_beside:
        model, copy, mib_s = a.read_beside
        paced_reads(ExpertReads.of(Path(model), None if copy == "-" else Path(copy)),
                    float(mib_s))
        return
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
        for name in ("mmap", "bound", "beside", "toll"):
            got = ratios[name]
            text = (f"median {statistics.median(got):.3f} (rounds {min(got):.3f}-"
                    f"{max(got):.3f})" if got else "none")
            if name == "mmap" and any(ratios["mmap_given_up"]):
                text = (f"at least {text} ({sum(ratios['mmap_given_up']):.0f} rounds gave "
                        "llama.cpp up: their ratio is its tokens over the timeout)")
            bar = BARS[depth].get(name)
            print(f"P14 {depth} layers, {LABELS[name]}: {text}  "
                  + (f"bar >= {bar:g}" if bar is not None else "(no bar)"))
        peaks = [x for x in ratios["peak"] if x == x]  # NaN: the kernel keeps no peak
        worst = f"worst {max(peaks):.3f}" if peaks else "unknown (no memory.peak here)"
        print(f"P14 {depth} layers, cgroup peak / limit: {worst}  bar <= 1")
    print(f"\nllama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist); host {os.uname().machine}")


if __name__ == "__main__":
    main()
