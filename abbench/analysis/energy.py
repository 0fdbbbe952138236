"""Mean power and energy per token of one cell, from the samples the sampler tagged with the
cell (docs/sensors.md#power-and-energy).

Sources, best first:

- battery: `battery.power_w` at each tick, the whole device's draw; usable when every tick
  of the cell says `Discharging` and none says plugged in.
- rapl psys, then rapl package-N: the `rapl.<domain>.energy_uj` counters, differenced
  between ticks (wrapping at `max_uj`); usable with two ticks of counters, plugged in or
  not (RAPL measures the platform or the package itself).

A battery read while charging (or full, or plugged in and not charging) measures the
charger, not the device: the cell gets no figure from it, and says so. Mean power is the
battery's mean over the cell's ticks, or RAPL's energy over the time between the cell's
first and last ticks. Energy per token is mean power over the steady window's tokens/s:
J/token = W / (tok/s). Intervals: a moving-block bootstrap of the power series (each tick's
reading, or each interval's) and, independently, of the per-token times, 95% percentile
interval of their ratio — the same method as a cell's tokens/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from abbench.analysis.stats import (
    Interval,
    percentile_interval,
    resampled_means,
    resampled_rates,
    tokens_per_s,
)
from abbench.records import Sample, keys

NOT_DRAWING = ("Charging", "Full", "Not charging")  # battery.status values: a charger is on


@dataclass(frozen=True)
class CellEnergy:
    source: str | None  # "battery", "rapl <domain>"; None: no usable reading
    power_w: Interval | None  # mean power over the cell
    j_per_token: Interval | None  # over the steady window's tokens/s
    note: str | None = None  # why there is no figure, or what was left out
    log_variance: float = math.nan  # variance of log J/token over the bootstrap draws

    @property
    def known(self) -> bool:
        return self.j_per_token is not None


NO_ENERGY = CellEnergy(None, None, None)


def _battery(samples: list[Sample]) -> tuple[np.ndarray | None, str | None]:
    """The cell's battery power readings (W), or None with the reason they are unusable."""
    readings = [s.values.get(keys.BATTERY_POWER_W) for s in samples]
    watts = [float(w) for w in readings if isinstance(w, (int, float)) and math.isfinite(w)]
    if not watts:
        return None, None
    statuses = {s.values.get(keys.BATTERY_STATUS) for s in samples} - {None}
    charging = sorted(statuses & set(NOT_DRAWING))
    if charging or any(s.values.get(keys.BATTERY_PLUGGED) is True for s in samples):
        why = f"battery {charging[0].lower()}" if charging else "plugged in"
        return None, (f"{why} during the cell: its power reading is the charger's, not the "
                      "device's draw, so no energy figure from it")
    if statuses != {"Discharging"}:
        return None, ("battery status not recorded as Discharging during the cell: the "
                      "direction of its power reading is unknown")
    return np.asarray(watts), None


def _rapl(samples: list[Sample]) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(domain, interval powers W, interval lengths s) of the preferred RAPL domain: psys
    (the platform), else the first package; None without two ticks of counters."""
    domains = {d for s in samples for d in keys.rapl_domains(s.values)}
    order = sorted(domains, key=lambda d: (d != "psys", not d.startswith("package"), d))
    for domain in order:
        ticks = [(s.t_mono, s.values[keys.rapl_energy(domain)], s.values.get(keys.rapl_max(domain)))
                 for s in samples if isinstance(s.values.get(keys.rapl_energy(domain)), int)]
        powers, lengths = [], []
        for (t0, e0, _), (t1, e1, wrap) in zip(ticks, ticks[1:]):
            dt = t1 - t0
            if dt <= 0:
                continue
            de = e1 - e0
            if de < 0:  # the counter wrapped (or reset, with no range to tell)
                if not isinstance(wrap, int) or wrap <= e0:
                    continue
                de += wrap
            powers.append(de / 1e6 / dt)
            lengths.append(dt)
        if powers:
            return domain, np.asarray(powers), np.asarray(lengths)
    return None


def cell_energy(samples: list[Sample], steady_ms: np.ndarray, seed: int) -> CellEnergy:
    """Mean power and J/token of a cell: `samples` are its ticks, `steady_ms` (n,) its
    steady window's per-token times."""
    battery, why = _battery(samples)
    rapl = _rapl(samples)
    if battery is not None:
        source, power, weight = "battery", battery, np.ones(len(battery))
    elif rapl is not None:
        domain, power, weight = rapl
        source = f"rapl {domain}"
    else:
        return CellEnergy(None, None, None, why)
    estimate = float((power * weight).sum() / weight.sum())
    draws = resampled_means(power, weight, seed) if len(power) >= 2 else None
    power_w = (percentile_interval(estimate, draws) if draws is not None
               else Interval(estimate, math.nan, math.nan))
    if len(steady_ms) < 2:
        return CellEnergy(source, power_w, None, "no steady window: no energy per token")
    rate = tokens_per_s(steady_ms)
    rates = resampled_rates([steady_ms], seed + 1)[:, 0]
    j_draws = draws / rates if draws is not None else None
    j = (percentile_interval(estimate / rate, j_draws) if j_draws is not None
         else Interval(estimate / rate, math.nan, math.nan))
    log_var = math.nan
    if j_draws is not None:
        logs = np.log(j_draws[np.isfinite(j_draws) & (j_draws > 0)])
        log_var = float(np.var(logs, ddof=1)) if len(logs) > 1 else math.nan
    note = (f"{why}; RAPL {source[5:]} used" if why and source != "battery" else None)
    return CellEnergy(source, power_w, j, note, log_var)
