"""`abbench sim fit RUN -o PROFILE.toml`: a simulated device fitted to a recorded run.

The fit is `abbench.sim.fit`'s; this module is the command: its parser, the profile
written as TOML (with comments naming the run and the fit's residuals, checked to load the
way `sim:PROFILE.toml` will load it before it replaces anything) and the printed summary.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from abbench import __version__
from abbench.commands.args import fraction, positive
from abbench.errors import FitError, UsageError
from abbench.fsutil import atomic_write_text
from abbench.records.toml import TOMLDecodeError, dump_value, parse
from abbench.sim.fit import THERMAL, Estimate, SimFit, fit_run
from abbench.sim.profile import Profile
from abbench.textsafe import shown

UNITS = {"heat_c_per_s": "°C/s", "soc_tau_s": "s", "case_tau_s": "s", "ambient_tau_s": "s",
         "ambient_c": "°C", "idle_load": ""}
NODES = {"soc": "SoC", "case": "case"}
RATES = ("heat_c_per_s", "soc_tau_s", "case_tau_s", "ambient_tau_s")  # relative σ means most
COMMENTS = {
    "name": "the device is `sim-NAME`",
    "time_scale": "simulated seconds per wall-clock second",
    "idle_load": "load (0..1) when no cell is attached",
    "ambient_c": "°C, the room",
    "heat_c_per_s": "°C per simulated second at full load and clocks",
    "soc_tau_s": "s, SoC relaxes toward the case",
    "case_tau_s": "s, case follows the SoC",
    "ambient_tau_s": "s, case cools toward ambient",
    "hysteresis_c": "°C below a trip point before its caps are lifted",
    "trip_sensor": "the node the trip points read: soc or case",
    "mem_total_mib": "MiB, MemTotal",
    "mem_available_mib": "MiB, MemAvailable",
    "battery_capacity_pct": "%, battery charge (constant)",
}


HELP = "the simulated device: fit a profile to a recorded run"
DESCRIPTION = "Tools for the simulated device (`sim:PROFILE`)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sim_sub = p.add_subparsers(dest="sim_command", required=True, metavar="COMMAND",
                               parser_class=type(p))
    f = sim_sub.add_parser(
        "fit", help="fit a profile's thermal constants to a run folder's timeline",
        description="Fit heat_c_per_s, soc_tau_s, case_tau_s, ambient_tau_s, ambient_c and "
        "idle_load to a run's CPU and battery temperatures (least squares over the recorded "
        "timeline), read clusters, trips and hysteresis off its caps, and write a profile "
        "for `transport = \"sim:PROFILE.toml\"`. Method: docs/sensors.md.")
    f.add_argument("run", metavar="RUN", help="the run folder (reports/NAME-YYYYmmdd-HHMMSS)")
    f.add_argument("-o", "--output", required=True, metavar="PROFILE.toml",
                   help="the profile to write (replaced atomically)")
    f.add_argument("--time-scale", type=positive, metavar="X",
                   help="simulated s per wall s, for the fit and the profile (default: the "
                   "profile's of a `sim:` run, else 1)")
    f.add_argument("--idle-load", type=fraction, metavar="X",
                   help="fix the load between cells instead of fitting it")
    f.add_argument("--name", help="the profile's name (default: the output file's stem)")
    f.set_defaults(func=run_sim_fit)


def run_sim_fit(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.suffix != ".toml":
        raise UsageError(f"the profile must be a .toml file, got {out}",
                         tip="`sim:PATH` loads a file only when PATH ends in .toml")
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", out.stem).strip("-.") or "fitted"
    fit = fit_run(Path(args.run), args.time_scale, args.idle_load)
    text = render_toml(fit.profile_dict(name), _header(fit, out), fit.params)
    try:  # exactly what `sim:PATH.toml` will do with the file, before it replaces anything
        profile = Profile.from_dict(parse(text), str(out))
    except (TOMLDecodeError, UsageError) as e:
        raise FitError(f"{fit.run}: the fitted profile does not load ({e})") from None
    try:
        atomic_write_text(out, text)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from None
    sys.stdout.write(summary(fit, profile, out))
    for line in warnings_for(fit):
        print(f"WARNING: {shown(line)}", file=sys.stderr)
    return 0


# -- TOML ------------------------------------------------------------------------------------


def render_toml(profile: dict[str, Any], header: list[str],
                fitted: dict[str, Estimate] | None = None) -> str:
    """A profile dict as `Profile.from_dict` takes it, as commented TOML."""
    out = [f"# {line}".replace("\n", " ") if line else "#" for line in header]
    tables = ("clusters", "trips")
    for key, v in profile.items():
        if key in tables or v is None:
            continue
        note = COMMENTS.get(key, "")
        est = (fitted or {}).get(key)
        if est is not None and est.sigma is not None:
            note += f" (± {_g(est.sigma)})"
        line = f"{key} = {dump_value(v)}"
        out.append(f"{line:<27} # {note}" if note else line)
    for c in profile.get("clusters", []):
        out += ["", "[[clusters]]", f"policy = {dump_value(c['policy'])}",
                f"{'hw_max_khz = ' + dump_value(c['hw_max_khz']):<27} # kHz, hardware max"]
    node = NODES.get(profile.get("trip_sensor", "soc"), "SoC")
    for t in profile.get("trips", []):
        out += ["", "[[trips]]", f"{'temp_c = ' + dump_value(t['temp_c']):<27} # °C on the {node}",
                f"caps_khz = {dump_value(t['caps_khz'])}"]
    return "\n".join(out) + "\n"


def _header(fit: SimFit, out: Path) -> list[str]:
    return [
        f"Simulated device profile fitted by `abbench sim fit` (abbench {__version__}).",
        f"Run: {json.dumps(str(fit.run.resolve()), ensure_ascii=False)}, device "
        f"{fit.device}, {fit.samples} samples over {fit.span_s:.0f} s (wall), "
        f"time scale {fit.time_scale:g}.",
        f"Residual RMS: SoC {fit.rms_soc_c:.3f} °C, case {fit.rms_case_c:.3f} °C. "
        "± values: 1 sigma from the fit's Jacobian.",
        f"idle_load: {fit.idle_load_how}. hysteresis_c: {fit.hysteresis_how}.",
        "No start_soc_c / start_case_c: the device starts at its idle equilibrium (cool).",
        f"Plan on it: transport = \"sim:{out}\" in a campaign's [device] table.",
        "",
    ]


# -- terminal --------------------------------------------------------------------------------


def _g(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def summary(fit: SimFit, profile: Profile, out: Path) -> str:
    lines = [f"fitted {fit.run} (device {fit.device}, {fit.samples} samples over "
             f"{fit.span_s:.0f} s, time scale {fit.time_scale:g})"]
    for key in THERMAL:
        e = fit.params[key]
        value = f"{_g(e.value)}" + (f" ± {_g(e.sigma)}" if e.sigma is not None else "")
        how = fit.idle_load_how if key == "idle_load" else ""
        lines.append(f"  {key:<16}{value + ' ' + UNITS[key]:<22}{how}".rstrip())
    lines.append(f"  {'hysteresis_c':<16}{_g(fit.hysteresis_c) + ' °C':<22}"
                 f"{fit.hysteresis_how}")
    for i, t in enumerate(fit.trips):
        caps = ", ".join(f"{p} {c}" for p, c in t.caps_khz.items())
        label = f"trips on {NODES[fit.trip_sensor]}" if i == 0 else ""
        lines.append(f"  {label:<16}{t.temp_c:.2f} °C   {caps} kHz")
    if not fit.trips:
        lines.append(f"  {'trips':<16}none: the caps never moved")
    lines += [f"  {'residual RMS':<16}SoC {fit.rms_soc_c:.3f} °C, case {fit.rms_case_c:.3f} °C",
              "  ± is 1 sigma from the fit's Jacobian (independent residuals assumed)",
              f"wrote {out} (it starts cool, at its idle equilibrium: SoC "
              f"{profile.start_soc_c:.1f} °C, case {profile.start_case_c:.1f} °C); plan on it "
              f"with transport = \"sim:{out}\"", ""]
    return "\n".join(lines)


def warnings_for(fit: SimFit) -> list[str]:
    """Evidence that the profile may mislead, each with what to try next."""
    out = []
    for key in fit.at_bound:
        out.append(f"{key} = {_g(fit.params[key].value)} ended on the edge of its search "
                   "range: this run does not determine it; record longer cells and idle gaps")
    for key, e in fit.params.items():
        if (key in RATES and key not in fit.at_bound and e.sigma is not None
                and e.sigma > 0.5 * e.value):
            out.append(f"{key} = {_g(e.value)} ± {_g(e.sigma)} is poorly determined: record "
                       "a longer run, with gaps between cells at least as long as the cells")
    worst = max(fit.rms_soc_c, fit.rms_case_c)
    if worst > 1.0:
        out.append(f"the model misses the recorded temperatures by {worst:.1f} °C RMS: the "
                   "device may not behave like two thermal nodes (a fan, a governor that "
                   "changes load); plan with margin")
    if not fit.has_caps:
        out.append("the run has no cpufreq caps: the profile has one placeholder cluster "
                   "and no trips, so it never throttles")
    return out
