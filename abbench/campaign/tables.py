"""The campaign file's tables: one frozen dataclass each, checking its values on
construction, plus the table of engine keys a cell may set.

A problem names its key relative to the table (`spacing_s`, not `campaign.spacing_s`):
the loader in `schema` knows where the table sits in the file.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from abbench.campaign._check import fail, in_range
from abbench.campaign.llamacpp import TOOLS
from abbench.engine.config import MAX_TURN_TOKENS, EngineConfig
from abbench.errors import Key
from abbench.records import DecisionSpec, GateSpec, MatchSpec
from abbench.records.plan import CELLS, EXPECT, FOREIGN_LOAD_TOL, INTERLEAVE, METRICS, SLICES
from abbench.records.schema import did_you_mean, show
from abbench.records.toml import dump_value

NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # cell names name folders
NAME_MAX = 100
NAME_TIP = ("names are letters, digits, `-`, `_` and `.` (not first), at most "
            f"{NAME_MAX} characters: they name folders")
DEFAULT_MODEL = "synthetic:default"
BMOE = "bmoe"  # the phone-streaming engine's CLI (campaign.bmoe)
ENGINES = ("embedded", "external", *TOOLS, BMOE)
ENGINES_TEXT = ", ".join(f"`{e}`" for e in ENGINES)
MAX_REPEAT = 100
MAX_CELLS = 10_000  # cells one campaign may run (planned and appended)
WEEK_S = 7 * 86400.0  # the longest wait or timeout a campaign may ask for
MAX_CORES = 4096  # a foreign-load tolerance above any machine's core count is a typo
_PULL = re.compile(r"[A-Za-z0-9_.*?\[\]/+@%,=-]+")  # what the device's sh expands, only
_TRANSPORT = re.compile(r"local\Z|(adb|ssh|sim):[^\s-]\S*\Z")

# TOML key -> EngineConfig field. The file uses the engine's long flag names with `-` as
# `_`, except `tokens` for `--n-tokens`; a new EngineConfig field becomes a key by itself,
# unless the campaign sets it itself (`option(..., cell_key=False)`: `turn_tokens`, which
# `[campaign] interleave` sets), which is no key and no part of a cell's configuration.
_RENAMED = {"n_tokens": "tokens"}
CELL_FIELDS = tuple(f for f in fields(EngineConfig) if f.metadata["cell_key"])
ENGINE_KEYS: dict[str, str] = {_RENAMED.get(f.name, f.name): f.name for f in CELL_FIELDS}
TOML_KEY: dict[str, str] = {f: k for k, f in ENGINE_KEYS.items()}

# What a cell table may hold, with the TOML type each key takes.
CELL_HINTS: dict[str, Any] = {
    "base": str,
    "engine": str,
    "timeout_s": float,
    "memory_limit_mib": float,
    "command": tuple[str, ...],
    "output": str,
    "llama_cpp_bin": str,
    "repetitions": int,
    "llama": dict[str, str | int | float | bool],
    "bmoe_bin": str,
    "bmoe": dict[str, str | int | float | bool],
    **{k: typing.get_type_hints(EngineConfig)[f] for k, f in ENGINE_KEYS.items()},
}
# The keys a llama.cpp cell takes besides `engine`, `base` and `timeout_s` (the engine keys
# among them as the embedded engine reads them); `[workload]` gives it only these.
LLAMA_KEYS = ("model", "tokens", "prompt", "seed", "llama_cpp_bin", "repetitions", "llama")
# The keys a bmoe cell takes besides `engine`, `base` and `timeout_s`.
BMOE_KEYS = ("model", "tokens", "prompt", "bmoe_bin", "bmoe")
# Keys of how a cell is launched, which every kind takes: `timeout_s` (not part of the
# work), `memory_limit_mib` (part of it: a cell with less memory is another arm).
LAUNCH_KEYS = ("timeout_s", "memory_limit_mib")
WORKLOAD_KEYS = ("engine", *LAUNCH_KEYS, *ENGINE_KEYS)
# Engine keys whose default in a cell differs from the command line's: a cell decodes
# exactly `tokens` (a run that stopped at EOS would be less work, not a slower run).
CELL_DEFAULTS: dict[str, Any] = {"ignore_eos": True}
SWEEP_KEYS = (*LAUNCH_KEYS, *ENGINE_KEYS)
MIN_MEMORY_MIB = 16.0  # below this not even the Python that starts a cell fits
MAX_MEMORY_MIB = 2.0**30  # a PiB: a limit above it is a typo


def check_memory_limit(limit: float | None) -> None:
    if limit is not None:
        in_range("memory_limit_mib", MIN_MEMORY_MIB <= limit <= MAX_MEMORY_MIB,
                 f"in [{MIN_MEMORY_MIB:g}, {MAX_MEMORY_MIB:g}] MiB", limit)


def check_name(key: Key, name: str, what: str = "cell name") -> None:
    if not NAME_RULE.match(name) or len(name) > NAME_MAX:
        fail(key, f"{show(name)} is not a valid {what}", tip=NAME_TIP)


@dataclass(frozen=True)
class CampaignTable:
    """`[campaign]`: the plan's shape."""

    name: str
    spacing_s: float = 30.0  # fixed gap between cells
    # cell names (a repeated name is a sentinel) | "abba" | None: file order
    order: tuple[str, ...] | str | None = None
    warmup_tokens: int = 16  # excluded from statistics
    sentinel_every: int | None = None  # the baseline again after every N other cells
    repeat: int = 1  # the whole sequence R times
    # "decided": after the planned order, append ABBA rounds of the open decisions until
    # each is GO or NO-GO or the budget (`max_cells`, `max_minutes`) is spent
    until: str | None = None
    max_cells: int | None = None  # every cell of the campaign, the planned ones included
    max_minutes: float | None = None  # wall minutes from the first cell's start
    # "slices": cells run in pairs, two engine processes taking turns every `slice_tokens`
    # decode tokens (records.plan INTERLEAVE); "cells": one cell at a time
    interleave: str = CELLS
    slice_tokens: int | None = None  # None: SLICE_TOKENS, with interleave = "slices"

    def __post_init__(self) -> None:
        check_name(("name",), self.name, "campaign name")
        in_range("spacing_s", 0 <= self.spacing_s <= WEEK_S, f"between 0 and {WEEK_S:g} s",
                 self.spacing_s)
        if isinstance(self.order, str) and self.order != "abba":
            fail(("order",), f'must be an array of cell names or "abba" (got {show(self.order)})',
                 tip='did you mean `"abba"`?' if self.order.lower() == "abba" else None)
        if self.order == ():
            fail(("order",), "must name at least one cell")
        in_range("warmup_tokens", self.warmup_tokens >= 0, ">= 0", self.warmup_tokens)
        if self.sentinel_every is not None:
            in_range("sentinel_every", self.sentinel_every >= 1, ">= 1", self.sentinel_every)
            if self.order is not None:
                fail(("sentinel_every",), "cannot be combined with `order`",
                     tip="write the sentinels into `order` (a repeated name is a sentinel), "
                     "or drop `order` to run the cells in file order")
        in_range("repeat", 1 <= self.repeat <= MAX_REPEAT, f"between 1 and {MAX_REPEAT}",
                 self.repeat)
        if self.until is not None and self.until != "decided":
            fail(("until",), f'must be "decided" (got {show(self.until)})',
                 tip=did_you_mean(self.until, ("decided",), "values"))
        if self.max_cells is not None:
            in_range("max_cells", 1 <= self.max_cells <= MAX_CELLS, f"between 1 and "
                     f"{MAX_CELLS}", self.max_cells)
        if self.max_minutes is not None:
            in_range("max_minutes", 0 < self.max_minutes <= WEEK_S / 60, "in (0, "
                     f"{WEEK_S / 60:g}] minutes", self.max_minutes)
        budget = self.max_cells is not None or self.max_minutes is not None
        if self.until is not None and not budget:
            fail(("until",), "needs a budget: `max_cells`, `max_minutes` or both",
                 tip='until = "decided" with max_cells = 16 appends ABBA rounds of the open '
                 "decisions until each is decided or 16 cells have run")
        if self.until is None and budget:
            key = "max_cells" if self.max_cells is not None else "max_minutes"
            fail((key,), 'applies only to a sequential campaign (`until = "decided"`)',
                 tip='add until = "decided", or remove it')
        self._check_interleave()

    def _check_interleave(self) -> None:
        if self.interleave not in INTERLEAVE:
            fail(("interleave",), f"must be one of {', '.join(f'`{x}`' for x in INTERLEAVE)} "
                 f"(got {show(self.interleave)})",
                 tip=did_you_mean(self.interleave, INTERLEAVE, "values"))
        if self.slice_tokens is not None:
            in_range("slice_tokens", 1 <= self.slice_tokens <= MAX_TURN_TOKENS,
                     f"between 1 and {MAX_TURN_TOKENS}", self.slice_tokens)
            if self.interleave != SLICES:
                fail(("slice_tokens",), 'applies only to `interleave = "slices"`',
                     tip='add interleave = "slices", or remove it')
        if self.interleave == SLICES and self.sentinel_every is not None:
            fail(("sentinel_every",), 'cannot be combined with `interleave = "slices"`',
                 tip='interleaved cells run in pairs: `order = "abba"` (the default there) '
                 "repeats the baseline in every other pair")


@dataclass(frozen=True)
class DeviceTable:
    """`[device]`: where the cells run and how often the sampler reads the sensors."""

    transport: str = "local"  # local | adb:SERIAL | ssh:HOST | sim:PROFILE
    sample_hz: float = 2.0
    root: str = "/"  # where the sensor readers look (a fixture tree in tests)
    # adb/ssh devices only: the command that runs abbench there (an embedded cell's
    # engine), and the folder the cells' own folders are made in there.
    abbench: str | tuple[str, ...] = "abbench"
    remote_dir: str | None = None
    prepare: tuple[tuple[str, ...], ...] = ()
    cleanup: tuple[tuple[str, ...], ...] = ()
    pull: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _TRANSPORT.match(self.transport):
            fail(("transport",), f"{show(self.transport)} is not a transport",
                 tip="one of `local`, `adb:SERIAL`, `ssh:HOST`, `sim:PROFILE`")
        in_range("sample_hz", 0 < self.sample_hz <= 50, "in (0, 50] Hz", self.sample_hz)
        if not self.root:
            fail(("root",), "must not be empty")
        if not self.abbench_argv or not all(self.abbench_argv):
            fail(("abbench",), "must name a command",
                 tip='the path of abbench on the device, e.g. "/home/me/.venv/bin/abbench", '
                 'or a command line: ["python3", "-m", "abbench"]')
        remote = self.transport.startswith(("adb:", "ssh:"))
        for key in ("prepare", "cleanup", "pull"):
            if getattr(self, key) and not remote:
                fail((key,), f"applies to adb:/ssh: devices (this one is {show(self.transport)})",
                     tip="on this machine a cell's `command` can do it itself")
        for key in ("prepare", "cleanup"):
            for i, argv in enumerate(getattr(self, key)):
                if not argv or not argv[0]:
                    fail((key, i), "is empty: a command is an array of its words",
                         tip='e.g. prepare = [["am", "force-stop", "com.example"], ["sync"]]')
        for i, pattern in enumerate(self.pull):
            if not _PULL.fullmatch(pattern) or ".." in pattern.split("/"):
                fail(("pull", i), f"{show(pattern)} is not a file pattern in the cell's folder",
                     tip='relative names and shell wildcards without spaces or quotes, e.g. '
                     '"*.metrics" or "logs/*.log"')
        if self.remote_dir is not None and not self.remote_dir.startswith("/"):
            fail(("remote_dir",), f"{show(self.remote_dir)} is not an absolute path",
                 tip='a folder on the device, e.g. "/tmp/abbench-cells"')

    @property
    def abbench_argv(self) -> tuple[str, ...]:
        return (self.abbench,) if isinstance(self.abbench, str) else self.abbench

    def remote_folder(self) -> str:
        """Where the cells' folders are made on an adb/ssh device: `remote_dir`, else the
        device's usual scratch folder (Android's shell may write only under
        /data/local/tmp)."""
        if self.remote_dir is not None:
            return self.remote_dir.rstrip("/") or "/"
        return "/data/local/tmp/abbench-cells" if self.transport.startswith("adb:") \
            else "/tmp/abbench-cells"


@dataclass(frozen=True)
class FleetTable:
    """`[fleet]`: the devices `abbench fleet` runs the campaign on (`abbench campaign`
    ignores it). `sim:PROFILE#N` is N simulated devices, `sim:PROFILE#1` .. `#N`."""

    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for i, device in enumerate(self.devices):
            if not _TRANSPORT.match(device):
                fail(("devices", i), f"{show(device)} is not a device",
                     tip="one of `local`, `adb:SERIAL`, `ssh:HOST`, `sim:PROFILE#N`")


@dataclass(frozen=True)
class GateTable(GateSpec):
    """`[gate]`: before each cell, wait until every condition set holds (or `timeout_s`);
    the fields and defaults are the plan's `GateSpec`, the file's ranges are checked here."""

    def __post_init__(self) -> None:
        for key, value, top in (("cpu_temp_max_c", self.cpu_temp_max_c, 150),
                                ("battery_temp_max_c", self.battery_temp_max_c, 100)):
            if value is not None:
                in_range(key, 0 < value <= top, f"in (0, {top}] °C", value)
        if self.mem_available_min_mib is not None:
            in_range("mem_available_min_mib", self.mem_available_min_mib >= 0, ">= 0 MiB",
                     self.mem_available_min_mib)
        if self.probe_min is not None:
            in_range("probe_min", 0 < self.probe_min <= 1, "in (0, 1]", self.probe_min)
        in_range("poll_s", 0 < self.poll_s <= WEEK_S, f"in (0, {WEEK_S:g}] s", self.poll_s)
        in_range("timeout_s", 0 < self.timeout_s <= WEEK_S, f"in (0, {WEEK_S:g}] s",
                 self.timeout_s)
        if not self.conditions():
            fail((), "sets no condition",
                 tip="set one of `cpu_temp_max_c`, `battery_temp_max_c`, "
                 "`mem_available_min_mib`, `caps_at_max = true`, `probe_min`, or remove it")


@dataclass(frozen=True)
class MatchTable(MatchSpec):
    """`[match]`: how close two cells' entry states must be to be compared (the fields and
    defaults are the plan's `MatchSpec`, but for the foreign load, a criterion of every
    campaign from now on; the file's ranges are checked here)."""

    foreign_load_tol: float | None = FOREIGN_LOAD_TOL

    def __post_init__(self) -> None:
        in_range("cpu_temp_tol_c", self.cpu_temp_tol_c >= 0, ">= 0 °C", self.cpu_temp_tol_c)
        in_range("battery_temp_tol_c", self.battery_temp_tol_c >= 0, ">= 0 °C",
                 self.battery_temp_tol_c)
        in_range("mem_available_tol_frac", 0 <= self.mem_available_tol_frac <= 1, "in [0, 1]",
                 self.mem_available_tol_frac)
        in_range("probe_tol", 0 <= self.probe_tol <= 1, "in [0, 1]", self.probe_tol)
        in_range("max_gap_s", 0 < self.max_gap_s <= WEEK_S, f"in (0, {WEEK_S:g}] s",
                 self.max_gap_s)
        if self.min_stability is not None:
            in_range("min_stability", 0 < self.min_stability <= 1, "in (0, 1]",
                     self.min_stability)
        if self.foreign_load_tol is not None:
            in_range("foreign_load_tol", 0 <= self.foreign_load_tol <= MAX_CORES,
                     f"in [0, {MAX_CORES}] cores", self.foreign_load_tol)


@dataclass(frozen=True)
class WorkloadTable:
    """`[workload]`: defaults every cell inherits."""

    engine: str = "embedded"  # cells that name neither `engine` nor `command`
    model: str = DEFAULT_MODEL
    timeout_s: float = 900.0  # per cell
    memory_limit_mib: float | None = None  # per cell, on this host (campaign/cgroup.py)
    settings: dict[str, Any] = field(default_factory=dict)  # other engine keys, as TOML keys

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            fail(("engine",), f"must be one of {ENGINES_TEXT} (got {show(self.engine)})",
                 tip=did_you_mean(self.engine, ENGINES, "engines"))
        in_range("timeout_s", 0 < self.timeout_s <= WEEK_S, f"in (0, {WEEK_S:g}] s",
                 self.timeout_s)
        check_memory_limit(self.memory_limit_mib)
        for k in self.settings:
            if k not in ENGINE_KEYS or k == "model":
                fail((k,), "not an engine key")


@dataclass(frozen=True)
class Decision(DecisionSpec):
    """`[[decision]]`: the plan's `DecisionSpec`, its values checked as the file gives them."""

    def __post_init__(self) -> None:
        in_range("min_effect", self.min_effect >= 0, ">= 0", self.min_effect)
        if self.candidate == self.baseline:
            fail(("baseline",), f"is the candidate itself (`{self.candidate}`)",
                 tip="a decision compares two different cells")
        if self.confounds:  # the plan's record of an import, not a question to ask
            fail(("confounds",), "is not a `[[decision]]` key: `abbench import` records it")
        if self.metric not in METRICS:
            fail(("metric",), f"must be one of {', '.join(f'`{m}`' for m in METRICS)} "
                 f"(got {show(self.metric)})", tip=did_you_mean(self.metric, METRICS, "values"))
        if self.expect not in EXPECT:
            fail(("expect",), f"must be one of {', '.join(f'`{e}`' for e in EXPECT)} "
                 f"(got {show(self.expect)})", tip=did_you_mean(self.expect, EXPECT, "values"))
        if self.expect == "not-slower":
            if self.max_regression is None:
                fail(("max_regression",), 'is needed with `expect = "not-slower"`',
                     tip="max_regression = 0.02 accepts a slow-down of up to 2%")
            in_range("max_regression", 0 < self.max_regression < 1, "in (0, 1)",
                     self.max_regression)
            if self.min_effect:
                fail(("min_effect",), 'applies to `expect = "faster"` only',
                     tip='a not-slower decision is set by `max_regression`')
        elif self.max_regression is not None:
            fail(("max_regression",), 'applies to `expect = "not-slower"` only',
                 tip='add expect = "not-slower", or use min_effect for a speed-up')


@dataclass(frozen=True)
class Sweep:
    """`[[sweep]]`: one cell per value of `key`, each inheriting from `cell`."""

    cell: str
    key: str
    values: tuple[str | int | float | bool, ...]

    def __post_init__(self) -> None:
        if self.key not in SWEEP_KEYS:
            fail(("key",), f"cannot sweep {show(self.key)}",
                 tip=did_you_mean(self.key, SWEEP_KEYS, "sweepable keys"))
        if not self.values:
            fail(("values",), "must hold at least one value")

    def cell_name(self, value: str | int | float | bool) -> str:
        """`CELL.KEY-VALUE`, with what a folder name cannot hold turned into `_`."""
        text = dump_value(value) if isinstance(value, (bool, float)) else str(value)
        return f"{self.cell}.{self.key}-" + re.sub(r"[^A-Za-z0-9._-]", "_", text)
