"""The simulated device, `sim:PROFILE`: a thermal model behind a sysfs-shaped tree.

For demos, tests and planning on machines without sensors
(docs/sensors.md#the-simulated-device-simprofile). A
`Profile` (TOML, shipped in `abbench/sim/profiles/`, or any `sim:PATH.toml`) gives
clusters, a two-node thermal model, trip points and a time scale. `SimulatedDevice` writes
what a phone's kernel would expose (cpufreq policies, a CPU thermal zone, a battery, meminfo)
into a temporary folder and reads it back through the SAME readers as a real device (a
`Device` over a `LocalTransport` rooted there): no separate sensor code path.

Thermal model (simulated seconds; `u` = load × clock fraction):

    dSoC/dt  = heat_c_per_s · u − (SoC − case) / soc_tau_s
    dcase/dt = (SoC − case) / case_tau_s − (case − ambient) / ambient_tau_s

Trip points on one node's temperature (`trip_sensor`: the SoC, or the case as a skin
sensor, which is what a phone's thermal service mostly throttles on) cap clusters in
steps; a trip is lifted only once that node is `hysteresis_c` below it. Without start
temperatures the device starts cool, at its idle equilibrium. The clock fraction is the
mean over clusters of cap / hardware max.

Throttling without the engine knowing: `attach(pid)` marks the device loaded and starts a
thread that duty-cycles the process with SIGSTOP/SIGCONT (as `cpulimit` does), letting it
run the clock fraction of every period (`run_fraction()`: less a burst's depth, below);
`unthrottle()` stops that and always leaves the process continued. `probe_factor()` is the
clock fraction. The campaign's speed probe runs in a child process attached the same way, so it
reads the simulated caps and the host's own load together, as on a real device.

Bursts (a profile's optional `[bursts]`, abbench/sim/bursts.py): foreign load that comes
and goes in simulated time. During a burst the attached process, whichever it is, runs
clock fraction × (1 − depth) of each period (`run_fraction()`); a visible burst adds
depth × this machine's cores to `load.foreign_cores` for the share of each reading's
interval it covers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from abbench.errors import UsageError
from abbench.records import keys
from abbench.sensors.device import Device, _Reading
from abbench.sensors.transports import LocalTransport
from abbench.sensors.tree import LocalTree
from abbench.sim.bursts import BurstSchedule
from abbench.sim.profile import (
    DUTY_PERIOD_S,
    IDLE_CLOCK_SHARE,
    STEP_S,
    TICK_S,
    Profile,
    profile_from_text,
    profile_text,
    shipped_profiles,
)


class ThermalModel:
    """The two-node model and the trip state; not thread-safe (the device holds a lock)."""

    def __init__(self, profile: Profile) -> None:
        self.p = profile
        self.soc_c = profile.start_soc_c
        self.case_c = profile.start_case_c
        self.level = 0                          # how many trips are engaged
        self.forced: float | None = None        # a clock fraction forced on every cluster
        self._update_level()

    def caps_khz(self) -> dict[str, int]:
        caps = {c.policy: c.hw_max_khz for c in self.p.clusters}
        if self.forced is not None:
            return {k: max(1, round(v * self.forced)) for k, v in caps.items()}
        for trip in self.p.trips[:self.level]:  # later trips only lower the caps further
            for policy, cap in trip.caps_khz.items():
                caps[policy] = min(caps[policy], cap)
        return caps

    def clock_fraction(self) -> float:
        caps = self.caps_khz()
        return sum(caps[c.policy] / c.hw_max_khz for c in self.p.clusters) / len(caps)

    def power_w(self, load: float) -> float:
        """The battery's draw at `load`: the rest of the device plus the CPU, whose share
        scales with load × clock fraction as its heat does."""
        return self.p.base_power_w + self.p.load_power_w * load * self.clock_fraction()

    def advance(self, dt_s: float, load: float) -> None:
        """Integrate `dt_s` simulated seconds at `load` (0..1)."""
        p = self.p
        while dt_s > 0:
            h = min(STEP_S, dt_s)
            dt_s -= h
            u = load * self.clock_fraction()
            to_case = (self.soc_c - self.case_c)
            self.soc_c += h * (p.heat_c_per_s * u - to_case / p.soc_tau_s)
            self.case_c += h * (to_case / p.case_tau_s
                                - (self.case_c - p.ambient_c) / p.ambient_tau_s)
            self._update_level()

    def trip_temp_c(self) -> float:
        """The temperature the trip points read (the SoC, or the case: a skin sensor)."""
        return self.soc_c if self.p.trip_sensor == "soc" else self.case_c

    def _update_level(self) -> None:
        trips, temp = self.p.trips, self.trip_temp_c()
        while self.level < len(trips) and temp >= trips[self.level].temp_c:
            self.level += 1
        while self.level > 0 and temp < trips[self.level - 1].temp_c - self.p.hysteresis_c:
            self.level -= 1


class SimulatedDevice(Device):
    """A `Device` whose tree is written by a `ThermalModel` (see the module docstring)."""

    def __init__(self, profile: Profile, spec: str | None = None, *,
                 clock: Callable[[], float] = time.monotonic, background: bool = True,
                 name: str | None = None) -> None:
        self.profile = profile
        self._profile_toml: str | None = None  # the profile's text, kept with a run
        self.model = ThermalModel(profile)
        self.root = Path(tempfile.mkdtemp(prefix=f"abbench-sim-{profile.name}-"))
        # removed by close(), or at exit by a caller that never closes (`abbench sensors`)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.root), True)
        self._sim_lock = threading.RLock()
        self._sim_clock = clock
        self._last = clock()
        self._sim_t = 0.0  # simulated seconds since the device opened, at `_last`
        self.bursts = BurstSchedule(profile.bursts) if profile.bursts is not None else None
        self._reading_sim_t = 0.0  # simulated time of the last reading (foreign load's span)
        self._cores = os.cpu_count() or 1  # the machine the cells run on
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._loads = True  # the attached process heats the device (a cell; not the probe)
        self._duty_stop = threading.Event()
        self._duty: threading.Thread | None = None
        self._write_static()
        self._write_dynamic()
        # The cells run on this machine: their CPU time and the foreign load are its own.
        super().__init__(LocalTransport(self.root), name or f"sim-{profile.name}",
                         simulated=True, clock=clock, processes=LocalTree("/"))
        self.transport = spec or f"sim:{profile.name}"
        self.kind = "sim"
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None
        if background:
            self._ticker = threading.Thread(target=self._tick_loop, name="abbench-sim",
                                            daemon=True)
            self._ticker.start()

    # -- the model ----------------------------------------------------------------------

    def advance(self) -> None:
        """Bring the model up to now (wall time × time_scale) and rewrite the tree."""
        with self._sim_lock:
            now = self._sim_clock()
            dt = max(0.0, now - self._last) * self.profile.time_scale
            self._last = now
            self._sim_t += dt
            load = 1.0 if self._pid is not None and self._loads else self.profile.idle_load
            self.model.advance(dt, load)
            self._write_dynamic()

    def force_clock_fraction(self, fraction: float | None) -> None:
        """Pin every cluster's cap at `fraction` of hardware max (None: back to the trips)."""
        with self._sim_lock:
            self.model.forced = fraction
            self._write_dynamic()

    @property
    def time_scale(self) -> float:
        """Simulated seconds per wall second: a campaign's spacing and gate times are
        simulated seconds on this device."""
        return self.profile.time_scale

    @property
    def profile_toml(self) -> str | None:
        return self._profile_toml

    @property
    def probe_rep_s(self) -> float:
        """How long one speed-probe repetition must run to be throttled as a whole: five
        duty periods (the stops of shorter ones fall between repetitions)."""
        return 5 * DUTY_PERIOD_S

    def probe_factor(self) -> float:
        """The clock fraction: how much slower than unthrottled the simulated CPU runs."""
        with self._sim_lock:
            return self.model.clock_fraction()

    def sim_time_s(self) -> float:
        """Simulated seconds since the device opened, now."""
        with self._sim_lock:
            now = self._sim_clock()
            return self._sim_t + max(0.0, now - self._last) * self.profile.time_scale

    def burst_depth(self) -> float:
        """How much slower a burst makes whatever runs now (0: none, or no `[bursts]`)."""
        with self._sim_lock:
            return 0.0 if self.bursts is None else self.bursts.depth_at(self.sim_time_s())

    def run_fraction(self) -> float:
        """The share of each duty period the attached process runs: the clock fraction,
        less a burst's depth while one lasts."""
        with self._sim_lock:
            return self.model.clock_fraction() * (1.0 - self.burst_depth())

    def _sample(self) -> _Reading:
        with self._sim_lock:  # no tree write can interleave with the readers' reads
            self.advance()
            reading = super()._sample()
            t0, self._reading_sim_t = self._reading_sim_t, self._sim_t
            foreign = reading.values.get(keys.FOREIGN_CORES)
            if foreign is not None and self.bursts is not None and self.bursts.spec.visible:
                # the foreign load covers the time since the previous reading, as the burst
                # share added to it does (unknown stays unknown: nothing added to no value)
                burst = self.bursts.mean_depth(t0, self._sim_t) * self._cores
                reading.values[keys.FOREIGN_CORES] = round(foreign + burst, 3)
            return reading

    def _tick_loop(self) -> None:
        while not self._closed.wait(TICK_S):
            with contextlib.suppress(Exception):  # never kill the thread over one tick
                self.advance()

    # -- the tree -----------------------------------------------------------------------

    def _put(self, path: str, text: str, *, make_parents: bool = False) -> None:
        f = self.root / path.lstrip("/")
        if make_parents:  # only the first write: never recreate a tree close() removed
            f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)

    def _write_static(self) -> None:
        for c in self.profile.clusters:
            self._put(f"/sys/devices/system/cpu/cpufreq/{c.policy}/cpuinfo_max_freq",
                      f"{c.hw_max_khz}\n", make_parents=True)
        self._put("/sys/class/thermal/thermal_zone0/type", "cpu-0-0-usr\n", make_parents=True)
        self._put("/sys/class/power_supply/battery/type", "Battery\n", make_parents=True)
        self._put("/sys/class/power_supply/battery/status", "Discharging\n", make_parents=True)
        self._put("/sys/class/power_supply/battery/capacity",
                  f"{self.profile.battery_capacity_pct}\n", make_parents=True)
        p = self.profile
        self._put("/proc/meminfo", f"MemTotal:       {p.mem_total_mib * 1024} kB\n"
                  f"MemFree:        {p.mem_available_mib * 512} kB\n"
                  f"MemAvailable:   {p.mem_available_mib * 1024} kB\n", make_parents=True)

    def _write_dynamic(self) -> None:
        if not self._cleanup.alive:  # closed (or exiting): the tree is gone
            return
        caps = self.model.caps_khz()
        busy = self._pid is not None and self._loads
        for c in self.profile.clusters:
            folder = f"/sys/devices/system/cpu/cpufreq/{c.policy}"
            cur = caps[c.policy] if busy else round(caps[c.policy] * IDLE_CLOCK_SHARE)
            self._put(f"{folder}/scaling_max_freq", f"{caps[c.policy]}\n")
            self._put(f"{folder}/scaling_cur_freq", f"{cur}\n")
        self._put("/sys/class/thermal/thermal_zone0/temp", f"{round(self.model.soc_c * 1000)}\n")
        self._put("/sys/class/power_supply/battery/temp", f"{round(self.model.case_c * 10)}\n")
        # The kernel ABI's units and sign (µA, µV; negative: discharging), as phones report.
        volts = self.profile.battery_voltage_v
        amps = self.model.power_w(1.0 if busy else self.profile.idle_load) / volts
        self._put("/sys/class/power_supply/battery/voltage_now", f"{round(volts * 1e6)}\n")
        self._put("/sys/class/power_supply/battery/current_now", f"{-round(amps * 1e6)}\n")

    # -- throttling the cell --------------------------------------------------------------

    def throttle(self, pid: int, loads: bool = True) -> None:
        """Load the device and duty-cycle `pid` at the clock fraction until `unthrottle()`.
        `loads=False` throttles without heating: the speed probe, a fraction of a second of
        one core on a real device, which the time scale would otherwise stretch into
        seconds of full load."""
        self.unthrottle()
        with self._sim_lock:
            self.advance()  # the idle time so far counts as idle
            self._loads = loads
            self._pid = pid
            try:
                self._pidfd = os.pidfd_open(pid)  # never signals a recycled pid
            except (AttributeError, OSError):
                self._pidfd = None
        self._duty_stop = threading.Event()
        self._duty = threading.Thread(target=self._duty_loop, args=(self._duty_stop,),
                                      name="abbench-sim-duty", daemon=True)
        self._duty.start()

    def unthrottle(self) -> None:
        """Stop duty-cycling; the process is left continued (if it still exists)."""
        self._duty_stop.set()
        if self._duty is not None and self._duty is not threading.current_thread():
            self._duty.join(5.0)
        self._duty = None
        with self._sim_lock:
            if self._pid is not None:
                self.advance()  # the busy time so far counts as busy
                self._signal(signal.SIGCONT)
            if self._pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._pidfd)
            self._pid = self._pidfd = None

    def _signal(self, sig: int) -> bool:
        """Send `sig` to the attached process, and to the process group it leads (a cell's
        wrapper and the engine it started: `CellChild` starts each cell as a group's
        leader); False once it is gone."""
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self._pid is not None:
                os.kill(self._pid, sig)
            else:
                return True
        except (ProcessLookupError, PermissionError, OSError):
            return False
        # the leader is alive: a group with its pid as id is its own
        with contextlib.suppress(OSError):
            os.killpg(self._pid, sig)
        return True

    def _duty_loop(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                run = min(1.0, max(0.0, self.run_fraction()))
                if run >= 0.999:
                    stop.wait(DUTY_PERIOD_S)
                    continue
                if stop.wait(DUTY_PERIOD_S * run):
                    break
                if not self._signal(signal.SIGSTOP):
                    break
                stop.wait(DUTY_PERIOD_S * (1.0 - run))
                if not self._signal(signal.SIGCONT):
                    break
        finally:
            self._signal(signal.SIGCONT)

    def close(self) -> None:
        """Detach, stop the background thread and remove the tree."""
        self.unthrottle()
        self._closed.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(5.0)
        self._cleanup()


def open_simulated(spec: str) -> SimulatedDevice:
    """`sim:NAME` or `sim:PATH.toml` as a running SimulatedDevice; `sim:NAME#N` is the Nth
    of several such devices (a fleet's): its own name, so its own device history."""
    _, _, arg = spec.partition(":")
    arg, hash_, instance = arg.partition("#")
    if not arg:
        raise UsageError("`sim:` needs a profile",
                         tip="shipped profiles: " + ", ".join(
                             f"sim:{n}" for n in shipped_profiles()))
    if hash_ and not (instance.isdigit() and int(instance) >= 1):
        raise UsageError(f"`{spec}`: the device number after `#` must be 1 or more")
    text, source = profile_text(arg)
    profile = profile_from_text(text, source)
    device = SimulatedDevice(profile, spec, name=f"sim-{profile.name}-{int(instance)}"
                             if hash_ else None)
    device._profile_toml = text
    return device
