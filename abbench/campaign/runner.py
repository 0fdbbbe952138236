"""Running a campaign: the loop over its cells — spacing, the thermal gate, the entry
state, the cell in its child process, its journal line — and the rounds a sequential
campaign appends; `start` and `resume` are its two ways in.

Each finished cell is appended to `journal.jsonl` (flushed and fsync'd) before the next one
starts, so an interrupted campaign loses at most the cell in flight: `--resume RUN` reads
the plan and the journal and runs only what the journal lacks. A cell that crashes, exits
non-zero, writes garbage or outlives its timeout is recorded as failed with its stderr tail
(and the reason its last `ERROR:` line gives) and the campaign goes on.

Resuming first repairs what a crash left (`recovery.repair`) and appends the sentinel
history lines a kill kept from being written (`sentinels`). A file that cannot be written
(a full disk) stops the campaign with one error naming it, `status.json` saying so, and
the journal whole: `--resume` continues once there is room.

An interleaved campaign (`interleave = "slices"`) runs its pairs as one each: spacing,
gate and entry state once, then both cells side by side taking turns (`interleave`), and
both journal lines; the sampler tags each tick with the cell whose turn it is.

The pieces live beside it: `child` (a cell's process), `interleave` (a pair's two),
`output` (what it produced), `entry` (entry state, speed probe), `run_folder` (the folder's
other files), `gate`, `sentinels`, `recovery`, `sequential` and `view`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import abbench.campaign.bmoe as bmoe
from abbench.campaign.child import (
    CellChild,
    ChildExit,
    cell_argv,
    launched_config,
    stated_reason,
    stderr_tail,
)
from abbench.campaign.entry import SpeedIndex, entry_state
from abbench.campaign.gate import GateSpec, wait_for_gate
from abbench.campaign.interleave import Arm, InterleavedPair, turn_argv
from abbench.campaign.output import CellResult, clear_output, read_result
from abbench.campaign.plan import planned_cells
from abbench.campaign.recovery import repair
from abbench.campaign.remote import ENGINE_FILES, RemoteCell, RemoteRun
from abbench.campaign.run_folder import Prepare, create_run_folder, write_plan, write_status
from abbench.campaign.sentinels import append_sentinel, resend_sentinels
from abbench.campaign.sequential import LookFn, fits, fraction, interleaved_round, next_round
from abbench.campaign.stage import stage_device
from abbench.campaign.view import CampaignView
from abbench.engine.run.models import prepare_models
from abbench.errors import EXIT_OK, AbbenchError, CellOutputError, Interrupted, WriteError
from abbench.fsutil import fault
from abbench.records import (
    CellRecord,
    EntryState,
    GateWait,
    Plan,
    PlannedCell,
    Sample,
    SampleLog,
    append_jsonl,
    read_journal,
    read_plan,
)
from abbench.records.cell_config import BmoeConfig, EmbeddedConfig, LaunchedConfig
from abbench.records.plan import SLICE_TOKENS, SLICES
from abbench.sensors import Device, Sampler
from abbench.sim import open_device


@dataclass
class RunOptions:
    out_root: Path = Path("reports")
    sentinels_dir: Path = Path("sentinels")
    python: str = sys.executable
    live: bool = True
    # Reads the decisions at a look of a sequential campaign (the command composes the
    # analysis in; a campaign never imports it). None: no rounds are appended.
    look: LookFn | None = None


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
        self.current: int | None = None  # the cell in flight, for the sampler's tags
        self._lock = threading.Lock()
        self._samples = SampleLog(folder)
        self._child = CellChild(device)
        self._pair = InterleavedPair(device, self._tag)
        self.speed = SpeedIndex(folder, device, opts.python)
        # An adb/ssh device's cells run in folders there, their processes killed there.
        self.remote = (RemoteRun(device, plan.remote, folder.name)
                       if plan.remote is not None and not device.on_host else None)

    # -- sampler sink (sampler thread) ---------------------------------------------

    def _sink(self, t_mono: float, t_wall: float, values: dict[str, Any]) -> None:
        with self._lock:
            cell = self.current
        self._samples.append(Sample(t_mono, t_wall, values, cell))

    def _tag(self, cell: int | None) -> None:
        """The cell whose samples the sampler's next ticks are (of a pair: whose turn)."""
        with self._lock:
            self.current = cell

    # -- the campaign --------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._run()
        except OSError as e:
            self._child.kill()
            self._pair.kill()
            error = WriteError.from_os(e, f"continue with: abbench campaign --resume "
                                          f"{self.folder}")
            with contextlib.suppress(OSError):  # the disk may be too full for this too
                write_status(self.folder, "failed", error.message)
            raise error from None
        finally:
            self.speed.close()
            self._samples.close()

    def _run(self) -> int:
        todo = self._reopen()
        # A synthetic model not built yet is built now, not by the first cell using it;
        # on an ssh device there, by the abbench there, once its version is checked.
        models = [c.config.model for c in todo
                  if isinstance(c.config, EmbeddedConfig) and c.config.model]
        try:
            if self.remote is None:
                prepare_models(models)
            else:
                stage_device(self.device, self.plan.stage, todo)
                if models:
                    self.remote.check_abbench()
                    self.remote.build_models(m for m in models if m.startswith("synthetic:"))
        except AbbenchError as e:
            write_status(self.folder, "failed", e.message)
            raise
        write_status(self.folder, "running")
        view = CampaignView(self.plan, self.device, live=self.opts.live)
        try:
            self._loop(todo, view)
        except Interrupted as e:  # the device went away
            write_status(self.folder, "interrupted", e.message)
            raise
        except KeyboardInterrupt:
            self._child.kill()
            self._pair.kill()
            write_status(self.folder, "interrupted")
            raise Interrupted(
                f"interrupted: {len(read_journal(self.folder))} of {len(self.plan.cells)} "
                f"cells are in {self.folder / 'journal.jsonl'}",
                tip=f"continue with: abbench campaign --resume {self.folder}",
                folder=self.folder,
            ) from None
        write_status(self.folder, "complete")
        return EXIT_OK

    def _reopen(self) -> list[PlannedCell]:
        """The cells the journal lacks (all of them in a new folder), once the folder is
        safe to append to again."""
        done = {r.index for r in read_journal(self.folder)}
        todo = [c for c in self.plan.cells if c.index not in done]
        repair(self.folder, self.plan, done)  # what a crash left, if this is a resume
        if done:
            resend_sentinels(self.opts.sentinels_dir, self.device, self.plan, self.folder)
        self.speed.load()
        return todo

    def _loop(self, todo: list[PlannedCell], view: CampaignView) -> None:
        # A simulated device runs its clock `time_scale` times faster than the wall: the
        # spacing and the gate's poll and timeout are in device seconds.
        scale = self.device.time_scale
        last_end: float | None = None
        with Sampler(self.device, self.hz, self._sink) as sampler, view:
            view.sampler = sampler
            while todo:
                for run in _runs(todo):
                    last_end = self._one(run, sampler, view, last_end, scale)
                # A sequential campaign reads its decisions and appends a round while
                # one is open and the budget allows it.
                todo = self._look(view) if self.plan.sequential is not None else []
            # One last reading, so the timeline covers the campaign's end too (a
            # sample that cannot be written is a gap, as in the sampler).
            with contextlib.suppress(OSError):
                self._sink(time.monotonic(), time.time(), self.device.sample())

    def _one(self, run: tuple[PlannedCell, ...], sampler: Sampler, view: CampaignView,
             last_end: float | None, scale: float) -> float:
        """Spacing, gate, entry state, the cell (or an interleaved pair of cells), its
        journal lines; returns when it ended."""
        cell = run[0]
        fault("before-cell")
        unprepared = None
        if self.remote is not None:  # before the entry state: leftovers, `[device] prepare`
            notes, unprepared = self.remote.before_cell(cell.label)
            for note in notes:
                view.note(note)
        if last_end is not None and self.plan.spacing_s > 0:
            view.phase(cell, f"spacing {self.plan.spacing_s:g} s"
                       + (f" (simulated: {self.plan.spacing_s / scale:.3g} s)"
                          if scale != 1.0 else ""))
            _sleep_until(last_end + self.plan.spacing_s / scale)
        gate = GateWait()
        if self.gate is not None:
            view.phase(cell, "gate")
            gate = wait_for_gate(self.gate, self.device, self.speed.index,
                                 functools.partial(view.phase, cell), scale)
        index = self.speed.index()
        values = sampler.latest or self.device.sample()
        entry = entry_state(values, index, self.device.simulated)
        records = ([self._run_cell(cell, entry, gate, view, unprepared)] if len(run) == 1
                   else self._run_pair(run, entry, gate, view))
        for c, record in zip(run, records, strict=True):
            append_jsonl(self.folder / "journal.jsonl", record.to_json())
            view.finished(c, record)
            append_sentinel(self.opts.sentinels_dir, self.device, self.plan, self.folder, c,
                            record)
        if self.remote is not None and any(r.status != "ok" for r in records):
            self._stop_if_lost()
        return time.monotonic()

    def _stop_if_lost(self) -> None:
        """After a cell failed on an adb/ssh device: a device that no longer answers
        stops the campaign (every cell left would fail the same way, and the failures
        would be read as the configurations' own); `--resume` goes on once it is back."""
        lost = self.device.unreachable()
        if lost is not None:
            raise Interrupted(
                f"stopped: {lost}; {len(read_journal(self.folder))} of "
                f"{len(self.plan.cells)} cells are in {self.folder / 'journal.jsonl'}",
                tip=f"once the device answers again: abbench campaign --resume {self.folder}",
                folder=self.folder)

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
        pairs = [(d.candidate, d.baseline) for d in plan.decisions]
        smallest = min(len(self._round([], p)) for p in pairs)
        final = not fits(n, smallest, seq.max_cells, elapsed, seq.max_minutes)
        outcome = self.opts.look(self.folder, plan,
                                 fraction(n, seq.max_cells, elapsed, seq.max_minutes), final)
        for line in outcome.lines:
            view.note(line)
        names: list[str] = []
        if not final:
            for p in outcome.open:
                block = self._round(names, p)
                if fits(n, len(names) + len(block), seq.max_cells, elapsed, seq.max_minutes):
                    names += block
        configs = {c.name: c.config for c in reversed(plan.cells)}
        width = len(plan.cells[0].label.split("-", 1)[0]) if plan.cells else 2
        width = max(width, len(str(n + len(names))))
        more = planned_cells(list(plan.cells), names, configs, width,
                             paired=plan.interleave == SLICES)
        self.plan = dataclasses.replace(plan, cells=plan.cells + tuple(more),
                                        looks=plan.looks + (outcome.look,))
        write_plan(self.folder, self.plan)
        view.plan = self.plan
        if names:
            view.note(f"round: {len(names)} more cells ({' '.join(names)}) for "
                      f"{', '.join(f'{c} vs {b}' for c, b in outcome.open)}")
        elif outcome.open:
            view.note("the budget is spent: no further round fits "
                      f"({len(records)} cells, {elapsed / 60:.1f} minutes)")
        return more

    def _round(self, names: list[str], decision: tuple[str, str]) -> list[str]:
        """The round one open (candidate, baseline) decision asks for, after the plan's
        cells and the `names` this look has appended so far."""
        plan = self.plan
        if plan.interleave == SLICES:
            pairs = [(a.name, b.name) for a, b in plan.pairs()]
            return interleaved_round(pairs + list(zip(names[::2], names[1::2])), [decision])
        last = names[-1] if names else (plan.cells[-1].name if plan.cells else None)
        return next_round(last, [decision])

    # -- one cell ------------------------------------------------------------------

    def _run_cell(self, cell: PlannedCell, entry: EntryState, gate: GateWait,
                  view: CampaignView, unprepared: str | None = None) -> CellRecord:
        out = self._cell_folder(cell)
        self._tag(cell.index)
        view.phase(cell, "running")
        # Before the clock starts: a llama.cpp cell's synthetic model is built here. Where
        # nothing starts (`argv` None), nothing below reads `launched`.
        there = self.remote.cell(cell.label) if self.remote is not None else None
        try:
            launched = launched_config(cell.config)
            argv: list[str] | None = cell_argv(
                launched, self.opts.python, out, self.device, there,
                self.plan.remote.abbench if self.plan.remote is not None else ("abbench",))
        except AbbenchError as e:
            argv, not_started = None, ChildExit("failed", None, e.message)
        unprepared = unprepared or (clear_output(launched, out, self.device) if argv else None)
        if unprepared is not None:  # `[device] prepare` failed, a stale output stays: not run
            argv, not_started = None, ChildExit("failed", None, unprepared)
        t0w, t0m = time.time(), time.monotonic()
        try:
            ended = (self._child.run(argv, out, launched.timeout_s, there,
                                     launched.memory_limit_mib) if argv is not None
                     else not_started)
        finally:
            self._tag(None)
        span = (t0w, time.time(), t0m, time.monotonic())
        files = ENGINE_FILES if isinstance(launched, EmbeddedConfig) else \
            bmoe.FILES if isinstance(launched, BmoeConfig) else None
        if there is not None and ended.status == "ok" and files is not None:
            lost = there.pull_into(out, files)
            ended = ChildExit("failed", ended.exit_code, lost) if lost else ended
        if there is not None and self.remote is not None:
            for note in self.remote.after_cell(cell.label, out):
                view.note(note)
        return self._record(cell, launched if argv is not None else None, ended, span,
                            entry, gate, there)

    def _run_pair(self, run: tuple[PlannedCell, ...], entry: EntryState, gate: GateWait,
                  view: CampaignView) -> list[CellRecord]:
        """An interleaved pair (`interleave.py`): both cells from one entry state, the
        gate waited once, before the first; `run[0]` takes the first turn."""
        gates = (gate, GateWait())
        try:
            arms = [self._arm(cell, other, view)
                    for cell, other in zip(run, run[::-1], strict=True)]
        except AbbenchError as e:  # nothing started
            now = (time.time(), time.time(), time.monotonic(), time.monotonic())
            return [self._record(c, None, ChildExit("failed", None, e.message), now, entry, g)
                    for c, g in zip(run, gates, strict=True)]
        ran = self._pair.run(arms[0], arms[1])
        return [self._record(c, arm.config, arm.ended, arm.span, entry, g)
                for c, arm, g in zip(run, ran, gates, strict=True)]

    def _arm(self, cell: PlannedCell, other: PlannedCell, view: CampaignView) -> Arm:
        """One cell of a pair, its folder made and its command line taking turns."""
        out = self._cell_folder(cell)
        view.phase(cell, f"running, taking turns with {other.label}")
        cfg = cell.config
        if not isinstance(cfg, EmbeddedConfig):  # the plan's checks keep this out
            raise CellOutputError(f"cell {cell.label} cannot take turns: only an embedded "
                                  "cell can")
        argv = cell_argv(cfg, self.opts.python, out, self.device)
        return Arm(cell.index, cell.label,
                   turn_argv(argv, self.plan.slice_tokens or SLICE_TOKENS), out, cfg)

    def _cell_folder(self, cell: PlannedCell) -> Path:
        out = self.folder / "cells" / cell.label
        if out.exists():  # a cell that was in flight when the campaign died: start clean
            shutil.rmtree(out)
        out.mkdir(parents=True)
        return out

    def _record(self, cell: PlannedCell, launched: LaunchedConfig | None, ended: ChildExit,
                span: tuple[float, float, float, float], entry: EntryState,
                gate: GateWait, there: RemoteCell | None = None) -> CellRecord:
        """The journal's line for a cell whose process ended, its output read and judged;
        `span`: its wall start and end, then its monotonic start and end."""
        out = self.folder / "cells" / cell.label
        result = (read_result(launched, out, self.device,
                              there.folder if there is not None else None)
                  if ended.status == "ok" and launched is not None else CellResult())
        status, error = ((ended.status, ended.error) if result.error is None
                         else ("failed", result.error))
        tail = stderr_tail(out / "stderr.txt")
        if ended.status == "failed" and ended.exit_code is not None and error is not None:
            error = stated_reason(error, tail)
        t0w, t1w, t0m, t1m = span
        return CellRecord(
            index=cell.index, name=cell.name, label=cell.label, status=status,
            t_start_wall=t0w, t_end_wall=t1w, t_start_mono=t0m, t_end_mono=t1m,
            entry=entry, gate=gate, summary=result.summary, fingerprint=result.fingerprint,
            tokens_per_s=result.tokens_per_s, exit_code=ended.exit_code, error=error,
            stderr_tail=tail, memory=ended.memory,
        )


def _runs(todo: list[PlannedCell]) -> list[tuple[PlannedCell, ...]]:
    """`todo` as the runs it makes: an interleaved pair whose both cells are to run is one
    run, any other cell its own (one whose partner ran already, before a crash: alone)."""
    runs: list[tuple[PlannedCell, ...]] = []
    i = 0
    while i < len(todo):
        cell, after = todo[i], todo[i + 1] if i + 1 < len(todo) else None
        run = (cell, after) if after and cell.interleaved_with == after.index else (cell,)
        runs.append(run)
        i += len(run)
    return runs


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def start(plan: Plan, resolved_toml: str, opts: RunOptions, hz: float,
          gate: GateSpec | None, root: str,
          prepare: Prepare | None = None) -> tuple[Path, int]:
    """Open the device, create the run folder (campaign.toml, plan.json, a simulated
    device's profile, and what `prepare` writes: the command's noise-floor snapshot) and
    run every cell."""
    device = open_device(plan.device, root)
    try:
        folder = create_run_folder(opts.out_root, plan, resolved_toml, device, prepare)
        return folder, CampaignRun(folder, plan, device, opts, hz, gate).run()
    finally:
        device.close()


def resume(folder: Path, opts: RunOptions, hz: float, gate: GateSpec | None,
           root: str, prepare: Prepare | None = None) -> int:
    """Run the cells a run folder's journal lacks, on the device its plan names, after
    `prepare` (what a campaign stopped between its plan and its first cell did not write)."""
    plan = read_plan(folder)
    device = open_device(plan.device, root)
    try:
        if prepare is not None:
            prepare(folder, device)
        return CampaignRun(folder, plan, device, opts, hz, gate).run()
    finally:
        device.close()
