"""The simulated device's profile: clusters, trips and thermal constants, from TOML
(shipped in `abbench/sim/profiles/`, or any `sim:PATH.toml`)."""


from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from abbench.errors import UsageError
from abbench.records.schema import tomllib

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
    """A simulated device; every field validated by `from_dict` (units in the names)."""

    name: str
    clusters: tuple[Cluster, ...]
    trips: tuple[Trip, ...]
    time_scale: float           # simulated s per wall s
    idle_load: float            # 0..1, load when no cell is attached
    ambient_c: float            # °C
    start_soc_c: float          # °C
    start_case_c: float         # °C
    heat_c_per_s: float         # °C per simulated s at full load and full clocks
    soc_tau_s: float            # s
    case_tau_s: float           # s
    ambient_tau_s: float        # s
    hysteresis_c: float         # °C
    trip_sensor: str            # "soc" or "case": the node the trip points read
    mem_total_mib: int          # MiB
    mem_available_mib: int      # MiB
    battery_capacity_pct: int   # %

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str) -> Profile:
        def bad(msg: str) -> UsageError:
            return UsageError(f"simulated device profile {source}: {msg}")

        def num(key: str, lo: float = -math.inf, hi: float = math.inf,
                lo_open: bool = False) -> float:
            v = d.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(f"`{key}` must be a number, got {v!r}")
            if v < lo or v > hi or (lo_open and v == lo):
                raise bad(f"`{key}` = {v} is out of range")
            return float(v)

        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise bad(f"unknown keys: {', '.join(unknown)}")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise bad("`name` must be a non-empty string")
        raw_clusters = d.get("clusters")
        if not isinstance(raw_clusters, list) or not raw_clusters:
            raise bad("needs at least one [[clusters]] with policy and hw_max_khz")
        clusters = []
        for c in raw_clusters:
            policy, hw = (c.get("policy"), c.get("hw_max_khz")) if isinstance(c, dict) else (
                None, None)
            if not isinstance(policy, str) or not policy.startswith("policy"):
                raise bad(f"cluster policy must be a name like `policy0`, got {policy!r}")
            if isinstance(hw, bool) or not isinstance(hw, int) or hw <= 0:
                raise bad(f"cluster {policy}: hw_max_khz must be a positive integer")
            clusters.append(Cluster(policy, hw))
        hw_max = {c.policy: c.hw_max_khz for c in clusters}
        if len(hw_max) != len(clusters):
            raise bad("cluster policies must be distinct")
        trips: list[Trip] = []
        for t in d.get("trips", []):
            temp, caps = (t.get("temp_c"), t.get("caps_khz", {})) if isinstance(t, dict) else (
                None, None)
            if isinstance(temp, bool) or not isinstance(temp, (int, float)):
                raise bad(f"trip temp_c must be a number, got {temp!r}")
            if not isinstance(caps, dict) or not caps:
                raise bad(f"trip at {temp} °C needs caps_khz for at least one policy")
            for p, cap in caps.items():
                if p not in hw_max:
                    raise bad(f"trip at {temp} °C caps unknown policy `{p}`")
                if isinstance(cap, bool) or not isinstance(cap, int) or not 0 < cap <= hw_max[p]:
                    raise bad(f"trip at {temp} °C: cap of {p} must be in 1..{hw_max[p]} kHz")
            if trips and temp <= trips[-1].temp_c:
                raise bad("trip points must be in ascending temperature order")
            trips.append(Trip(float(temp), dict(caps)))
        taus = {k: num(k, MIN_TAU_S) for k in ("soc_tau_s", "case_tau_s", "ambient_tau_s")}
        trip_sensor = d.get("trip_sensor", "soc")
        if trip_sensor not in ("soc", "case"):
            raise bad(f"`trip_sensor` must be \"soc\" or \"case\", got {trip_sensor!r}")
        heat = num("heat_c_per_s", 0.0)
        idle = num("idle_load", 0.0, 1.0)
        ambient = num("ambient_c", -40.0, 60.0)
        # Without start temperatures the device starts at its idle equilibrium (cool).
        eq_soc, eq_case = idle_equilibrium(ambient, heat * idle, taus["soc_tau_s"],
                                           taus["case_tau_s"], taus["ambient_tau_s"])
        start = {k: (num(k, -40.0, 150.0) if k in d else default)
                 for k, default in (("start_soc_c", eq_soc), ("start_case_c", eq_case))}
        return cls(
            name=name, clusters=tuple(clusters), trips=tuple(trips),
            time_scale=num("time_scale", 0.0, 10_000.0, lo_open=True),
            idle_load=idle, ambient_c=ambient, **start, heat_c_per_s=heat, **taus,
            hysteresis_c=num("hysteresis_c", 0.0), trip_sensor=trip_sensor,
            mem_total_mib=int(num("mem_total_mib", 1.0)),
            mem_available_mib=int(num("mem_available_mib", 0.0, num("mem_total_mib"))),
            battery_capacity_pct=int(num("battery_capacity_pct", 0.0, 100.0)),
        )


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
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"simulated device profile {source}: {e}") from None
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

