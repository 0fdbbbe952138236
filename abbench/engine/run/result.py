"""What one engine run produced: a record per forward pass and the run's result.

Written by `session.Engine.run` (each pass measured by `measure.measure_pass`), read by
`telemetry` (the summary, console lines, CSV and JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from abbench.engine.config import EngineConfig


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
    slice: int | None = None  # a decode token's slice (0-based) in a run that took turns

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
