"""Device sensors: readers, transports (local, adb, ssh), the speed probe and the sampler.

The face the campaign uses:

    device = open_device("adb:R5CT1234")       # or "local", "ssh:HOST"
    device.sample()                            # {"cpu.policy0.cap_khz": 2188800, ...}
    speed_probe()                              # seconds for a fixed workload (min of 5)
    with Sampler(device, hz=2, sink=write) as s: ...

Nothing here imports the engine, the campaign or the analysis
(docs/architecture.md#the-packages-and-their-public-faces).
"""

from abbench.sensors.device import Device, ZoneFreeze, open_device, thermal_gaps
from abbench.sensors.probe import speed_probe
from abbench.sensors.sampler import Sampler, Sink

__all__ = [
    "Device",
    "Sampler",
    "Sink",
    "ZoneFreeze",
    "open_device",
    "speed_probe",
    "thermal_gaps",
]
