"""A byte-budgeted LRU over (layer, expert), the accounting the seed engine uses.

One lookup per unique expert per layer batch; a miss costs the expert's bytes; eviction
never takes an entry the current batch touched. The budget counts bytes actually held in
expert buffers (F32 buffers' bytes, or the file's bytes where experts are kept as the file
stores them). Evicted buffers are reused for the next miss of the same *kind* (the kind
makes them: `streamer.F32Kind`, `slots.SlotPool`) instead of being returned to the
allocator, so memory stays flat at the budget; one evicted to make room for another kind
gives its pages back first (`trim`).
Only the compute thread touches the cache: no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from abbench.engine.streaming.slots import SlotLayout, SlotPool, fault_in
from abbench.engine.streaming.streamer import Buffer, BufferArena, F32Kind, LayerExperts

Key = tuple[int, int]  # (layer, expert)


class BufferKind(Protocol):
    """What makes an expert's buffers: their bytes against the budget, a new one, and
    their memory given back at the end."""

    @property
    def nbytes(self) -> int: ...

    def new(self) -> Any: ...

    def release(self) -> None:
        """Give the memory of every buffer made back, once none will be used again."""


def buffer_kinds(layout: list[LayerExperts], raw: bool, n_expert: int, max_k: int,
                 fault_bytes: int = 0) -> list[BufferKind]:
    """Each layer's buffer kind: F32 buffers of its shape from one arena, or (`raw`: the
    file's own bytes) slots of its layout, one pool per layout with room for every expert
    of the layers that have it — or, for a streaming cache (`fault_bytes`: its budget),
    for as many as the budget holds, where that is fewer — and a prefill batch's scratch
    and a layer's (address space, not memory), `fault_bytes` of them mapped in now
    (`slots.fault_in`). A pool no larger than it needs to be: ggml's `mul_mat_id` loops
    over every slot of the pool on every call."""
    if not raw:
        arena = BufferArena()
        f32: dict[tuple[int, int], F32Kind] = {}
        return [f32.setdefault((le.ff, le.d), F32Kind(le.ff, le.d, arena)) for le in layout]
    layouts = [le.slot_layout for le in layout]

    def held(lay: SlotLayout) -> int:  # the most experts of this layout the cache holds
        every = layouts.count(lay) * n_expert
        return min(every, fault_bytes // lay.file_bytes) if fault_bytes else every

    pools = {lay: SlotPool(lay, held(lay) + n_expert + 2 * max_k)
             for lay in dict.fromkeys(layouts)}
    kinds = [pools[lay] for lay in layouts]
    if fault_bytes:
        fault_in(kinds, fault_bytes, n_expert)
    return list[BufferKind](kinds)


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0  # misses on an expert that was resident once and got evicted
    uncached: int = 0  # misses read into scratch because the budget could not hold them
    spec_useful: int = 0  # speculatively read entries later hit before their eviction


@dataclass
class ExpertCache:
    budget_bytes: int
    entries: OrderedDict[Key, Buffer] = field(default_factory=OrderedDict)
    resident_bytes: int = 0
    counters: CacheCounters = field(default_factory=CacheCounters)
    speculative: set[Key] = field(default_factory=set)  # filled by speculation, not yet hit
    _free: dict[object, list[Buffer]] = field(default_factory=dict)  # by kind
    _evicted_once: set[Key] = field(default_factory=set)
    # Holds every expert of the model for good (`--resident`, once preloaded): it never
    # evicts, so it keeps no recency — a hit or a retention reorders nothing. Anything that
    # removes an entry ends it.
    complete: bool = False

    def lookup(self, key: Key) -> Buffer | None:
        """A hit refreshes recency and is counted; a miss is counted by `admit`."""
        buf = self.entries.get(key)
        if buf is not None:
            if not self.complete:
                self.entries.move_to_end(key)
            self.counters.hits += 1
            if key in self.speculative:
                self.speculative.discard(key)
                self.counters.spec_useful += 1
        return buf

    def peek(self, key: Key) -> bool:
        """Residency without touching recency or counters (policies and predictors ask this)."""
        return key in self.entries

    def retain(self, keys: list[Key]) -> int:
        """`refresh` of those of `keys` that are resident, in order; how many were (the
        retention path: one call per layer, not one per key)."""
        if self.complete:  # every key is resident, and recency is not kept
            return len(keys)
        entries = self.entries
        move = entries.move_to_end
        n = 0
        for key in keys:
            if key in entries:
                move(key)
                n += 1
        return n

    def refresh(self, key: Key) -> bool:
        """Mark a resident expert recently used without counting a hit (retention)."""
        if key in self.entries:
            if not self.complete:
                self.entries.move_to_end(key)
            return True
        return False

    def admit(
        self, key: Key, kind: BufferKind, pinned: set[Key], speculative: bool = False
    ) -> tuple[Buffer, bool]:
        """A buffer to read a missing expert into, and whether it is now cached.

        Evicts least-recently-used entries outside `pinned` until the expert fits. When the
        budget cannot hold it even then, the buffer is scratch and the caller releases it.
        A speculative admission is not a lookup: it counts no miss.
        """
        if not speculative:
            self.counters.misses += 1
            if key in self._evicted_once:
                self.counters.rereads += 1
        nbytes = kind.nbytes
        if self.resident_bytes + nbytes > self.budget_bytes and (
            sum(self.entries[k].nbytes for k in pinned if k in self.entries) + nbytes
            > self.budget_bytes
        ):
            # It cannot fit even after evicting everything allowed: evict nothing.
            self.counters.uncached += 1
            return self._buffer(kind), False
        while self.resident_bytes + nbytes > self.budget_bytes:
            victim = next((k for k in self.entries if k not in pinned), None)
            if victim is None:
                self.counters.uncached += 1
                return self._buffer(kind), False
            self._evict(victim, kind)
        buf = self._buffer(kind)
        self.entries[key] = buf
        self.resident_bytes += nbytes
        return buf, True

    def insert(self, key: Key, buf: Buffer) -> None:
        """Place an already-filled buffer (used to preload a resident model)."""
        self.entries[key] = buf
        self.resident_bytes += buf.nbytes

    def release(self, buf: Buffer) -> None:
        """Return a scratch buffer to the free list."""
        self._free.setdefault(buf.kind, []).append(buf)

    def drop(self, key: Key) -> None:
        """Forget an entry whose contents are not valid (a failed or cancelled read)."""
        self.complete = False
        buf = self.entries.pop(key, None)
        self.speculative.discard(key)
        if buf is not None:
            self.resident_bytes -= buf.nbytes
            self.release(buf)

    def _evict(self, key: Key, making_room_for: object) -> None:
        self.complete = False
        buf = self.entries.pop(key)
        self.speculative.discard(key)
        self.resident_bytes -= buf.nbytes
        self.counters.evictions += 1
        self._evicted_once.add(key)
        if buf.kind is not making_room_for:
            buf.trim()  # the room is for another kind: its pages go back now
        self.release(buf)

    def _buffer(self, kind: BufferKind) -> Buffer:
        free = self._free.get(kind)
        return free.pop() if free else kind.new()
