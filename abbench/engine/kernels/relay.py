"""Re-laying a streamed expert for ggml's repacked kernels, on the compute team's threads.

A slot read as the file has it is re-laid, part by part where its pool repacks the part
(`QuantTeam.repack_pool`), as its read is first waited for, on the thread that computes
from it (`ReadTicket.wait`). ggml lays a part from a copy into the part's own memory, eight
rows at a time (the interleaved layout's groups): the rows r0.. of the re-laid part sit
where the plain rows r0.. were. So a part's rows split among the team's threads, each
laying its share from a scratch copy of its own through tensor headers of its own, at
once (`ggml.OnThreads`). On one thread, laying a Q4_K expert of the Qwen3-30B-A3B geometry
took about 1 ms here while the team's other thread spun, waiting for the next graph.
"""

from __future__ import annotations

import numpy as np

from abbench.engine.kernels import ggml
from abbench.engine.streaming.slots import RawSlot, SlotPool
from abbench.errors import EngineError

GROUP = 8  # rows a repacked group interleaves: a thread's share is whole groups


class SlotRelay:
    """The re-laying of one pool's slots (`pool.repack`: which parts), split among
    `threads`' threads: call it with a slot just read."""

    def __init__(self, g: ggml.Lib, threads: ggml.Threads, repacker: ggml.Repacker,
                 pool: SlotPool) -> None:
        self.repacker = repacker
        lay = pool.layout
        n = threads.n
        self.ctx = ggml.Context(g, 3 * n + 1)
        # per thread: (its header of the part's rows, their offset in a slot, their bytes)
        self.shares: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        for i, (part, offset) in enumerate(zip((lay.gate, lay.up, lay.down), lay.offsets)):
            if not pool.repack[i]:
                continue
            row, groups = ggml.row_bytes(part.ggml_type, part.cols), part.rows // GROUP
            for ith in range(n):
                r0, r1 = GROUP * (groups * ith // n), GROUP * (groups * (ith + 1) // n)
                if r1 == r0:
                    continue
                head = self.ctx.tensor(part.ggml_type, (part.cols, r1 - r0),
                                       pool.part_address(i) + r0 * row)
                if not repacker.attach(head):
                    raise EngineError(f"a repacked part's rows {r0}-{r1} have no layout")
                self.shares[ith].append((head, offset + r0 * row, (r1 - r0) * row))
        most = max((nbytes for share in self.shares for _, _, nbytes in share), default=1)
        self.scratch = [np.empty(most, np.uint8) for _ in range(n)]
        self._slot: RawSlot | None = None
        self.on_threads = ggml.OnThreads(g, threads, self._lay)

    def __call__(self, slot: RawSlot) -> None:
        """Re-lay `slot`'s repacked parts, read as the file has them."""
        self._slot = slot
        try:
            self.on_threads.run()
        finally:
            self._slot = None

    def _lay(self, ith: int, nth: int) -> None:
        """Thread ith's share of every repacked part of the slot."""
        slot = self._slot
        if slot is None or ith >= len(self.shares):
            return
        scratch, base = self.scratch[ith], slot.data.ctypes.data
        for head, offset, nbytes in self.shares[ith]:
            np.copyto(scratch[:nbytes], slot.data[offset : offset + nbytes])
            self.ctx.set_data(head, base + offset)
            self.repacker.write(head, scratch.ctypes.data)
