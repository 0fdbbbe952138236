"""A Python function run on every thread of a ggml pool at once: a graph of one custom
node (`ggml_map_custom1`), whose callback ggml calls on each of the pool's threads with
the thread's index, the caller being thread 0.

Why on ggml's threads rather than Python's: between graphs ggml's worker threads spin,
waiting for the next one, so a Python thread started beside them waits behind a spinning
worker for a core (on two cores, the reader lanes did: docs/engine.md, `--repack`); given
the pool's work, the worker takes it at once. A callback holds the GIL only while it runs
Python; a ggml call it makes through ctypes lets the GIL go, so those calls run side by
side — the re-laying of a streamed expert's rows, split among the threads
(`kernels/relay.py`), is what this is for.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from abbench.engine.kernels.ggml.abi import CUSTOM1_OP, F32
from abbench.engine.kernels.ggml.context import Context, Graph, Threads
from abbench.engine.kernels.ggml.library import Lib


class OnThreads:
    """`fn(ith, nth)` on each of `threads`' threads (`run`): thread ith of nth."""

    def __init__(self, g: Lib, threads: Threads, fn: Callable[[int, int], None]) -> None:
        self.fn = fn
        self._errors: list[BaseException] = []
        self._callback = CUSTOM1_OP(self._call)  # alive as long as the graph that calls it
        self._cell = np.zeros(1, np.float32)  # the node's input, which it never reads
        self.ctx = Context(g, 2, 2, 64)
        a = self.ctx.tensor(F32, (1,), self._cell.ctypes.data)
        node = self.ctx.op("map_custom1", a, self._callback, threads.n, None)
        self.graph = Graph(self.ctx, [node], threads)

    def _call(self, _dst: int, _a: int, ith: int, nth: int, _userdata: int) -> None:
        try:
            self.fn(ith, nth)
        except BaseException as e:  # ggml cannot carry it: raised again by `run`
            self._errors.append(e)

    def run(self) -> None:
        """Every thread's share done; raises the first error a thread met."""
        self.graph.compute()
        if self._errors:
            error = self._errors[0]
            self._errors.clear()
            raise error
