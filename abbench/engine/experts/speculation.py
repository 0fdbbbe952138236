"""Speculation on the expert side: reads issued behind a decode layer's own for the
layers after it, and the retention of predicted residents.

After a layer's lookups and reads, the speculation policy (`policies.prev_token_prefetch`
for `--prefetch K`, `policies.stale_gate_prefetch` for `--predict-prefetch`) names what
to read and what to refresh; the reads go on the reader lanes behind the layer's (FIFO:
real reads first) and are *settled* before the next layer's selection (finished ones join
the cache, the rest are cancelled). With no speculative reads (`--predict-spec-max 0`)
the refresh waits for the next layer's lookups (`Speculator.speculate`).

`Speculator` is a part of `ExpertRunner` (runner.py) with its own state: the reads in
flight (`pending`), the deferred retention (`retain_at`), each layer's routing this token
and the previous one, and the predictor the session installs. It reads and fills the
runner's cache through the runner's reader, counted in its counters (`Host`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from abbench.engine.experts.policies import Policies, prev_token_prefetch, stale_gate_prefetch
from abbench.engine.experts.selection import TokenCounters
from abbench.engine.streaming.cache import BufferKind, ExpertCache, Key
from abbench.engine.streaming.streamer import LayerExperts, ReadTicket, Slice, SliceReader

if TYPE_CHECKING:
    from abbench.engine.experts.predictor import RoutePredictor


class Host(Protocol):
    """What speculation reads of the runner it is part of."""

    layout: list[LayerExperts]
    kinds: list[BufferKind]
    reader: SliceReader
    cache: ExpertCache
    tok: TokenCounters
    policies: Policies

    def slices(self, layer: int, expert: int) -> tuple[Slice, Slice, Slice]: ...


class Speculator:
    """The speculative reads and deferred retention behind a decode layer's own reads."""

    def __init__(self, host: Host) -> None:
        self.host = host
        n_layer = len(host.layout)
        self.predictor: RoutePredictor | None = None  # set by the session for predictions
        self.prev_routing: list[list[int]] = [[] for _ in range(n_layer)]  # previous token's
        self.routing: list[list[int]] = [[] for _ in range(n_layer)]  # this token's
        self.pending: list[tuple[Key, ReadTicket]] = []  # speculative reads in flight
        # Those the layer being run routed, still in flight: it waits for them (`settle`).
        self.adopted: dict[Key, ReadTicket] = {}
        # Retention only: the layer and experts predicted for it, refreshed at its lookups.
        self.retain_at: tuple[int, list[int]] | None = None

    def begin_pass(self, phase: int) -> None:
        """A forward pass begins: a retention left by the last pass is done now, and a
        decode pass's routing so far becomes the previous token's."""
        if self.retain_at is not None:  # a pass ended before the layer it was for
            self.retain(*self.retain_at)
        if phase == 1 and any(self.routing):
            self.prev_routing = self.routing
            self.routing = [[] for _ in self.host.layout]

    def at_lookups(self, layer: int, experts: list[int]) -> list[int] | None:
        """Before `layer`'s lookups of `experts`: the deferred retention for it, less
        what the lookups refresh themselves, is done now (→ the experts predicted for
        it, whose hits count as retained), or all of it where it was for another layer
        (→ None)."""
        retain_at = self.retain_at
        if retain_at is None:
            return None
        if retain_at[0] == layer:
            self.retain(layer, [e for e in retain_at[1] if e not in experts])
            return retain_at[1]
        self.retain(*retain_at)  # not the layer it was for (never in a decode pass): now
        return None

    def speculate(self, layer: int, in_use: set[Key] | None) -> None:
        """Ask the speculation policy what to read and retain after `layer`'s own reads,
        and issue the reads behind them (FIFO lanes: real reads first)."""
        host = self.host
        pol = host.policies
        nxt = layer + 1
        if pol.prefetch:
            plan = prev_token_prefetch(layer, self.prev_routing, pol.prefetch)
        elif self.predictor is not None and nxt < len(host.layout):
            pred = self.predictor.pred_ids[nxt]
            if pred is None:
                return
            if pol.spec_max == 0 and host.cache.complete:  # every prediction resident,
                host.tok.retained += len(pred)  # and a complete cache keeps no recency
                return
            if pol.spec_max == 0:
                # Retention only: every resident prediction is refreshed (the policy's
                # answer without reads), and as nothing is read before the next layer's
                # lookups, the refresh waits for them (`at_lookups`): the ones it looks up are
                # refreshed by their own lookup, the others just before. The LRU ends in
                # the same order and evicts the same entries (tested), for a fraction of
                # the dictionary work on the path P4 measures.
                self.retain_at = (nxt, pred.tolist())
                return
            plan = stale_gate_prefetch(nxt, pred, self.predictor.pred_weights[nxt],
                                       host.cache.entries, pol.spec_max, pol.drop_frac)
        else:
            return
        # Refreshed first: the reads below then evict older entries.
        host.tok.retained += host.cache.retain(plan.retain)
        if not plan.read:
            return
        if in_use is None:  # no miss at this layer: its routing is what it uses
            in_use = {(layer, e) for e in self.routing[layer]}
        self._issue(plan.read, in_use)
        if pol.prefetch_sync:
            self.settle(cancel=False)

    def retain(self, layer: int, experts: list[int]) -> None:
        """The deferred retention (see `speculate`) of `experts` at `layer`, now."""
        self.retain_at = None
        self.host.tok.retained += self.host.cache.retain([(layer, e) for e in experts])

    def _issue(self, targets: list[Key], in_use: set[Key]) -> None:
        """Read each target not resident or in flight, into a cache entry that evicts
        nothing in use or pending; a target with no such room is not read."""
        host = self.host
        cache = host.cache
        pinned = {key for key, _ in self.pending} | in_use
        for key in targets:
            if cache.peek(key) or key in pinned:
                continue
            buf, cached = cache.admit(key, host.kinds[key[0]], pinned, speculative=True)
            if not cached:  # no room without evicting what is in use: do not speculate
                cache.release(buf)
                continue
            pinned.add(key)
            self.pending.append((key, host.reader.submit(host.slices(*key), buf)))

    def settle(self, cancel: bool = True, routed: set[Key] | None = None) -> None:
        """Finished speculative reads join the cache; the rest are cancelled — except
        those still in flight for an expert the layer routed (`routed`, its keys): these
        are *adopted*, their reads go on, and the layer waits for each as for a miss's
        (`adopted`, settled by `adopted_done`). Cancelling one would throw away a read
        already under way only to read the same expert again from its start."""
        cache = self.host.cache
        for key, ticket in self.pending:
            if routed is not None and key in routed and not ticket.event.is_set():
                self.adopted[key] = ticket
                cache.speculative.add(key)  # its lookup counts a useful speculation
                continue
            if cancel and not ticket.event.is_set():
                ticket.cancelled = True
            if self._ended(key, ticket):
                cache.speculative.add(key)
        self.pending.clear()

    def adopted_done(self, failed: bool = False) -> None:
        """The layer that adopted reads has run (`failed`: it was abandoned, and the
        adopted entries leave the cache once their reads end): count them as speculation's."""
        for key, ticket in self.adopted.items():
            self._ended(key, ticket, failed)
        self.adopted.clear()

    def _ended(self, key: Key, ticket: ReadTicket, failed: bool = False) -> bool:
        """A speculative read, once it has ended, counted: → whether its entry stays (else
        it was dropped: it failed, was partly read or its layer `failed`: not trustworthy)."""
        tok = self.host.tok
        ticket.event.wait()
        tok.spec_read_bytes += ticket.nbytes
        if failed or ticket.error is not None or ticket.skipped:
            self.host.cache.drop(key)
            tok.spec_cancelled += 1
            return False
        ticket.wait()  # finished (re-laid) before a lookup computes from it
        tok.spec_experts += 1
        return True

    def finish(self) -> None:
        """Settle what speculation is still in flight (end of run)."""
        if self.retain_at is not None:
            self.retain(*self.retain_at)
        if self.pending:
            self.settle()
        self.adopted_done()
