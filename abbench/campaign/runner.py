"""Running a campaign: spacing, the thermal gate, entry states, cells in child processes,
the journal, resume.

Each finished cell is appended to `journal.jsonl` (flushed and fsync'd) before the next one
starts, so an interrupted campaign loses at most the cell in flight: `--resume RUN` reads
the plan and the journal and runs only what the journal lacks. A cell that crashes, exits
non-zero, writes garbage or outlives its timeout is recorded as failed with its stderr tail
and the campaign goes on.

Resuming first repairs what a crash left (`recovery.repair`) and appends the sentinel
history lines a kill kept from being written. A file that cannot be written (a full disk)
stops the campaign with one error naming it, `status.json` saying so, and the journal
whole: `--resume` continues once there is room.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from abbench.campaign.gate import GateSpec, wait_for_gate
from abbench.campaign.output import read_cell_output
from abbench.campaign.plan import planned_cells
from abbench.campaign.recovery import note_child, repair
from abbench.campaign.sequential import LookFn, fits, fraction, next_round
from abbench.campaign.view import CampaignView
from abbench.engine.config import to_argv
from abbench.engine.models import prepare_models
from abbench.errors import (
    EXIT_OK,
    AbbenchError,
    Interrupted,
    RecordError,
    UsageError,
    WriteError,
)
from abbench.fsutil import atomic_write_text, fault
from abbench.records import (
    CellRecord,
    EntryState,
    GateWait,
    Plan,
    PlannedCell,
    Sample,
    append_jsonl,
    config_key,
    keys,
    read_journal,
    read_jsonl,
    read_plan,
)
from abbench.sensors import Device, Sampler, speed_probe
from abbench.sensors.probe import ProbeWorker
from abbench.sim import open_device

PROFILE_FILE = "device-profile.toml"  # a simulated device's profile, as the run used it
STDERR_TAIL = 4000




@dataclass
class RunOptions:
    out_root: Path = Path("reports")
    sentinels_dir: Path = Path("sentinels")
    python: str = sys.executable
    live: bool = True
    # Reads the decisions at a look of a sequential campaign (the command composes the
    # analysis in; a campaign never imports it). None: no rounds are appended.
    look: LookFn | None = None


def new_run_folder(root: Path, name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            folder = root / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
            try:
                folder.mkdir()  # atomic: two campaigns never share a folder
                return folder
            except FileExistsError:
                continue
    except OSError as e:
        raise WriteError.from_os(e) from None
    raise UsageError(f"{root}: cannot create a unique run folder for `{name}`")


def engine_argv(python: str, cfg: dict[str, Any], out_dir: Path) -> list[str]:
    """`python -m abbench engine run ...` for a cell's resolved configuration."""
    return [python, "-m", "abbench", "engine", "run", "--json", str(out_dir / "summary.json"),
            "--csv", str(out_dir / "tokens.csv"), "-q",
            *to_argv(cfg, route_trace=str(out_dir / "route.csv"))]


def entry_state(values: dict[str, Any], probe_index: float | None, simulated: bool) -> EntryState:
    caps = {p: int(v) for p, v in keys.policies(values, "cap_khz").items()}
    hw = {p: int(v) for p, v in keys.policies(values, "hw_max_khz").items()}
    status = values.get(keys.ANDROID_THERMAL_STATUS)
    return EntryState(
        t_wall=time.time(), caps_khz=caps, hw_max_khz=hw,
        **{name: values.get(key) for key, name in keys.ENTRY_READINGS}, probe_index=probe_index,
        thermal_status=int(status) if status is not None else None, simulated=simulated,
    )


class CampaignRun:
    """One run folder being filled. `run()` returns the exit status."""

    def __init__(self, folder: Path, plan: Plan, device: Device, opts: RunOptions,
                 hz: float, gate: GateSpec | None) -> None:
        self.folder = folder
        self.plan = plan
        self.device = device
        self.opts = opts
        self.hz = hz
        self.gate = gate
        self.current: int | None = None
        self._lock = threading.Lock()
        self._samples = folder / "samples.jsonl"
        self._child: subprocess.Popen[bytes] | None = None
        self.first_probe: float | None = None
        self._probe: ProbeWorker | None = None

    # -- sampler sink (sampler thread) ---------------------------------------------

    def _sink(self, t_mono: float, t_wall: float, values: dict[str, Any]) -> None:
        with self._lock:
            cell = self.current
        append_jsonl(self._samples, Sample(t_mono, t_wall, values, cell).to_json(), fsync=False)

    def probe_index(self) -> float:
        """first probe / this probe. On a simulated device the probe runs for real in a
        child process that the device throttles like a cell (DESIGN 8): it sees the
        simulated caps and the host's own load, as a real device's probe would."""
        t = self._probe_seconds()
        if self.first_probe is None:
            self.first_probe = t
            state = {"first_probe_s": t}
            atomic_write_text(self.folder / "probe.json", json.dumps(state) + "\n")
        return self.first_probe / t

    def _probe_seconds(self) -> float:
        if not self.device.simulated:
            return speed_probe()
        if self._probe is None:
            self._probe = ProbeWorker(self.opts.python)
        self.device.throttle(self._probe.pid, loads=False)
        try:
            return self._probe.measure(3, self.device.probe_rep_s)
        finally:
            self.device.unthrottle()

    def run(self) -> int:
        try:
            return self._run()
        except OSError as e:
            self._kill_child()
            error = WriteError.from_os(e, f"continue with: abbench campaign --resume "
                                          f"{self.folder}")
            with contextlib.suppress(OSError):  # the disk may be too full for this too
                self._write_status("failed", error.message)
            raise error from None
        finally:
            if self._probe is not None:
                self._probe.close()
                self._probe = None

    def _run(self) -> int:
        done = {r.index for r in read_journal(self.folder)}
        todo = [c for c in self.plan.cells if c.index not in done]
        repair(self.folder, self.plan, done)  # what a crash left, if this is a resume
        if done:
            self._resend_sentinels()
        probe_file = self.folder / "probe.json"
        if probe_file.exists():
            self.first_probe = float(json.loads(probe_file.read_text())["first_probe_s"])
        # A synthetic model not built yet is built now, not by the first cell using it.
        try:
            prepare_models([str(c.config["model"]) for c in todo
                            if c.config.get("engine", "embedded") == "embedded"])
        except AbbenchError as e:
            self._write_status("failed", e.message)
            raise
        self._write_status("running")
        view = CampaignView(self.plan, self.device, live=self.opts.live)
        # A simulated device runs its clock `time_scale` times faster than the wall: the
        # spacing and the gate's poll and timeout are in device seconds.
        scale = self.device.time_scale
        last_end: float | None = None
        try:
            with Sampler(self.device, self.hz, self._sink) as sampler, view:
                view.sampler = sampler
                while todo:
                    for cell in todo:
                        last_end = self._one(cell, sampler, view, last_end, scale)
                    # A sequential campaign reads its decisions and appends a round while
                    # one is open and the budget allows it.
                    todo = self._look(view) if self.plan.sequential is not None else []
                # One last reading, so the timeline covers the campaign's end too (a
                # sample that cannot be written is a gap, as in the sampler).
                with contextlib.suppress(OSError):
                    self._sink(time.monotonic(), time.time(), self.device.sample())
        except KeyboardInterrupt:
            self._kill_child()
            self._write_status("interrupted")
            raise Interrupted(
                f"interrupted: {len(read_journal(self.folder))} of {len(self.plan.cells)} "
                f"cells are in {self.folder / 'journal.jsonl'}",
                tip=f"continue with: abbench campaign --resume {self.folder}",
                folder=self.folder,
            ) from None
        self._write_status("complete")
        return EXIT_OK

    def _one(self, cell: PlannedCell, sampler: Sampler, view: CampaignView,
             last_end: float | None, scale: float) -> float:
        """Spacing, gate, entry state, the cell, its journal line; returns when it ended."""
        fault("before-cell")
        if last_end is not None and self.plan.spacing_s > 0:
            view.phase(cell, f"spacing {self.plan.spacing_s:g} s"
                       + (f" (simulated: {self.plan.spacing_s / scale:.3g} s)"
                          if scale != 1.0 else ""))
            _sleep_until(last_end + self.plan.spacing_s / scale)
        gate = GateWait()
        if self.gate is not None:
            view.phase(cell, "gate")
            gate = wait_for_gate(self.gate, self.device, self.probe_index,
                                 lambda msg, c=cell: view.phase(c, msg), scale)
        index = self.probe_index()
        values = sampler.latest or self.device.sample()
        entry = entry_state(values, index, self.device.simulated)
        record = self._run_cell(cell, entry, gate, view)
        append_jsonl(self.folder / "journal.jsonl", record.to_json())
        view.finished(cell, record)
        self._sentinel(cell, record)
        return time.monotonic()

    # -- sequential rounds -----------------------------------------------------------

    def _look(self, view: CampaignView) -> list[PlannedCell]:
        """Take the look due after the cells run so far (none if it was taken: a resume)
        and append the round it asks for; the plan, with the look and the round, is
        written in one replace, so a crash leaves one or the other whole."""
        plan = self.plan
        seq = plan.sequential
        n = len(plan.cells)
        if seq is None or self.opts.look is None or (plan.looks and plan.looks[-1].cells == n):
            return []
        records = read_journal(self.folder)
        first = min(records, key=lambda r: r.t_start_wall, default=None)
        began = first.t_start_wall - first.gate.waited_s if first is not None else time.time()
        elapsed = max(0.0, time.time() - began)
        last = plan.cells[-1].name if plan.cells else None
        pairs = [(str(d["candidate"]), str(d["baseline"])) for d in plan.decisions]
        smallest = min(len(next_round(last, [p])) for p in pairs)
        final = not fits(n, smallest, seq.max_cells, elapsed, seq.max_minutes)
        outcome = self.opts.look(self.folder, plan,
                                 fraction(n, seq.max_cells, elapsed, seq.max_minutes), final)
        for line in outcome.lines:
            view.note(line)
        names: list[str] = []
        if not final:
            for p in outcome.open:
                block = next_round(names[-1] if names else last, [p])
                if fits(n, len(names) + len(block), seq.max_cells, elapsed, seq.max_minutes):
                    names += block
        configs = {c.name: c.config for c in reversed(plan.cells)}
        width = len(plan.cells[0].label.split("-", 1)[0]) if plan.cells else 2
        width = max(width, len(str(n + len(names))))
        more = planned_cells(list(plan.cells), names, configs, width)
        self.plan = dataclasses.replace(plan, cells=plan.cells + tuple(more),
                                        looks=plan.looks + (outcome.look,))
        atomic_write_text(self.folder / "plan.json",
                          json.dumps(self.plan.to_json(), indent=1) + "\n")
        view.plan = self.plan
        if names:
            view.note(f"round: {len(names)} more cells ({' '.join(names)}) for "
                      f"{', '.join(f'{c} vs {b}' for c, b in outcome.open)}")
        elif outcome.open:
            view.note("the budget is spent: no further round fits "
                      f"({len(records)} cells, {elapsed / 60:.1f} minutes)")
        return more

    # -- one cell ------------------------------------------------------------------

    def _run_cell(self, cell: PlannedCell, entry: EntryState, gate: GateWait,
                  view: CampaignView) -> CellRecord:
        out = self.folder / "cells" / cell.label
        if out.exists():  # a cell that was in flight when the campaign died: start clean
            shutil.rmtree(out)
        out.mkdir(parents=True)
        cfg = cell.config
        timeout = float(cfg.get("timeout_s", 900))
        with self._lock:
            self.current = cell.index
        view.phase(cell, "running")
        t0w, t0m = time.time(), time.monotonic()
        status, code, error = "ok", None, None
        stderr_path = out / "stderr.txt"
        try:
            if cfg.get("engine", "embedded") == "embedded":
                argv = engine_argv(self.opts.python, cfg, out)
            else:
                # The device's own command line (ssh with BatchMode, adb -s SERIAL): a cell
                # is launched with the same options as the sampler's reads.
                argv = self.device.command([str(x) for x in cfg["command"]])
            with open(stderr_path, "wb") as err, open(out / "stdout.txt", "wb") as so:
                self._child = subprocess.Popen(argv, stdout=so, stderr=err,
                                               stdin=subprocess.DEVNULL)
                try:
                    # A simulated device throttles the child from its first instruction.
                    self.device.throttle(self._child.pid)
                    note_child(out / "child.json", self._child.pid)
                    code = self._child.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._kill_child()
                    status, error = "timeout", f"no result after the {timeout:g} s timeout"
                except BaseException:  # Ctrl-C: the child must not outlive the campaign
                    self._kill_child()
                    raise
            if status == "ok" and code != 0:
                status, error = "failed", _exit_reason(code)
        except OSError as e:
            status, error = "failed", f"could not start: {e.strerror or e}"
        finally:
            self.device.unthrottle()
            self._child = None
            with self._lock:
                self.current = None
        t1w, t1m = time.time(), time.monotonic()
        summary: dict[str, Any] = {}
        fingerprint = None
        if status == "ok":
            try:
                summary, fingerprint = read_cell_output(cfg, out, self.device)
            except AbbenchError as e:
                status, error = "failed", e.message
            except Exception as e:  # noqa: BLE001 — garbage output must not end the campaign
                status, error = "failed", (f"its output could not be read "
                                           f"({type(e).__name__}: {e})")
        tps = summary.get("tok/s")
        usable = (isinstance(tps, (int, float)) and not isinstance(tps, bool)
                  and 0 < tps < math.inf)
        if status == "ok" and "tok/s" in summary and not usable:
            status, error = "failed", f"it reported no usable throughput (tok/s = {tps!r})"
        return CellRecord(
            index=cell.index, name=cell.name, label=cell.label, status=status,
            t_start_wall=t0w, t_end_wall=t1w, t_start_mono=t0m, t_end_mono=t1m,
            entry=entry, gate=gate,
            summary=_finite(summary),  # NaN in a cell's output is garbage, and not JSON
            fingerprint=fingerprint, tokens_per_s=float(tps) if usable else None,
            exit_code=code, error=error, stderr_tail=_tail(stderr_path),
        )

    def _kill_child(self) -> None:
        self.device.unthrottle()  # a stopped child ignores SIGTERM: continue it first
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()

    def _sentinels_file(self) -> Path:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.device.name) or "device"
        return self.opts.sentinels_dir / f"{name}.jsonl"

    def _resend_sentinels(self) -> None:
        """Append the sentinel entries of journaled cells that the history lacks: a kill
        between the journal line and the history line must not lose one (nor a re-run
        duplicate one: the history is keyed by run folder and cell)."""
        try:
            sent = {(Path(str(d.get("run"))).name, d.get("cell"))
                    for d in read_jsonl(self._sentinels_file())}
        except RecordError:
            return  # a history that does not parse is not ours to extend blindly
        by_index = {c.index: c for c in self.plan.cells}
        for record in read_journal(self.folder):
            if (self.folder.name, record.label) not in sent and record.index in by_index:
                self._sentinel(by_index[record.index], record)

    def _sentinel(self, cell: PlannedCell, record: CellRecord) -> None:
        """Append sentinel runs (and the runs they repeat) to the device's history."""
        is_twin = any(c.sentinel_of == cell.index for c in self.plan.cells)
        if (cell.sentinel_of is None and not is_twin) or record.status != "ok":
            return
        self.opts.sentinels_dir.mkdir(parents=True, exist_ok=True)
        append_jsonl(self._sentinels_file(), {
            "device": self.device.name, "simulated": self.device.simulated,
            "campaign": self.plan.campaign, "run": str(self.folder), "cell": cell.label,
            "name": cell.name, "config_key": config_key(cell.config),
            "t_wall": record.t_start_wall, "tokens_per_s": record.tokens_per_s,
            "fingerprint": record.fingerprint, "entry": record.entry.to_json(),
        })

    def _write_status(self, state: str, error: str | None = None) -> None:
        doc: dict[str, Any] = {"state": state, "t_wall": time.time()}
        if error is not None:
            doc["error"] = error
        atomic_write_text(self.folder / "status.json", json.dumps(doc) + "\n")


def _finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, inf) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _exit_reason(code: int) -> str:
    """`exited with status 3`, or for a negative Popen status `killed by SIGSEGV`."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - STDERR_TAIL))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def start(plan: Plan, resolved_toml: str, opts: RunOptions, hz: float,
          gate: GateSpec | None, root: str,
          prepare: Callable[[Path, Device], None] | None = None) -> tuple[Path, int]:
    """Open the device, create the run folder (campaign.toml, plan.json, a simulated
    device's profile, and what `prepare` writes: the command's noise-floor snapshot) and
    run every cell."""
    device = open_device(plan.device, root)
    try:
        folder = new_run_folder(opts.out_root, plan.campaign)
        try:
            atomic_write_text(folder / "campaign.toml", resolved_toml)
            atomic_write_text(folder / "plan.json",
                              json.dumps(plan.to_json(), indent=1) + "\n")
            profile = device.profile_toml
            if profile is not None:  # a simulated device: the run keeps the model it ran on
                atomic_write_text(folder / PROFILE_FILE, profile)
            if prepare is not None:
                prepare(folder, device)
        except OSError as e:
            raise WriteError.from_os(e) from None
        return folder, CampaignRun(folder, plan, device, opts, hz, gate).run()
    finally:
        device.close()


def resume(folder: Path, opts: RunOptions, hz: float, gate: GateSpec | None,
           root: str) -> int:
    plan = read_plan(folder)
    device = open_device(plan.device, root)
    try:
        return CampaignRun(folder, plan, device, opts, hz, gate).run()
    finally:
        device.close()




Progress = Callable[[str], None]
