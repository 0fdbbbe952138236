"""plan.json: the cells in execution order, the decisions asked, the match tolerances and
the sequential looks."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from abbench.errors import BadField, ConfigError, Key, RecordError, format_key, render
from abbench.records.cell_config import CellConfig, cell_config
from abbench.records.cell_config import config_key as config_key  # its historic home
from abbench.records.journal import FORMAT, check_label
from abbench.records.schema import as_table, build, fail, show, typed

EXPECT = ("faster", "not-slower")  # a decision's question (`[[decision]] expect`)
# What a decision compares (`[[decision]] metric`): tokens per second, or energy per token
# (read as tokens per joule, so that for both a ratio above 1 favours the candidate).
METRICS = ("tok_per_s", "energy_per_token")
# How cells run (`[campaign] interleave`): one at a time, or in pairs of two engine
# processes taking turns every `slice_tokens` decode tokens (records.slices).
CELLS, SLICES = "cells", "slices"
INTERLEAVE = (CELLS, SLICES)
SLICE_TOKENS = 16  # `slice_tokens` where a campaign interleaves and does not say
# `[match] foreign_load_tol` when a campaign file does not set it: cores of other processes'
# CPU load by which two cells may differ (docs/method.md#foreign-load says why 0.25).
FOREIGN_LOAD_TOL = 0.25


@dataclass(frozen=True)
class GateSpec:
    """The thermal gate a campaign waits on before each cell: every condition set holds,
    or `timeout_s` passes (then the cell runs, marked as gave-up). The campaign file's
    `[gate]` checks the ranges (`campaign.tables.GateTable`)."""

    cpu_temp_max_c: float | None = None
    battery_temp_max_c: float | None = None
    mem_available_min_mib: float | None = None
    caps_at_max: bool = False
    probe_min: float | None = None
    poll_s: float = 5.0
    timeout_s: float = 600.0

    def conditions(self) -> list[str]:
        """The conditions this gate waits for, by key."""
        thresholds = ("cpu_temp_max_c", "battery_temp_max_c", "mem_available_min_mib",
                      "probe_min")
        found = [k for k in thresholds if getattr(self, k) is not None]
        return [*found, "caps_at_max"] if self.caps_at_max else found


@dataclass(frozen=True)
class RemoteSpec:
    """Where an adb/ssh device's cells live there: `folder`, under which each cell has a
    folder of its own (its outputs, its pid), and the command that runs abbench on the
    device (an embedded cell's engine; `abbench --version` checks it)."""

    folder: str
    abbench: tuple[str, ...] = ("abbench",)
    prepare: tuple[tuple[str, ...], ...] = ()  # commands before each cell, in order
    cleanup: tuple[tuple[str, ...], ...] = ()  # commands after each cell
    pull: tuple[str, ...] = ()  # patterns of files in the cell's folder there to bring back

    def __post_init__(self) -> None:
        if not self.folder.startswith("/") or "\x00" in self.folder:
            raise BadField("remote.folder", f"is {show(self.folder)}: not an absolute path")
        if not self.abbench or not all(self.abbench):
            raise BadField("remote.abbench", "is empty: a command line to run abbench")


@dataclass(frozen=True)
class StageSpec:
    """`[stage]`: files an adb/ssh device must hold before the first cell (the model, the
    binaries), each checked there by size and sha256 against the file here; `push`: copy
    what is missing or differs."""

    push: bool = False
    files: tuple[tuple[str, str], ...] = ()  # (the path there, the absolute path here)

    def __post_init__(self) -> None:
        for i, (there, here) in enumerate(self.files):
            if not there.startswith("/") or not here.startswith("/"):
                raise BadField(f"stage.files[{i}]", f"is {show([there, here])}: two "
                               "absolute paths (there, here)")


@dataclass(frozen=True)
class MatchSpec:
    """`[match]`: the entry-state tolerances two cells must meet to be compared, as a plan
    records them; cells.toml's [match] table (which checks the ranges) extends this."""

    cpu_temp_tol_c: float = 3.0
    battery_temp_tol_c: float = 0.5
    mem_available_tol_frac: float = 0.15
    probe_tol: float = 0.03
    max_gap_s: float = 900.0
    min_stability: float | None = None  # required of both cells' stability ratio; None: report it
    # cores by which two cells' mean foreign load may differ; None: not a criterion (plans
    # written before it; a campaign file's [match] sets FOREIGN_LOAD_TOL unless told)
    foreign_load_tol: float | None = None

    def to_json(self) -> dict[str, float]:
        d = asdict(self)
        for key in ("min_stability", "foreign_load_tol"):
            if d[key] is None:  # plans before it stay byte-identical
                del d[key]
        return d


@dataclass(frozen=True)
class DecisionSpec:
    """`[[decision]]` as a plan records it: is `candidate` faster than `baseline` by at least
    `min_effect` (`expect = "faster"`), or not slower by `max_regression` or more
    (`"not-slower"`)? cells.toml's `[[decision]]` table (which checks them) extends this."""

    candidate: str
    baseline: str
    min_effect: float = 0.0  # the smallest speed-up worth shipping (0.03 = 3%)
    expect: str = "faster"
    max_regression: float | None = None  # not-slower: the largest slow-down accepted
    metric: str = "tok_per_s"  # or "energy_per_token"
    # The configuration keys that set the two arms apart beyond the ones the decision names
    # (`abbench import` finds them; a campaign's cells are the user's own): the ratio would
    # measure those changes too, so no GO or NO-GO.
    confounds: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(DecisionSpec)}
        if self.max_regression is None:
            del d["max_regression"]
        if self.metric == "tok_per_s":  # plans before it stay byte-identical
            del d["metric"]
        if not self.confounds:  # plans before it stay byte-identical
            del d["confounds"]
        else:
            d["confounds"] = list(self.confounds)
        return d


@dataclass(frozen=True)
class PlannedCell:
    index: int  # 0-based execution order
    name: str  # the cell name in cells.toml (sentinels repeat a name)
    config: CellConfig  # resolved configuration, of the kind the cell runs as
    sentinel_of: int | None = None  # index of the earlier cell this one repeats
    label: str = ""  # NN-NAME, the cell's folder name
    # interleave = "slices": the index of the cell this one runs beside, taking turns (the
    # one before it or after it; the lower index takes the first turn)
    interleaved_with: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"index": self.index, "name": self.name, "config": self.config.to_json(),
             "sentinel_of": self.sentinel_of, "label": self.label}
        if self.interleaved_with is not None:  # plans before it stay byte-identical
            d["interleaved_with"] = self.interleaved_with
        return d

    @classmethod
    def from_json(cls, d: Any, key: Key = ()) -> PlannedCell:
        """A cell as plan.json holds it, its `config` read as the kind it names."""
        table = as_table(key, d, strict=False)
        at: Key = (*key, "config")
        if "config" not in table:
            fail(key, "missing key `config`")
        try:
            config = cell_config(typed(table["config"], dict[str, Any], at))
        except ConfigError as e:  # a record's problem is a BadField, named by its path
            raise BadField(f"{format_key(at)}.{e.field}", render(e.problem, str)) from None
        return build(cls, table, key, strict=False, config=config)


@dataclass(frozen=True)
class Sequential:
    """`[campaign] until = "decided"`: rounds appended until every decision is decided or
    the budget (cells, wall minutes; either may be absent) is spent."""

    until: str = "decided"
    max_cells: int | None = None
    max_minutes: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Look:
    """One look of a sequential campaign: the decisions are read on the first `cells`
    cells at a two-sided level of 1 - `alpha` (this look's boundary, analysis.sequential)."""

    cells: int
    fraction: float  # of the budget spent at this look (cells or minutes, whichever is more)
    alpha: float
    final: bool = False  # no further round fits the budget: the rest of the alpha is spent

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    campaign: str
    cells: tuple[PlannedCell, ...]
    spacing_s: float
    warmup_tokens: int
    device: str  # transport, e.g. "local", "adb:SERIAL", "sim:phone"
    decisions: tuple[DecisionSpec, ...] = ()
    match: MatchSpec = field(default_factory=MatchSpec)
    gate: GateSpec | None = None
    format: str = FORMAT
    sequential: Sequential | None = None
    looks: tuple[Look, ...] = ()  # taken so far (sequential campaigns)
    planned_cells: int | None = None  # cells before any appended round (None: all of them)
    # False for imported runs whose execution order nothing recorded: no two cells are
    # adjacent, so none is compared (docs/import.md#provenance-measured-derived-unknown)
    order_known: bool = True
    interleave: str = CELLS  # SLICES: cells run in the pairs `interleaved_with` names
    slice_tokens: int | None = None  # with SLICES: decode tokens per turn
    remote: RemoteSpec | None = None  # an adb/ssh device's cells: where they live there
    stage: StageSpec | None = None  # files the device must hold before the first cell

    def to_json(self) -> dict[str, Any]:
        # field by field, not `asdict`: its deep copy of every cell is what an import of
        # ten thousand runs would spend seconds on, and each part below has its own rule
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["gate"] = asdict(self.gate) if self.gate is not None else None
        d["sequential"] = asdict(self.sequential) if self.sequential is not None else None
        d["match"] = self.match.to_json()  # its own rule: plans before a key stay as they were
        d["cells"] = [c.to_json() for c in self.cells]
        d["decisions"] = [x.to_json() for x in self.decisions]
        d["looks"] = [x.to_json() for x in self.looks]
        if self.interleave == CELLS:  # plans before it stay byte-identical
            del d["interleave"], d["slice_tokens"]
        if self.remote is None:
            del d["remote"]
        else:
            d["remote"] = asdict(self.remote)
        if self.stage is None:  # plans before it stay byte-identical
            del d["stage"]
        else:
            d["stage"] = asdict(self.stage)
        return d

    def pairs(self) -> list[tuple[PlannedCell, PlannedCell]]:
        """The interleaved pairs, in execution order: (the cell that takes the first turn,
        the other)."""
        return [(c, self.cells[c.interleaved_with]) for c in self.cells
                if c.interleaved_with is not None and c.interleaved_with > c.index]

    @classmethod
    def from_json(cls, d: Any) -> Plan:
        """A plan as plan.json holds it, each cell's configuration read as its kind."""
        table = as_table((), d, strict=False)
        if "cells" not in table:
            fail((), "missing key `cells`")
        rows = typed(table["cells"], tuple[Any, ...], ("cells",))
        cells = tuple(PlannedCell.from_json(c, ("cells", i)) for i, c in enumerate(rows))
        return build(cls, table, strict=False, cells=cells)


def read_plan(run: Path) -> Plan:
    path = run / "plan.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{run}: not a run folder (no plan.json)") from None
    except OSError as e:
        raise RecordError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:  # not JSON, not UTF-8, a huge number
        raise RecordError(f"{path}: malformed plan ({str(e)[:200]})") from None
    except RecursionError:
        raise RecordError(f"{path}: malformed plan (nested too deeply)") from None
    try:
        plan = Plan.from_json(doc)
        _check_plan(plan)
    except BadField as e:
        raise RecordError(f"{path}: malformed plan: {e}") from None
    return plan


def _check_plan(plan: Plan) -> None:
    """What the analysis relies on beyond the types: cells in execution order, each in its
    own folder, sentinels of earlier cells, decisions and tolerances that are numbers,
    interleaved pairs of neighbours."""
    if plan.interleave not in INTERLEAVE:
        raise BadField("interleave", f"is {show(plan.interleave)}, expected one of "
                       f"{', '.join(INTERLEAVE)}")
    if plan.interleave == SLICES and not (plan.slice_tokens or 0) >= 1:
        raise BadField("slice_tokens", f"is {plan.slice_tokens}, expected a count >= 1")
    for i, c in enumerate(plan.cells):
        if c.index != i:
            raise BadField(f"cells[{i}].index", f"is {c.index}, expected {i} (execution "
                            "order)")
        check_label(c.label, f"cells[{i}].label")
        if c.sentinel_of is not None and not 0 <= c.sentinel_of < i:
            raise BadField(f"cells[{i}].sentinel_of", f"is {c.sentinel_of}, not an earlier "
                            "cell")
        _check_pair(plan, c)
    for i, d in enumerate(plan.decisions):
        if d.candidate == d.baseline:
            raise BadField(f"decisions[{i}]", f"compares `{d.candidate}` with itself")
        if d.expect not in EXPECT:
            raise BadField(f"decisions[{i}].expect", f"is {show(d.expect)}, "
                            f"expected one of {', '.join(EXPECT)}")
        if d.metric not in METRICS:  # any other would be decided as tokens/s, silently
            raise BadField(f"decisions[{i}].metric", f"is {show(d.metric)}, "
                            f"expected one of {', '.join(METRICS)}")
    last = 0
    for i, look in enumerate(plan.looks):
        if not last < look.cells <= len(plan.cells) or not 0 < look.alpha < 1:
            raise BadField(f"looks[{i}]", "is not a look at more cells than the one before, "
                            "within the plan, at an alpha in (0, 1)")
        last = look.cells


def _check_pair(plan: Plan, c: PlannedCell) -> None:
    """An interleaved cell's partner: a neighbour naming it back, in an interleaved plan."""
    j = c.interleaved_with
    if j is None:
        return
    if plan.interleave != SLICES or j not in (c.index - 1, c.index + 1) \
            or not 0 <= j < len(plan.cells) or plan.cells[j].interleaved_with != c.index:
        raise BadField(f"cells[{c.index}].interleaved_with", f"is {j}: not a neighbouring "
                       "cell interleaved with this one, in a plan with interleave = "
                       f"{SLICES!r}")
