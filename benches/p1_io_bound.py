"""P1 — I/O-bound decode against a raw read of the same slices (docs/benches.md: bar >= 0.85).

The engine decodes with a small cache (most routed experts miss), O_DIRECT and 4 lanes,
overlap on. Its *effective read bandwidth* for a token is, as the seed engine defines it and
the `moe-stream:` line prints it, the bytes it read over the time its reads were in flight
(per layer, first issue to last completion: `io_ms`) — what the streaming machinery (lanes,
buffers, cache) delivers. The stricter figure, bytes over the token's whole wall time
(attention, routing and the compute not hidden included), is printed beside it.

After every token the bench reads exactly the slices that token read — same file, offsets
and sizes, O_DIRECT, the same number of lanes, one layer's batch at a time as the decode
must (layer l+1's routing is unknown until layer l has run) — with a minimal reader:
persistent threads, one descriptor each, `os.preadv` into page-aligned buffers spanning as
much memory as the engine's cache (see RawLanes). The ratio is taken per token and its
median reported, so a shared machine's drift cancels. A raw read of the whole token's
slices at once (no layer barrier) is printed beside it for reference.

    python benches/p1_io_bound.py [--tokens 32] [--cache-mib 64] [--lanes 4]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import threading
import time

from abbench.engine.config import EngineConfig
from abbench.engine.run.models import resolve_model
from abbench.engine.run.session import Engine, TokenRecord
from abbench.engine.streaming.streamer import BufferArena, Slice

MIB = 2**20


class RawLanes:
    """The reference: `lanes` threads, own O_DIRECT descriptors, one queue, preadv.

    Reads land in `footprint` bytes of page-aligned destination buffers, cycled — as the
    engine's reads land in its cache's buffers, and in the same kind of memory (a
    `BufferArena`: where reads land moves O_DIRECT's speed by tens of percent).
    `footprint=slice size` (one buffer per lane, always hot) is printed for reference.
    """

    def __init__(self, path: str, lanes: int, slice_bytes: int, footprint: int) -> None:
        self.q: queue.SimpleQueue[tuple[int, int, threading.Event] | None] = queue.SimpleQueue()
        self.threads = []
        per_lane = max(1, footprint // slice_bytes // lanes)
        arena = BufferArena()  # the memory the engine's cache reads into
        for _ in range(lanes):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            bufs = []
            for _ in range(per_lane):
                mm, offset = arena.take(slice_bytes)
                bufs.append(memoryview(mm)[offset : offset + slice_bytes])
            t = threading.Thread(target=self._lane, args=(fd, bufs), daemon=True)
            t.start()
            self.threads.append(t)

    def _lane(self, fd: int, views: list[memoryview]) -> None:
        k = 0
        while (item := self.q.get()) is not None:
            view = views[k % len(views)]
            k += 1
            offset, nbytes, done = item
            got = 0
            while got < nbytes:
                got += os.preadv(fd, [view[got:nbytes]], offset + got)
            done.set()

    def read_batch(self, slices: list[Slice]) -> float:
        t0 = time.perf_counter()
        events = []
        for s in slices:
            ev = threading.Event()
            self.q.put((s.offset, s.nbytes, ev))
            events.append(ev)
        for ev in events:
            ev.wait()
        return time.perf_counter() - t0

    def close(self) -> None:
        for _ in self.threads:
            self.q.put(None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:default")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--cache-mib", type=float, default=64)
    ap.add_argument("--lanes", type=int, default=4)
    a = ap.parse_args()

    path = resolve_model(a.model)
    cfg = EngineConfig(model=a.model, n_tokens=a.tokens + a.warmup, cache_mib=a.cache_mib,
                       io_lanes=a.lanes, o_direct=True, overlap=True, ignore_eos=True)
    with Engine(cfg, path) as engine:
        if not engine.runner.o_direct:
            raise SystemExit("O_DIRECT is refused on this filesystem: P1 needs it")
        reader = engine.runner.reader
        batches: list[list[Slice]] = []  # this token's reads, one list per layer batch
        original_submit = reader.submit
        original_select = engine.runner.select

        def select(layer, *rest, **kw):  # type: ignore[no-untyped-def]
            batches.append([])  # one layer's reads begin with its selection
            return original_select(layer, *rest, **kw)

        def submit(slices, buffer):  # type: ignore[no-untyped-def]
            if not batches:  # a batched prefill's reads come before any selection
                batches.append([])
            batches[-1].extend(slices)
            return original_submit(slices, buffer)

        engine.runner.select = select  # type: ignore[method-assign]
        reader.submit = submit  # type: ignore[method-assign]
        biggest = max(engine.info["expert_slice_bytes"].values())
        footprint = max(int(a.cache_mib * MIB), engine.info["expert_bytes"] * 8)
        raw = RawLanes(str(path), a.lanes, biggest, footprint)
        hot = RawLanes(str(path), a.lanes, biggest, biggest)
        rows: list[tuple[float, float, float, float, int]] = []
        walls: list[float] = []

        def after(rec: TokenRecord) -> None:
            # The first token's batches include the prefill's; warm-up drops that row.
            layered = sum(raw.read_batch(b) for b in batches if b)
            flat = raw.read_batch([s for b in batches for s in b])
            one_buffer = sum(hot.read_batch(b) for b in batches if b)
            rows.append((rec.io_ms / 1e3, layered, flat, one_buffer, rec.read_bytes))
            walls.append(rec.wall_ms / 1e3)
            batches.clear()

        result = engine.run(on_token=after)
        raw.close()
        hot.close()

    keep = [i for i in range(a.warmup, len(rows)) if rows[i][4] > 0]
    wall_eff = [rows[i][4] / walls[i] for i in keep]
    rows = [rows[i] for i in keep]
    eff = [n / io for io, _, _, _, n in rows]
    raw_layered = [n / t for _, t, _, _, n in rows]
    raw_flat = [n / t for _, _, t, _, n in rows]
    raw_hot = [n / t for _, _, _, t, n in rows]
    ratios = [e / r for e, r in zip(eff, raw_layered)]
    s = result.decode[a.warmup:]
    hit = 100 * sum(r.hits for r in s) / max(1, sum(r.hits + r.misses for r in s))
    print(f"model: {a.model}, cache {a.cache_mib:g} MiB ({hit:.1f}% hit), {a.lanes} lanes, "
          f"O_DIRECT, overlap, {len(rows)} tokens after {a.warmup} warm-up")
    print(f"read per token: median {statistics.median(r[4] for r in rows) / MIB:.1f} MiB")
    print(f"engine effective bandwidth (read bytes / time reads were in flight): median "
          f"{statistics.median(eff) / MIB:.0f} MiB/s")
    print(f"engine read bytes / whole token wall time: median "
          f"{statistics.median(wall_eff) / MIB:.0f} MiB/s")
    print(f"raw read, same slices, layer by layer: median "
          f"{statistics.median(raw_layered) / MIB:.0f} MiB/s")
    print(f"raw read, same slices, all at once:    median "
          f"{statistics.median(raw_flat) / MIB:.0f} MiB/s (for reference)")
    print(f"raw read, layer by layer, one hot buffer per lane: median "
          f"{statistics.median(raw_hot) / MIB:.0f} MiB/s (for reference)")
    print(f"P1 ratio (engine / raw layer by layer), median of per-token ratios: "
          f"{statistics.median(ratios):.3f}  bar >= 0.85")
    print(f"    strict (bytes / token wall) / raw layer by layer: "
          f"{statistics.median(w / r for w, r in zip(wall_eff, raw_layered)):.3f}")
    print(f"    engine / raw all at once: "
          f"{statistics.median(e / r for e, r in zip(eff, raw_flat)):.3f}; engine / raw one "
          f"hot buffer: {statistics.median(e / r for e, r in zip(eff, raw_hot)):.3f}")


if __name__ == "__main__":
    main()
