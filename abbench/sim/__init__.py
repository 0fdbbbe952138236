"""The simulated device (docs/sensors.md#the-simulated-device-simprofile): a profile
(`profile`), its thermal model (`thermal`), its bursts of foreign load (`bursts`), the
device that samples and throttles a cell by them (`device`), and the fit of a profile to a
recorded run (`fit`, with `trips`). Always says it is simulated."""

from __future__ import annotations

import os

from abbench.errors import UsageError
from abbench.sensors import Device
from abbench.sensors import open_device as open_real_device
from abbench.sim.device import SimulatedDevice, open_simulated

__all__ = ["SimulatedDevice", "open_device"]


def open_device(transport: str, root: str | os.PathLike[str] = "/") -> Device:
    """Any device a campaign names: `sim:PROFILE` as a running SimulatedDevice (it owns a
    thread and a temporary tree: call `close()` when done), anything else as
    `abbench.sensors.open_device` opens it."""
    spec = transport.strip()
    if spec.partition(":")[0] != "sim":
        return open_real_device(spec, root)
    if str(root) not in ("/", ""):
        raise UsageError(f"--root applies to the local transport only, not `{spec}`")
    return open_simulated(spec)
