"""The thermal gate: before a cell, wait until the device is back in the state asked for.

Conditions (each optional): CPU temperature at most `cpu_temp_max_c`, battery temperature
at most `battery_temp_max_c`, MemAvailable at least `mem_available_min_mib`, every cpufreq
policy's cap at its hardware maximum (`caps_at_max`), speed-probe index at least
`probe_min`. Polled every `poll_s`; after `timeout_s` the gate gives up, the cell runs
anyway, and the give-up is recorded. A condition whose sensor this device lacks cannot
hold the gate; it is recorded as not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from abbench.records import GateSpec, GateWait, keys
from abbench.sensors import Device


def unmet(spec: GateSpec, values: dict[str, Any], probe_index: float | None) -> list[str]:
    """Why the device is not ready (empty: ready)."""
    why = []
    cpu = values.get(keys.CPU_TEMP_C)
    if spec.cpu_temp_max_c is not None and cpu is not None and cpu > spec.cpu_temp_max_c:
        why.append(f"cpu {cpu:.1f} C > {spec.cpu_temp_max_c:g} C")
    bat = values.get(keys.BATTERY_TEMP_C)
    if spec.battery_temp_max_c is not None and bat is not None and bat > spec.battery_temp_max_c:
        why.append(f"battery {bat:.1f} C > {spec.battery_temp_max_c:g} C")
    mem = values.get(keys.MEM_AVAILABLE_MIB)
    if (spec.mem_available_min_mib is not None and mem is not None
            and mem < spec.mem_available_min_mib):
        why.append(f"MemAvailable {mem:.0f} MiB < {spec.mem_available_min_mib:g} MiB")
    if spec.caps_at_max:
        for policy, cap in sorted(keys.policies(values, "cap_khz").items()):
            hw = values.get(keys.hw_max_khz(policy))
            if hw is not None and cap < hw:
                why.append(f"{policy} capped at {cap / 1e3:.0f} of {hw / 1e3:.0f} MHz")
    if spec.probe_min is not None and probe_index is not None \
            and probe_index < spec.probe_min:
        why.append(f"speed probe {probe_index:.3f} < {spec.probe_min:g}")
    return why


def wait_for_gate(spec: GateSpec, device: Device, probe: Callable[[], float | None],
                  report: Callable[[str], None], time_scale: float = 1.0) -> GateWait:
    """Poll until ready or `timeout_s`. The spec's times are device seconds (`time_scale`
    of them per wall second on a simulated device); the recorded `waited_s` is wall time,
    like every other time in the run folder."""
    t0 = time.monotonic()
    polls = 0
    first: list[str] = []
    while True:
        values = device.sample()
        index = probe() if spec.probe_min is not None else None
        why = unmet(spec, values, index)
        polls += 1
        wall = time.monotonic() - t0
        waited = wall * time_scale
        if not why:
            return GateWait(waited_s=wall, polls=polls, reasons=tuple(first), gave_up=False)
        first = first or why
        if waited >= spec.timeout_s:
            return GateWait(waited_s=wall, polls=polls, reasons=tuple(why), gave_up=True)
        report(f"gate: waiting {waited:.0f}/{spec.timeout_s:g} s — {'; '.join(why)}")
        time.sleep(min(spec.poll_s, max(0.0, spec.timeout_s - waited)) / time_scale)
