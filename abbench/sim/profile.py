"""The simulated device's profile: clusters, trips and thermal constants, from TOML
(shipped in `abbench/sim/profiles/`, or any `sim:PATH.toml`)."""


from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from abbench.errors import BadField, UsageError
from abbench.records.schema import build, fail, show
from abbench.records.toml import TOMLDecodeError, parse
from abbench.sim.bursts import Bursts

STEP_S = 0.25            # s (simulated): Euler integration step, well below every tau
MIN_TAU_S = 1.0          # s (simulated): shortest time constant a profile may give
DUTY_PERIOD_S = 0.02     # s (wall): one SIGSTOP/SIGCONT period while attached (short, so
                         # that per-token times spread less around the mean slowdown)
TICK_S = 0.2             # s (wall): the background thread advances the model this often
IDLE_CLOCK_SHARE = 0.3   # fraction of the cap an idle cluster runs at (scaling_cur_freq)


def shipped_profiles() -> list[str]:
    """The names of the profiles shipped in the package (`sim:NAME`)."""
    folder = resources.files("abbench.sim") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


@dataclass(frozen=True)
class Cluster:
    policy: str          # cpufreq policy folder name, e.g. "policy4"
    hw_max_khz: int      # kHz, cpuinfo_max_freq


@dataclass(frozen=True)
class Trip:
    temp_c: float                 # °C on the SoC node at which the trip engages
    caps_khz: Mapping[str, int]   # kHz per policy while engaged (others: hardware max)


@dataclass(frozen=True)
class Profile:
    """A simulated device, read by the one validator (`records.schema`, strict) and checked
    here on construction (units in the names)."""

    name: str
    clusters: tuple[Cluster, ...]
    time_scale: float           # simulated s per wall s
    idle_load: float            # 0..1, load when no cell is attached
    ambient_c: float            # °C
    heat_c_per_s: float         # °C per simulated s at full load and full clocks
    soc_tau_s: float            # s
    case_tau_s: float           # s
    ambient_tau_s: float        # s
    hysteresis_c: float         # °C
    mem_total_mib: int          # MiB
    mem_available_mib: int      # MiB
    battery_capacity_pct: int   # %
    trips: tuple[Trip, ...] = ()
    trip_sensor: str = "soc"    # "soc" or "case": the node the trip points read
    # °C; NaN (not given): the idle equilibrium, so that the device starts cool
    start_soc_c: float = math.nan
    start_case_c: float = math.nan
    # W: the battery's draw is base_power_w + load_power_w × load × clock fraction (the
    # heat's own factor), at battery_voltage_v
    base_power_w: float = 0.8
    load_power_w: float = 5.0
    battery_voltage_v: float = 3.85
    # optional [bursts]: foreign load that comes and goes (abbench/sim/bursts.py)
    bursts: Bursts | None = None

    def __post_init__(self) -> None:
        if not self.name:
            fail(("name",), "must be a non-empty string")
        for key, lo, hi in (("time_scale", 0.0, 10_000.0), ("idle_load", 0.0, 1.0),
                            ("ambient_c", -40.0, 60.0), ("heat_c_per_s", 0.0, math.inf),
                            *((k, MIN_TAU_S, math.inf) for k in _TAUS),
                            ("hysteresis_c", 0.0, math.inf), ("mem_total_mib", 1, math.inf),
                            ("mem_available_mib", 0, self.mem_total_mib),
                            ("battery_capacity_pct", 0, 100), ("base_power_w", 0.0, 1e4),
                            ("load_power_w", 0.0, 1e4), ("battery_voltage_v", 0.5, 100.0)):
            value = getattr(self, key)
            if not lo <= value <= hi or (key == "time_scale" and value == lo):
                fail((key,), f"= {value} is out of range")
        if self.trip_sensor not in ("soc", "case"):
            fail(("trip_sensor",), f'must be "soc" or "case", got {show(self.trip_sensor)}')
        self._check_clusters_and_trips()
        eq_soc, eq_case = idle_equilibrium(self.ambient_c, self.heat_c_per_s * self.idle_load,
                                           self.soc_tau_s, self.case_tau_s, self.ambient_tau_s)
        for key, equilibrium in (("start_soc_c", eq_soc), ("start_case_c", eq_case)):
            value = getattr(self, key)
            if math.isnan(value):
                object.__setattr__(self, key, equilibrium)
            elif not -40.0 <= value <= 150.0:
                fail((key,), f"= {value} is out of range")

    def _check_clusters_and_trips(self) -> None:
        if not self.clusters:
            fail(("clusters",), "needs at least one [[clusters]] with policy and hw_max_khz")
        for i, c in enumerate(self.clusters):
            if not c.policy.startswith("policy"):
                fail(("clusters", i, "policy"), f"must be a name like `policy0`, got "
                     f"{show(c.policy)}")
            if c.hw_max_khz <= 0:
                fail(("clusters", i, "hw_max_khz"), "must be a positive integer")
        hw_max = {c.policy: c.hw_max_khz for c in self.clusters}
        if len(hw_max) != len(self.clusters):
            fail(("clusters",), "cluster policies must be distinct")
        for i, t in enumerate(self.trips):
            if not t.caps_khz:
                fail(("trips", i, "caps_khz"), f"trip at {t.temp_c} °C needs caps for at "
                     "least one policy")
            for policy, cap in t.caps_khz.items():
                if policy not in hw_max:
                    fail(("trips", i, "caps_khz", policy), f"trip at {t.temp_c} °C caps "
                         f"unknown policy `{policy}`")
                if not 0 < cap <= hw_max[policy]:
                    fail(("trips", i, "caps_khz", policy), f"must be in 1..{hw_max[policy]} "
                         "kHz")
            if i and t.temp_c <= self.trips[i - 1].temp_c:
                fail(("trips", i, "temp_c"), "trip points must be in ascending temperature "
                     "order")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str) -> Profile:
        try:
            return build(cls, dict(d), strict=True)
        except BadField as e:
            raise UsageError(f"simulated device profile {source}: {e}", tip=e.tip) from None


_TAUS = ("soc_tau_s", "case_tau_s", "ambient_tau_s")


def idle_equilibrium(ambient_c: float, heat_c_per_s: float, soc_tau_s: float,
                     case_tau_s: float, ambient_tau_s: float) -> tuple[float, float]:
    """(SoC, case) °C where the model rests under a constant `heat_c_per_s` (load × rate)."""
    soc_over_case = heat_c_per_s * soc_tau_s
    case = ambient_c + soc_over_case * ambient_tau_s / case_tau_s
    return case + soc_over_case, case


def load_profile(spec: str) -> Profile:
    """A shipped profile by name (`phone`), or a TOML file (`path/to/x.toml`)."""
    return profile_from_text(*profile_text(spec))


def profile_from_text(text: str, source: str) -> Profile:
    """A profile from its TOML text; `source` names it in error messages."""
    try:
        data = parse(text)
    except TOMLDecodeError as e:
        raise UsageError(f"simulated device profile {source}: {e}") from None
    except RecursionError:
        raise UsageError(f"simulated device profile {source}: nested too deeply") from None
    return Profile.from_dict(data, source)


def profile_text(spec: str) -> tuple[str, str]:
    """(TOML text, source name) of a shipped profile or a profile file."""
    if spec.endswith(".toml"):
        path = Path(spec).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot read simulated device profile {path}: "
                             f"{e.strerror or e}") from None
        source = str(path)
    else:
        if spec not in shipped_profiles():
            raise UsageError(f"unknown simulated device profile `{spec}`",
                             tip="shipped profiles: " + ", ".join(
                                 f"sim:{n}" for n in shipped_profiles())
                             + "; or give sim:PATH.toml")
        text = (resources.files("abbench.sim") / "profiles" / f"{spec}.toml").read_text(
            encoding="utf-8")
        source = f"`{spec}`"
    return text, source

