"""P1 — I/O-bound decode against a raw read of the same slices (DESIGN 9: bar >= 0.85).

The engine decodes with a small cache (most routed experts miss), O_DIRECT and 4 lanes,
overlap on. Its *effective read bandwidth* for a token is the bytes it read divided by the
token's whole wall time (compute, bookkeeping and stalls included). After every token the
bench reads exactly the slices that token read — same files, same offsets, same sizes,
O_DIRECT, the same number of lanes, one layer's batch at a time as the decode must (layer
l+1's routing is unknown until layer l has run) — with a minimal reader: persistent threads,
one descriptor each, `os.preadv` into page-aligned buffers. The ratio is taken per token
and its median reported, so a shared machine's drift cancels. A raw read of the whole
token's slices at once (no layer barrier) is printed beside it for reference.

    python benches/p1_io_bound.py [--tokens 32] [--cache-mib 64] [--lanes 4]
"""

from __future__ import annotations

import argparse
import mmap
import os
import queue
import statistics
import threading
import time

from abbench.engine.config import EngineConfig
from abbench.engine.models import resolve_model
from abbench.engine.session import Engine, TokenRecord
from abbench.engine.streamer import Slice

MIB = 2**20


class RawLanes:
    """The reference: `lanes` threads, own O_DIRECT descriptors, one queue, preadv."""

    def __init__(self, path: str, lanes: int, max_bytes: int) -> None:
        self.q: queue.SimpleQueue[tuple[int, int, threading.Event] | None] = queue.SimpleQueue()
        self.threads = []
        for _ in range(lanes):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            buf = mmap.mmap(-1, max_bytes)
            t = threading.Thread(target=self._lane, args=(fd, buf), daemon=True)
            t.start()
            self.threads.append(t)

    def _lane(self, fd: int, buf: mmap.mmap) -> None:
        view = memoryview(buf)
        while (item := self.q.get()) is not None:
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
                       io_lanes=a.lanes, o_direct=True, overlap=True)
    with Engine(cfg, path) as engine:
        if not engine.runner.o_direct:
            raise SystemExit("O_DIRECT is refused on this filesystem: P1 needs it")
        reader = engine.runner.reader
        batches: list[list[Slice]] = []  # this token's reads, one list per layer batch
        original_submit = reader.submit
        original_forward = engine.runner.forward

        def forward(layer, *rest, **kw):  # type: ignore[no-untyped-def]
            batches.append([])
            return original_forward(layer, *rest, **kw)

        def submit(slices, buffer):  # type: ignore[no-untyped-def]
            batches[-1].extend(slices)
            return original_submit(slices, buffer)

        engine.runner.forward = forward  # type: ignore[method-assign]
        reader.submit = submit  # type: ignore[method-assign]
        biggest = engine.info["expert_slice_bytes"]
        raw = RawLanes(str(path), a.lanes, max(biggest.values()))
        rows: list[tuple[float, float, float, int]] = []

        def after(rec: TokenRecord) -> None:
            # The first token's batches include the prefill's; warm-up drops that row.
            layered = sum(raw.read_batch(b) for b in batches if b)
            flat = raw.read_batch([s for b in batches for s in b])
            rows.append((rec.wall_ms / 1e3, layered, flat, rec.read_bytes))
            batches.clear()

        result = engine.run(on_token=after)
        raw.close()

    rows = [r for r in rows[a.warmup:] if r[3] > 0]
    eff = [n / w for w, _, _, n in rows]
    raw_layered = [n / t for _, t, _, n in rows]
    raw_flat = [n / t for _, _, t, n in rows]
    ratios = [e / r for e, r in zip(eff, raw_layered)]
    s = result.decode[a.warmup:]
    hit = 100 * sum(r.hits for r in s) / max(1, sum(r.hits + r.misses for r in s))
    print(f"model: {a.model}, cache {a.cache_mib:g} MiB ({hit:.1f}% hit), {a.lanes} lanes, "
          f"O_DIRECT, overlap, {len(rows)} tokens after {a.warmup} warm-up")
    print(f"read per token: median {statistics.median(r[3] for r in rows) / MIB:.1f} MiB")
    print(f"engine effective bandwidth (read bytes / token wall): median "
          f"{statistics.median(eff) / MIB:.0f} MiB/s")
    print(f"raw read, same slices, layer by layer: median "
          f"{statistics.median(raw_layered) / MIB:.0f} MiB/s")
    print(f"raw read, same slices, all at once:    median "
          f"{statistics.median(raw_flat) / MIB:.0f} MiB/s (for reference)")
    print(f"P1 ratio (engine / raw layer by layer), median of per-token ratios: "
          f"{statistics.median(ratios):.3f}  bar >= 0.85")
    print(f"    engine / raw all at once: "
          f"{statistics.median(e / r for e, r in zip(eff, raw_flat)):.3f}")


if __name__ == "__main__":
    main()
