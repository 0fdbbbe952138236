"""The engine's configuration: one frozen dataclass, validated on construction.

Field names are the long flag names with `-` turned into `_`, so an error can name the flag
and a campaign file can name the same keys.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, get_type_hints

from abbench.engine.architectures import PRESET_NAMES
from abbench.errors import ConfigError, Setting
from abbench.workers import workers

DEFAULT_PROMPT = "Explain how a mixture-of-experts model routes each token."
MAX_REPEAT_PENALTY = 100.0
MAX_REPEAT_LAST_N = 1_000_000


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


MODEL, STREAMING, POLICIES = "model and workload", "streaming", "policies (all off by default)"
TURNS = "turn-taking (interleaved campaigns)"
MAX_TURN_TOKENS = 1_000_000
KERNELS = ("auto", "ggml", "numpy")
RELAYS = ("auto", "lanes", "off")


def option(default: Any, help: str, group: str, *, short: str | None = None,
           metavar: str | None = None, choices: tuple[str, ...] | None = None,
           toggle: bool = False, parse: Callable[[str], Any] | None = None,
           cell_key: bool = True) -> Any:
    """An engine option: its default and how the command line shows it. Its flag is the
    field name with `-` for `_`; a bool is a switch (`--flag`, or `--flag/--no-flag` when
    `toggle`), anything else takes a value of the field's type (or `parse`'s). `cell_key`
    False: a campaign sets it itself, so no cell may (it is no campaign key, and no part
    of a cell's configuration)."""
    return field(default=default, metadata={
        "help": help, "group": group, "short": short, "metavar": metavar, "choices": choices,
        "toggle": toggle, "parse": parse, "cell_key": cell_key})


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids, got `{text}`") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


@dataclass(frozen=True)
class EngineConfig:
    """Every option of `abbench engine run`, declared once: the command line, a campaign
    cell's TOML keys, the child process's argv and the run JSON's `config` all come from
    these fields (see docs/architecture.md, "adding an engine flag")."""

    model: str = option(MISSING, f"a .gguf file, or synthetic:PRESET[@SEED] ({PRESET_NAMES}), "
                        "or a real shape quantized, synthetic:qwen3-30b-a3b-4L-Q4_K_M (built "
                        "once)", MODEL, short="-m")
    prompt: str = option(DEFAULT_PROMPT, "prompt text (byte vocabularies)", MODEL, short="-p")
    prompt_tokens: tuple[int, ...] | None = option(
        None, "prompt as comma-separated token ids (overrides --prompt)", MODEL,
        metavar="IDS", parse=_token_ids)
    n_tokens: int = option(64, "tokens to decode (default 64)", MODEL, short="-n", metavar="N")
    temp: float | None = option(  # None: the model's `general.sampling.temp`, else greedy
        None, "sampling temperature; 0 = greedy (default: the model's general.sampling.temp, "
        "1.0 on synthetic models, else greedy)", MODEL)
    seed: int = option(0, "sampling seed (default 0)", MODEL)
    # None: the model's `general.sampling.penalty_repeat` / `penalty_last_n`, else 1.0 / 64
    repeat_penalty: float | None = option(
        None, "divide the positive logits (multiply the negative ones) of tokens among the "
        "last --repeat-last-n by P; 1 = off (default: the model's "
        "general.sampling.penalty_repeat, 1.1 on synthetic models, else 1)", MODEL,
        metavar="P")
    repeat_last_n: int | None = option(
        None, "how many of the context's last tokens the penalty covers, prompt included "
        "(default: the model's general.sampling.penalty_last_n, else 64)", MODEL, metavar="N")
    n_expert_used: int | None = option(None, "override the model's top-k", MODEL, metavar="K")
    n_ctx: int | None = option(None, "KV cache length (default: prompt + N)", MODEL)
    ignore_eos: bool = option(False, "decode all N tokens: never sample an end-of-generation "
                              "token, as llama.cpp's --ignore-eos (default: stop at one, as "
                              "llama.cpp does; campaign cells default to it)", MODEL)
    # streaming
    dense: str = option("pinned", "dense weights read into anonymous memory at load (pinned, "
                        "default) or left to the page cache (mmap)", STREAMING,
                        choices=("pinned", "mmap"))
    resident: bool = option(False, "load every expert at startup (the reference for the "
                            "gates)", STREAMING)
    cache_mib: float = option(256.0, "LRU expert cache budget in MiB; 0 = no cache "
                              "(default 256)", STREAMING, metavar="MIB")
    io_lanes: int = option(4, "reader threads, each with its own descriptor (default 4)",
                           STREAMING, metavar="N")
    o_direct: bool = option(True, "bypass the page cache for expert reads (default on; falls "
                            "back with a warning where the filesystem refuses)", STREAMING,
                            toggle=True)
    overlap: bool = option(False, "compute resident experts while missing ones load "
                           "(default off)", STREAMING, toggle=True)
    threads: int = option(0, "expert compute threads (default: one per core, up to 8)",
                          STREAMING, metavar="N")  # 0: one per core (up to 8)
    kernels: str = option("auto", "how weights that are not F32 are computed: ggml (in the "
                          "file's own types, by ggml's CPU kernels; the cache holds the "
                          "file's bytes), numpy (converted to F32 when read: the reference), "
                          "auto (ggml where the experts are not F32, else numpy; default)",
                          STREAMING, choices=KERNELS)
    repack: bool = option(True, "with ggml kernels, lay resident quantized weights out for "
                          "ggml's repacked kernels where this CPU has them, as llama.cpp does "
                          "by default (--no-repack: as the file has them; the bits differ "
                          "in the last place)", STREAMING, toggle=True)
    prelaid: bool = option(False, "read quantized experts from a copy laid out for ggml's "
                           "repacked kernels, written once into the model cache "
                           "($ABBENCH_CACHE/prelaid: the experts' size again on disk), "
                           "instead of re-laying each one as it is read (needs ggml kernels "
                           "and --repack)", STREAMING)
    relay: str = option("auto", "streamed quantized experts: re-laid for ggml's repacked "
                        "kernels by the reader lanes as each lands (lanes: the resident "
                        "run's kernels and bits, for about 1 ms of CPU per expert), or kept "
                        "as the file has them (off: ggml's plain kernels, their bits the "
                        "same in all but the last place); auto (default): lanes where this "
                        "process has a core beyond the compute threads to lay on, else off",
                        STREAMING, choices=RELAYS)
    flash_attn: bool = option(False, "attention as llama.cpp's default computes it on CPU: "
                              "flash attention over an F16 KV cache (llama-completion's "
                              "-fa on); default off: KQ, the masked softmax and KQV over an "
                              "F32 cache (its -fa off -ctk f32 -ctv f32). Computed on ggml's "
                              "graph model: --kernels auto takes it, numpy refuses", STREAMING)
    # policies (all off by default)
    drop_cold_experts: float | None = option(  # F: skip non-resident experts below F/k
        None, "in decode, skip a routed expert that is not resident and whose weight is "
        "below F/k (0 < F <= 1; the top expert is never skipped; needs the cache)", POLICIES,
        metavar="F")
    drop_in_prefill: bool = option(False, "drop during prefill too", POLICIES)
    drop_no_renorm: bool = option(False, "do not renormalise the surviving experts' weights",
                                  POLICIES)
    prefetch: int = option(  # K: speculate the previous token's routing of layers l+1..l+K
        0, "after each layer's load, speculatively read the experts the previous token "
        "routed at the next K layers (needs the cache)", POLICIES, metavar="K")
    prefetch_sync: bool = option(False, "complete speculative reads at once (deterministic; "
                                 "for tests)", POLICIES)
    predict_log: bool = option(False, "score the stale-gate, previous-token and control "
                               "predictors per layer (reads the same bytes; do not read tok/s "
                               "off a probed run)", POLICIES)
    predict_prefetch: bool = option(False, "speculate the stale-gate prediction of the next "
                                    "layer (exclusive with --prefetch; needs the cache)",
                                    POLICIES)
    predict_spec_max: int = option(2, "speculate at most the top N predicted misses per "
                                   "layer, 0..8; 0 = retention only (default 2)", POLICIES,
                                   metavar="N")
    route_trace: str | None = option(None, "write one row per routed expert (route_trace v1)",
                                     POLICIES, metavar="FILE")
    # N: after the prefill and every N decode tokens, settle what is in flight and wait on
    # stdin for the driver's `go` (records.slices); a campaign's `interleave` sets it
    turn_tokens: int = option(
        0, "take turns with another run: after the prefill and after every N decode tokens, "
        "settle in-flight reads, print `abbench-turn ...` on stdout and wait for a `go` line "
        "on stdin (end of file or `stop`: finish now, writing the outputs); 0 = off "
        "(default; docs/engine.md#turn-taking)", TURNS, metavar="N", cell_key=False)

    def __post_init__(self) -> None:
        CACHE = Setting("cache_mib")  # noqa: N806
        bad = ConfigError.of

        if self.n_tokens < 1:
            raise bad("n_tokens", f"must be at least 1 (got {self.n_tokens})")
        if self.temp is not None and self.temp < 0:
            raise bad("temp", f"must be >= 0 (got {self.temp})")
        if self.repeat_penalty is not None and not 0 < self.repeat_penalty <= MAX_REPEAT_PENALTY:
            raise bad("repeat_penalty", f"must be in (0, {MAX_REPEAT_PENALTY:g}] "
                      f"(got {self.repeat_penalty})")
        if self.repeat_last_n is not None and not 0 <= self.repeat_last_n <= MAX_REPEAT_LAST_N:
            raise bad("repeat_last_n", f"must be between 0 and {MAX_REPEAT_LAST_N} "
                      f"(got {self.repeat_last_n})")
        if self.n_expert_used is not None and self.n_expert_used < 1:
            raise bad("n_expert_used", f"must be at least 1 (got {self.n_expert_used})")
        if self.n_ctx is not None and self.n_ctx < 2:
            raise bad("n_ctx", f"must be at least 2 (got {self.n_ctx})")
        self._check_compute()
        if self.prompt_tokens is not None and not self.prompt_tokens:
            raise bad("prompt_tokens", "must name at least one token id")
        if self.prompt_tokens is None and not self.prompt:
            raise bad("prompt", "must not be empty")
        has_cache = self.resident or self.cache_mib > 0
        if self.drop_cold_experts is not None:
            if not 0 < self.drop_cold_experts <= 1:
                raise bad("drop_cold_experts", f"must be in (0, 1] (got {self.drop_cold_experts})")
            if not has_cache:
                raise bad("drop_cold_experts", "needs the expert cache (", CACHE, " > 0)")
        elif self.drop_in_prefill or self.drop_no_renorm:
            flag = "drop_in_prefill" if self.drop_in_prefill else "drop_no_renorm"
            raise bad(flag, "needs ", Setting("drop_cold_experts"), " F")
        if not 0 <= self.prefetch <= 64:
            raise bad("prefetch", f"must be between 0 (off) and 64 layers (got {self.prefetch})")
        if self.prefetch and not has_cache:
            raise bad("prefetch", "needs the expert cache (", CACHE, " > 0)")
        if self.predict_prefetch:
            if self.prefetch:
                raise bad("predict_prefetch", "and ", Setting("prefetch"),
                          " are mutually exclusive")
            if not has_cache:
                raise bad("predict_prefetch", "needs the expert cache (", CACHE, " > 0)")
        if not 0 <= self.predict_spec_max <= 8:
            raise bad("predict_spec_max", f"must be between 0 and 8 (got {self.predict_spec_max})")
        if self.prefetch_sync and not (self.prefetch or self.predict_prefetch):
            raise bad("prefetch_sync", "needs ", Setting("prefetch"), " K or ",
                      Setting("predict_prefetch"))
        if not 0 <= self.turn_tokens <= MAX_TURN_TOKENS:
            raise bad("turn_tokens", f"must be between 0 (off) and {MAX_TURN_TOKENS} "
                      f"(got {self.turn_tokens})")

    def _check_compute(self) -> None:
        """The settings of how weights are held, read and computed."""
        bad = ConfigError.of
        if self.dense not in ("pinned", "mmap"):
            raise bad("dense", f"must be `pinned` or `mmap` (got `{self.dense}`)")
        if self.kernels not in KERNELS:
            raise bad("kernels", f"must be one of {', '.join(KERNELS)} (got `{self.kernels}`)")
        if self.flash_attn and self.kernels == "numpy":
            raise bad("flash_attn", "is computed on ggml's graph model: not with --kernels "
                      "numpy")
        # what rules out ggml's repacked kernels, if anything
        plain = "--kernels numpy" if self.kernels == "numpy" else None if self.repack \
            else "--no-repack"
        if self.prelaid and plain:
            raise bad("prelaid", f"is a copy laid out for ggml's repacked kernels: not with "
                      f"{plain}")
        if self.relay not in RELAYS:
            raise bad("relay", f"must be one of {', '.join(RELAYS)} (got `{self.relay}`)")
        if self.relay == "off" and self.prelaid:
            raise bad("relay", "off keeps streamed experts as the file has them; --prelaid "
                      "reads them already re-laid: not both")
        if self.relay == "lanes" and plain:
            raise bad("relay", f"lanes re-lays experts for ggml's repacked kernels: not with "
                      f"{plain}")
        if not self.cache_mib >= 0:
            raise bad("cache_mib", f"must be >= 0 (got {self.cache_mib})")
        if not 1 <= self.io_lanes <= 64:
            raise bad("io_lanes", f"must be between 1 and 64 (got {self.io_lanes})")
        if not 0 <= self.threads <= 256:
            raise bad("threads", f"must be between 0 (auto) and 256 (got {self.threads})")

    @property
    def speculates(self) -> bool:
        return bool(self.prefetch) or self.predict_prefetch

    @property
    def compute_threads(self) -> int:
        return self.threads or default_threads()

    @property
    def relays_streamed(self) -> bool:
        """Whether the reader lanes re-lay streamed quantized experts (`--relay`). `auto`
        asks for a core beside the compute threads: on a machine they fill, laying competes
        with the decode for its cores and costs more than the repacked kernels save
        (docs/engine.md, "What re-laying a streamed expert costs")."""
        if self.relay == "auto":
            return workers() > self.compute_threads
        return self.relay == "lanes"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt_tokens"] = list(self.prompt_tokens) if self.prompt_tokens else None
        d["threads"] = self.compute_threads
        return d


# -- the command line, from the declarations ----------------------------------------------


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _options() -> list[tuple[Field[Any], type]]:
    hints = get_type_hints(EngineConfig)
    out = []
    for f in fields(EngineConfig):
        hint = hints[f.name]
        base = next((t for t in getattr(hint, "__args__", (hint,)) if t is not type(None)), hint)
        out.append((f, base))
    return out


def add_options(parser: argparse.ArgumentParser) -> None:
    """Every engine option as an argparse flag, in its group, with its default and help."""
    groups: dict[str, Any] = {}
    for f, base in _options():
        m = f.metadata
        group = groups.get(m["group"]) or groups.setdefault(
            m["group"], parser.add_argument_group(m["group"]))
        names = [m["short"], flag(f.name)] if m["short"] else [flag(f.name)]
        kw: dict[str, Any] = {"help": m["help"], "dest": f.name}
        if f.name == "model":
            kw["required"] = True
        elif base is bool:
            kw["action"] = argparse.BooleanOptionalAction if m["toggle"] else "store_true"
            kw["default"] = f.default
        else:
            kw["default"] = f.default
        if base is not bool:
            kw["type"] = m["parse"] or base
            if m["metavar"]:
                kw["metavar"] = m["metavar"]
            if m["choices"]:
                kw["choices"] = list(m["choices"])
                del kw["type"]
        group.add_argument(*names, **kw)


def from_args(a: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(a, f.name) for f in fields(EngineConfig)})


def to_argv(values: dict[str, Any], route_trace: str | None = None) -> list[str]:
    """The flags that give an `EngineConfig` of these field values (a campaign cell's
    resolved configuration; absent and None fields take their defaults). A route trace is
    written to `route_trace` when the values ask for one."""
    argv: list[str] = [f"--model={values['model']}"]
    for f, base in _options():
        value = values.get(f.name)
        if f.name == "route_trace":
            if value and route_trace:
                argv += [flag(f.name), route_trace]
            continue
        if f.metadata["toggle"]:
            on = f.default if value is None else bool(value)
            argv.append(flag(f.name) if on else "--no-" + flag(f.name)[2:])
        elif base is bool:
            if value:
                argv.append(flag(f.name))
        elif value is not None and value != f.default and f.name != "model":
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            argv.append(f"{flag(f.name)}={shown}")  # one word: a prompt may start with `-`
    return argv
