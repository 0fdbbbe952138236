"""Offline answers from a route trace (DESIGN 6.4): cache policies, predictors, drop trade.

Pure functions: a `RouteTrace` in, immutable results out. The definitions are the ones the
engine's authors used for their published figures (reference/bmoe/README.md):

- Cache accounting: one lookup per *unique* expert per layer batch (duplicates in a batch
  only refresh recency); a miss costs that layer's `expert_bytes`; eviction happens after
  the batch and never evicts an entry the batch touched. A batch is a run of consecutive
  rows with the same turn, phase and layer and, in decode, the same step: a decode token
  meets each layer once, a prefill pass meets each layer once with all its prompt tokens.
  Prefill and decode are replayed together, one cache, from cold.
- Predictors (decode): share of a routing's top-k slots that a predictor named, the
  predictor naming k experts per layer.
- Drop trade (decode): a routed expert is dropped when the run recorded it as a miss, it is
  not its routing's top-weighted expert, and its weight is below F / k.
"""

from __future__ import annotations

import heapq
import sys
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from abbench.records.route_trace import RouteTrace

MIB = 1 << 20
NEVER = sys.maxsize                     # next use of an entry the trace never asks for again
POLICIES = ("lru", "lfu", "belady")
LAGS = (1, 2, 4, 8)
DROP_FACTORS = (0.25, 0.5, 0.75, 1.0)


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole else None


# -- the cache's view of a trace -----------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Lookups:
    """One lookup per unique expert per layer batch, in run order."""

    keys: list[int]            # per lookup: layer * n_expert + expert
    cost: list[int]            # per lookup: the layer's expert_bytes, what a miss reads
    next_use: list[int]        # per lookup: the batch that asks for the key next, or NEVER
    recorded_hit: list[bool]   # per lookup: the run's own residency (its first row) was a hit
    starts: list[int]          # lookup index where each batch starts, plus the total at the end
    decode: list[bool]         # per batch: a decode batch
    key_bytes: dict[int, int]  # per key: its layer's expert_bytes

    @property
    def batches(self) -> int:
        return len(self.decode)

    def __len__(self) -> int:
        return len(self.keys)


def lookups(trace: RouteTrace) -> Lookups:
    """Group the trace's rows into layer batches and dedupe each batch. Rows the run dropped
    were never loaded, so they are not looked up."""
    turn, phase, step, layer, expert, res, dropped = (
        a.tolist() for a in (trace.turn, trace.phase, trace.step, trace.layer, trace.expert,
                             trace.residency, trace.dropped))
    n_expert, layer_bytes = trace.n_expert, trace.expert_bytes
    keys: list[int] = []
    cost: list[int] = []
    hit: list[bool] = []
    starts: list[int] = []
    decode: list[bool] = []
    current: tuple[int, int, int, int] | None = None
    seen: set[int] = set()
    for i in range(len(layer)):
        if dropped[i]:
            continue
        batch = (turn[i], phase[i], layer[i], step[i] if phase[i] else -1)
        if batch != current:
            current, seen = batch, set()
            starts.append(len(keys))
            decode.append(phase[i] == 1)
        key = layer[i] * n_expert + expert[i]
        if key in seen:
            continue
        seen.add(key)
        keys.append(key)
        cost.append(layer_bytes[layer[i]])
        hit.append(res[i] > 0)
    starts.append(len(keys))
    return Lookups(keys=keys, cost=cost, next_use=_next_use(keys, starts), recorded_hit=hit,
                   starts=starts, decode=decode,
                   key_bytes={k: layer_bytes[k // n_expert] for k in set(keys)})


def _next_use(keys: list[int], starts: list[int]) -> list[int]:
    """Per lookup, the index of the next batch that looks the same key up (Belady's oracle),
    computed once in one backward pass."""
    nxt = [NEVER] * len(keys)
    later: dict[int, int] = {}
    for b in range(len(starts) - 2, -1, -1):
        lo, hi = starts[b], starts[b + 1]
        for j in range(lo, hi):
            nxt[j] = later.get(keys[j], NEVER)
        for j in range(lo, hi):
            later[keys[j]] = b
    return nxt


# -- cache policies ------------------------------------------------------------------------


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
        return _pct(self.hits, self.lookups)

    @property
    def decode_hit_pct(self) -> float | None:
        return _pct(self.decode_hits, self.decode_lookups)


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


def _evict(heap: list[tuple], live: dict[int, tuple], touched: set[int], size: int,
           budget: float, key_bytes: dict[int, int]) -> int:
    """Pop the heap's smallest live entries until `size` fits, sparing `touched`; entries
    whose rank changed since they were pushed are stale and skipped. Returns the new size."""
    spared = []
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
    hit = [False] * len(lk)
    freq: Counter[int] = Counter()
    live: dict[int, tuple] = {}          # key → its current rank (count, last lookup)
    heap: list[tuple] = []
    size = 0
    for b in range(lk.batches):
        lo, hi = lk.starts[b], lk.starts[b + 1]
        for j in range(lo, hi):
            key = lk.keys[j]
            freq[key] += 1
            if key in live:
                hit[j] = True
            else:
                size += lk.cost[j]
            live[key] = (freq[key], j)
            heapq.heappush(heap, (freq[key], j, key))
        if size > budget:
            size = _evict(heap, live, set(lk.keys[lo:hi]), size, budget, lk.key_bytes)
    return hit


def _belady(lk: Lookups, budget: float) -> list[bool]:
    """Belady: evict the entry whose next use is farthest ahead (never used again first,
    then the larger entry), from the precomputed next-use index."""
    hit = [False] * len(lk)
    live: dict[int, tuple] = {}          # key → its current rank (-next use, -bytes)
    heap: list[tuple] = []
    size = 0
    for b in range(lk.batches):
        lo, hi = lk.starts[b], lk.starts[b + 1]
        for j in range(lo, hi):
            key = lk.keys[j]
            if key in live:
                hit[j] = True
            else:
                size += lk.cost[j]
            rank = (-lk.next_use[j], -lk.cost[j])
            live[key] = rank
            heapq.heappush(heap, (*rank, key))
        if size > budget:
            size = _evict(heap, live, set(lk.keys[lo:hi]), size, budget, lk.key_bytes)
    return hit


# -- sizes and default budgets -------------------------------------------------------------


def token_cycle_bytes(trace: RouteTrace) -> int:
    """Expert bytes one token routes through all layers: k × Σ expert_bytes."""
    return trace.n_expert_used * sum(trace.expert_bytes)


def all_experts_bytes(trace: RouteTrace) -> int:
    return trace.n_expert * sum(trace.expert_bytes)


def recorded_budget_mib(trace: RouteTrace) -> float | None:
    """The run's own cache budget, where the preamble states it (`cache_mib=` or
    `cache_mb=`, as the bmoe_metrics preamble writes it)."""
    for key in ("cache_mib", "cache_mb"):
        try:
            value = float(trace.meta.get(key, ""))
        except ValueError:
            continue
        if 0 < value < float("inf"):
            return value
    return None


def default_budgets(trace: RouteTrace) -> list[float]:
    """The trace's own budget (if stated) plus a doubling ladder of round sizes,
    125 × 2^n MiB, from below half a token's cycle to the first size that holds every
    expert (where only first-touch misses remain)."""
    half_cycle = token_cycle_bytes(trace) / 2 / MIB
    everything = all_experts_bytes(trace) / MIB
    rung = 125.0
    while rung > half_cycle:
        rung /= 2
    while rung * 2 <= half_cycle:
        rung *= 2
    ladder = [rung]
    while ladder[-1] < everything:
        ladder.append(ladder[-1] * 2)
    own = recorded_budget_mib(trace)
    return sorted(set(ladder) | ({own} if own else set()))


# -- predictors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PredictorScore:
    """Slots named over slots routed, on the routings the predictor could be scored on."""

    name: str                    # prev_token | run_hottest | prompt_hottest | random
    lag: int | None              # prev_token only
    named: int | None            # routed slots the predictor had named
    slots: int | None            # routed slots scored (the denominator)
    routings: int | None         # (token, layer) routings scored
    tie_layers: int | None = None  # static predictors: layers whose k-th place is tied
    tie_span: tuple[float, float] | None = None  # pct under the worst and best tie order
    analytic_pct: float | None = None  # random: k / n_expert

    @property
    def pct(self) -> float | None:
        if self.analytic_pct is not None:
            return self.analytic_pct
        return None if self.named is None or self.slots is None else _pct(self.named,
                                                                           self.slots)


Routing = dict[int, frozenset[int]]     # layer → the experts one token routed there


def _routings(trace: RouteTrace, phase: int) -> dict[int, list[Routing]]:
    """Per turn, one routing per token of `phase`, in run order."""
    rows = np.flatnonzero(trace.phase == phase)
    tokens: dict[tuple[int, int], dict[int, set[int]]] = {}
    for t, s, la, e in zip(*(a[rows].tolist() for a in
                             (trace.turn, trace.step, trace.layer, trace.expert))):
        tokens.setdefault((t, s), {}).setdefault(la, set()).add(e)
    out: dict[int, list[Routing]] = {}
    for (t, _), layers in tokens.items():
        out.setdefault(t, []).append({la: frozenset(es) for la, es in layers.items()})
    return out


def _counts(routings: Iterable[Routing]) -> dict[int, Counter[int]]:
    """Per layer, how many of `routings` routed each expert."""
    counts: dict[int, Counter[int]] = {}
    for routing in routings:
        for la, es in routing.items():
            counts.setdefault(la, Counter()).update(es)
    return counts


def _top_k(counts: dict[int, Counter[int]], k: int,
           tie: Callable[[int, int], float]) -> dict[int, frozenset[int]]:
    """Per layer, the k most counted experts, ties ordered by `tie(layer, expert)`."""
    return {la: frozenset(sorted(c, key=lambda e: (-c[e], tie(la, e)))[:k])
            for la, c in counts.items()}


def _tied_layers(counts: dict[int, Counter[int]], k: int) -> int:
    """Layers whose k-th and (k+1)-th most counted experts tie: their top-k set depends on
    the tie rule."""
    ties = 0
    for c in counts.values():
        ranked = sorted(c.values(), reverse=True)
        ties += len(ranked) > k and ranked[k - 1] == ranked[k]
    return ties


def predictors(trace: RouteTrace, lags: Sequence[int] = LAGS) -> list[PredictorScore]:
    """Decode-phase predictor accuracy. Every predictor is scored on the same routings —
    decode tokens after each turn's first (the first has no previous token to go on) — except
    prev-token at lag d, which needs d earlier decode tokens of the same turn."""
    k = trace.n_expert_used
    decode = _routings(trace, 1)
    scores = []
    for lag in lags:
        named = slots = count = 0
        for tokens in decode.values():
            for i in range(lag, len(tokens)):
                before = tokens[i - lag]
                for la, actual in tokens[i].items():
                    named += len(actual & before.get(la, frozenset()))
                    slots += len(actual)
                    count += 1
        scores.append(PredictorScore("prev_token", lag, named, slots, count))

    scored = [r for tokens in decode.values() for r in tokens[1:]]
    slots = sum(len(es) for r in scored for es in r.values())
    count = sum(len(r) for r in scored)

    truth = _counts(scored)     # what the scored routings routed, to bound the tie rule

    def score(hot: dict[int, frozenset[int]]) -> int:
        return sum(len(es & hot.get(la, frozenset())) for r in scored for la, es in r.items())

    def static(name: str, counts: dict[int, Counter[int]]) -> PredictorScore:
        """The k hottest per layer, ties to the lowest expert id; where ties decide, the span
        of scores over every tie order (worst and best) goes with it."""
        named = score(_top_k(counts, k, lambda la, e: e))
        ties = _tied_layers(counts, k)
        span = None
        if ties and slots:
            worst = score(_top_k(counts, k, lambda la, e: truth.get(la, Counter())[e]))
            best = score(_top_k(counts, k, lambda la, e: -truth.get(la, Counter())[e]))
            span = (100.0 * worst / slots, 100.0 * best / slots)
        return PredictorScore(name, None, named, slots, count, tie_layers=ties, tie_span=span)

    scores.append(static("run_hottest", _counts(r for tokens in decode.values()
                                                 for r in tokens)))
    prompt = [r for tokens in _routings(trace, 0).values() for r in tokens]
    if prompt:
        scores.append(static("prompt_hottest", _counts(prompt)))
    else:
        scores.append(PredictorScore("prompt_hottest", None, None, slots, count))
    scores.append(PredictorScore("random", None, None, None, None,
                                 analytic_pct=100.0 * k / trace.n_expert))
    return scores


# -- drop policy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DropTrade:
    """What `--drop-cold-experts F` would have skipped in this run's decode."""

    factor: float            # F, in units of the uniform weight 1/k
    threshold: float         # F / k
    dropped: int             # routed experts it skips
    candidates: int          # decode misses (recorded residency 0) that are not the top expert
    miss_bytes: int          # all decode miss bytes, at the layer's expert_bytes
    avoided_bytes: int
    weight_total: float      # all decode router weight
    weight_discarded: float

    @property
    def reads_avoided_pct(self) -> float | None:
        return _pct(self.avoided_bytes, self.miss_bytes)

    @property
    def weight_discarded_pct(self) -> float | None:
        return _pct(self.weight_discarded, self.weight_total)


def drop_trade(trace: RouteTrace, factors: Sequence[float] = DROP_FACTORS) -> list[DropTrade]:
    """Per factor F: the decode misses (as the run recorded them) whose weight is below
    F / k, never a routing's top-weighted expert. The trade is read off the recorded
    residency: a drop does not change later residency here."""
    rows = np.flatnonzero(trace.phase == 1)                     # (d,) decode row indices
    weight = trace.weight[rows]                                  # (d,)
    # One id per (turn, step, layer) routing, then its heaviest row (the first on ties).
    _, routing = np.unique(np.stack([trace.turn[rows], trace.step[rows], trace.layer[rows]]),
                           axis=1, return_inverse=True)
    routing = routing.reshape(-1)                                # (d,)
    order = np.lexsort((np.arange(len(rows)), -weight, routing))
    first = np.ones(len(order), dtype=bool)
    first[1:] = routing[order][1:] != routing[order][:-1]
    top = np.zeros(len(rows), dtype=bool)
    top[order[first]] = True
    miss = trace.residency[rows] == 0
    cost = np.asarray(trace.expert_bytes, dtype=np.int64)[trace.layer[rows]]  # (d,)
    candidate = miss & ~top
    k = trace.n_expert_used
    out = []
    for f in factors:
        drop = candidate & (weight < f / k)
        out.append(DropTrade(
            factor=f, threshold=f / k, dropped=int(drop.sum()), candidates=int(candidate.sum()),
            miss_bytes=int(cost[miss].sum()), avoided_bytes=int(cost[drop].sum()),
            weight_total=float(weight.sum()), weight_discarded=float(weight[drop].sum()),
        ))
    return out


# -- the whole replay ----------------------------------------------------------------------


@dataclass(frozen=True)
class TraceShape:
    """What the trace holds, for the report's header."""

    turns: int
    prefill_tokens: int
    decode_tokens: int
    prefill_rows: int
    decode_rows: int
    dropped_rows: int
    token_cycle_bytes: int
    all_experts_bytes: int


def shape(trace: RouteTrace) -> TraceShape:
    def tokens(phase: int) -> int:
        rows = trace.phase == phase
        return len(set(zip(trace.turn[rows].tolist(), trace.step[rows].tolist())))
    return TraceShape(
        turns=len(set(trace.turn.tolist())), prefill_tokens=tokens(0), decode_tokens=tokens(1),
        prefill_rows=int((trace.phase == 0).sum()), decode_rows=int((trace.phase == 1).sum()),
        dropped_rows=int(trace.dropped.sum()), token_cycle_bytes=token_cycle_bytes(trace),
        all_experts_bytes=all_experts_bytes(trace),
    )


@dataclass(frozen=True, eq=False)
class Replay:
    """Everything `abbench replay` answers about one trace."""

    trace: RouteTrace
    shape: TraceShape
    lookups: Lookups
    recorded: CacheResult
    budgets_mib: tuple[float, ...]
    cache: tuple[CacheResult, ...]      # budgets × POLICIES, budget-major
    predictors: tuple[PredictorScore, ...]
    drops: tuple[DropTrade, ...]

    def at(self, budget_mib: float, policy: str) -> CacheResult:
        for r in self.cache:
            if r.budget_mib == budget_mib and r.policy == policy:
                return r
        raise KeyError((budget_mib, policy))

    def predictor(self, name: str, lag: int | None = None) -> PredictorScore:
        for p in self.predictors:
            if p.name == name and p.lag == lag:
                return p
        raise KeyError((name, lag))

    def drop(self, factor: float) -> DropTrade:
        for d in self.drops:
            if d.factor == factor:
                return d
        raise KeyError(factor)


def replay(trace: RouteTrace, budgets_mib: Sequence[float] | None = None,
           factors: Sequence[float] = DROP_FACTORS) -> Replay:
    """Run every offline answer on `trace`; `budgets_mib` defaults to `default_budgets`."""
    budgets = tuple(sorted(set(budgets_mib))) if budgets_mib else tuple(default_budgets(trace))
    lk = lookups(trace)
    return Replay(
        trace=trace, shape=shape(trace), lookups=lk, recorded=recorded(lk), budgets_mib=budgets,
        cache=tuple(replay_cache(lk, m, p) for m in budgets for p in POLICIES),
        predictors=tuple(predictors(trace)),
        drops=tuple(drop_trade(trace, sorted(set(factors)))),
    )
