"""One resolved cell of a campaign file: `base`, `[workload]` and its `[[sweep]]` applied
(campaign/resolve.py makes it), as the configuration a plan carries (`to_config`) and as
the keys the run folder's campaign.toml writes back (`to_toml`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from abbench.campaign._check import fail, in_range
from abbench.campaign.bmoe import BmoeCell
from abbench.campaign.llamacpp import TOOLS, LlamaCell
from abbench.campaign.tables import (
    BMOE,
    CELL_FIELDS,
    ENGINES_TEXT,
    TOML_KEY,
    WEEK_S,
    check_memory_limit,
    check_name,
)
from abbench.engine.config import EngineConfig
from abbench.records.cell_config import OUTPUT, CellConfig, cell_config
from abbench.records.schema import show


@dataclass(frozen=True)
class CellSpec:
    """One resolved cell: `base` and `[workload]` applied. Embedded cells carry an
    `EngineConfig`; external ones a command and how to read its result; llama.cpp ones a
    `LlamaCell`; bmoe ones a `BmoeCell`."""

    name: str
    engine: str  # "embedded" | "external" | "llama-bench" | "llama-completion" | "bmoe"
    timeout_s: float = 900.0
    memory_limit_mib: float | None = None  # its own memory cgroup's limit (None: none)
    config: EngineConfig | None = None
    command: tuple[str, ...] = ()
    output: str | None = None  # bmoe-csv:PATH | json:PATH | stdout-summary
    base: str | None = None  # the cell it inherits from, as written
    sweep: int | None = None  # index of the `[[sweep]]` that generated it
    llama: LlamaCell | None = None
    bmoe: BmoeCell | None = None

    def __post_init__(self) -> None:
        check_name((), self.name)
        in_range("timeout_s", 0 < self.timeout_s <= WEEK_S, f"in (0, {WEEK_S:g}] s",
                 self.timeout_s)
        check_memory_limit(self.memory_limit_mib)
        if self.engine == "embedded":
            if self.config is None:
                fail((), "an embedded cell needs an engine configuration")
            if self.command or self.output is not None:
                fail(("command",), "an embedded cell cannot have a `command` or `output`")
        elif self.engine == "external":
            if self.config is not None:
                fail((), "an external cell cannot have an engine configuration")
            if not self.command or not self.command[0]:
                fail(("command",), "must be a non-empty array of strings, the program first",
                     tip='command = ["adb", "shell", "sh", "/data/local/tmp/run.sh"]')
            if self.output is None or not OUTPUT.match(self.output):
                fail(("output",), f"{show(self.output)} is not an output",
                     tip='one of "bmoe-csv:PATH", "json:PATH", "stdout-summary"')
        elif self.engine in TOOLS:
            if self.llama is None or self.llama.tool != self.engine:
                fail((), f"a {self.engine} cell needs its llama.cpp configuration")
        elif self.engine == BMOE:
            if self.bmoe is None:
                fail((), "a bmoe cell needs its bmoe-cli configuration")
        else:
            fail(("engine",), f"must be one of {ENGINES_TEXT} (got {show(self.engine)})")
        if self.engine not in TOOLS and self.llama is not None:
            fail(("llama",), f"applies to llama.cpp cells only (this one is {self.engine})")
        if self.engine != BMOE and self.bmoe is not None:
            fail(("bmoe",), f"applies to bmoe cells only (this one is {self.engine})")

    def planned(self) -> CellConfig:
        """The configuration a plan carries, as its kind (`records.cell_config`)."""
        return cell_config(self.to_config())

    def to_config(self) -> dict[str, Any]:
        """The configuration as plan.json holds it: JSON-able, with EngineConfig field
        names (the order of its keys is the order on disk); `memory_limit_mib` last, and
        only where set, so that a cell without one keeps the identity it always had."""
        limit = self.memory_limit_mib
        return {**self._config(), **({} if limit is None else {"memory_limit_mib": limit})}

    def _config(self) -> dict[str, Any]:
        if self.llama is not None:
            m = self.llama
            return {"engine": m.tool, "model": m.model, "tokens": m.tokens,
                    "prompt": m.prompt, "seed": m.seed, "repetitions": m.repetitions,
                    "llama_cpp_bin": m.bin_dir, "llama": dict(m.options),
                    "timeout_s": self.timeout_s}
        if self.bmoe is not None:
            b = self.bmoe
            return {"engine": BMOE, "model": b.model, "tokens": b.tokens, "prompt": b.prompt,
                    "bmoe_bin": b.bin_dir, "bmoe": dict(b.options), "timeout_s": self.timeout_s}
        if self.config is None:
            return {"engine": "external", "command": list(self.command), "output": self.output,
                    "timeout_s": self.timeout_s}
        every = asdict(self.config)
        values = {f.name: every[f.name] for f in CELL_FIELDS}  # in the fields' order
        if values["prompt_tokens"] is not None:
            values["prompt_tokens"] = list(values["prompt_tokens"])
        return {"engine": "embedded", **values, "timeout_s": self.timeout_s}

    def to_toml(self) -> dict[str, Any]:
        """The configuration as cell keys (None: left out)."""
        cfg = self.to_config()
        if self.llama is not None:
            if self.llama.tool == "llama-bench":  # what llama-bench does not read
                del cfg["prompt"], cfg["seed"]
            else:
                del cfg["repetitions"]
            return {k: v for k, v in cfg.items() if v != {}}
        if self.bmoe is not None:
            return {k: v for k, v in cfg.items() if v != {} and v is not None}
        if self.config is None:
            return cfg
        limit = {k: cfg[k] for k in ("memory_limit_mib",) if k in cfg}
        return {"engine": "embedded", "timeout_s": self.timeout_s, **limit,
                **{TOML_KEY[f.name]: cfg[f.name] for f in CELL_FIELDS}}
