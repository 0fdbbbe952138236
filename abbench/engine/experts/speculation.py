"""Speculation on the expert side: reads issued behind a decode layer's own for the
layers after it, and the retention of predicted residents.

After a layer's lookups and reads, the speculation policy (`policies.prev_token_prefetch`
for `--prefetch K`, `policies.stale_gate_prefetch` for `--predict-prefetch`) names what
to read and what to refresh; the reads go on the reader lanes behind the layer's (FIFO:
real reads first) and are *settled* before the next layer's selection (finished ones join
the cache, the rest are cancelled). With no speculative reads (`--predict-spec-max 0`)
the refresh waits for the next layer's lookups (`_speculate`).

`Speculation` is a part of `ExpertRunner` (experts.py), not an object of its own: its
state is read on the caller's path of every decode layer (`_pending`, `_retain_at`), so
it stays one attribute away as it was when this was one class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from abbench.engine.experts.policies import Policies, prev_token_prefetch, stale_gate_prefetch
from abbench.engine.experts.selection import TokenCounters
from abbench.engine.streaming.cache import BufferKind, ExpertCache, Key
from abbench.engine.streaming.streamer import LayerExperts, ReadTicket, SliceReader

if TYPE_CHECKING:
    from abbench.engine.experts.predictor import RoutePredictor


class Speculation:
    """The speculative reads and deferred retention of `ExpertRunner`, which sets every
    attribute below in its constructor."""

    layout: list[LayerExperts]
    kinds: list[BufferKind]
    raw: bool
    reader: SliceReader
    cache: ExpertCache
    tok: TokenCounters
    policies: Policies
    predictor: RoutePredictor | None
    _prev_routing: list[list[int]]  # per layer, the previous token's routing
    _routing: list[list[int]]  # per layer, this token's
    _pending: list[tuple[Key, ReadTicket]]  # speculative reads in flight
    # Retention only: the layer and experts predicted for it, refreshed at its lookups.
    _retain_at: tuple[int, list[int]] | None

    def _speculate(self, layer: int, in_use: set[Key] | None) -> None:
        """Ask the speculation policy what to read and retain after `layer`'s own reads,
        and issue the reads behind them (FIFO lanes: real reads first)."""
        pol = self.policies
        nxt = layer + 1
        if pol.prefetch:
            plan = prev_token_prefetch(layer, self._prev_routing, pol.prefetch)
        elif self.predictor is not None and nxt < len(self.layout):
            pred = self.predictor.pred_ids[nxt]
            if pred is None:
                return
            if pol.spec_max == 0 and self.cache.complete:  # every prediction resident,
                self.tok.retained += len(pred)  # and a complete cache keeps no recency
                return
            if pol.spec_max == 0:
                # Retention only: every resident prediction is refreshed (the policy's
                # answer without reads), and as nothing is read before the next layer's
                # lookups, the refresh waits for them (`_load`): the ones it looks up are
                # refreshed by their own lookup, the others just before. The LRU ends in
                # the same order and evicts the same entries (tested), for a fraction of
                # the dictionary work on the path P4 measures.
                self._retain_at = (nxt, pred.tolist())
                return
            plan = stale_gate_prefetch(nxt, pred, self.predictor.pred_weights[nxt],
                                       self.cache.entries, pol.spec_max, pol.drop_frac)
        else:
            return
        # Refreshed first: the reads below then evict older entries.
        self.tok.retained += self.cache.retain(plan.retain)
        if not plan.read:
            return
        if in_use is None:  # no miss at this layer: its routing is what it uses
            in_use = {(layer, e) for e in self._routing[layer]}
        self._issue_speculative(plan.read, in_use)
        if pol.prefetch_sync:
            self._settle(cancel=False)

    def _retain(self, layer: int, experts: list[int]) -> None:
        """The deferred retention (see `_speculate`) of `experts` at `layer`, now."""
        self._retain_at = None
        self.tok.retained += self.cache.retain([(layer, e) for e in experts])

    def _issue_speculative(self, targets: list[Key], in_use: set[Key]) -> None:
        """Read each target not resident or in flight, into a cache entry that evicts
        nothing in use or pending; a target with no such room is not read."""
        cache = self.cache
        pinned = {key for key, _ in self._pending} | in_use
        for key in targets:
            if cache.peek(key) or key in pinned:
                continue
            le = self.layout[key[0]]
            buf, cached = cache.admit(key, self.kinds[key[0]], pinned, speculative=True)
            if not cached:  # no room without evicting what is in use: do not speculate
                cache.release(buf)
                continue
            pinned.add(key)
            self._pending.append((key, self.reader.submit(le.slices(key[1], self.raw), buf)))

    def _settle(self, cancel: bool = True) -> None:
        """Finished speculative reads join the cache; the rest are cancelled."""
        tok = self.tok
        for key, ticket in self._pending:
            if cancel and not ticket.event.is_set():
                ticket.cancelled = True
            ticket.event.wait()
            tok.spec_read_bytes += ticket.nbytes
            if ticket.error is not None or ticket.skipped:
                self.cache.drop(key)  # partly read or failed: not trustworthy
                tok.spec_cancelled += 1
            else:
                self.cache.speculative.add(key)
                tok.spec_experts += 1
        self._pending.clear()

    def finish(self) -> None:
        """Settle what speculation is still in flight (end of run)."""
        if self._retain_at is not None:
            self._retain(*self._retain_at)
        if self._pending:
            self._settle()
