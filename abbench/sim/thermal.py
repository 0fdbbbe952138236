"""The thermal half of `abbench sim fit`: the simulated device's model, integrated over a
recorded timeline, fitted to its temperatures.

The model is the simulated device's (abbench/sim/device.py,
docs/sensors.md#the-simulated-device-simprofile), in
simulated seconds (wall seconds × time scale), with u = load × clock fraction:

    dSoC/dt  = heat_c_per_s · u − (SoC − case) / soc_tau_s
    dcase/dt = (SoC − case) / case_tau_s − (case − ambient) / ambient_tau_s

Method: output-error least squares (scipy `least_squares`, trust region reflective) over
θ = (ln heat_c_per_s, ln soc_tau_s, ln case_tau_s, ln ambient_tau_s, ambient_c[, idle_load]).
Each evaluation integrates the model over every segment of the timeline from its first
sample's measured temperatures, exactly (the model is linear, and u is held constant on
each interval between samples and cell boundaries, so each interval is a 2×2 matrix
exponential, done in the eigenbasis), and returns model − measured for both series in °C,
equally weighted. The start point comes from the integral method (`integral_guess`), which
lands near the optimum on clean data and keeps the refinement out of the long flat valleys
of the time constants. Uncertainties are 1σ from the Jacobian at the optimum, assuming
independent residuals: optimistic when the model misfits or the sensor is quantized.

The simulator itself steps Euler at 0.25 simulated s; against its runs the exact
integration is biased by about h / 2τ (under 1% for every τ ≥ 15 s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from abbench.errors import FitError
from abbench.sim.profile import MIN_TAU_S

MAX_TAU_S = 1e6              # s: bounds of the search, far outside any device
HEAT_RANGE = (1e-6, 1e3)     # °C per s
THERMAL = ("heat_c_per_s", "soc_tau_s", "case_tau_s", "ambient_tau_s", "ambient_c",
           "idle_load")




@dataclass(frozen=True)
class Segment:
    """A stretch of timeline sampled without a gap; arrays on the integration grid."""

    h_s: np.ndarray       # (g,) interval lengths, simulated s
    busy: np.ndarray      # (g,) 1.0 while a cell ran through the interval, else 0.0
    cf: np.ndarray        # (g,) clock fraction (of the sample nearest the interval)
    at: np.ndarray        # (n,) grid point of each sample (grid has g + 1 points)
    first: int            # index of the segment's first sample in the timeline


Series = tuple[Segment, np.ndarray, np.ndarray]  # (segment, SoC (n,), case (n,)) °C, NaN: gap


@dataclass(frozen=True)
class Estimate:
    value: float
    sigma: float | None   # 1σ, same unit; None: not fitted, or not determined


@dataclass(frozen=True)
class ThermalFit:
    params: dict[str, Estimate]   # THERMAL keys; a fixed idle_load has sigma None
    rms_soc_c: float
    rms_case_c: float
    at_bound: tuple[str, ...]     # fitted keys that ended on their search bound


# -- the model -------------------------------------------------------------------------------


def simulate(v: dict[str, float], seg: Segment, soc0: float, case0: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """(SoC, case) at each of the segment's samples, integrated exactly from (soc0, case0)."""
    a, c, d = 1 / v["soc_tau_s"], 1 / v["case_tau_s"], 1 / v["ambient_tau_s"]
    # A = [[-a, a], [c, -(c + d)]]: real, distinct, negative eigenvalues (ac > 0)
    half = (a + c + d) / 2
    root = math.sqrt(half * half - a * d)
    lams = (-half + root, -half - root)
    vec = np.array([[a, a], [a + lams[0], a + lams[1]]])         # (2, 2) columns: eigenvectors
    inv = np.linalg.inv(vec)
    u = seg.cf * (seg.busy + (1 - seg.busy) * v["idle_load"])   # (g,)
    lift = v["heat_c_per_s"] * v["soc_tau_s"] * u               # (g,) equilibrium SoC − case
    case_eq = v["ambient_c"] + lift * v["ambient_tau_s"] / v["case_tau_s"]
    eq = np.stack([case_eq + lift, case_eq])                     # (2, g)
    z_eq = inv @ eq                                              # (2, g) in eigen coordinates
    z0 = inv @ np.array([soc0, case0])
    z = np.empty((2, len(seg.h_s) + 1))
    for j in range(2):
        e = np.exp(lams[j] * seg.h_s)                            # (g,) decay over each interval
        steps = zip(e.tolist(), ((1 - e) * z_eq[j]).tolist())
        z[j] = list(accumulate(steps, lambda zj, s: s[0] * zj + s[1], initial=z0[j]))
    x = vec @ z[:, seg.at]                                       # (2, n)
    return x[0], x[1]


def _residuals(v: dict[str, float], data: Sequence[Series]
               ) -> tuple[np.ndarray, np.ndarray]:
    rs, rc = [], []
    for seg, soc, case in data:
        ms, mc = simulate(v, seg, soc[0], case[0])
        rs.append((ms - soc)[~np.isnan(soc)])
        rc.append((mc - case)[~np.isnan(case)])
    return np.concatenate(rs), np.concatenate(rc)


def integral_guess(data: Sequence[Series], idle_load: float | None) -> dict[str, float]:
    """Start values from the integrated model equations, each node a linear regression:

        SoC(t) − SoC(0)   = heat·∫busy·cf + heat·idle·∫(1−busy)·cf − ∫(SoC − case) / soc_tau
        case(t) − case(0) = ∫(SoC − case) / case_tau − ∫case / ambient_tau + t · amb / amb_tau

    Integrals by the trapezoid rule over samples; integrating first keeps the battery's
    0.1 °C steps from swamping a finite difference. A non-physical answer falls back to
    generic values the refinement starts from instead."""
    rows_s: list[np.ndarray] = []
    rows_c: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    yc: list[np.ndarray] = []
    span_c: list[float] = []
    for seg, soc, case in data:
        ok = ~np.isnan(soc) & ~np.isnan(case)
        s, c = soc[ok], case[ok]
        span_c.append(float(np.nanmin(case)))
        grid_t = np.concatenate([[0.0], np.cumsum(seg.h_s)])
        t = grid_t[seg.at][ok]
        ib = np.concatenate([[0.0], np.cumsum(seg.h_s * seg.busy * seg.cf)])[seg.at][ok]
        ii = np.concatenate([[0.0], np.cumsum(seg.h_s * (1 - seg.busy) * seg.cf)])[seg.at][ok]
        j = _cumtrapz(s - c, t)
        k = _cumtrapz(c, t)
        rows_s.append(np.stack([ib, ii, -j], 1) if idle_load is None
                      else np.stack([ib + idle_load * ii, -j], 1))
        ys.append(s - s[0])
        rows_c.append(np.stack([j, -k, t], 1))
        yc.append(c - c[0])
    ps = np.linalg.lstsq(np.concatenate(rows_s), np.concatenate(ys), rcond=None)[0].tolist()
    pc = np.linalg.lstsq(np.concatenate(rows_c), np.concatenate(yc), rcond=None)[0].tolist()
    heat = float(ps[0])
    idle = float(ps[1] / ps[0]) if idle_load is None and heat > 0 else (idle_load or 0.0)
    soc_tau = 1 / float(ps[-1]) if ps[-1] > 0 else math.nan
    guess = {"heat_c_per_s": heat, "soc_tau_s": soc_tau, "idle_load": idle,
             "case_tau_s": 1 / pc[0] if pc[0] > 0 else math.nan,
             "ambient_tau_s": 1 / pc[1] if pc[1] > 0 else math.nan,
             "ambient_c": pc[2] / pc[1] if pc[1] > 0 else math.nan}
    if not (HEAT_RANGE[0] < heat < HEAT_RANGE[1]):
        guess["heat_c_per_s"] = 1.0
    if not (MIN_TAU_S < soc_tau < MAX_TAU_S):
        guess["soc_tau_s"] = 20.0
    for k in ("case_tau_s", "ambient_tau_s"):
        if not (MIN_TAU_S < guess[k] < MAX_TAU_S):
            guess[k] = 10 * guess["soc_tau_s"]
    if not (-40 < guess["ambient_c"] <= min(span_c)):
        guess["ambient_c"] = max(-39.0, min(span_c) - 1.0)
    guess["idle_load"] = min(max(guess["idle_load"], 0.01), 0.99)
    return guess


def _cumtrapz(y: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum((y[1:] + y[:-1]) / 2 * np.diff(t))])


# -- the fit ---------------------------------------------------------------------------------

_LOG = ("heat_c_per_s", "soc_tau_s", "case_tau_s", "ambient_tau_s")
_BOUNDS = {"heat_c_per_s": HEAT_RANGE, "soc_tau_s": (MIN_TAU_S, MAX_TAU_S),
           "case_tau_s": (MIN_TAU_S, MAX_TAU_S), "ambient_tau_s": (MIN_TAU_S, MAX_TAU_S),
           "ambient_c": (-40.0, 60.0), "idle_load": (0.0, 1.0)}


def fit_thermal(data: Sequence[Series], idle_load: float | None, where: str) -> ThermalFit:
    """Least squares over `data` (see the module docstring); `idle_load` None: fit it.
    FitError, its message starting with `where`, when the fit fails or does not converge."""
    from scipy.optimize import least_squares  # 0.3 s to import: only when fitting

    m = sum(int((~np.isnan(s)).sum() + (~np.isnan(c)).sum()) for _, s, c in data)
    keys = [k for k in THERMAL if k != "idle_load" or idle_load is None]
    fixed = {} if idle_load is None else {"idle_load": idle_load}
    guess = integral_guess(data, idle_load)

    def to_theta(v: dict[str, float]) -> np.ndarray:
        return np.array([math.log(v[k]) if k in _LOG else v[k] for k in keys])

    def to_values(theta: np.ndarray) -> dict[str, float]:
        v = {k: math.exp(x) if k in _LOG else float(x) for k, x in zip(keys, theta)}
        return {**v, **fixed}

    lo = to_theta({k: b[0] for k, b in _BOUNDS.items()})
    hi = to_theta({k: b[1] for k, b in _BOUNDS.items()})
    span = hi - lo
    start = np.clip(to_theta(guess), lo + 1e-6 * span, hi - 1e-6 * span)

    def fun(theta: np.ndarray) -> np.ndarray:
        return np.concatenate(_residuals(to_values(theta), data))

    try:
        res = least_squares(fun, start, bounds=(lo, hi), x_scale="jac", method="trf",
                            max_nfev=200 * len(keys))
    except (ValueError, np.linalg.LinAlgError, FloatingPointError) as e:
        raise FitError(f"{where}: the fit failed ({e})") from None
    if res.status <= 0 or not np.all(np.isfinite(res.x)):
        raise FitError(f"{where}: the fit did not converge after {res.nfev} model evaluations "
                       f"({res.message})", tip="a longer run with several cells and idle "
                       "gaps between them constrains the constants better")
    v = to_values(res.x)
    rs, rc = _residuals(v, data)
    sigmas = _sigmas(res.jac, res.fun, m)
    est = {}
    for i, k in enumerate(keys):
        sd = None if sigmas is None else float(sigmas[i])
        est[k] = Estimate(v[k], None if sd is None else (v[k] * sd if k in _LOG else sd))
    if idle_load is not None:
        est["idle_load"] = Estimate(idle_load, None)
    edge = tuple(k for i, k in enumerate(keys)
                 if min(res.x[i] - lo[i], hi[i] - res.x[i]) < 1e-3 * span[i])
    return ThermalFit({k: est[k] for k in THERMAL}, float(np.sqrt(np.mean(rs ** 2))),
                      float(np.sqrt(np.mean(rc ** 2))), edge)


def _sigmas(jac: np.ndarray, fun: np.ndarray, m: int) -> np.ndarray | None:
    """1σ of θ: sqrt(diag((JᵀJ)⁻¹)) × residual σ; None when JᵀJ is (nearly) singular."""
    n = jac.shape[1]
    if m <= n:
        return None
    _, s, vt = np.linalg.svd(jac, full_matrices=False)
    if s[-1] <= s[0] * 1e-10:
        return None
    cov = (vt.T / s ** 2) @ vt * (float(fun @ fun) / (m - n))
    return np.sqrt(np.diag(cov))
