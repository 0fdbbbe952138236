"""A stand-in for the phone-streaming engine's CLI, `bmoe-cli` (github.com/Helldez/
BigMoeOnEdge at 2d4f2b1), for the bmoe cell tests: what it parses, refuses, writes and
prints follows that source, and every line it writes is one of `bmoe_formats`' strings
(STYLE 12). It does not decode: its timings are the time it really spends per token, a
sleep that the configuration scales (a cache, dropping cold experts and overlap each make a
token cheaper), and its bytes read per token follow from the configuration alone, so two
cells of one configuration report the same work.

  - flags: exact string matches as cli/main.cpp:545-691 parses them; an unknown one prints
    `unknown arg:` and exits 1; `--mtp` with `--ngram` and a bad `--dense-weights` exit 2;
  - the `BMOE_*` overrides where a flag is absent (cli/main.cpp:697-704);
  - part of `validate()` (core/src/config.cpp), `config error: MSG`, exit 1;
  - the model's arch and shape read from its GGUF header (`gguf`), as the engine reads them;
  - the CSV (v2 preamble as core/src/engine/session.cpp:746-790 fills RunInfo, header, one
    row per token, one `# summary`); one it cannot open is a warning and exit 0
    (cli/main.cpp:717-720);
  - stdout: the prompt, the text, `generation:` and `prefill:` lines.

`standin.json` beside the program, if present, changes what it does for a test:
{"ms_per_token": 50, "hang": false, "ignore": ["--overlap"], "exit": 0, "rss_mib": 48,
"no_csv": false}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bmoe_formats import (  # noqa: E402
    GENERATION,
    PREFILL,
    V2_HEADER,
    V2_PREAMBLE,
    V2_ROW,
    V2_SUMMARY,
    lines,
    printf,
)

VERSION = "0.9.0"  # the CMake project version the build defines as BMOE_VERSION
SWITCHES = {"--chatml": "chatml", "--no-think": "no_think", "--moe-stream": "moe_stream",
            "--no-odirect": "no_odirect", "--load-all": "load_all",
            "--force-cache": "force_cache", "--overlap": "overlap",
            "--io-two-wave": "io_two_wave", "--prefetch-sync": "prefetch_sync",
            "--drop-no-renorm": "drop_no_renorm", "--drop-in-prefill": "drop_in_prefill",
            "--predict-log": "predict_log", "--predict-prefetch": "predict_prefetch"}
VALUES = {"-m": "model", "-p": "prompt", "-n": "n_predict", "-t": "threads", "-c": "n_ctx",
          "--ubatch": "n_ubatch", "--n-expert-used": "n_expert_used", "--temp": "temp",
          "--seed": "seed", "--draft": "draft", "--mtp-p-min": "mtp_p_min",
          "--ngram-min-match": "ngram_min_match", "--csv": "csv", "--cache-mb": "cache_mb",
          "--cache-floor-mb": "cache_floor_mb", "--cache-ceil-mb": "cache_ceil_mb",
          "--io-threads": "io_threads", "--dense-weights": "dense_weights",
          "--prefetch": "prefetch", "--drop-cold-experts": "drop_cold",
          "--route-ahead": "route_ahead", "--predict-spec-max": "predict_spec_max"}
ENV = {"--cache-mb": ("BMOE_CACHE_MB", "cache_mb"), "--io-threads": ("BMOE_IO_THREADS",
       "io_threads"), "--overlap": ("BMOE_OVERLAP", "overlap"),
       "--prefetch": ("BMOE_PREFETCH", "prefetch"),
       "--n-expert-used": ("BMOE_N_EXPERT_USED", "n_expert_used"),
       "--predict-log": ("BMOE_PREDICT_LOG", "predict_log"),
       "--predict-prefetch": ("BMOE_PREDICT_PREFETCH", "predict_prefetch")}
DEFAULTS = {"prompt": "The capital of Japan is", "n_predict": "128", "threads": "4",
            "n_ctx": "2048", "n_ubatch": "0", "n_expert_used": "0", "temp": "0",
            "seed": "4294967295", "draft": "3", "mtp_p_min": "0", "ngram_min_match": "3",
            "cache_mb": "0", "cache_floor_mb": "1536", "cache_ceil_mb": "0",
            "io_threads": "4", "dense_weights": "anon", "prefetch": "0", "drop_cold": "0",
            "route_ahead": "0", "predict_spec_max": "2"}


def control() -> dict:
    path = Path(os.environ.get("BMOE_STANDIN_DIR", "/nonexistent")) / "standin.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def parse(argv: list[str], ignore: set[str]) -> tuple[dict, dict, set[str]] | int:
    values, switches, seen = dict(DEFAULTS), dict.fromkeys(SWITCHES.values(), False), set()
    spec = None
    i = 0
    while i < len(argv):
        a = argv[i]
        seen.add(a)
        if a in ("--mtp", "--ngram"):
            want = a[2:]
            if spec is not None and spec != want:
                sys.stderr.write("bmoe: --mtp and --ngram are two draft sources for the same "
                                 "verify loop; choose one.\n")
                return 2
            spec = want
        elif a in SWITCHES:
            switches[SWITCHES[a]] = a not in ignore
        elif a in VALUES:
            if i + 1 >= len(argv):
                sys.stderr.write(f"missing value for {a}\n")
                return 1
            i += 1
            if a == "--dense-weights" and argv[i] not in ("mmap", "warm", "anon", "ahwb"):
                sys.stderr.write(f"bmoe: --dense-weights expects mmap|warm|anon|ahwb, got "
                                 f"'{argv[i]}'\n")
                return 2
            if a not in ignore:
                values[VALUES[a]] = argv[i]
        else:
            sys.stderr.write(f"unknown arg: {a}\n")
            return 1
        i += 1
    for flag, (var, key) in ENV.items():
        if flag not in seen and var in os.environ:
            if key in switches:
                switches[key] = os.environ[var] not in ("", "0")
            else:
                values[key] = os.environ[var]
    values["spec"] = spec or "off"
    return values, switches, seen


def validate(v: dict, s: dict) -> str | None:
    """Part of core/src/config.cpp validate(), in its words."""
    cache = v["cache_mb"]
    mb = 0 if cache == "auto" else int(cache)
    cache_on = mb > 0 or cache == "auto"
    if s["overlap"] and not s["moe_stream"]:
        return "moe.overlap requires moe.enabled"
    if s["moe_stream"] and 0 < mb < 1500 and not s["force_cache"]:
        return (f"moe.cache_mb={mb} is in the pathological band (< 1500 MiB): a cache smaller "
                "than one token's routed working set thrashes and is slower than no cache.")
    if s["moe_stream"] and float(v["drop_cold"]) > 0 and not cache_on:
        return "moe.drop_cold_frac requires the LRU cache (cache_mb > 0 or cache_auto)"
    return None


def model_facts(path: str) -> dict:
    import gguf
    reader = gguf.GGUFReader(path)
    fields = {f.name: f for f in reader.fields.values()}

    def value(name: str):
        f = fields.get(name)
        return None if f is None else f.contents()
    arch = value("general.architecture")
    return {"arch": arch, "n_layer": value(f"{arch}.block_count") or 0,
            "n_expert": value(f"{arch}.expert_count") or 0,
            "n_expert_used": value(f"{arch}.expert_used_count") or 0}


def preamble(v: dict, s: dict, facts: dict, model: str) -> str:
    """The v2 preamble, RunInfo filled as session.cpp:746-790 fills it."""
    stream = s["moe_stream"]
    spec = v["spec"]
    auto = v["cache_mb"] == "auto"
    cache_mb = (4096 if auto else int(v["cache_mb"])) if stream else 0
    used = int(v["n_expert_used"]) or facts["n_expert_used"]
    return lines(V2_PREAMBLE, (
        (), (VERSION,),
        (os.path.basename(model), facts["arch"], facts["n_layer"], facts["n_expert"], used,
         int(v["threads"]), int(v["n_ctx"]), int(v["n_ubatch"]), int(s["chatml"])),
        (int(stream), cache_mb, int(auto), int(v["cache_floor_mb"]), int(v["cache_ceil_mb"]),
         int(s["force_cache"]), int(stream and s["load_all"]),
         int(v["io_threads"]) if stream else 0, int(stream and not s["no_odirect"]),
         int(stream and s["overlap"]), int(stream and s["io_two_wave"]),
         int(v["prefetch"]) if stream else 0, int(v["route_ahead"]) if stream else 0,
         int(stream and s["predict_prefetch"]), int(stream and s["predict_log"]),
         int(v["predict_spec_max"]) if stream else 0, int(stream and s["prefetch_sync"]),
         v["dense_weights"], float(v["drop_cold"]) if stream else 0.0,
         int(not s["drop_no_renorm"]), int(s["drop_in_prefill"])),
        (float(v["temp"]), 40, 0.95, int(v["seed"]), 0, spec,
         int(v["draft"]) if spec != "off" else 0,
         float(v["mtp_p_min"]) if spec == "mtp" else 0.0,
         int(v["ngram_min_match"]) if spec == "ngram" else 0)))


def main() -> int:
    ctl = control()
    parsed = parse(sys.argv[1:], set(ctl.get("ignore", ())))
    if isinstance(parsed, int):
        return parsed
    v, s, _ = parsed
    if "model" not in v:
        sys.stderr.write("usage: bmoe-cli -m model.gguf [options]\n")
        return 1
    problem = validate(v, s)
    if problem:
        sys.stderr.write(f"config error: {problem}\n")
        return 1
    try:
        facts = model_facts(v["model"])
    except (OSError, ValueError) as e:
        sys.stderr.write(f"\nerror: cannot load model {v['model']}: {e}\n")
        return 1
    ballast = bytearray(int(ctl.get("rss_mib", 48)) * 2**20)  # a resident set to measure
    ballast[::4096] = b"\1" * len(ballast[::4096])
    csv = None
    if "csv" in v:
        try:
            if ctl.get("no_csv"):  # as on storage that refuses the file
                raise PermissionError(v["csv"])
            csv = open(v["csv"], "w", encoding="utf-8")  # noqa: SIM115
        except OSError:
            sys.stderr.write(f"warning: could not open csv {v['csv']}\n")
    if ctl.get("hang"):
        time.sleep(3600)
    stream = s["moe_stream"]
    mb = 0 if not stream else 4096 if v["cache_mb"] == "auto" else int(v["cache_mb"])
    drop = float(v["drop_cold"]) if stream else 0.0
    # the configuration's cost a token: reads fall with the cache and with dropped experts
    read_mib = (96.0 if stream else 0.0) * (1 - min(mb, 6000) / 8000) * (1 - 0.3 * drop)
    scale = (1 - min(mb, 6000) / 12000) * (1 - 0.2 * drop) * (0.9 if s["overlap"] else 1.0)
    delay = float(ctl.get("ms_per_token", 50)) * scale / 1e3
    n = int(v["n_predict"])
    if csv:
        csv.write(preamble(v, s, facts, v["model"]) + printf(V2_HEADER))
    sys.stdout.write(v["prompt"])
    walls, t_load = [], 0.05
    for step in range(1, n + 1):
        t0 = time.perf_counter()
        time.sleep(delay)
        wall = (time.perf_counter() - t0) * 1e3
        walls.append(wall)
        read = int(read_mib * 2**20 * (1 + (step % 5) / 10))  # the configuration's, not time's
        if csv:
            csv.write(printf(V2_ROW, step, n, wall, 0.5 * wall, 0.4 * wall, read, 100 - read_mib,
                             0.0, 0.02 * wall, 0, 0.9 * wall, 1.0, 0, 0.0, float(mb),
                             len(ballast) / 2**20, len(ballast) / 2**20, 0.0, 0.0, 5200.0,
                             300.0, 0.0, 0.01, 1, 0.0, 0.0, 0.0, 0.0, 0.0))
        sys.stdout.write(" tok")
    gen = sum(walls) / 1e3
    if csv:
        csv.write(printf(V2_SUMMARY, n, gen / n, n / gen, read_mib * n, 0.5 * gen, 0.4 * gen / n,
                         0.5 * gen / n, 100 - read_mib, 6, t_load, 0.02, 300.0, 0.0,
                         0.02 * gen / n, float(mb), float(mb), 0, 0.0, 0, 0, 0.0,
                         0.9 * gen / n, read_mib, read_mib / 4, 8 * n, int(8 * n * drop / 4),
                         0.00001, 0, 0, 0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0))
        csv.close()
    sys.stdout.write("\n\n" + printf(GENERATION, n, gen / n, n / gen)
                     + printf(PREFILL, 6, 0.02, 300.0, t_load, t_load + 0.02))
    return int(ctl.get("exit", 0))


def install(folder: Path, **control_values: object) -> Path:
    """A `bmoe-cli` in `folder` that runs this stand-in (with `standin.json` from
    `control_values`, if any); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    cli = folder / "bmoe-cli"
    cli.write_text(f"#!/bin/sh\nexport BMOE_STANDIN_DIR={folder.resolve()}; exec {sys.executable} "
                   f"{Path(__file__).resolve()} \"$@\"\n")
    cli.chmod(0o755)
    if control_values:
        (folder / "standin.json").write_text(json.dumps(control_values))
    return cli


if __name__ == "__main__":
    sys.exit(main())
