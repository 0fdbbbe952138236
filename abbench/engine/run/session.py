"""One engine run: load a model for streaming, prefill a prompt, decode N tokens, measure each.

Prompt tokens but the last run as one batch per layer (`phase=0`; one record
per batch of up to PREFILL_BATCH tokens); decode step i feeds the newest token and samples
the next (`phase=1`), so N decode steps produce N tokens, each one forward pass — step 1
feeds the prompt's last token, and time to first token is prefill plus step 1. Timing
covers each pass and sampling; counters of what the expert side did are collected per pass.
How a token is computed: docs/engine.md#how-a-token-is-computed.

Beside it: what a run resolves before loading (`settings.py`), what a model file is
(`model_info.py`), how a pass is measured (`measure.py`), the route trace (`tracing.py`),
taking turns with another run (`turns.py`) and the records a run returns
(`result.py`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from threadpoolctl import threadpool_limits

from abbench.engine.arch import GRAPH_FOR_F32, GRAPHS, architecture
from abbench.engine.config import EngineConfig
from abbench.engine.experts.policies import Policies
from abbench.engine.experts.predictor import RoutePredictor
from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.run.measure import measure_pass, peak_rss_mib
from abbench.engine.run.model_info import check_vectors, choose_kernels, model_info
from abbench.engine.run.models import cache_dir, check_context_memory
from abbench.engine.run.result import RunResult, TokenRecord
from abbench.engine.run.sampling import Sampler
from abbench.engine.run.settings import context_size, experts_used, prompt_of, sampling_settings
from abbench.engine.run.tracing import open_route_trace
from abbench.engine.run.turns import TurnPipe, slice_of
from abbench.engine.streaming import memory
from abbench.engine.streaming.streamer import expert_layout
from abbench.engine.text.tokenizer import end_of_generation
from abbench.engine.units import MIB
from abbench.errors import ConfigError, EngineError
from abbench.records.route_trace import RouteTraceWriter

# The run's face: the records and the model's description are read through this module.
__all__ = ["PREFILL_BATCH", "Engine", "RunResult", "TokenRecord", "choose_kernels",
           "model_info"]

# Prompt tokens per prefill pass: llama.cpp's default micro-batch. It bounds a pass's
# attention scores (heads x batch x context floats) and its union of experts.
PREFILL_BATCH = 512


class Engine:
    """A loaded model ready to run `config` once. Use as a context manager."""

    def __init__(self, config: EngineConfig, model_path: str | Path) -> None:
        t0 = time.perf_counter()
        self.config = config
        self.mf = ModelFile(model_path)
        arch = architecture(self.mf.architecture, self.mf.path)
        args = arch.ModelArgs.from_file(self.mf)
        self.info = model_info(self.mf)
        check_vectors(self.mf)
        k = experts_used(config, args.expert_count, args.expert_used_count)
        self.prompt_ids, self.tokenizer = prompt_of(config, self.mf, args.vocab_size)
        n_ctx = context_size(config, len(self.prompt_ids), args.context_length)
        check_context_memory(self.mf.path, n_ctx, args.context_bytes(n_ctx))
        self.temp, self.repeat_penalty, self.repeat_last_n = sampling_settings(config, self.mf)
        self.end_ids = end_of_generation(self.mf)  # EOS and llama.cpp's other EOG tokens
        self.layout = expert_layout(self.mf, args.block_count, args.expert_count)
        self.dense_bytes = int(self.info["dense_bytes"])
        self.kernels = choose_kernels(config.kernels, self.layout,
                                      self.mf.architecture in GRAPHS,
                                      self.mf.architecture in GRAPH_FOR_F32
                                      or config.flash_attn)
        self._check_memory(args.context_bytes(n_ctx), n_ctx)
        self._load(arch, args, n_ctx, k)
        self.predictor = self._attach_predictor(args.block_count)
        self._start_partner()
        self.load_s = time.perf_counter() - t0

    def _check_memory(self, context: int, n_ctx: int) -> None:
        """What the load and the cache will allocate, against what this process may have
        now (`engine.memory`): refused before any of it is allocated."""
        c = self.config
        mm = memory.of_model(self.mf, self.layout)
        needs = mm.needs(self.kernels, c.resident, c.cache_mib, c.dense == "pinned",
                         context, n_ctx)
        memory.check(self.mf.path, needs, lambda room: memory.way_out(
            mm, self.kernels, c.resident, c.dense == "pinned", context, n_ctx, room))

    def _load(self, arch: ModuleType, args: Any, n_ctx: int, k: int) -> None:
        """The expert side (cache, streamer, compute team, running the architecture's expert
        FFN) and the dense model beside it."""
        config = self.config
        graph = GRAPHS.get(self.mf.architecture)
        if config.flash_attn and (self.kernels != "ggml" or graph is None):
            raise EngineError(f"{self.mf.path}: --flash-attn is computed on ggml's graph "
                              f"model, which `{self.mf.architecture}` has not here")
        if self.kernels == "ggml" and graph is None:
            raise EngineError(f"{self.mf.path}: no ggml graph of `{self.mf.architecture}` to "
                              "compute its quantized experts with",
                              tip="--kernels numpy converts them to F32")
        ffn = arch.expert_ffn(self.mf, args)
        team = (QuantTeam(config.compute_threads, config.repack, ffn, config.relays_streamed)
                if self.kernels == "ggml" else None)
        if config.prelaid and team is None:
            raise ConfigError(f"{self.mf.path}: --prelaid pre-lays quantized experts for "
                              "ggml; this file's are computed by numpy (F32)",
                              tip="run without --prelaid, or with --kernels ggml")
        self.runner = ExpertRunner(
            self.mf,
            self.layout,
            cache_mib=config.cache_mib,
            resident=config.resident,
            io_lanes=config.io_lanes,
            o_direct=config.o_direct,
            overlap=config.overlap,
            threads=config.compute_threads,
            max_k=k,
            policies=Policies.of(config),
            team=team,
            ffn=ffn,
            prelaid=cache_dir() / "prelaid" if config.prelaid else None,
            note=lambda line: print(line, file=sys.stderr, flush=True),
        )
        pinned = config.dense == "pinned"
        if team is None:
            self.model = arch.Model(self.mf, args, self.runner, pinned, n_ctx, k)
        else:  # llama.cpp's graph, as llama.cpp computes a quantized file
            assert graph is not None
            self.model = graph.GraphModel(self.mf, args, self.runner, team, pinned, n_ctx, k,
                                          flash_attn=config.flash_attn)

    def _attach_predictor(self, n_layer: int) -> RoutePredictor | None:
        """The route predictor, when `--predict-log` or `--predict-prefetch` asks for one,
        hooked into the model's routing and the runner's prefetch."""
        config = self.config
        if not (config.predict_log or config.predict_prefetch):
            return None
        self.model.fuse_next_routers()  # before the partner, which shares those GEMVs
        predictor = RoutePredictor(
            [self.model.router_matrix(i) for i in range(n_layer)],
            log=config.predict_log, predict=config.predict_prefetch,
            weights=config.predict_spec_max > 0,
            biases=[self.model.router_bias(i) for i in range(n_layer)],
        )
        self.model.routing_hook = predictor
        self.runner.predictor = predictor
        return predictor

    def _start_partner(self) -> None:
        """The partner process where the runner uses one, then the model's large GEMVs on
        the runner's team (the partner's, or the threads')."""
        prefill_rows = min(PREFILL_BATCH, max(0, len(self.prompt_ids) - 1))
        self.runner.start_partner(self.model.gemv_matrices(), prefill_rows)
        self.model.matvec = self.runner.team.matvec
        self.model.matmul_t = self.runner.team.matmul_t
        self.model.vector = self.runner.team.input

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
        return open_route_trace(path, self.mf, self.layout, self.info, self.model.k)

    def run(self, on_token: Callable[[TokenRecord], None] | None = None,
            turns: TurnPipe | None = None) -> RunResult:
        """Prefill and decode, measuring each pass. With `--turn-tokens N` the run takes
        turns through `turns` (default: on stdin and stdout, `turns.py`)."""
        if self.config.turn_tokens and turns is None:
            turns = TurnPipe.stdio()
        # The engine parallelises over experts with its own threads (`--threads`). BLAS's
        # threads would fight them: two callers of a threaded OpenBLAS serialise, and its
        # idle workers busy-wait on the cores the compute team needs. So BLAS runs
        # single-threaded inside a run.
        trace = self._open_trace()
        self.runner.trace = trace
        try:
            with threadpool_limits(limits=1, user_api="blas"):
                result = self._run(on_token, turns if self.config.turn_tokens else None)
        except BaseException:
            if trace is not None:
                trace.abandon()
            raise
        finally:
            self.runner.trace = None
        if trace is not None:
            trace.close()
        return result

    def _run(self, on_token: Callable[[TokenRecord], None] | None,
             turns: TurnPipe | None) -> RunResult:
        cfg = self.config
        # --ignore-eos as llama.cpp's: the end-of-generation tokens are never sampled
        sampler = Sampler(self.temp, cfg.seed, self.repeat_penalty, self.repeat_last_n,
                          self.end_ids if cfg.ignore_eos else ())
        for tok in self.prompt_ids:
            sampler.accept(tok)
        records, pos = self._prefill_prompt()
        # Taking turns, the first decode token waits for the driver's first `go`.
        go = turns is None or turns.ready()
        output = self._decode(sampler, pos, records, on_token, turns) if go else []
        if turns is not None:
            turns.done(len(output))
        return self._result(output, records)

    def _prefill_prompt(self) -> tuple[list[TokenRecord], int]:
        """The prompt but its last token, in batches of PREFILL_BATCH; the last one runs as
        decode step 1, whose logits sample the first output token. → the batches' records
        and the position decoding starts at."""
        prompt = self.prompt_ids
        records: list[TokenRecord] = []
        pos = 0
        for start in range(0, len(prompt) - 1, PREFILL_BATCH):
            batch = prompt[start : min(start + PREFILL_BATCH, len(prompt) - 1)]
            records.append(self._prefill(batch, pos, len(records) + 1))
            pos += len(batch)
        self.runner.finish()
        return records, pos

    def _decode(self, sampler: Sampler, pos: int, records: list[TokenRecord],
                on_token: Callable[[TokenRecord], None] | None,
                turns: TurnPipe | None = None) -> list[int]:
        """Decode steps from position `pos` (each appended to `records`) until `-n` tokens,
        an end-of-generation token or, taking turns, the driver's `stop`; → the tokens
        sampled."""
        output: list[int] = []
        current = self.prompt_ids[-1]
        n, every = self.config.n_tokens, self.config.turn_tokens
        for step in range(1, n + 1):
            holder: list[int] = []
            rec = self._step(current, pos, 1, step, lambda lg, h=holder: h.append(sampler(lg)))
            if turns is not None:
                rec = dataclasses.replace(rec, slice=slice_of(step, every))
            records.append(rec)
            if on_token is not None:
                on_token(rec)
            current = holder[0]
            output.append(current)
            pos += 1
            if current in self.end_ids:  # never sampled with --ignore-eos
                break
            if turns is not None and step % every == 0 and step < n:
                # Between passes, off every token's clock; nothing of this run may read
                # on while the other runs.
                self.runner.finish()
                if not turns.pause(step):
                    break
        self.runner.finish()
        return output

    def _result(self, output: list[int], records: list[TokenRecord]) -> RunResult:
        cfg = self.config
        extra = self._extra()
        peak = peak_rss_mib()
        raw = b"".join(self.tokenizer.piece(i) for i in output) if self.tokenizer else b""
        return RunResult(
            config=cfg,
            model=self.info,
            o_direct=self.runner.o_direct,
            threads=cfg.compute_threads,
            temp=self.temp,
            repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n,
            prompt_ids=tuple(self.prompt_ids),
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

    def _extra(self) -> dict[str, Any]:
        """The run JSON's policies, kernels and (with `--predict-log`) predictor scores."""
        cfg = self.config
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
        return extra

    def kernel_info(self) -> dict[str, Any]:
        """What computed this run: the backend, and the types of the experts and of the
        dense matrices as they were computed."""
        dense = self.model.dense_types() if hasattr(self.model, "dense_types") else ["F32"]
        info: dict[str, Any] = {
            "backend": self.kernels,
            "experts": self.runner.kernel_types,
            "dense": dense,
            # what the attention computes: llama.cpp's -fa on (F16 cache) or -fa off (F32)
            "attention": "flash, F16 cache" if self.config.flash_attn else "F32",
        }
        if self.kernels == "ggml":
            lib = ggml.lib()
            info["ggml"] = {"library": str(lib.folder), "cpu": lib.cpu_features()}
            dense = getattr(self.model, "dense_matrices", list)()
            prelaid = self.runner.prelaid
            info["repacked"] = {
                "experts": self.runner.repacked,
                # where streamed experts were read from already re-laid (--prelaid)
                "prelaid": None if prelaid is None else str(prelaid.path),
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
            # over the logits per token (microseconds) decides it, on either backend: their
            # sum in double is finite exactly when each is (an F32 sum could overflow).
            if not math.isfinite(np.add.reduce(logits, dtype=np.float64)):
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
        return measure_pass(self.runner, step, phase, tokens, work, trace_step)
