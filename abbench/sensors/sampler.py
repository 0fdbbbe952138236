"""The sampler: a daemon thread in the campaign process recording the device's timeline.

Rich's refresh thread is the template: a daemon thread looping on `Event.wait(interval)`,
owned by a context manager that stops and joins it on the way out, whatever happened:

    with Sampler(device, hz=2, sink=write_sample) as sampler:
        run_cells()                       # sampler.latest is the freshest reading

Every tick calls `sink(t_monotonic, t_wall, values)`. A tick whose `device.sample()` or
`sink` raises is a gap (counted in `gaps`, the error kept in `last_error`), never the end
of the thread; a value that is not a JSON scalar or not a finite number (a reader handing
back garbage) is left out of its tick, a gap for that key alone. Ticks keep to a fixed
schedule; a tick that overruns (a slow adb round trip) is not made up with a burst, the
schedule restarts from now.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from abbench.errors import ConfigError

Sink = Callable[[float, float, dict[str, Any]], None]


class Samples(Protocol):
    def sample(self) -> dict[str, Any]: ...


class Sampler:
    """Samples `device` at `hz` into `sink` on a daemon thread while the `with` block runs."""

    def __init__(self, device: Samples, hz: float, sink: Sink | None = None,
                 join_timeout_s: float = 5.0) -> None:
        if not (math.isfinite(hz) and hz > 0):
            raise ConfigError(f"sample rate must be a positive number of Hz, got {hz}")
        self.device = device
        self.interval = 1.0 / hz
        self.sink = sink
        self.join_timeout_s = join_timeout_s
        self.latest: dict[str, Any] = {}
        self.ticks = 0          # attempts, gaps included
        self.gaps = 0           # ticks whose sample or sink raised
        self.last_error: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="abbench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish and wait for it (bounded: a hung read cannot hang us)."""
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.join_timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        deadline = time.monotonic()
        while not self._done.is_set():
            self._tick()
            deadline += self.interval
            now = time.monotonic()
            if deadline < now:  # overran: restart the schedule rather than burst
                deadline = now
            if self._done.wait(deadline - now):
                break

    def _tick(self) -> None:
        self.ticks += 1
        t0, wall0 = time.monotonic(), time.time()
        try:
            values = _scalars(self.device.sample())
        except Exception as e:
            self._gap(e)
            return
        # stamp the middle of the read: a remote round trip takes a visible fraction of a tick
        half = (time.monotonic() - t0) / 2
        self.latest = values
        if self.sink is None:
            return
        try:
            self.sink(t0 + half, wall0 + half, values)
        except Exception as e:
            self._gap(e)

    def _gap(self, error: Exception) -> None:
        self.gaps += 1
        self.last_error = f"{type(error).__name__}: {error}"


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    """The readings a timeline can hold: strings, booleans and finite numbers."""
    return {k: v for k, v in values.items() if isinstance(k, str) and (
        isinstance(v, (str, bool)) or (isinstance(v, (int, float)) and math.isfinite(v)))}
