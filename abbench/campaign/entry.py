"""A cell's entry state: the device's readings and its speed-probe index as the cell starts.

The probe index is the campaign's first probe time over this probe's time: 1.0 at the
first, below 1 once the device has slowed. The first probe's time is kept in the run
folder, so a resumed campaign is measured against the same reference.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from abbench.campaign.run_folder import read_first_probe, write_first_probe
from abbench.records import EntryState, keys
from abbench.sensors import Device, speed_probe
from abbench.sensors.probe import ProbeWorker, device_probe


def entry_state(values: dict[str, Any], probe_index: float | None, simulated: bool) -> EntryState:
    caps = {p: int(v) for p, v in keys.policies(values, "cap_khz").items()}
    hw = {p: int(v) for p, v in keys.policies(values, "hw_max_khz").items()}
    status = values.get(keys.ANDROID_THERMAL_STATUS)
    return EntryState(
        t_wall=time.time(), caps_khz=caps, hw_max_khz=hw,
        **{name: values.get(key) for key, name in keys.ENTRY_READINGS}, probe_index=probe_index,
        thermal_status=int(status) if status is not None else None, simulated=simulated,
    )


class SpeedIndex:
    """The speed-probe index of one run folder's device; `close()` ends its probe worker."""

    def __init__(self, folder: Path, device: Device, python: str) -> None:
        self.folder = folder
        self.device = device
        self.python = python
        self.first: float | None = None  # seconds of the campaign's first probe
        self._worker: ProbeWorker | None = None

    def load(self) -> None:
        """Take the reference of a campaign that already probed (a resume)."""
        self.first = read_first_probe(self.folder)

    def index(self) -> float | None:
        """first probe / this probe (the first one is written to the run folder); None
        where the probe cannot be measured on the device."""
        t = self._seconds()
        if t is None:
            return None
        if self.first is None:
            self.first = t
            write_first_probe(self.folder, t)
        return self.first / t

    def _seconds(self) -> float | None:
        """On a simulated device the probe runs for real in a child process that the device
        throttles like a cell: it sees the simulated caps and the host's own load, as a
        real device's probe would (docs/sensors.md#the-simulated-device-simprofile). On an
        adb/ssh device it runs in the device's shell (`shell_probe_script`): this
        machine's speed says nothing of the device's."""
        if self.device.kind in ("adb", "ssh"):
            return device_probe(self.device)
        if not self.device.simulated:
            return speed_probe()
        if self._worker is None:
            self._worker = ProbeWorker(self.python)
        self.device.throttle(self._worker.pid, loads=False)
        try:
            return self._worker.measure(3, self.device.probe_rep_s)
        finally:
            self.device.unthrottle()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
