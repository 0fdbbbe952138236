"""What one run's files say of it — tokens/s, hit rate, entry state, start and end, the work
it did — each with where it came from (`records.Fact`: measured, derived or unknown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from abbench.errors import ForeignRunError
from abbench.importers.discover import Run
from abbench.importers.driverlog import DriverEntry
from abbench.importers.state import Snapshot
from abbench.records import EntryState, Fact, GateWait, RunSummary, keys
from abbench.records.bmoe_csv import BmoeRun

UNKNOWN = "unknown"


def run_summary(run: Run) -> tuple[RunSummary, Fact]:
    """The run's summary (tokens, s/tok, tok/s ...), always with its tok/s: the CSV's
    `# summary` line(s) — what a user waited through where the run records the time between
    decodes (`records.bmoe_view`) — else the log's `generation:` line, else derived from the
    per-token rows."""
    table = run.table
    own = RunSummary.from_json(run.digest.summary) if run.digest is not None else RunSummary()
    if table is not None and table.turns and own.tok_per_s is not None:
        where = f"{run.table_file.name}:{_trailers(table)}" if run.table_file else "summary"
        if own.decode_tok_per_s is not None:
            return own, Fact("derived", f"{where}: tokens / (decode + the time between "
                             "decodes: `s/tok` + `loop_overhead_s/tok`), what a user waits "
                             f"through; the decode alone {own.decode_tok_per_s:.3f} tok/s")
        return own, Fact("measured", f"{where} (`# summary` tok/s)")
    if run.log_summary is not None and own.decode_tok_per_s is None:
        # (rows that record the time between decodes beat a `generation:` line, which
        # leaves it out: both arms of a comparison are read as a user waits through them)
        return run.log_summary, Fact("measured", f"{run.summary_where or 'log'} "
                                     "(`generation:` line)")
    origin = run.table_file or run.name
    if run.digest is None or not run.digest.walls:
        raise ForeignRunError(origin, "no tokens/s: no `# summary` line, no .log `generation:` "
                              "line and no `wall_ms` values")
    if run.digest.wall_sum_ms <= 0:
        raise ForeignRunError(origin, "the `wall_ms` column sums to zero")
    name = Path(str(origin)).name
    if own.decode_tok_per_s is not None:
        return own, Fact("derived", f"tokens / sum of (wall_ms + loop_overhead_ms) in {name}, "
                         "what a user waits through; the decode alone "
                         f"{own.decode_tok_per_s:.3f} tok/s")
    return own, Fact("derived", f"tokens / sum of wall_ms in {name}")


def _trailers(table: BmoeRun) -> str:
    """Where a run's trailers are: `70`, or `70, 141 (2 turns)`."""
    lines = [t.line for t in table.turns]
    shown = ", ".join(str(n) for n in lines[:4]) + (", ..." if len(lines) > 4 else "")
    return shown + (f" ({len(lines)} turns)" if len(lines) > 1 else "")


def hit_pct(run: Run, summary: RunSummary) -> tuple[float | None, Fact]:
    """The run's hit rate: its summary's, else the last value of the per-token column,
    which the seed engine writes cumulative (a mean of it would weigh the cold start);
    negative values mean the cache was off."""
    v = summary.cache_hit_pct
    if v is not None:
        return (float(v) if v >= 0 else None), Fact("measured", "the run's summary")
    last = run.digest.last_hit_pct if run.digest is not None else None
    if last is not None:
        return (last if last >= 0 else None), Fact(
            "derived", f"the last (cumulative) `cache_hit_pct` of {run.table_file.name}"
            if run.table_file else "the last cumulative value")
    return None, Fact(UNKNOWN, "no summary hit rate and no `cache_hit_pct` column")


def _scaled(metrics: dict[str, float | None], key: str, div: float) -> float | None:
    v = metrics.get(key)
    return None if v is None else v / div


def entry_state(run: Run, driver: DriverEntry | None
                ) -> tuple[EntryState, dict[str, Fact], GateWait]:
    """The entry state from what was recorded — the driver log's entry line, then
    `.metrics` `*_before_*`, then `.state` BEFORE — with where each value came from."""
    before: Snapshot | None = run.state.before if run.state else None
    m = run.metrics
    facts: dict[str, Fact] = {}
    metrics_name = run.metrics_file.name if run.metrics_file else ""
    state_where = f"{run.state_file.name}:{before.line}" if run.state_file and before else ""

    def pick(key: str, *options: tuple[Any, str]) -> Any:
        for value, where in options:
            if value is not None:
                facts[f"entry.{key}"] = Fact("measured", where)
                return value
        facts[f"entry.{key}"] = Fact(UNKNOWN, "not recorded")
        return None

    dw = driver.where if driver else ""
    caps, hw = _caps(driver, before, state_where, facts)
    entry = EntryState(
        t_wall=0.0, caps_khz=caps, hw_max_khz=hw,
        cpu_temp_c=pick("cpu_temp_c", (driver.cpu_temp_c if driver else None, dw),
                        (_scaled(m, "cpu_temp_before_mC", 1000),
                         f"{metrics_name} `cpu_temp_before_mC`"),
                        (before.cpu_temp_c if before else None, state_where)),
        battery_temp_c=pick("battery_temp_c", (driver.battery_temp_c if driver else None, dw),
                            (_scaled(m, "batt_temp_before_dC", 10),
                             f"{metrics_name} `batt_temp_before_dC`"),
                            (before.battery_temp_c if before else None, state_where)),
        mem_available_mib=pick("mem_available_mib",
                               (driver.mem_available_mib if driver else None, dw),
                               (_scaled(m, "mem_avail_before_kb", 1024),
                                f"{metrics_name} `mem_avail_before_kb`"),
                               (before.mem_available_mib if before else None, state_where)),
        thermal_status=pick("thermal_status", (driver.thermal_status if driver else None, dw),
                            (before.thermal_status if before else None, state_where)),
    )
    gate = GateWait(waited_s=driver.gate_waited_s or 0.0) if driver else GateWait()
    return entry, facts, gate


def _caps(driver: DriverEntry | None, before: Snapshot | None, state_where: str,
          facts: dict[str, Fact]) -> tuple[dict[str, int], dict[str, int]]:
    """The frequency caps and hardware maxima at entry (kHz by policy): the driver's entry
    line, else the `.state` BEFORE snapshot; their provenance goes into `facts`."""
    dw = driver.where if driver else ""
    caps = driver.caps_khz if driver and driver.caps_khz else {}
    hw = driver.hw_max_khz if driver and driver.hw_max_khz else {}
    if caps:
        facts["entry.caps_khz"] = Fact("measured", dw)
    elif before is not None and before.policies:
        caps = {p: v.scaling_max_khz for p, v in before.policies.items()
                if v.scaling_max_khz is not None}
        hw = {p: v.hw_max_khz for p, v in before.policies.items() if v.hw_max_khz is not None}
        facts["entry.caps_khz"] = Fact("measured", state_where)
    else:
        facts["entry.caps_khz"] = Fact(UNKNOWN, "not recorded")
    if caps and not all(p in hw for p in caps):
        facts["entry.hw_max_khz"] = Fact(UNKNOWN, "the hardware maximum of "
                                         + ", ".join(p for p in caps if p not in hw)
                                         + " was not recorded")
    return caps, hw


def times(run: Run, driver: DriverEntry | None, summary: RunSummary
          ) -> tuple[float, float, Fact, Fact]:
    """Start and end (0: unknown) and where they came from."""
    before = run.state.before if run.state else None
    after = run.state.after if run.state else None
    start, sf = 0.0, Fact(UNKNOWN, "no driver entry time, no dated .state snapshot")
    if driver is not None and driver.t_wall is not None:
        start = driver.t_wall
        sf = (Fact("measured", f"{driver.where} t_wall=") if driver.t_wall_how == "t_wall="
              else Fact("derived", f"the timestamp at the start of {driver.where} (time zone "
                        "unknown: differences between lines are exact)"))
    elif before is not None and before.t_wall is not None and run.state_file:
        start, sf = before.t_wall, Fact("measured", f"{run.state_file.name}:{before.line} date")
    if (end := _exit_time(driver)) is not None and end[0] >= start:  # the driver's own clock
        return start, end[0], sf, end[1]
    if after is not None and after.t_wall is not None and run.state_file and start:
        return start, after.t_wall, sf, Fact("measured",
                                             f"{run.state_file.name}:{after.line} date")
    if not start:
        return 0.0, 0.0, sf, Fact(UNKNOWN, "the start is unknown")
    d = run.digest
    decode = d.wall_sum_ms / 1e3 if d and d.walls else float(summary.s_per_tok or 0.0) * float(
        summary.tokens or 0.0)
    own = decode + float(summary.load_s or 0.0) + float(summary.prefill_s or 0.0)
    return start, start + own, sf, Fact("derived", f"the start + the run's own time ({own:.0f} "
                                        "s: load, prefill and decode as its files give them)")


def _exit_time(driver: DriverEntry | None) -> tuple[float, Fact] | None:
    """The run's end by the driver's exit line, when its entry line gave the start."""
    if driver is None or driver.t_wall is None:
        return None
    line = next((e for e in driver.after if e.position == keys.EXIT and e.t_wall is not None),
                None)
    if line is None or line.t_wall is None:
        return None
    how = "measured" if line.t_wall_how == "t_wall=" else "derived"
    return line.t_wall, Fact(how, f"{line.where} (`EXIT STATE:` t_wall=)" if how == "measured"
                             else f"the timestamp at the start of {line.where}")


def fingerprint(run: Run) -> str | None:
    """The work the run reports, as the campaign's external cells fingerprint it: bytes read
    per token."""
    return run.digest.fingerprint if run.digest is not None else None


__all__ = ["UNKNOWN", "entry_state", "fingerprint", "hit_pct", "run_summary", "times"]
