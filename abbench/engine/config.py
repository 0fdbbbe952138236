"""The engine's configuration: one frozen dataclass, validated on construction.

Field names are the long flag names with `-` turned into `_`, so an error can name the flag
and a campaign file can name the same keys.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from abbench.errors import ConfigError

DEFAULT_PROMPT = "Explain how a mixture-of-experts model routes each token."
MAX_REPEAT_PENALTY = 100.0
MAX_REPEAT_LAST_N = 1_000_000


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


@dataclass(frozen=True)
class EngineConfig:
    model: str
    prompt: str = DEFAULT_PROMPT
    prompt_tokens: tuple[int, ...] | None = None
    n_tokens: int = 64
    temp: float | None = None  # None: the model's `general.sampling.temp`, else greedy
    seed: int = 0
    # None: the model's `general.sampling.penalty_repeat` / `penalty_last_n`, else 1.0 / 64
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    n_expert_used: int | None = None
    n_ctx: int | None = None
    stop_at_eos: bool = False
    # streaming
    dense: str = "pinned"
    resident: bool = False
    cache_mib: float = 256.0
    io_lanes: int = 4
    o_direct: bool = True
    overlap: bool = False
    threads: int = 0  # 0: one per core (up to 8)
    # policies (all off by default)
    drop_cold_experts: float | None = None  # F: skip non-resident experts below F/k
    drop_in_prefill: bool = False
    drop_no_renorm: bool = False
    prefetch: int = 0  # K: speculate the previous token's routing of layers l+1..l+K
    prefetch_sync: bool = False
    predict_log: bool = False
    predict_prefetch: bool = False
    predict_spec_max: int = 2
    route_trace: str | None = None

    def __post_init__(self) -> None:
        def bad(flag: str, msg: str) -> ConfigError:
            return ConfigError(f"`--{flag.replace('_', '-')}` {msg}")

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
        if self.dense not in ("pinned", "mmap"):
            raise bad("dense", f"must be `pinned` or `mmap` (got `{self.dense}`)")
        if not self.cache_mib >= 0:
            raise bad("cache_mib", f"must be >= 0 (got {self.cache_mib})")
        if not 1 <= self.io_lanes <= 64:
            raise bad("io_lanes", f"must be between 1 and 64 (got {self.io_lanes})")
        if not 0 <= self.threads <= 256:
            raise bad("threads", f"must be between 0 (auto) and 256 (got {self.threads})")
        if self.prompt_tokens is not None and not self.prompt_tokens:
            raise bad("prompt_tokens", "must name at least one token id")
        if self.prompt_tokens is None and not self.prompt:
            raise bad("prompt", "must not be empty")
        has_cache = self.resident or self.cache_mib > 0
        if self.drop_cold_experts is not None:
            if not 0 < self.drop_cold_experts <= 1:
                raise bad("drop_cold_experts", f"must be in (0, 1] (got {self.drop_cold_experts})")
            if not has_cache:
                raise bad("drop_cold_experts", "needs the expert cache (`--cache-mib` > 0)")
        elif self.drop_in_prefill or self.drop_no_renorm:
            flag = "drop_in_prefill" if self.drop_in_prefill else "drop_no_renorm"
            raise bad(flag, "needs `--drop-cold-experts F`")
        if not 0 <= self.prefetch <= 64:
            raise bad("prefetch", f"must be between 0 (off) and 64 layers (got {self.prefetch})")
        if self.prefetch and not has_cache:
            raise bad("prefetch", "needs the expert cache (`--cache-mib` > 0)")
        if self.predict_prefetch:
            if self.prefetch:
                raise bad("predict_prefetch", "and `--prefetch` are mutually exclusive")
            if not has_cache:
                raise bad("predict_prefetch", "needs the expert cache (`--cache-mib` > 0)")
        if not 0 <= self.predict_spec_max <= 8:
            raise bad("predict_spec_max", f"must be between 0 and 8 (got {self.predict_spec_max})")
        if self.prefetch_sync and not (self.prefetch or self.predict_prefetch):
            raise bad("prefetch_sync", "needs `--prefetch K` or `--predict-prefetch`")

    @property
    def speculates(self) -> bool:
        return bool(self.prefetch) or self.predict_prefetch

    @property
    def compute_threads(self) -> int:
        return self.threads or default_threads()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt_tokens"] = list(self.prompt_tokens) if self.prompt_tokens else None
        d["threads"] = self.compute_threads
        return d
