"""Cells that run the phone-streaming engine's CLI, `bmoe-cli` (github.com/Helldez/
BigMoeOnEdge; docs/cells.md#bmoe-cells): its options, the checks its source makes on them
(made here, when the plan is made), and its command line.

A cell's `[cells.NAME.bmoe]` table holds `bmoe-cli` options by their long flag's name,
`-` as `_` (`--drop-cold-experts 0.75` is `drop_cold_experts = 0.75`; `-t` is `threads`,
`-c` `ctx_size`). Unlike a llama.cpp cell's table, every key is known here: the CLI
parses its flags by exact string (cli/main.cpp:545-691) and `validate()`
(core/src/config.cpp:15-219) refuses combinations at start-up, exit 1, after the device
time of a cell's entry state is spent. `BmoeCell` refuses them when the campaign file is
read, in the source's own words, naming the keys.

What a cell measures is abbench's to set: `-m MODEL -p PROMPT -n TOKENS --csv FILE`, greedy
decoding (the CLI's default, `temp` 0; speculation needs it). The CLI reads `BMOE_*`
variables for flags it was not given (cli/main.cpp:697-704); the cell's command unsets them
so that its table is the whole configuration.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abbench.campaign._check import fail
from abbench.records.schema import did_you_mean, show

BINARY = "bmoe-cli"  # the CLI target (cli/CMakeLists.txt)
CSV = "bmoe.csv"  # in the cell's folder: the per-token CSV (`--csv`)
METRICS = "bmoe.metrics"  # in the cell's folder: the pressure readings the wrapper writes
FILES = (CSV, METRICS)
# Env overrides the CLI applies where its flag is absent (cli/main.cpp:697-704).
ENV_OVERRIDES = ("BMOE_CACHE_MB", "BMOE_IO_THREADS", "BMOE_PROGRESS", "BMOE_OVERLAP",
                 "BMOE_PREFETCH", "BMOE_N_EXPERT_USED", "BMOE_PREDICT_LOG",
                 "BMOE_PREDICT_PREFETCH")
# Limits from core/include/bmoe/config.h.
CACHE_MIN_MB = 1500
IO_THREADS_MAX = 8
PREFETCH_MAX = 8
ROUTE_AHEAD_MAX = 8
DRAFT_MAX_LIMIT = 8
NGRAM_MAX_MATCH = 12  # SpecConfig::ngram_max_match's default; the CLI has no flag for it
DENSE_WEIGHTS = ("mmap", "warm", "anon", "ahwb")
Scalar = str | int | float | bool


@dataclass(frozen=True)
class Option:
    """One `bmoe-cli` option: its flag, the value it takes and the CLI's default."""

    flag: str
    kind: str  # "switch" | "int" | "float" | "choice" | "cache"
    default: Any
    low: float | None = None  # an int's or float's range (None: unbounded)
    high: float | None = None


def _int(flag: str, default: int, low: int | None = None,
         high: int | None = None) -> Option:
    return Option(flag, "int", default, low, high)


def _switch(flag: str) -> Option:
    return Option(flag, "switch", False)


# Every option a cell may set, with config.h's defaults (cli/main.cpp:545-691 for flags).
OPTIONS: dict[str, Option] = {
    "threads": _int("-t", 4, 1), "ctx_size": _int("-c", 2048, 1), "ubatch": _int("--ubatch", 0, 0),
    "n_expert_used": _int("--n-expert-used", 0, 0),
    "chatml": _switch("--chatml"), "no_think": _switch("--no-think"),
    "moe_stream": _switch("--moe-stream"),
    "cache_mb": Option("--cache-mb", "cache", 0),  # MiB, or "auto"
    "cache_floor_mb": _int("--cache-floor-mb", 1536, 0),
    "cache_ceil_mb": _int("--cache-ceil-mb", 0, 0),
    "io_threads": _int("--io-threads", 4), "no_odirect": _switch("--no-odirect"),
    "dense_weights": Option("--dense-weights", "choice", "anon"),
    "load_all": _switch("--load-all"), "force_cache": _switch("--force-cache"),
    "overlap": _switch("--overlap"), "io_two_wave": _switch("--io-two-wave"),
    "prefetch": _int("--prefetch", 0), "prefetch_sync": _switch("--prefetch-sync"),
    "drop_cold_experts": Option("--drop-cold-experts", "float", 0.0),
    "drop_no_renorm": _switch("--drop-no-renorm"),
    "drop_in_prefill": _switch("--drop-in-prefill"),
    "route_ahead": _int("--route-ahead", 0), "predict_log": _switch("--predict-log"),
    "predict_prefetch": _switch("--predict-prefetch"),
    "predict_spec_max": _int("--predict-spec-max", 2),
    "mtp": _switch("--mtp"), "ngram": _switch("--ngram"), "draft": _int("--draft", 3),
    "mtp_p_min": Option("--mtp-p-min", "float", 0.0),
    "ngram_min_match": _int("--ngram-min-match", 3),
}
# Flags abbench sets or that make a run something else than a benchmark run: why each.
RESERVED = {
    "model": "`model`", "prompt": "`prompt`", "n_predict": "`tokens`", "csv": "abbench (it "
    "reads the cell's CSV)", "temp": "abbench (greedy decoding)", "top_k": "abbench (greedy "
    "decoding)", "top_p": "abbench (greedy decoding)", "seed": "abbench (greedy decoding: "
    "a seed changes nothing)", "progress": "abbench (the CSV has the per-token times)",
    "session": "abbench (one prompt a cell)",
}


def _check_value(key: str, value: Any) -> None:
    """`value` as option `key` takes it (a problem names `bmoe.KEY`)."""
    opt, at = OPTIONS[key], ("bmoe", key)
    if opt.kind == "switch":
        if not isinstance(value, bool):
            fail(at, f"is a switch: true or false (got {show(value)})")
    elif opt.kind == "choice":
        if value not in DENSE_WEIGHTS:
            fail(at, f"expects {'|'.join(DENSE_WEIGHTS)} (got {show(value)})",
                 tip=did_you_mean(str(value), DENSE_WEIGHTS, "values"))
    elif opt.kind == "cache":
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)):
            fail(at, f'is MiB (an integer) or "auto" (got {show(value)})')
    elif opt.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            fail(at, f"must be an integer (got {show(value)})")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        fail(at, f"must be a number (got {show(value)})")
    if opt.kind in ("int", "float") and not (
            (opt.low is None or value >= opt.low) and (opt.high is None or value <= opt.high)):
        fail(at, f"must be >= {opt.low:g} (got {show(value)})")


@dataclass(frozen=True)
class BmoeCell:
    """A `bmoe-cli` cell, resolved: what it runs on and its options, checked as the CLI's
    `validate()` checks them."""

    model: str  # a path on the device, or `synthetic:...` (this machine only)
    tokens: int
    prompt: str
    bin_dir: str | None = None  # `bmoe_bin`: the folder of bmoe-cli (and its libraries)
    options: tuple[tuple[str, Scalar], ...] = ()  # the `bmoe` table, in file order

    def __post_init__(self) -> None:
        if not 1 <= self.tokens <= 1_000_000:
            fail(("tokens",), f"must be in 1 .. 1000000 (got {self.tokens})")
        for key, value in self.options:
            if key in RESERVED:
                fail(("bmoe", key), f"is set by {RESERVED[key]} in a bmoe cell",
                     tip="abbench fixes what a cell measures; the other options are yours")
            if key not in OPTIONS:
                fail(("bmoe", key), "is not a bmoe-cli option",
                     tip=did_you_mean(key, OPTIONS, "options") or "options are bmoe-cli's "
                     "long flags with `-` as `_` (docs/cells.md, bmoe cells)")
            _check_value(key, value)
        self._validate()

    def value(self, key: str) -> Any:
        """The option as the CLI will hold it: the table's value, else its default."""
        return dict(self.options).get(key, OPTIONS[key].default)

    def _refuse(self, keys: tuple[str, ...], problem: str) -> None:
        """Fail on the first of `keys` the table sets (the cell's table where none is)."""
        own = dict(self.options)
        key = next((k for k in keys if k in own), None)
        fail(("bmoe", key) if key else ("bmoe",), problem + " (bmoe-cli's validate(), "
             "core/src/config.cpp)", tip="bmoe-cli refuses it at start-up with `config "
             "error:`, exit 1")

    def _validate(self) -> None:
        """core/src/config.cpp `validate()` at 2d4f2b1, in its order, on what a cell can
        set (the model and the token count are abbench's: always valid)."""
        v = self.value
        if v("ubatch") > v("ctx_size"):
            self._refuse(("ubatch", "ctx_size"), f"n_ubatch={v('ubatch')} exceeds "
                         f"n_ctx={v('ctx_size')}")
        spec = v("mtp") or v("ngram")
        if v("mtp") and v("ngram"):  # main.cpp:573-581: exit 2, before validate()
            self._refuse(("ngram", "mtp"), "--mtp and --ngram are two draft sources for the "
                         "same verify loop; choose one")
        if spec and not 1 <= v("draft") <= DRAFT_MAX_LIMIT:
            self._refuse(("draft",), f"spec.draft_max must be in [1, {DRAFT_MAX_LIMIT}]")
        if v("mtp") and not 0 <= v("mtp_p_min") <= 1:
            self._refuse(("mtp_p_min",), "spec.draft_p_min must be in [0, 1]")
        if v("ngram") and v("mtp_p_min") != 0:
            self._refuse(("mtp_p_min", "ngram"), "spec.draft_p_min is an MTP knob and has no "
                         "meaning for the n-gram source")
        if v("ngram") and not 1 <= v("ngram_min_match") <= NGRAM_MAX_MATCH:
            self._refuse(("ngram_min_match",), "spec.ngram_min_match must be in [1, "
                         f"spec.ngram_max_match={NGRAM_MAX_MATCH}]")
        if spec and 0 < v("ubatch") < v("draft") + 1:
            self._refuse(("ubatch", "draft"), f"n_ubatch={v('ubatch')} is narrower than the "
                         f"verify batch ({v('draft') + 1} positions)")
        stream = v("moe_stream")
        for key in ("overlap", "predict_log", "predict_prefetch", "route_ahead"):
            if v(key) and not stream:
                self._refuse((key,), f"moe.{_field(key)} requires moe.enabled "
                             "(`moe_stream = true`)")
        if stream:
            self._validate_stream(spec)

    def _validate_stream(self, spec: bool) -> None:
        v = self.value
        if not 1 <= v("io_threads") <= IO_THREADS_MAX:
            self._refuse(("io_threads",), f"moe.io_threads must be in [1, {IO_THREADS_MAX}]")
        auto = v("cache_mb") == "auto"
        mb = 0 if auto else v("cache_mb")
        if mb < 0:
            self._refuse(("cache_mb",), "moe.cache_mb must be >= 0")
        if 0 < mb < CACHE_MIN_MB and not v("force_cache"):
            self._refuse(("cache_mb",), f"moe.cache_mb={mb} is in the pathological band "
                         f"(< {CACHE_MIN_MB} MiB): a cache smaller than one token's routed "
                         "working set thrashes; use 0, a value >= 1500, or force_cache")
        if not 0 <= v("prefetch") <= PREFETCH_MAX:
            self._refuse(("prefetch",), f"moe.prefetch_layers must be in [0, {PREFETCH_MAX}]")
        cache_on = mb > 0 or auto
        for key in ("prefetch", "predict_prefetch", "io_two_wave", "drop_cold_experts"):
            if v(key) and not cache_on:
                self._refuse((key, "cache_mb"), f"moe.{_field(key)} requires the LRU cache "
                             '(cache_mb > 0 or "auto")')
        if v("io_two_wave") and not v("overlap"):
            self._refuse(("io_two_wave",), "moe.io_two_wave requires moe.overlap")
        if not 0 <= v("predict_spec_max") <= 8:
            self._refuse(("predict_spec_max",), "moe.predict_spec_max must be in [0, 8]")
        if v("predict_prefetch") and v("prefetch"):
            self._refuse(("predict_prefetch", "prefetch"), "moe.predict_prefetch and "
                         "moe.prefetch_layers are mutually exclusive")
        if not 0 <= v("route_ahead") <= ROUTE_AHEAD_MAX:
            self._refuse(("route_ahead",), f"moe.route_ahead must be in [0, {ROUTE_AHEAD_MAX}]")
        if v("route_ahead") and (v("predict_log") or v("predict_prefetch") or v("prefetch")):
            self._refuse(("route_ahead",), "moe.route_ahead excludes predict_log, "
                         "predict_prefetch and prefetch_layers")
        if v("route_ahead") and spec:
            self._refuse(("route_ahead", "mtp", "ngram"), "moe.route_ahead and "
                         "self-speculative decoding are mutually exclusive")
        if not 0 <= v("drop_cold_experts") <= 1:
            self._refuse(("drop_cold_experts",), "moe.drop_cold_frac must be in [0, 1]")

    def flags(self) -> list[str]:
        """The table as `bmoe-cli` flags, in file order (a false switch left out)."""
        out: list[str] = []
        for key, value in self.options:
            if value is False:
                continue
            opt = OPTIONS[key]
            out += [opt.flag] if value is True else [opt.flag, _text(value)]
        return out

    def argv(self, binary: str, model_path: str, csv: str) -> list[str]:
        """The CLI's command line: the `BMOE_*` overrides unset, the binary's folder on the
        library path (where the project's build puts libbmoe)."""
        folder = os.path.dirname(binary) or "."
        unset = [word for name in ENV_OVERRIDES for word in ("-u", name)]
        return ["env", *unset,
                f"LD_LIBRARY_PATH={folder}", binary, "-m", model_path, "-p", self.prompt,
                "-n", str(self.tokens), *self.flags(), "--csv", csv]

    def expected_preamble(self) -> dict[str, str]:
        """What the CSV preamble says of a run of this cell (`RunInfo` as
        core/src/engine/session.cpp:746-790 fills it), for the settings that do not depend on
        the model or on what the streamer settles: a preamble that says otherwise is a run of
        another configuration (an older binary, an option it ignored)."""
        v = self.value
        stream = v("moe_stream")
        spec = "mtp" if v("mtp") else "ngram" if v("ngram") else "off"

        def on(key: str) -> str:
            return "1" if stream and v(key) else "0"
        out = {"threads": str(v("threads")), "n_ctx": str(v("ctx_size")),
               "n_ubatch": str(v("ubatch")), "chatml": "1" if v("chatml") else "0",
               "spec": spec, "spec_draft_max": str(v("draft") if spec != "off" else 0),
               "ngram_min_match": str(v("ngram_min_match") if spec == "ngram" else 0),
               "mtp_p_min": _g(v("mtp_p_min") if spec == "mtp" else 0.0),
               "moe_stream": "1" if stream else "0",
               "cache_auto": "1" if v("cache_mb") == "auto" else "0",
               "cache_floor_mb": str(v("cache_floor_mb")),
               "cache_ceil_mb": str(v("cache_ceil_mb")),
               "force_cache": "1" if v("force_cache") else "0",
               "io_threads": str(v("io_threads") if stream else 0),
               "o_direct": "1" if stream and not v("no_odirect") else "0",
               "prefetch": str(v("prefetch") if stream else 0),
               "route_ahead": str(v("route_ahead") if stream else 0),
               "predict_spec_max": str(v("predict_spec_max") if stream else 0),
               "drop_cold_frac": _g(v("drop_cold_experts") if stream else 0.0),
               "drop_renorm": "0" if v("drop_no_renorm") else "1",
               "drop_prefill": "1" if v("drop_in_prefill") else "0",
               "dense_weights": v("dense_weights")}
        out.update({k: on(k) for k in ("load_all", "overlap", "io_two_wave",
                                       "predict_prefetch", "predict_log", "prefetch_sync")})
        if v("n_expert_used") > 0:
            out["n_expert_used"] = str(v("n_expert_used"))
        return out


def _field(key: str) -> str:
    """The config.h field an option sets, as validate()'s messages name it."""
    return {"prefetch": "prefetch_layers", "drop_cold_experts": "drop_cold_frac"}.get(key, key)


def _g(value: float) -> str:
    """`%.4g`, as the preamble writes a float."""
    return f"{value:.4g}"


def _text(value: Scalar) -> str:
    return _g(value) if isinstance(value, float) else str(value)


def preamble_mismatches(expected: dict[str, str], preamble: dict[str, str]) -> list[str]:
    """`key=VALUE` (asked ASKED) for each setting the preamble records differently; a key it
    does not record (an older CSV) is not a mismatch."""
    wrong = []
    for key, want in expected.items():
        got = preamble.get(key)
        if got is None or got == want:
            continue
        try:
            if float(got) == float(want):
                continue
        except ValueError:
            pass
        wrong.append(f"{key}={got} (the cell asked {want})")
    return wrong


def find_binary(bin_dir: str | None, on_host: bool) -> str | None:
    """`bmoe-cli` in `bin_dir` (`bmoe_bin`), else on PATH; on another device (`on_host`
    false) the device's path as given, unchecked; here None when nothing is found."""
    if not on_host:
        return f"{bin_dir.rstrip('/')}/{BINARY}" if bin_dir else BINARY
    if bin_dir is None:
        return shutil.which(BINARY)
    path = Path(bin_dir).expanduser() / BINARY
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


# The cell's process: `bmoe-cli` in the background, its peak RSS (VmHWM) and the free-RAM
# floor (MemAvailable) read once a second while it runs, as scripts/bench-run.sh:13-37 reads
# them, then `key=value` lines in bench-run.sh's `.metrics` form (its lines 39-49) for the
# keys read here (the temperatures are the sampler's), and the CLI's own exit status. One
# line: old adb servers mangle newlines. A value never read is left empty (not recorded):
# the first reading is a second in, so a CLI that ends sooner has no peak RSS rather than
# the few kB of the moment it was started (bench-run.sh reads at once, and records those).
_WRAPPER = (
    "M=$1; shift; "
    "mem() { sed -n 's/^MemAvailable:[[:space:]]*\\([0-9]*\\).*/\\1/p' /proc/meminfo; }; "
    "hwm() { sed -n 's/^VmHWM:[[:space:]]*\\([0-9]*\\).*/\\1/p' /proc/$1/status 2>/dev/null; }; "
    "M0=$(mem); F=$M0; P=; \"$@\" & C=$!; "
    "while kill -0 $C 2>/dev/null; do sleep 1; "
    "R=$(hwm $C); [ -n \"$R\" ] && [ \"$R\" -gt \"${P:-0}\" ] && P=$R; "
    "A=$(mem); [ -n \"$A\" ] && [ \"$A\" -lt \"${F:-$A}\" ] && F=$A; "
    "done; wait $C; RC=$?; M1=$(mem); "
    "printf 'peak_rss_kb=%s\\nmem_avail_before_kb=%s\\nmem_avail_floor_kb=%s\\n"
    "mem_avail_after_kb=%s\\n' \"$P\" \"$M0\" \"$F\" \"$M1\" > \"$M\"; exit $RC"
)


def wrapped(argv: list[str], metrics: str) -> list[str]:
    """`argv` run under the pressure sampler, which writes `metrics`."""
    return ["sh", "-c", _WRAPPER, "bmoe", metrics, *argv]
