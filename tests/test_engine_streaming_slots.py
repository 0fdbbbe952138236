"""Slot pools: a streaming cache's budget mapped in at load (`fault_in`), each pool its
layers' share, and pools making room for one another so the memory held stays the budget."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from abbench.engine.kernels import ggml
from abbench.engine.streaming import slots
from abbench.engine.streaming.cache import ExpertCache
from abbench.engine.streaming.slots import Part, SlotLayout, SlotPool, fault_in

FF, D = 512, 1024  # one Q8_0 slot: three parts of 0.53 MiB


def layout(down: int = ggml.Q8_0) -> SlotLayout:
    def part(rows: int, cols: int, t: int) -> Part:
        return Part(t, rows, cols, rows * ggml.row_bytes(t, cols))

    return SlotLayout(part(FF, D, ggml.Q8_0), part(FF, D, ggml.Q8_0), part(D, FF, down))


def resident_bytes(pool: SlotPool) -> int:
    """The bytes of `pool`'s slots in memory now: its pages present in /proc/self/pagemap
    (bit 63 of each page's entry). Adjacent mappings merge in /proc/self/smaps, so the
    pages are asked for one by one."""
    page = mmap.PAGESIZE
    first, n = pool.address // page, pool.capacity * pool.layout.stride // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read(n * 8), np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63))) * page


def test_fault_in_maps_each_pools_share_of_the_budget_now() -> None:
    # three layers of one layout and one of another: 3/4 and 1/4 of 40 experts' bytes
    a, b = SlotPool(layout(), 64), SlotPool(layout(ggml.Q4_0), 64)
    kinds = [a, a, b, a]
    budget = 40 * a.nbytes
    assert resident_bytes(a) == 0
    fault_in(kinds, budget, n_expert=16)
    assert a.faulted == 30
    assert b.faulted == budget // 4 // b.nbytes
    assert resident_bytes(a) >= 30 * a.layout.stride
    assert resident_bytes(a) < 31 * a.layout.stride + (2 << 20)  # a huge page at most
    assert a.siblings == (b,) and b.siblings == (a,)


def test_fault_in_holds_no_more_than_the_layers_experts() -> None:
    a = SlotPool(layout(), 64)
    fault_in([a, a], 1 << 40, n_expert=8)
    assert a.faulted == 16


def test_a_slot_past_the_faulted_ones_takes_back_an_unused_one_of_another_pool() -> None:
    a, b = SlotPool(layout(), 32), SlotPool(layout(ggml.Q4_0), 32)
    fault_in([a, b], 8 * a.nbytes, n_expert=16)
    assert (a.faulted, b.faulted) == (4, b.faulted) and b.faulted >= 4
    before = b.faulted
    handed = [b.new() for _ in range(2)]
    for _ in range(4):
        a.new()  # the faulted ones: nothing given back
    assert b.faulted == before
    a.new()  # a fresh one: b's last unused faulted slot goes back
    assert b.faulted == before - 1
    while b.faulted > len(handed):
        a.new()
    a.new()  # b has none unused left: it keeps the slots it handed out
    assert b.faulted == len(handed)
    assert resident_bytes(b) < (len(handed) + 1) * b.layout.stride + (2 << 20)


def test_a_cache_over_faulted_pools_reuses_them_and_stays_in_its_budget() -> None:
    pool = SlotPool(layout(), 16)
    fault_in([pool], 4 * pool.nbytes, n_expert=16)
    cache = ExpertCache(4 * pool.nbytes)
    for e in range(12):
        cache.admit((0, e), pool, {(0, e)})
    assert pool.faulted == 4
    assert resident_bytes(pool) <= 5 * pool.layout.stride + (2 << 20)
    assert cache.counters.evictions == 8


def test_pages_are_written_by_hand_where_the_kernel_cannot_populate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a kernel before 5.14 refuses MADV_POPULATE_WRITE as an unknown advice (EINVAL)
    monkeypatch.setattr(slots, "MADV_POPULATE_WRITE", 9999)
    pool = SlotPool(layout(), 8)
    pool.fault(3)
    assert pool.faulted == 3
    assert resident_bytes(pool) >= 3 * pool.layout.stride
