"""Build run folders with known timelines for the analysis and report tests: plan.json,
journal.jsonl, samples.jsonl and cells/NN-NAME/summary.json written directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from abbench.records import (
    CellRecord,
    DecisionSpec,
    EntryState,
    GateWait,
    MatchSpec,
    NoiseFloor,
    Plan,
    PlannedCell,
    RunSummary,
    Sample,
    Sequential,
    append_jsonl,
    keys,
)
from abbench.records.cell_config import cell_config

HW = {"policy0": 2_000_000, "policy4": 2_400_000}
AT_MAX = dict(HW)


def cell(name: str, rate: float, **kw: Any) -> dict[str, Any]:
    """A cell spec: name, steady tokens/s, and overrides (caps, cpu_temp, battery_temp, mem,
    probe, caps_during, fingerprint, sentinel_of, gave_up, status, n, noise, per_token,
    dropped, compute_ms, read_bytes, majflt, cpu_ms, gap_s, wall_ms: the per-token times
    themselves, power: the battery's draw in W (8 samples during the cell, 3% noise,
    discharging), config: the configuration's identity, by default the name, foreign: the
    `load.foreign_cores` of each of its samples, with a run queue of 2, 3, ...)."""
    return {"name": name, "rate": rate, **kw}


def make_run(tmp: Path, cells: list[dict[str, Any]], decisions: list[dict[str, Any]] = (),  # type: ignore[assignment]
             match: dict[str, Any] | None = None, warmup: int = 4, device: str = "local",
             state: bool = True, simulated: bool = False, seed: int = 1,
             floor: float | None = None, floor_df: int = 30, looks: tuple = (),
             sequential: dict[str, Any] | None = None) -> Path:
    """A run folder; `floor` writes a noise-floor snapshot of that relative spread per
    cell (with `floor_df` degrees of freedom)."""
    run = tmp / "run"
    (run / "cells").mkdir(parents=True)
    if floor is not None:
        (run / "noise-floor.json").write_text(json.dumps(NoiseFloor(
            variance=floor ** 2, df=floor_df, repeats=floor_df + 1).to_json()))
    rng = np.random.default_rng(seed)
    planned = []
    for i, c in enumerate(cells):
        label = f"{i + 1:02d}-{c['name']}"
        config = cell_config({"tokens": c.get("n", 64), "arm": c.get("config", c["name"])})
        planned.append(PlannedCell(i, c["name"], config, c.get("sentinel_of"), label))
    plan = Plan(campaign="t", cells=tuple(planned), spacing_s=30, warmup_tokens=warmup,
                device=device, decisions=tuple(DecisionSpec(**d) for d in decisions),
                looks=tuple(looks), sequential=Sequential(**sequential) if sequential else None,
                match=MatchSpec(**(match or {})))
    (run / "plan.json").write_text(json.dumps(plan.to_json()))
    t = 1000.0
    for i, (c, pc) in enumerate(zip(cells, planned, strict=True)):
        n = c.get("n", 64)
        wall = (1000.0 / c["rate"]) * (1 + c.get("noise", 0.02) * rng.standard_normal(n))
        if "wall_ms" in c:
            wall = np.asarray(c["wall_ms"], float)
            n = len(wall)
        caps = c.get("caps", AT_MAX)
        if state:
            entry = EntryState(t_wall=t, caps_khz=dict(caps) if caps else {},
                               hw_max_khz=dict(HW) if caps else {},
                               cpu_temp_c=c.get("cpu_temp", 40.0),
                               battery_temp_c=c.get("battery_temp", 30.0),
                               mem_available_mib=c.get("mem", 8000.0),
                               probe_index=c.get("probe", 1.0), simulated=simulated)
        else:
            entry = EntryState(t_wall=t)
        dur = float(wall.sum()) / 1000 + 1
        cell_dir = run / "cells" / pc.label
        cell_dir.mkdir()
        per_token = {
            "wall_ms": wall.tolist(),
            "compute_ms": [c.get("compute_ms", 10.0)] * n,
            "read_bytes": [c.get("read_bytes", 4 * 2**20)] * n,
            "hits": [90] * n, "misses": [10] * n, "majflt": [c.get("majflt", 0)] * n,
            "cpu_ms": [c.get("cpu_ms", 0.8 * 1000.0 / c["rate"] * 2)] * n,
            "stall_ms": [1.0] * n, "experts_routed": [128] * n,
            "experts_dropped": [c.get("dropped", 0)] * n,
        }
        doc = {"summary": {"tok/s": c["rate"], "threads": 2}, "fingerprint": None}
        if c.get("per_token", True):
            doc["per_token"] = per_token
        (cell_dir / "summary.json").write_text(json.dumps(doc))
        rec = CellRecord(
            index=i, name=c["name"], label=pc.label, status=c.get("status", "ok"),
            t_start_wall=t, t_end_wall=t + dur, t_start_mono=t, t_end_mono=t + dur,
            entry=entry, gate=GateWait(gave_up=c.get("gave_up", False)),
            summary=RunSummary(tok_per_s=c["rate"], threads=2),
            fingerprint=c.get("fingerprint", f"sha256:{c['name']}"), tokens_per_s=c["rate"])
        append_jsonl(run / "journal.jsonl", rec.to_json(), fsync=False)
        during = c.get("caps_during", [caps] if caps and state else [])
        if "power" in c:  # the battery sampled 8 times, at the cell's (last) caps
            during = [*during[:-1], *[during[-1] if during else {}] * 8]
        for k, cd in enumerate(during):
            values: dict[str, Any] = {"mem.available_mib": c.get("mem", 8000.0)}
            for p, v in cd.items():
                values[f"cpu.{p}.cap_khz"] = v
                values[f"cpu.{p}.hw_max_khz"] = HW[p]
            if "foreign" in c:
                values[keys.FOREIGN_CORES] = c["foreign"]
                values[keys.RUNNABLE_TASKS] = 2 + k
            if "power" in c:
                values[keys.BATTERY_POWER_W] = c["power"] * (1 + 0.03 * rng.standard_normal())
                values[keys.BATTERY_STATUS] = "Discharging"
            append_jsonl(run / "samples.jsonl",
                         Sample(t + k * 0.5, t + k * 0.5, values, i).to_json(), fsync=False)
        t += dur + c.get("gap_s", 30.0)
    (run / "status.json").write_text(json.dumps({"state": "complete", "t_wall": t}))
    return run
