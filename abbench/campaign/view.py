"""The live view: cell n of N, what is happening, temperatures and caps.

On a terminal, a rich live panel refreshed a few times a second; elsewhere (CI, a pipe),
one plain line per event on stderr. Either way the data files are the record: the view
only shows. Cell names, the transport and a cell's failure reason can come from elsewhere (a
run folder resumed, what an external cell wrote): every line and table cell goes through
`textsafe.shown`, and none is read as rich markup.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from abbench.records import CellRecord, Plan, PlannedCell, keys
from abbench.sensors import Device
from abbench.textsafe import shown

PLAIN_GATE_EVERY_S = 10.0  # wall seconds between repeated plain-text gate lines


class CampaignView:
    def __init__(self, plan: Plan, device: Device, live: bool = True) -> None:
        self.plan = plan
        self.device = device
        self.console = Console(stderr=True)
        self.live = live and self.console.is_terminal
        self.sampler: Any = None
        self.status: dict[int, str] = {}
        self.results: dict[int, CellRecord] = {}
        self.now = ""
        self._gate_kinds: tuple[str, ...] = ()
        self._gate_said = 0.0
        self._t0 = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> CampaignView:
        sim = " (SIMULATED device)" if self.device.simulated else ""
        self._say(f"campaign {self.plan.campaign}: {len(self.plan.cells)} cells on "
                  f"{self.device.transport}{sim}")
        if self.live:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4,
                              get_renderable=self._render)
            self._live.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(et, e, tb)
            self._live = None

    def phase(self, cell: PlannedCell, what: str) -> None:
        self.status[cell.index] = what
        self.now = f"cell {cell.index + 1}/{len(self.plan.cells)} {cell.name}: {what}"
        if not self.live and not self._repeats_gate(what):
            self._say(self.now)

    def _repeats_gate(self, what: str) -> bool:
        """Plain lines: a gate poll is printed when the set of reasons changes, and at
        most every PLAIN_GATE_EVERY_S otherwise (the live view shows every poll)."""
        if not what.startswith("gate: waiting"):
            return False
        kinds = tuple(r.split(" ", 1)[0] for r in what.split(" — ", 1)[-1].split("; "))
        now = time.monotonic()
        if kinds == self._gate_kinds and now - self._gate_said < PLAIN_GATE_EVERY_S:
            return True
        self._gate_kinds, self._gate_said = kinds, now
        return False

    def finished(self, cell: PlannedCell, record: CellRecord) -> None:
        self.results[cell.index] = record
        self.status[cell.index] = record.status
        tps = f"{record.tokens_per_s:.3f} tok/s" if record.tokens_per_s else "-"
        why = f" ({record.error})" if record.error else ""
        gate = ""
        if record.gate.polls > 1 or record.gate.gave_up:
            gate = (f", gate waited {record.gate.waited_s:.0f} s"
                    + (" and GAVE UP" if record.gate.gave_up else ""))
        line = (f"cell {cell.index + 1}/{len(self.plan.cells)} {cell.name}: {record.status}, "
                f"{tps}{gate}{why}")
        if self.live:
            self.console.print(shown(line), markup=False)
        else:
            self._say(line)

    def note(self, line: str) -> None:
        """A line of what the campaign decided on the way (a sequential look, a round)."""
        if self.live:
            self.console.print(shown(line), markup=False)
        else:
            self._say(line)

    def _say(self, text: str) -> None:
        print(f"[{time.monotonic() - self._t0:7.1f}s] {shown(text)}", file=sys.stderr,
              flush=True)

    def _render(self) -> Table:
        table = Table(title=Text(shown(f"{self.plan.campaign} — {self.now}")), expand=False)
        for col in ("#", "cell", "status", "tok/s"):
            table.add_column(col)
        for c in self.plan.cells:
            r = self.results.get(c.index)
            tps = f"{r.tokens_per_s:.3f}" if r and r.tokens_per_s else ""
            name = c.name + (" (sentinel)" if c.sentinel_of is not None else "")
            table.add_row(str(c.index + 1), Text(shown(name)),
                          Text(shown(self.status.get(c.index, "planned"))), tps)
        latest = getattr(self.sampler, "latest", None) or {}
        temps = ", ".join(f"{k[len(keys.ZONE_PREFIX):-2]} {v:.1f} C"
                          for k, v in sorted(latest.items())
                          if keys.is_zone_temp(k) and isinstance(v, (int, float)))
        caps = ", ".join(
            f"{p} {v / 1e3:.0f}/{latest.get(keys.hw_max_khz(p), v) / 1e3:.0f}"
            for p, v in sorted(keys.policies(latest, "cap_khz").items()))
        table.caption = f"temps: {temps or 'not measured'} | caps MHz: {caps or 'not measured'}"
        return table
