"""Many independent pieces of work on every core: reading ten thousand run files, or the
statistics of ten thousand cells, is that much work per core with one process per core.

`map_all` keeps the order of its inputs and gives what `fn` gives for each, as `map`
would; below `MIN_ITEMS` items, on one core, or where no process can be started (no
`fork`: the pieces would have to be imported anew in each), it is `map` itself. `fn` and
its items must be picklable (a module-level function, plain data); an exception in a worker
is raised here, as `map` would raise it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")

MIN_ITEMS = 256  # fewer: the processes' start costs more than they save
CHUNKS_PER_WORKER = 8  # pieces handed out a chunk at a time, a few chunks a worker


def workers() -> int:
    """The cores this process may run on (its affinity, where the system says)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def map_all(fn: Callable[[C, T], R], context: C, items: Sequence[T]) -> list[R]:
    """`[fn(context, x) for x in items]`, on every core when there are enough items. The
    context (what every piece reads: a run folder's records) reaches each worker as the
    fork copied it, not through a pipe."""
    n = workers()
    if len(items) < MIN_ITEMS or n < 2 or "fork" not in mp.get_all_start_methods():
        return [fn(context, x) for x in items]
    global _JOB
    chunk = max(1, len(items) // (n * CHUNKS_PER_WORKER))
    _JOB = (fn, context)  # set before the workers fork: each has it
    pool = mp.get_context("fork").Pool(n, initializer=_quiet_signals)
    try:
        out = pool.map(_run, items, chunksize=chunk)
        pool.close()
        return out
    except BaseException:
        pool.terminate()  # interrupted (or a piece failed): no worker outlives the caller
        raise
    finally:
        pool.join()
        _JOB = None


_JOB: tuple[Callable[[Any, Any], Any], Any] | None = None


def _quiet_signals() -> None:
    """A worker leaves Ctrl-C to its parent (a terminal sends SIGINT to every process of
    the group) and dies at once on SIGTERM, which `Pool.terminate` sends: it forked the
    parent's handlers (an import turns SIGTERM into KeyboardInterrupt), and a worker that
    raised one while holding its queue's lock can leave the parent waiting for that lock
    (the likely cause of an interrupted import that once did not exit, beside other
    processes; not reproduced)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(item: Any) -> Any:
    assert _JOB is not None, "a worker forked before its job was set"
    fn, context = _JOB
    return fn(context, item)


__all__ = ["MIN_ITEMS", "map_all", "workers"]
