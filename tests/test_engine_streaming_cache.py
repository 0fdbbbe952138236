"""ExpertCache: LRU recency, the byte budget, pinning, counters and buffer reuse."""

from __future__ import annotations

import functools
from collections import OrderedDict
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import model_info
from abbench.engine.streaming.cache import ExpertCache, Key, buffer_kinds
from abbench.engine.streaming.slots import SlotPool
from abbench.engine.streaming.streamer import BufferArena, ExpertBuffer, F32Kind, expert_layout

FF, D = 4, 8
NBYTES = 3 * FF * D * 4  # one expert's F32 buffer


@functools.cache
def kind(ff: int = FF, d: int = D) -> F32Kind:
    """One kind per shape, as the runner makes them."""
    return F32Kind(ff, d, BufferArena(1 << 20))


def cache_of(slots: int) -> ExpertCache:
    return ExpertCache(slots * NBYTES)


def run_batch(
    cache: ExpertCache, layer: int, experts: list[int], ff: int = FF, d: int = D
) -> list[tuple[Key, bool, bool, ExpertBuffer]]:
    """What the runner does per layer: look up, admit the misses pinned by the batch, release
    the scratch ones. Returns (key, hit, cached, buffer) per routed expert."""
    pinned = {(layer, e) for e in experts}
    out = []
    scratch = []
    for e in experts:
        key = (layer, e)
        buf = cache.lookup(key)
        if buf is not None:
            out.append((key, True, True, buf))
            continue
        buf, cached = cache.admit(key, kind(ff, d), pinned)
        assert cache.resident_bytes <= cache.budget_bytes
        out.append((key, False, cached, buf))
        if not cached:
            scratch.append(buf)
    for buf in scratch:
        cache.release(buf)
    return out


def test_lru_evicts_least_recently_used_and_a_hit_refreshes() -> None:
    cache = cache_of(3)
    for e in (0, 1, 2):
        run_batch(cache, 0, [e])
    assert list(cache.entries) == [(0, 0), (0, 1), (0, 2)]
    run_batch(cache, 0, [0])  # hit: (0, 0) becomes the most recent
    assert list(cache.entries) == [(0, 1), (0, 2), (0, 0)]
    run_batch(cache, 0, [3])
    assert list(cache.entries) == [(0, 2), (0, 0), (0, 3)]  # (0, 1) was the LRU
    c = cache.counters
    assert (c.hits, c.misses, c.evictions, c.rereads, c.uncached) == (1, 4, 1, 0, 0)
    assert cache.resident_bytes == 3 * NBYTES


def test_a_complete_cache_keeps_no_recency_until_an_entry_leaves() -> None:
    cache = cache_of(3)
    for e in (0, 1, 2):
        run_batch(cache, 0, [e])
    cache.complete = True  # what a resident runner sets once every expert is preloaded
    run_batch(cache, 0, [0])
    assert cache.retain([(0, 1), (0, 9)]) == 2  # every key counts: all are resident
    assert list(cache.entries) == [(0, 0), (0, 1), (0, 2)]  # nothing reordered
    assert cache.counters.hits == 1
    cache.drop((0, 2))
    assert not cache.complete
    run_batch(cache, 0, [0])
    assert list(cache.entries) == [(0, 1), (0, 0)]  # recency again
    assert cache.retain([(0, 1), (0, 9)]) == 1


def test_budget_counts_bytes_and_never_overflows() -> None:
    cache = ExpertCache(2 * NBYTES + NBYTES // 2)  # room for two and a half experts
    for e in range(10):
        run_batch(cache, 1, [e])
        assert cache.resident_bytes <= cache.budget_bytes
        assert cache.resident_bytes == sum(b.nbytes for b in cache.entries.values())
    assert len(cache.entries) == 2
    assert cache.counters.evictions == 8


def test_eviction_never_takes_a_pinned_key() -> None:
    cache = cache_of(2)
    run_batch(cache, 0, [0])
    run_batch(cache, 0, [1])
    # (0, 0) is the LRU but pinned: the victim is (0, 1).
    buf, cached = cache.admit((0, 2), kind(), pinned={(0, 0), (0, 2)})
    assert cached
    assert list(cache.entries) == [(0, 0), (0, 2)]
    # Everything resident pinned: the miss is read into scratch and nothing is evicted.
    buf, cached = cache.admit((0, 3), kind(), pinned={(0, 0), (0, 2), (0, 3)})
    assert not cached
    assert buf not in cache.entries.values()
    assert list(cache.entries) == [(0, 0), (0, 2)]
    c = cache.counters
    assert (c.misses, c.evictions, c.uncached) == (4, 1, 1)


def test_batch_larger_than_the_cache_keeps_what_it_holds() -> None:
    cache = cache_of(2)
    result = run_batch(cache, 0, [0, 1, 2, 3])
    assert [cached for _, _, cached, _ in result] == [True, True, False, False]
    assert list(cache.entries) == [(0, 0), (0, 1)]
    assert cache.counters.uncached == 2
    assert cache.counters.evictions == 0


def test_rereads_count_misses_of_evicted_experts_only() -> None:
    cache = cache_of(1)
    run_batch(cache, 0, [0])  # cold miss
    run_batch(cache, 0, [1])  # cold miss, evicts (0, 0)
    run_batch(cache, 0, [0])  # re-read, evicts (0, 1)
    run_batch(cache, 0, [2])  # cold miss
    run_batch(cache, 0, [1])  # re-read
    c = cache.counters
    assert (c.misses, c.evictions, c.rereads, c.hits) == (5, 4, 2, 0)


def test_budget_zero_makes_every_miss_uncached_scratch() -> None:
    cache = ExpertCache(0)
    ids = set()
    for step in range(5):
        result = run_batch(cache, step % 2, [0, 1, 2])
        assert all(not hit and not cached for _, hit, cached, _ in result)
        ids.update(id(buf) for *_, buf in result)
    assert cache.entries == OrderedDict()
    assert cache.resident_bytes == 0
    c = cache.counters
    assert (c.hits, c.misses, c.uncached, c.evictions, c.rereads) == (0, 15, 15, 0, 0)
    assert len(ids) == 3  # the released scratch buffers are handed out again


def test_buffers_are_reused_not_allocated_per_miss() -> None:
    import random

    rng = random.Random(7)
    slots, k = 3, 2
    cache = cache_of(slots)
    seen: dict[int, ExpertBuffer] = {}  # hold references so ids cannot be recycled
    for _ in range(300):
        for *_, buf in run_batch(cache, rng.randrange(4), rng.sample(range(8), k)):
            seen[id(buf)] = buf
    assert cache.counters.evictions > 100
    assert len(seen) <= slots + k


def test_drop_forgets_without_counting_an_eviction_and_reuses_the_buffer() -> None:
    cache = cache_of(2)
    (_, _, _, buf0), = run_batch(cache, 0, [0])
    run_batch(cache, 0, [1])
    cache.drop((0, 0))
    assert (0, 0) not in cache.entries
    assert cache.resident_bytes == NBYTES
    assert cache.counters.evictions == 0
    cache.drop((0, 9))  # not resident: nothing happens
    assert cache.resident_bytes == NBYTES
    (_, hit, cached, buf) = run_batch(cache, 0, [0])[0]
    assert (hit, cached) == (False, True)
    assert buf is buf0  # the dropped buffer went back to the free list
    assert cache.counters.rereads == 0  # dropped is not evicted


def test_refresh_changes_recency_without_counting_a_hit() -> None:
    cache = cache_of(2)
    run_batch(cache, 0, [0])
    run_batch(cache, 0, [1])
    assert cache.refresh((0, 0)) is True
    assert cache.refresh((0, 5)) is False
    assert cache.counters.hits == 0
    run_batch(cache, 0, [2])
    assert list(cache.entries) == [(0, 0), (0, 2)]


def test_peek_leaves_recency_and_counters_alone() -> None:
    cache = cache_of(2)
    run_batch(cache, 0, [0])
    run_batch(cache, 0, [1])
    before = (cache.counters.hits, cache.counters.misses)
    assert cache.peek((0, 0)) is True
    assert cache.peek((0, 7)) is False
    assert (cache.counters.hits, cache.counters.misses) == before
    run_batch(cache, 0, [2])
    assert list(cache.entries) == [(0, 1), (0, 2)]  # (0, 0) stayed the LRU and went


def test_insert_counts_held_bytes() -> None:
    cache = cache_of(4)
    cache.insert((3, 1), ExpertBuffer(FF, D))
    assert cache.resident_bytes == NBYTES
    assert cache.lookup((3, 1)) is not None
    assert cache.counters.hits == 1


def test_admit_does_not_evict_when_the_expert_cannot_fit_anyway() -> None:
    small = 3 * 2 * D * 4
    cache = ExpertCache(NBYTES + small)
    cache.admit((0, 0), kind(), pinned=set())  # big, resident
    cache.admit((1, 0), kind(2, D), pinned=set())  # small, resident
    # A big one with the big resident pinned: evicting the small one cannot make room.
    _, cached = cache.admit((0, 1), kind(), pinned={(0, 0), (0, 1)})
    assert not cached
    assert (1, 0) in cache.entries
    assert cache.counters.evictions == 0


# -- property: invariants and a reference LRU ----------------------------------------------


class RefLRU:
    """Slot-counting LRU with the same rules: pinned keys stay, no room means scratch."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.keys: OrderedDict[Key, None] = OrderedDict()
        self.evicted: set[Key] = set()
        self.hits = self.misses = self.evictions = self.rereads = self.uncached = 0

    def batch(self, layer: int, experts: list[int]) -> None:
        pinned = {(layer, e) for e in experts}
        for e in experts:
            key = (layer, e)
            if key in self.keys:
                self.keys.move_to_end(key)
                self.hits += 1
                continue
            self.misses += 1
            self.rereads += key in self.evicted
            if len(self.keys) >= self.slots:
                victim = next((k for k in self.keys if k not in pinned), None)
                if victim is None or self.slots == 0:
                    self.uncached += 1
                    continue
                del self.keys[victim]
                self.evicted.add(victim)
                self.evictions += 1
            self.keys[key] = None


batches = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(slots=st.integers(0, 5), extra=st.integers(0, NBYTES - 1), seq=batches)
def test_property_budget_pinning_and_lru_counts(
    slots: int, extra: int, seq: list[tuple[int, list[int]]]
) -> None:
    cache = ExpertCache(slots * NBYTES + extra)
    ref = RefLRU(slots)
    for layer, experts in seq:
        pinned = {(layer, e) for e in experts}
        scratch = []
        for e in experts:
            key = (layer, e)
            if cache.lookup(key) is not None:
                continue
            resident_pinned = pinned & set(cache.entries)
            buf, cached = cache.admit(key, kind(), pinned)
            assert cache.resident_bytes <= cache.budget_bytes
            assert resident_pinned <= set(cache.entries), "a pinned entry was evicted"
            assert (key in cache.entries) == cached
            if not cached:
                scratch.append(buf)
        for buf in scratch:
            cache.release(buf)
        ref.batch(layer, experts)
        assert list(cache.entries) == list(ref.keys)
        assert cache.resident_bytes == NBYTES * len(cache.entries)
    c = cache.counters
    assert (c.hits, c.misses, c.evictions, c.rereads, c.uncached) == (
        ref.hits, ref.misses, ref.evictions, ref.rereads, ref.uncached
    )


def test_a_streaming_pool_holds_what_its_budget_holds_and_never_runs_out(
        tiny_model: Path) -> None:
    """A pool is sized by what the cache's budget can hold of its layout (where that is
    fewer than its layers' experts), plus a prefill batch's scratch: ggml's `mul_mat_id`
    loops over every slot of it on every call. A cache of that budget reading every
    expert of every layer, a decode layer's and a prefill batch's worth at a time,
    finds a slot for each."""
    mf = ModelFile(tiny_model)
    info = model_info(mf)
    n_layer, n_expert = int(info["n_layer"]), int(info["n_expert"])
    layout = expert_layout(mf, n_layer, n_expert)
    whole = buffer_kinds(layout, True, n_expert, 4, 0)  # resident: every expert
    pool = whole[0]
    assert isinstance(pool, SlotPool) and pool.capacity == n_layer * n_expert + n_expert + 8
    one = layout[0].slot_layout.file_bytes
    kinds = buffer_kinds(layout, True, n_expert, 4, 5 * one)
    small = kinds[0]
    assert isinstance(small, SlotPool) and small.capacity == 5 + n_expert + 8
    cache = ExpertCache(5 * one)
    for batch in (4, n_expert):  # a decode layer's reads, then a prefill batch's
        for layer in range(n_layer):
            pinned = {(layer, e) for e in range(batch)}
            bufs = [cache.admit(key, kinds[layer], pinned) for key in sorted(pinned)]
            for buf, cached in bufs:
                if not cached:
                    cache.release(buf)
    assert cache.resident_bytes <= 5 * one
