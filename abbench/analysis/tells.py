"""Contamination tells: cells whose numbers the device, not the configuration, may have
moved (docs/report.md#method).

The authors' two tells (their method's "Cool on a condition" section) and what follows
from them, each against a *set* of runs, never a neighbour, so that which cells a per-cell
tell flags does not depend on the order they ran in:

- **majflt**: major faults per token far above its reference runs — its configuration's
  other runs, else its model's runs that agree on the keys that move faults on their own;
- **memory_floor**: free memory during the cell fell below `MEMORY_FLOOR_FRACTION` of the
  device's RAM — whatever its neighbours did (two runs both deep in memory pressure hold
  each other up as references, and neither majflt tell could fire);
- **device_majflt**: a run with no clean repeat of its configuration (a repeat that faults
  alike says the configuration faults, not the device) whose major faults per token are in
  the hundreds and far above the median of the device's clean runs (those no memory floor
  flags) that agree on the fault keys — its model's where it has others, else any model's;
- **occupancy_fall**, **compute_up_work_down**: threads waiting, or slower at the same or
  less work;
- **drops**, **capped_after**: a drop rate to quote; a cap read after the cell;
- **entry_degrading** (the only one that needs the order): entry state worse at every cell.

Each reference set is built once for the whole campaign (`_Peers`), so a folder of n runs
costs O(n log n), not a scan of every run per run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from abbench.analysis.cells import CellStats
from abbench.analysis.matching import tolerances
from abbench.analysis.readings import place
from abbench.records import CellRecord, MatchSpec, keys

COMPUTE_RISE = 1.10  # compute/token up by more than 10% ...
OCCUPANCY_FALL = 0.85  # CPU occupancy below 85% of the comparable cell's
# "majflt/token jumps an order of magnitude between cells that should do comparable work":
# the authors' own canonical case is 149 -> 1189 (8x), so the tell fires from 5x (half an
# order of magnitude and more), where a 10x threshold missed it.
MAJFLT_FACTOR = 5.0
MAJFLT_FLOOR = 1.0  # ... and at least one major fault per token, so 0.01 vs 0.001 is quiet
# Against the device's other runs (no like-for-like reference), only what the authors call
# thrashing: "hundreds means the dense set is thrashing, single digits means it is not"
# (their benchmark method, "gpt-oss / harmony models").
DEVICE_MAJFLT_FLOOR = 100.0
# Free memory during a cell below this share of the device's RAM: the kernel is reclaiming
# (the page cache of the model's dense weights first, then compressing anonymous memory),
# and the cell's time includes the refaults. The authors' 2026-07-17 matrix on an 11.3 GB
# phone: its clean first run kept a 1.61 GB floor (14%), the runs their notes mark as
# contaminated fell to 0.63-1.28 GB (6-11%); an eighth separates them.
MEMORY_FLOOR_FRACTION = 1 / 8
# The configuration key that moves major faults by orders of magnitude on its own (dense
# weights in the page cache vs anonymous memory: hundreds per token vs single digits), so a
# run without repeats is held only against its model's runs that agree on it.
FAULT_KEYS = ("dense_weights",)
# Keys of a configuration that name a session, not what ran. (An import's partial
# configuration carries its run's name as `run`, which keeps it from equalling any other.)
NOT_WORK = frozenset({"session"})
# The knobs that take work away and leave the kernels as they were — the authors' tell is
# "compute per token rises as top-k falls" — and the direction in which each does more work.
LESS_WORK = {"n_expert_used": 1, "drop_cold_frac": -1}


@dataclass(frozen=True)
class Tell:
    cell: int | None  # None: the campaign as a whole
    # compute_up_work_down | majflt | memory_floor | device_majflt | occupancy_fall |
    # entry_degrading | drops | capped_after
    kind: str
    detail: str


@dataclass(frozen=True)
class DeviceRam:
    """The device's RAM as the records give it: MemTotal where a reading holds it (`known`),
    else a lower bound — the most MemAvailable any cell recorded."""

    mib: float
    known: bool

    def describe(self) -> str:
        if self.known:
            return f"{self.mib:.0f} MiB (MemTotal)"
        return (f"at least {self.mib:.0f} MiB (the most MemAvailable any cell recorded; "
                "MemTotal not recorded)")


def model_of(c: CellStats) -> str | None:
    """The model a cell ran (its configuration's `model`), None when it does not say."""
    model = _parsed(c.config_key).get("model")
    return str(model) if model is not None else None


def config_of(c: CellStats) -> dict[str, object]:
    """A cell's configuration as the tells compare it: its keys without the session (a
    folder of several sessions carries it; the same configuration in another session is
    still comparable work)."""
    return {k: v for k, v in _parsed(c.config_key).items() if k not in NOT_WORK}


def _parsed(config_key: str | None) -> dict[str, object]:
    if not config_key:
        return {}
    try:
        cfg = json.loads(config_key)
    except ValueError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _canonical(cfg: dict[str, object]) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _names(cells: Sequence[CellStats], total: int | None = None) -> str:
    """Cells as a message names them: the first six, then how many more (of `total`)."""
    total = len(cells) if total is None else total
    shown = ", ".join(f"{x.index + 1}" for x in cells[:6])
    more = f" and {total - 6} more" if total > 6 else ""
    return f"cell{'s' if total > 1 else ''} {shown}{more}"


class _Sorted:
    """A reference set's values, sorted once: its median with one member left out in
    O(1), and who the others are."""

    def __init__(self, members: list[CellStats], value: Callable[[CellStats], float | None]):
        valued = [(v, x) for x in members if (v := value(x)) is not None]
        order = sorted(range(len(valued)), key=lambda k: (valued[k][0], valued[k][1].index))
        self.values = [valued[k][0] for k in order]
        self.cells = sorted((x for _, x in valued), key=lambda x: x.index)
        self._at = {valued[k][1].index: pos for pos, k in enumerate(order)}

    def without(self, c: CellStats) -> tuple[float, str] | None:
        """The median of the others and their names (`_names`); None when no other has a
        value."""
        k = self._at.get(c.index)
        n = len(self.values) - (k is not None)
        if n <= 0:
            return None

        def at(i: int) -> float:
            return self.values[i + (1 if k is not None and i >= k else 0)]

        mid = at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
        first = [x for x in self.cells[:7] if x.index != c.index][:6]
        return mid, _names(first, n)


class _Peers:
    """Every reference set the per-cell tells read, grouped once for the campaign."""

    def __init__(self, cells: list[CellStats], ram: DeviceRam | None) -> None:
        self.ok = [c for c in cells if c.ok]
        self.by_index = {c.index: c for c in self.ok}
        self._more: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.cfg = {c.index: config_of(c) for c in self.ok}
        self.model = {c.index: model_of(c) for c in self.ok}
        same: dict[tuple[str | None, str], list[CellStats]] = defaultdict(list)
        like: dict[tuple[str | None, str], list[CellStats]] = defaultdict(list)
        kernels: dict[tuple[str | None, str], list[CellStats]] = defaultdict(list)
        for c in self.ok:
            m, cfg = self.model[c.index], self.cfg[c.index]
            same[(m, _canonical(cfg))].append(c)
            like[(m, self._fault_key(c))].append(c)
            kernels[(m, _canonical({k: v for k, v in cfg.items() if k not in LESS_WORK}))
                    ].append(c)
        self.same, self.like, self.kernels = same, like, kernels
        self.ram = ram
        self.deep = {c.index for c in self.ok if self.floor_share(c) is not None
                     and self.floor_share(c) < MEMORY_FLOOR_FRACTION}  # type: ignore[operator]
        of_model: dict[tuple[str | None, str], list[CellStats]] = defaultdict(list)
        of_any: dict[str, list[CellStats]] = defaultdict(list)
        for c in self.ok:
            if c.index not in self.deep:
                of_model[(self.model[c.index], self._fault_key(c))].append(c)
                of_any[self._fault_key(c)].append(c)

        def majflt(x: CellStats) -> float | None:
            return x.work.majflt_per_token

        self._clean_model = {k: _Sorted(v, majflt) for k, v in of_model.items()}
        self._clean_any = {k: _Sorted(v, majflt) for k, v in of_any.items()}
        self._sorted: dict[tuple[str, int], _Sorted] = {}

    def _fault_key(self, c: CellStats) -> str:
        return _canonical({k: self.cfg[c.index].get(k) for k in FAULT_KEYS})

    def floor_share(self, c: CellStats) -> float | None:
        floor = c.during.mem_available_floor_mib
        if self.ram is None or floor is None or self.ram.mib <= 0:
            return None
        return floor / self.ram.mib

    def reference(self, c: CellStats) -> tuple[list[CellStats], str]:
        """The runs `c` is held against, and how they are named: the other runs of its
        model and configuration; a configuration with no other run, the model's runs that
        agree with it on the keys known to move major faults by orders of magnitude
        (`FAULT_KEYS`)."""
        m = self.model[c.index]
        same = self.same[(m, _canonical(self.cfg[c.index]))]
        if len(same) > 1:
            return same, "its configuration's other runs"
        return self.like[(m, self._fault_key(c))], "its model's other runs"

    def median(self, members: list[CellStats], c: CellStats,
               value: Callable[[CellStats], float | None], what: str
               ) -> tuple[float, str] | None:
        key = (what, id(members))
        if key not in self._sorted:
            self._sorted[key] = _Sorted(members, value)
        return self._sorted[key].without(c)

    def clean_median(self, c: CellStats) -> tuple[float, str, str] | None:
        """The median major faults per token of the device's clean runs (no memory floor
        flags them) that agree with `c` on `FAULT_KEYS`: its model's, where it has any
        besides `c`, else any model's; with their names and which they are."""
        fault = self._fault_key(c)
        for group, which in ((self._clean_model.get((self.model[c.index], fault)),
                              "runs of its model"), (self._clean_any.get(fault), "runs")):
            got = group.without(c) if group is not None else None
            if got is not None:
                return (*got, which)
        return None

    def clean_repeat(self, c: CellStats) -> bool:
        """Whether another run of `c`'s model and configuration is clean (no memory floor
        flags it)."""
        same = self.same[(self.model[c.index], _canonical(self.cfg[c.index]))]
        return any(x.index != c.index and x.index not in self.deep for x in same)

    def more_of_the_same(self, c: CellStats) -> tuple[float, float, str] | None:
        """The runs of the same kernels as `c` with at least as much work — its model and
        configuration but for the knobs that only take work away (`LESS_WORK`), where each
        takes away no more than `c`, with at least its flash reads — as the medians of
        their compute and reads per token and their names; None when there are none.
        Anything else that differs (a predictor's GEMV, overlap, a partial configuration's
        unknowns) can move compute on its own."""
        mine = self.cfg[c.index]
        kernels = (self.model[c.index],
                   _canonical({k: v for k, v in mine.items() if k not in LESS_WORK}))
        work = tuple(_number(mine.get(k)) for k in LESS_WORK)
        key = (kernels, work)
        if key not in self._more:
            members = [x for x in self.kernels[kernels]
                       if x.work.compute_ms_per_token and x.work.read_mib_per_token is not None
                       and all(self._no_less(self.cfg[x.index].get(k), mine.get(k), sign)
                               for k, sign in LESS_WORK.items())]
            members.sort(key=lambda x: -x.work.read_mib_per_token)  # type: ignore[operator]
            self._more[key] = (
                np.array([-x.work.read_mib_per_token for x in members]),  # type: ignore[operator]
                np.array([x.work.compute_ms_per_token for x in members], dtype=float),
                np.array([x.index for x in members], dtype=int))
        neg_reads, compute, index = self._more[key]
        upto = int(np.searchsorted(neg_reads, -c.work.read_mib_per_token, side="right"))  # type: ignore[operator]
        keep = index[:upto] != c.index
        if not keep.any():
            return None
        who = np.sort(index[:upto][keep])
        return (float(np.median(compute[:upto][keep])), float(np.median(-neg_reads[:upto][keep])),
                _names([self.by_index[int(i)] for i in who[:6]], len(who)))

    @staticmethod
    def _no_less(theirs: object, mine: object, sign: int) -> bool:
        a, b = _number(theirs), _number(mine)
        if (a is None) != (b is None):
            return False
        return a is None or sign * (a - b) >= 0  # type: ignore[operator]


def device_ram(cells: Sequence[CellStats], rec: dict[int, CellRecord],
               mem_total_mib: float | None = None) -> DeviceRam | None:
    """The device's RAM: MemTotal when the samples recorded it, else the most MemAvailable
    any cell recorded (at entry, during, after): a lower bound, so that a floor flagged
    against it is below the fraction of the real RAM too. None when nothing recorded
    memory."""
    if mem_total_mib is not None and mem_total_mib > 0:
        return DeviceRam(mem_total_mib, True)
    seen = [r.entry.mem_available_mib for r in rec.values()
            if r.entry.mem_available_mib is not None]
    for c in cells:
        seen += [x.mem_available_mib for x in c.during.around
                 if x.mem_available_mib is not None]
        if c.during.mem_available_floor_mib is not None:
            seen.append(c.during.mem_available_floor_mib)
    return DeviceRam(max(seen), False) if seen else None


def _cell_tells(c: CellStats, peers: _Peers) -> list[Tell]:
    """The authors' two tells, the memory floor and the occupancy fall for one cell, each
    against the median of a reference set (one contaminated reference run does not move a
    median of three)."""
    out: list[Tell] = []
    ref, what = peers.reference(c)
    faults = peers.median(ref, c, lambda x: x.work.majflt_per_token, "majflt")
    flagged = False
    if c.work.majflt_per_token is not None and faults is not None:
        m, who = faults
        if c.work.majflt_per_token >= MAJFLT_FLOOR and c.work.majflt_per_token > MAJFLT_FACTOR * m:
            flagged = True
            out.append(Tell(c.index, "majflt",
                            f"{c.work.majflt_per_token:.1f} major faults/token vs {m:.2f} "
                            f"(the median of {what}: {who}): memory pressure"))
    share = peers.floor_share(c)
    if share is not None and share < MEMORY_FLOOR_FRACTION and peers.ram is not None:
        out.append(Tell(c.index, "memory_floor",
                        f"free memory fell to {c.during.mem_available_floor_mib:.0f} MiB "
                        f"during the cell, {share:.1%} of the device's RAM "
                        f"({peers.ram.describe()}), below {MEMORY_FLOOR_FRACTION:.1%}: the "
                        "kernel was reclaiming memory, and the cell's time includes what "
                        "it faulted back in"))
    clean = peers.clean_median(c)
    if not flagged and c.work.majflt_per_token is not None and clean is not None \
            and c.work.majflt_per_token >= DEVICE_MAJFLT_FLOOR and not peers.clean_repeat(c):
        m, who, which = clean
        if c.work.majflt_per_token > MAJFLT_FACTOR * m:
            out.append(Tell(c.index, "device_majflt",
                            f"{c.work.majflt_per_token:.1f} major faults/token vs {m:.2f} (the "
                            f"median of the device's {which} that no memory floor flags: "
                            f"{who}): memory pressure"))
    busy = peers.median(ref, c, lambda x: x.work.cpu_occupancy or None, "busy")
    if c.work.cpu_occupancy is not None and busy is not None:
        m, who = busy
        if c.work.cpu_occupancy < OCCUPANCY_FALL * m:
            out.append(Tell(c.index, "occupancy_fall",
                            f"CPU occupancy {c.work.cpu_occupancy:.0%} vs {m:.0%} (the median of "
                            f"{what}: {who}): threads waiting or descheduled"))
    if c.work.compute_ms_per_token and c.work.read_mib_per_token is not None:
        more = peers.more_of_the_same(c)
        if more is not None:
            m, r, who = more
            if c.work.compute_ms_per_token > COMPUTE_RISE * m:
                out.append(Tell(c.index, "compute_up_work_down",
                                f"compute {c.work.compute_ms_per_token:.1f} ms/token vs "
                                f"{m:.1f} (the median of the runs of the same kernels with as "
                                f"much work or more: {who}) while flash reads were "
                                f"{c.work.read_mib_per_token:.2f} MiB/token against {r:.2f}: "
                                "slower at the same or less work — a slower CPU"))
    return out


def contamination_tells(cells: list[CellStats], rec: dict[int, CellRecord],
                        match: MatchSpec | None = None, order_known: bool = True,
                        mem_total_mib: float | None = None) -> list[Tell]:
    """Flags, each with the numbers behind it (thresholds are the module constants). The
    per-cell tells compare a cell with a set of runs, so they are the same whatever order
    — known or not — the cells ran in; only the campaign-wide degradation needs the
    order."""
    peers = _Peers(cells, device_ram(cells, rec, mem_total_mib))
    out: list[Tell] = []
    for c in cells:
        if not c.ok:
            continue
        out.extend(_cell_tells(c, peers))
        if c.work.drop_rate:
            out.append(Tell(c.index, "drops",
                            f"drops {c.work.drop_rate:.1%} of routed experts: quote its drop rate "
                            "next to its speed (it does less work per token)"))
    out.extend(capped_after(cells))
    if order_known:
        out.extend(_degrading(cells, rec, match))
    return out


def capped_after(cells: list[CellStats]) -> list[Tell]:
    """A cap read after a cell or at its exit below the hardware maximum (the maximum
    unknown: below the cap the cell entered with): the device was throttling by the end of
    that cell, whatever its entry said. It needs no order and no other cell."""
    out: list[Tell] = []
    for c in cells:
        entry = next((r.caps_khz for r in c.during.around if r.position == keys.BEFORE), {})
        seen: dict[str, str] = {}
        for r in (r for r in c.during.around if r.position in (keys.AFTER, keys.EXIT)):
            for p, cap in sorted(r.caps_khz.items()):
                top = r.hw_max_khz.get(p, c.during.hw_max_khz.get(p))
                limit = top if top is not None else entry.get(p)
                if p in seen or limit is None or cap >= limit or not c.ok:
                    continue
                against = (f"hardware max {top / 1e6:.2f} GHz" if top is not None
                           else "hardware max unknown")
                if p in entry:
                    against += f", {entry[p] / 1e6:.2f} GHz at entry"
                seen[p] = f"{p} {cap / 1e6:.2f} GHz at {place(c.index, r.position)} ({against})"
        if seen:
            out.append(Tell(c.index, "capped_after", "; ".join(seen.values()) + ": throttled "
                            "by the end of the cell — its speed may be the device's, not its "
                            "configuration's"))
    return out


def _degrading(cells: list[CellStats], rec: dict[int, CellRecord],
               match: MatchSpec | None = None) -> list[Tell]:
    """Entry state getting worse at every cell, over three or more cells in run order, by
    more than the matching tolerance in all (a 13 MiB slide of 128 GiB is not a tell)."""
    ran = [c for c in cells if c.index in rec]
    ents = [rec[c.index].entry for c in ran]
    if len(ents) < 3:
        return []
    tol = tolerances(match or MatchSpec())
    mem0 = next((e.mem_available_mib for e in ents if e.mem_available_mib is not None), None)
    out: list[Tell] = []
    series = {  # values, direction of worse, unit, decimals, the change that counts
        "CPU temperature": ([e.cpu_temp_c for e in ents], 1, " °C", 1, tol["cpu_temp_tol_c"]),
        "battery temperature": ([e.battery_temp_c for e in ents], 1, " °C", 1,
                                tol["battery_temp_tol_c"]),
        "MemAvailable": ([e.mem_available_mib for e in ents], -1, " MiB", 0,
                         (mem0 or 0.0) * tol["mem_available_tol_frac"]),
        "speed probe index": ([e.probe_index for e in ents], -1, "", 2, tol["probe_tol"]),
        "capped policies": ([float(len([p for p, cap in e.caps_khz.items()
                                       if p in e.hw_max_khz and cap < e.hw_max_khz[p]]))
                             if e.caps_khz else None for e in ents], 1, "", 0, 0.0),
        # What the cells left behind, in run order (the seed's 2026-07-17 matrix: the free
        # RAM floor and the major faults degraded with position, not with configuration).
        "free-RAM floor during the cell": ([c.during.mem_available_floor_mib for c in ran],
                                           -1, " MiB", 0,
                                           (mem0 or 0.0) * tol["mem_available_tol_frac"]),
        "major faults per token": ([c.work.majflt_per_token for c in ran], 1, "", 0,
                                   MAJFLT_FLOOR),
    }
    for what, (vals, sign, unit, decimals, counts) in series.items():
        if any(v is None for v in vals):
            continue
        steps = [sign * (b - a) for a, b in zip(vals, vals[1:], strict=False)]  # type: ignore[operator]
        if all(s > 0 for s in steps) and sum(steps) > counts:
            shown = " → ".join(f"{v:.{decimals}f}" for v in vals)  # type: ignore[str-format]
            at = "" if what.endswith(("cell", "token")) else " at entry"
            out.append(Tell(None, "entry_degrading",
                            f"{what}{at} worsened at every cell in run order "
                            f"({shown}{unit}): later cells ran on a worse device — "
                            "compare only matched pairs, or add a [gate]"))
    return out


__all__ = ["MEMORY_FLOOR_FRACTION", "DeviceRam", "Tell", "capped_after", "config_of",
           "contamination_tells", "device_ram", "model_of"]
