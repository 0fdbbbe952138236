"""Cache policies replayed over a trace's lookups: LRU, LFU and Belady-optimal at a budget,
and the run's own recorded residency under the same accounting.

Eviction happens after each batch and never evicts an entry the batch touched. Prefill and
decode are replayed together, one cache, from cold.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from abbench.analysis.replay.batches import Lookups
from abbench.analysis.replay.units import MIB, percent

POLICIES = ("lru", "lfu", "belady")

_Rank = tuple[int, int]                 # what a policy evicts the smallest of first
_Entry = tuple[int, int, int]           # a heap entry: (*rank, key)


@dataclass(frozen=True)
class CacheResult:
    """Hits of one policy at one budget; `decode_*` count decode lookups only (the cache
    still warms over prefill)."""

    policy: str                 # lru | lfu | belady | recorded
    budget_mib: float | None    # None for the run's recorded residency
    lookups: int
    hits: int
    decode_lookups: int
    decode_hits: int
    read_bytes: int             # what the misses read

    @property
    def hit_pct(self) -> float | None:
        return percent(self.hits, self.lookups)

    @property
    def decode_hit_pct(self) -> float | None:
        return percent(self.decode_hits, self.decode_lookups)


def _tally(lk: Lookups, policy: str, budget_mib: float | None,
           hit: Sequence[bool]) -> CacheResult:
    hits = d_hits = d_lookups = read = 0
    for b, is_decode in enumerate(lk.decode):
        lo, hi = lk.starts[b], lk.starts[b + 1]
        h = sum(hit[lo:hi])
        hits += h
        read += sum(c for c, was in zip(lk.cost[lo:hi], hit[lo:hi]) if not was)
        if is_decode:
            d_hits += h
            d_lookups += hi - lo
    return CacheResult(policy, budget_mib, len(lk), hits, d_lookups, d_hits, read)


def recorded(lk: Lookups) -> CacheResult:
    """The run's own cache, read off the residency column with the same accounting."""
    return _tally(lk, "recorded", None, lk.recorded_hit)


def replay_cache(lk: Lookups, budget_mib: float, policy: str) -> CacheResult:
    """Replay the lookups through `policy` (lru, lfu or belady) with `budget_mib` MiB."""
    run = {"lru": _lru, "lfu": _lfu, "belady": _belady}[policy]
    return _tally(lk, policy, budget_mib, run(lk, budget_mib * MIB))


def _lru(lk: Lookups, budget: float) -> list[bool]:
    """LRU: evict the least recently looked-up entry."""
    hit = [False] * len(lk)
    cache: OrderedDict[int, None] = OrderedDict()
    size = 0
    for b in range(lk.batches):
        lo, hi = lk.starts[b], lk.starts[b + 1]
        for j in range(lo, hi):
            key = lk.keys[j]
            if key in cache:
                hit[j] = True
                cache.move_to_end(key)
            else:
                cache[key] = None
                size += lk.cost[j]
        # The batch's entries are now the newest hi - lo: evicting from the old end never
        # reaches them.
        while size > budget and len(cache) > hi - lo:
            key, _ = cache.popitem(last=False)
            size -= lk.key_bytes[key]
    return hit


def _evict(heap: list[_Entry], live: dict[int, _Rank], touched: set[int], size: int,
           budget: float, key_bytes: dict[int, int]) -> int:
    """Pop the heap's smallest live entries until `size` fits, sparing `touched`; entries
    whose rank changed since they were pushed are stale and skipped. Returns the new size."""
    spared: list[_Entry] = []
    while size > budget and heap:
        item = heapq.heappop(heap)
        key = item[-1]
        if live.get(key) != item[:-1]:
            continue
        if key in touched:
            spared.append(item)
            continue
        del live[key]
        size -= key_bytes[key]
    for item in spared:
        heapq.heappush(heap, item)
    return size


def _lfu(lk: Lookups, budget: float) -> list[bool]:
    """LFU: evict the entry with the fewest lookups so far in the trace (counts survive
    eviction), ties to the least recently used."""
    freq: Counter[int] = Counter()

    def rank(j: int, key: int) -> _Rank:
        freq[key] += 1
        return freq[key], j
    return _ranked(lk, budget, rank)


def _belady(lk: Lookups, budget: float) -> list[bool]:
    """Belady: evict the entry whose next use is farthest ahead (never used again first,
    then the larger entry), from the precomputed next-use index."""
    next_use, cost = lk.next_use, lk.cost
    return _ranked(lk, budget, lambda j, key: (-next_use[j], -cost[j]))


def _ranked(lk: Lookups, budget: float, rank: Callable[[int, int], _Rank]) -> list[bool]:
    """A policy that evicts the smallest `rank(j, key)`, given at each lookup j (a heap of
    ranks, stale entries skipped at eviction)."""
    hit = [False] * len(lk)
    live: dict[int, _Rank] = {}          # key → its current rank
    heap: list[_Entry] = []
    size = 0
    for b in range(lk.batches):
        lo, hi = lk.starts[b], lk.starts[b + 1]
        for j in range(lo, hi):
            key = lk.keys[j]
            r = rank(j, key)
            if key in live:
                hit[j] = True
            else:
                size += lk.cost[j]
            live[key] = r
            heapq.heappush(heap, (*r, key))
        if size > budget:
            size = _evict(heap, live, set(lk.keys[lo:hi]), size, budget, lk.key_bytes)
    return hit
