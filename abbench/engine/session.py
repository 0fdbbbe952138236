"""One engine run: load a model for streaming, prefill a prompt, decode N tokens, measure each.

Prompt tokens but the last run as one batch per layer (`phase=0`; one record
per batch of up to PREFILL_BATCH tokens); decode step i feeds the newest token and samples
the next (`phase=1`), so N decode steps produce N tokens, each one forward pass — step 1
feeds the prompt's last token, and time to first token is prefill plus step 1. Timing
covers each pass and sampling; counters of what the expert side did are collected per pass.
How a token is computed: docs/engine.md#how-a-token-is-computed.
"""

from __future__ import annotations

import resource
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from threadpoolctl import threadpool_limits

from abbench.engine import ggml
from abbench.engine.arch import GRAPHS, architecture
from abbench.engine.config import MAX_REPEAT_LAST_N, MAX_REPEAT_PENALTY, EngineConfig
from abbench.engine.experts import MIB, ExpertRunner
from abbench.engine.gguf_file import ModelFile
from abbench.engine.models import check_context_memory
from abbench.engine.policies import Policies
from abbench.engine.predictor import RoutePredictor
from abbench.engine.qcompute import QuantTeam
from abbench.engine.sampling import Sampler
from abbench.engine.streamer import LayerExperts, expert_layout
from abbench.engine.tokenizer import Tokenizer, end_of_generation, tokenizer_for
from abbench.errors import ConfigError, EngineError
from abbench.records.route_trace import RouteTraceWriter

# Prompt tokens per prefill pass: llama.cpp's default micro-batch. It bounds a pass's
# attention scores (heads x batch x context floats) and its union of experts.
PREFILL_BATCH = 512


@dataclass(frozen=True)
class TokenRecord:
    step: int  # 1-based within its phase
    phase: int  # 0 prefill, 1 decode
    token: int  # the token fed to this forward pass (a prefill batch's first)
    wall_ms: float
    io_ms: float
    compute_ms: float
    stall_ms: float
    mgmt_ms: float
    read_bytes: int
    hits: int
    misses: int
    evictions: int
    majflt: int
    cpu_ms: float
    rss_mib: float
    experts_routed: int
    experts_dropped: int
    spec_read_bytes: int = 0
    spec_experts: int = 0
    spec_useful: int = 0
    spec_cancelled: int = 0
    retained: int = 0
    tokens: int = 1  # how many tokens the pass ran: a prefill batch's size, 1 in decode

    @property
    def cache_hit_pct(self) -> float:
        looked = self.hits + self.misses
        return 100.0 * self.hits / looked if looked else 0.0


@dataclass(frozen=True)
class RunResult:
    config: EngineConfig
    model: dict[str, Any]
    o_direct: bool
    threads: int
    temp: float
    repeat_penalty: float
    repeat_last_n: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    text: str
    records: tuple[TokenRecord, ...]
    load_s: float
    resident_mib: float
    cache_budget_mib: float
    peak_rss_mib: float
    dense_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)
    # The output as llama.cpp prints it: each token's bytes, unchecked (byte tokens may spell
    # bytes that are no UTF-8); `text` is the same decoded, broken sequences replaced.
    text_bytes: bytes = b""

    @property
    def decode(self) -> tuple[TokenRecord, ...]:
        return tuple(r for r in self.records if r.phase == 1)

    @property
    def prefill(self) -> tuple[TokenRecord, ...]:
        return tuple(r for r in self.records if r.phase == 0)


def model_info(mf: ModelFile) -> dict[str, Any]:
    """Architecture and sizes of a model file, as `abbench model info` prints them."""
    arch = architecture(mf.architecture, mf.path)
    args = arch.ModelArgs.from_file(mf)
    layout = expert_layout(mf, args.block_count, args.expert_count)
    kernels = choose_kernels("auto", layout)
    expert_names = {t.name for le in layout for t in (le.gate, le.up, le.down)}
    expert_file_bytes = sum(mf.tensors[n].nbytes for n in expert_names)
    dense_bytes = sum(t.nbytes for n, t in mf.tensors.items() if n not in expert_names)
    types = sorted({t.type_name for t in mf.tensors.values()})
    info: dict[str, Any] = {
        "path": str(mf.path),
        "architecture": mf.architecture,
        "name": mf.get("general.name"),
        "file_bytes": mf.file_size,
        "alignment": mf.alignment,
        "tensor_types": types,
        "n_layer": args.block_count,
        "n_expert": args.expert_count,
        "n_expert_used": args.expert_used_count,
        "d_model": args.embedding_length,
        "expert_ff": args.expert_feed_forward_length,
        "n_head": args.head_count,
        "n_head_kv": args.head_count_kv,
        "head_dim": args.key_length,
        "vocab_size": args.vocab_size,
        "context_length": args.context_length,
        "dense_bytes": dense_bytes,
        "expert_file_bytes": expert_file_bytes,
        "expert_slice_bytes": {
            "gate": layout[0].gate.nbytes // args.expert_count,
            "up": layout[0].up.nbytes // args.expert_count,
            "down": layout[0].down.nbytes // args.expert_count,
        },
        "expert_bytes": layout[0].file_bytes,
        "expert_f32_bytes": layout[0].buffer_bytes,
        # What the engine computes the experts with by default (`--kernels auto`), and so
        # what one expert holds in the cache: the file's bytes with ggml, else F32.
        "kernels": kernels,
        "expert_resident_bytes": [le.file_bytes if kernels == "ggml" else le.buffer_bytes
                                  for le in layout],
        "routed_bytes_per_token": sum(le.file_bytes for le in layout) * args.expert_used_count,
        "sampling_temp": mf.get("general.sampling.temp"),
        "sampling_penalty_repeat": mf.get("general.sampling.penalty_repeat"),
        "sampling_penalty_last_n": mf.get("general.sampling.penalty_last_n"),
        "synthetic": {k.split(".", 2)[2]: v for k, v in mf.metadata.items()
                      if k.startswith("abbench.synthetic.")} or None,
    }
    return info


class Engine:
    """A loaded model ready to run `config` once. Use as a context manager."""

    def __init__(self, config: EngineConfig, model_path: str | Path) -> None:
        t0 = time.perf_counter()
        self.config = config
        self.mf = ModelFile(model_path)
        arch = architecture(self.mf.architecture, self.mf.path)
        args = arch.ModelArgs.from_file(self.mf)
        self.info = model_info(self.mf)
        _check_vectors(self.mf)
        k = config.n_expert_used or args.expert_used_count
        if k > args.expert_count:
            raise ConfigError(
                f"`--n-expert-used` {k} exceeds the model's {args.expert_count} experts"
            )
        if config.prompt_tokens is not None:
            bad = [t for t in config.prompt_tokens if not 0 <= t < args.vocab_size]
            if bad:
                raise ConfigError(
                    f"`--prompt-tokens`: ids {bad[:5]} outside the vocabulary "
                    f"(0..{args.vocab_size - 1})"
                )
            self.prompt_ids = list(config.prompt_tokens)
            self.tokenizer: Tokenizer | None = None
        else:
            self.tokenizer = tokenizer_for(self.mf)
            self.prompt_ids = self.tokenizer.encode(config.prompt)
        need = len(self.prompt_ids) + config.n_tokens
        n_ctx = config.n_ctx or need
        if need > n_ctx or n_ctx > args.context_length:
            raise ConfigError(
                f"prompt ({len(self.prompt_ids)} tokens) + `-n` {config.n_tokens} = {need} "
                f"does not fit the context ({n_ctx} asked, model maximum {args.context_length})"
            )
        check_context_memory(self.mf.path, n_ctx, args.context_bytes(n_ctx))
        temp = config.temp
        if temp is None:
            stored = self.mf.get("general.sampling.temp")  # a file's: any type, any value
            usable = isinstance(stored, (int, float)) and not isinstance(stored, bool) \
                and 0 <= stored < float("inf")
            temp = float(stored) if usable else 0.0
        self.temp = temp
        stored_penalty, stored_last_n = _stored_penalty(self.mf)
        self.repeat_penalty = (stored_penalty if config.repeat_penalty is None
                               else float(config.repeat_penalty))
        self.repeat_last_n = (stored_last_n if config.repeat_last_n is None
                              else int(config.repeat_last_n))
        self.end_ids = end_of_generation(self.mf)  # EOS and llama.cpp's other EOG tokens
        layout = expert_layout(self.mf, args.block_count, args.expert_count)
        self.dense_bytes = int(self.info["dense_bytes"])
        self.kernels = choose_kernels(config.kernels, layout)
        team = (QuantTeam(config.compute_threads, config.repack) if self.kernels == "ggml"
                else None)
        self.runner = ExpertRunner(
            self.mf,
            layout,
            cache_mib=config.cache_mib,
            resident=config.resident,
            io_lanes=config.io_lanes,
            o_direct=config.o_direct,
            overlap=config.overlap,
            threads=config.compute_threads,
            max_k=k,
            policies=Policies.of(config),
            team=team,
        )
        pinned = config.dense == "pinned"
        if team is None:
            self.model = arch.Model(self.mf, args, self.runner, pinned, n_ctx, k)
        else:  # llama.cpp's graph, as llama.cpp computes a quantized file
            graph = GRAPHS[self.mf.architecture]
            self.model = graph.GraphModel(self.mf, args, self.runner, team, pinned, n_ctx, k)
        self.predictor: RoutePredictor | None = None
        if config.predict_log or config.predict_prefetch:
            self.model.fuse_next_routers()  # before the partner, which shares those GEMVs
            self.predictor = RoutePredictor(
                [self.model.router_matrix(i) for i in range(args.block_count)],
                log=config.predict_log, predict=config.predict_prefetch,
                weights=config.predict_spec_max > 0,
            )
            self.model.routing_hook = self.predictor
            self.runner.predictor = self.predictor
        prefill_rows = min(PREFILL_BATCH, max(0, len(self.prompt_ids) - 1))
        self.runner.start_partner(self.model.gemv_matrices(), prefill_rows)
        self.model.matvec = self.runner.team.matvec
        self.model.matmul_t = self.runner.team.matmul_t
        self.model.vector = self.runner.team.input
        self.layout = layout
        self.load_s = time.perf_counter() - t0

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.runner.close()

    def _open_trace(self) -> RouteTraceWriter | None:
        path = self.config.route_trace
        if path is None:
            return None
        expert_names = {t.name for le in self.layout for t in (le.gate, le.up, le.down)}
        layer_bytes = []
        for i, le in enumerate(self.layout):
            prefix = f"blk.{i}."
            dense = sum(t.nbytes for n, t in self.mf.tensors.items()
                        if n.startswith(prefix) and n not in expert_names)
            layer_bytes.append((le.file_bytes, dense))
        info = self.info
        return RouteTraceWriter(path, str(info["name"] or info["path"]), info["architecture"],
                                info["n_layer"], info["n_expert"], self.model.k, layer_bytes)

    def run(self, on_token: Callable[[TokenRecord], None] | None = None) -> RunResult:
        # The engine parallelises over experts with its own threads (`--threads`). BLAS's
        # threads would fight them: two callers of a threaded OpenBLAS serialise, and its
        # idle workers busy-wait on the cores the compute team needs. So BLAS runs
        # single-threaded inside a run.
        trace = self._open_trace()
        self.runner.trace = trace
        try:
            with threadpool_limits(limits=1, user_api="blas"):
                result = self._run(on_token)
        except BaseException:
            if trace is not None:
                trace.abandon()
            raise
        finally:
            self.runner.trace = None
        if trace is not None:
            trace.close()
        return result

    def _run(self, on_token: Callable[[TokenRecord], None] | None) -> RunResult:
        cfg = self.config
        # --ignore-eos as llama.cpp's: the end-of-generation tokens are never sampled
        sampler = Sampler(self.temp, cfg.seed, self.repeat_penalty, self.repeat_last_n,
                          self.end_ids if cfg.ignore_eos else ())
        records: list[TokenRecord] = []
        prompt = self.prompt_ids
        for tok in prompt:
            sampler.accept(tok)
        output: list[int] = []
        pos = 0
        # The prompt but its last token, in batches of PREFILL_BATCH; the last one runs as
        # decode step 1, whose logits sample the first output token.
        for start in range(0, len(prompt) - 1, PREFILL_BATCH):
            batch = prompt[start : min(start + PREFILL_BATCH, len(prompt) - 1)]
            records.append(self._prefill(batch, pos, len(records) + 1))
            pos += len(batch)
        self.runner.finish()
        current = prompt[-1]
        for step in range(1, cfg.n_tokens + 1):
            holder: list[int] = []
            rec = self._step(current, pos, 1, step, lambda lg, h=holder: h.append(sampler(lg)))
            records.append(rec)
            if on_token is not None:
                on_token(rec)
            current = holder[0]
            output.append(current)
            pos += 1
            if current in self.end_ids:  # never sampled with --ignore-eos
                break
        self.runner.finish()
        extra: dict[str, Any] = {
            "policies": {
                "drop_cold_experts": cfg.drop_cold_experts, "drop_in_prefill": cfg.drop_in_prefill,
                "drop_renorm": not cfg.drop_no_renorm, "prefetch": cfg.prefetch,
                "prefetch_sync": cfg.prefetch_sync, "predict_log": cfg.predict_log,
                "predict_prefetch": cfg.predict_prefetch,
                "predict_spec_max": cfg.predict_spec_max if cfg.predict_prefetch else None,
            },
        }
        extra["kernels"] = self.kernel_info()
        if self.predictor is not None and cfg.predict_log:
            extra["predict"] = self.predictor.scores.to_dict()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        raw = b"".join(self.tokenizer.piece(i) for i in output) if self.tokenizer else b""
        return RunResult(
            config=cfg,
            model=self.info,
            o_direct=self.runner.o_direct,
            threads=cfg.compute_threads,
            temp=self.temp,
            repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n,
            prompt_ids=tuple(prompt),
            output_ids=tuple(output),
            text=raw.decode("utf-8", errors="replace"),
            text_bytes=raw,
            records=tuple(records),
            load_s=self.load_s,
            resident_mib=self.runner.cache.resident_bytes / MIB,
            cache_budget_mib=self.runner.cache.budget_bytes / MIB,
            peak_rss_mib=peak,
            dense_bytes=self.dense_bytes,
            extra=extra,
        )

    def kernel_info(self) -> dict[str, Any]:
        """What computed this run: the backend, and the types of the experts and of the
        dense matrices as they were computed."""
        dense = self.model.dense_types() if hasattr(self.model, "dense_types") else ["F32"]
        info: dict[str, Any] = {
            "backend": self.kernels,
            "experts": self.runner.kernel_types,
            "dense": dense,
        }
        if self.kernels == "ggml":
            lib = ggml.lib()
            info["ggml"] = {"library": str(lib.folder), "cpu": lib.cpu_features()}
            dense = getattr(self.model, "dense_matrices", list)()
            info["repacked"] = {
                "experts": self.runner.repacked,
                "dense": sorted({GGMLQuantizationType(m.ggml_type).name for m in dense
                                 if m.repacked}),
            }
        return info

    def _prefill(self, tokens: list[int], pos: int, step: int) -> TokenRecord:
        """One prefill pass over `tokens` (positions pos ..), measured as one record."""
        return self._measure(step, 0, tokens, lambda: self.model.prefill(tokens, pos), pos)

    def _step(
        self, token: int, pos: int, phase: int, step: int,
        sample: Callable[[np.ndarray], None] | None,
    ) -> TokenRecord:
        def forward() -> None:
            logits = self.model.forward(token, pos, phase)  # (vocab,)
            # NaN or inf weights, or bytes that are not what the header says they are,
            # decode into tokens all the same: a run on them is no measurement. One pass
            # over the logits per token (microseconds) decides it, on either backend.
            if not np.isfinite(logits).all():
                raise EngineError(
                    f"{self.mf.path}: non-finite logits (NaN or inf) at decode step {step}: "
                    "NaN or inf in the weights, or a tensor's bytes are not what its header "
                    "says", tip="no measurement comes of this file: check it against its "
                    "source (a checksum), or rebuild it")
            if sample is not None:
                sample(logits)

        return self._measure(step, phase, [token], forward, step - 1)

    def _measure(self, step: int, phase: int, tokens: list[int], work: Callable[[], None],
                 trace_step: int) -> TokenRecord:
        tok = self.runner.tok
        self.runner.begin_pass(phase, trace_step)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        partner0 = self.runner.partner_cpu_s()
        t0 = time.perf_counter()
        # A prefill batch's GEMMs run on one BLAS thread too: BLAS splits a GEMM by thread
        # count, and the output must not depend on --threads (measured: two BLAS threads
        # gave no clear gain on 2 cores).
        work()
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        cpu += self.runner.partner_cpu_s() - partner0
        return TokenRecord(
            step=step,
            phase=phase,
            token=tokens[0],
            tokens=len(tokens),
            wall_ms=wall * 1e3,
            io_ms=tok.io_s * 1e3,
            compute_ms=max(0.0, wall - tok.stall_s - tok.mgmt_s) * 1e3,
            stall_ms=tok.stall_s * 1e3,
            mgmt_ms=tok.mgmt_s * 1e3,
            majflt=ru1.ru_majflt - ru0.ru_majflt,
            cpu_ms=cpu * 1e3,
            rss_mib=_rss_mib(),
            **tok.counts(),
        )


def choose_kernels(choice: str, layout: list[LayerExperts]) -> str:
    """`ggml` or `numpy` for `--kernels` (auto: ggml where the experts are not F32)."""
    quantized = any(t.ggml_type != GGMLQuantizationType.F32
                    for le in layout for t in (le.gate, le.up, le.down))
    if choice == "numpy" or (choice == "auto" and not quantized):
        return "numpy"
    try:
        ggml.lib()
    except ggml.GgmlUnavailable as e:
        if choice == "ggml":
            raise
        warnings.warn(f"{e.message}: the experts are converted to F32 by numpy (the "
                      "reference path: slow, and 3.8-7x the memory)", RuntimeWarning,
                      stacklevel=2)
        return "numpy"
    return "ggml"


def _check_vectors(mf: ModelFile) -> None:
    """Refuse a model whose vectors (the norms' weights: kilobytes) hold NaN or inf.
    The logits check in `Engine._step` finds NaN anywhere else, but with ggml kernels a
    NaN that a norm weight puts into a few values is lost when the next quantized matrix
    quantizes its input, and the run would decode finite garbage."""
    for name, info in mf.tensors.items():
        if len(info.shape) == 1 and not np.isfinite(mf.read_dense(name, True)).all():
            raise EngineError(f"{mf.path}: tensor `{name}` holds NaN or inf",
                              tip="no measurement comes of this file: check it against its "
                              "source (a checksum), or rebuild it")


_PAGE = resource.getpagesize()


def _rss_mib() -> float:
    try:
        with open("/proc/self/statm", "rb") as f:  # "size resident shared ..." in pages
            return int(f.read().split()[1]) * _PAGE / MIB
    except (OSError, IndexError, ValueError):
        return float("nan")


def _stored_penalty(mf: ModelFile) -> tuple[float, int]:
    """The model's repetition penalty and window (`general.sampling.penalty_repeat`,
    `penalty_last_n`) where they are usable values, else 1.0 (off) and 64."""
    penalty, last_n = 1.0, 64
    value = mf.get("general.sampling.penalty_repeat")
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 0 < value <= MAX_REPEAT_PENALTY:
        penalty = float(f"{value:.7g}")  # stored as float32: 1.1, not 1.100000023841858
    value = mf.get("general.sampling.penalty_last_n")
    if isinstance(value, int) and 0 <= value <= MAX_REPEAT_LAST_N:
        last_n = value
    return penalty, last_n
