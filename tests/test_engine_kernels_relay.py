"""engine/kernels/relay.py and ggml/parallel.py: a streamed slot re-laid for the repacked
kernels with its rows split among the team's threads, byte for byte what laying each whole
part on one thread gives; a thread's error reaches the caller."""

from __future__ import annotations

import numpy as np
import pytest

from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import QuantTeam
from abbench.engine.kernels.relay import SlotRelay
from abbench.engine.streaming.slots import Part, RawSlot, SlotLayout, SlotPool

D = 256


def layout(ff: int, down: int = ggml.Q4_K) -> SlotLayout:
    def part(rows: int, cols: int, t: int) -> Part:
        return Part(t, rows, cols, rows * ggml.row_bytes(t, cols))

    return SlotLayout(part(ff, D, ggml.Q4_K), part(ff, D, ggml.Q4_K), part(D, ff, down))


def filled(pool: SlotPool, seed: int) -> RawSlot:
    """A slot holding quantized experts as the file has them."""
    rng = np.random.default_rng(seed)
    slot = pool.new()
    lay = pool.layout
    for part, offset in zip((lay.gate, lay.up, lay.down), lay.offsets):
        w = rng.standard_normal((part.rows, part.cols)).astype(np.float32)
        slot.data[offset : offset + part.nbytes] = ggml.quantize(w, part.ggml_type).ravel()
    return slot


def whole_parts(repacker: ggml.Repacker, pool: SlotPool, slot: RawSlot) -> np.ndarray:
    """The slot's bytes with each repacked part laid at once, from a copy (one thread)."""
    out = slot.data.copy()
    ctx = ggml.Context(ggml.lib(), 3)
    lay = pool.layout
    for i, (part, offset) in enumerate(zip((lay.gate, lay.up, lay.down), lay.offsets)):
        if not pool.repack[i]:
            continue
        head = ctx.tensor(part.ggml_type, (part.cols, part.rows),
                          out[offset:].ctypes.data)
        assert repacker.attach(head)
        copy = slot.data[offset : offset + part.nbytes].copy()
        repacker.write(head, copy.ctypes.data)
    return out


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("ff", [256, 768])  # 32 and 96 groups of 8 rows
def test_rows_laid_by_several_threads_are_the_whole_parts_laid_by_one(
        threads: int, ff: int) -> None:
    team = QuantTeam(threads, repack=True)
    try:
        down = ggml.Q6_K if ff == 768 else ggml.Q4_K
        pool = SlotPool(layout(ff, down), 4)
        team.repack_pool(pool)
        if not pool.repack[0]:
            pytest.skip("this CPU has no repacked layout for Q4_K")
        slot = filled(pool, ff + threads)
        want = whole_parts(team.repacker, pool, slot)  # type: ignore[arg-type]
        team.repack_slot(slot)
        assert np.array_equal(slot.data, want)
        assert not np.array_equal(want, filled(SlotPool(pool.layout, 1), ff + threads).data)
    finally:
        team.close()


def test_an_error_in_one_threads_share_reaches_the_caller() -> None:
    team = QuantTeam(2, repack=True)
    try:
        pool = SlotPool(layout(256), 2)
        team.repack_pool(pool)
        if not pool.repack[0]:
            pytest.skip("this CPU has no repacked layout for Q4_K")
        relay = SlotRelay(team.g, team.threads_pool, team.repacker, pool)  # type: ignore[arg-type]
        seen: list[tuple[int, int]] = []
        lay = relay.on_threads.fn

        def failing(ith: int, nth: int) -> None:
            seen.append((ith, nth))
            if ith == 1:
                raise OSError("lane gone")
            lay(ith, nth)

        relay.on_threads.fn = failing
        with pytest.raises(OSError, match="lane gone"):
            relay(filled(pool, 1))
        assert sorted(seen) == [(0, 2), (1, 2)]
        relay.on_threads.fn = lay
        relay(filled(pool, 2))  # the next call runs clean
    finally:
        team.close()
