"""A model's experts pre-laid on disk: a copy of every expert as a slot holds it once
re-laid for ggml's repacked kernels (`--prelaid`), written once into the model cache, so
that a streamed expert is read ready to compute.

Why: a quantized expert read from the model file is re-laid by the reader lane that reads
it (`QuantTeam.relay_part`): about 1.1 ms of CPU per Q4_K expert of the Qwen3-30B-A3B
geometry, paid on every miss, on the cores the decode runs on where it has no others. Read
from the copy, a miss costs its read alone; without re-laying at all, the experts run on
ggml's plain kernels, about 1.4x slower (docs/engine.md, `--repack`). The copy takes the
experts' bytes again on disk.

The file: a header (JSON, ended by a NUL and padded to 4 KiB pages: the format, the model
file's path, size and mtime, each layer's slot layout and which parts are re-laid), then
each layer's experts, one slot image each (`SlotLayout.stride` bytes, the three parts each on
a 4 KiB boundary as in a slot): expert e of a layer at its base + e * stride. Every
offset and length is 4 KiB-aligned, so an O_DIRECT read lands straight in the slot.

On open, the header must match the model file and the pools, and layer 0's expert 0
re-laid from the model now must match its copy byte for byte (another CPU may lay
experts another way; a damaged copy shows there too); a copy that fails is written
again. Written to a temporary file, then renamed: a copy cut short
is never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from abbench.engine.streaming.slots import RawSlot, SlotLayout, SlotPool, whole_pages
from abbench.engine.streaming.streamer import LayerExperts, Slice, SliceReader
from abbench.errors import ConfigError, EngineError

FORMAT = "abbench-prelaid-2"
HEADER_MAX = 1 << 20  # a header's bytes at most (a JSON of each layer's layout)

Lay = Callable[[RawSlot], None]  # re-lay a slot read as the file has it (the team's)
Prepare = Callable[[SlotPool], None]  # make a pool's slots re-laid (the team's)


@dataclass(frozen=True)
class PrelaidLayer:
    """One layer in the copy: its experts' slot layout, which parts are re-laid, and where
    expert 0 starts."""

    layout: SlotLayout
    repack: tuple[bool, bool, bool]
    base: int

    def slices(self, expert: int) -> tuple[Slice, Slice, Slice]:
        """Expert `expert`'s three parts as reads into a slot: each part's 4 KiB-aligned
        range (three lanes may read them at once)."""
        lay = self.layout
        at = self.base + expert * lay.stride
        out = [Slice(at + dest, whole_pages(part.nbytes),
                     part.ggml_type, (part.rows, part.cols), dest, raw=True)  # type: ignore[arg-type]
               for part, dest in zip((lay.gate, lay.up, lay.down), lay.offsets)]
        return out[0], out[1], out[2]


@dataclass(frozen=True)
class Prelaid:
    """An open copy: its path and each layer's place in it."""

    path: Path
    layers: tuple[PrelaidLayer, ...]

    def slices(self, layer: int, expert: int) -> tuple[Slice, Slice, Slice]:
        return self.layers[layer].slices(expert)


def prelaid_path(folder: Path, model: Path) -> Path:
    """Where the copy of `model`'s experts is kept in `folder`: named by the model's
    path, size and mtime (a model written again gets a copy of its own)."""
    st = model.stat()
    key = hashlib.sha256(f"{model.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return folder / f"{model.stem}-{key.hexdigest()[:16]}.experts"


def open_prelaid(folder: Path, model: Path, layout: Sequence[LayerExperts],
                 pools: Sequence[SlotPool], lay: Lay, prepare: Prepare, o_direct: bool,
                 note: Callable[[str], None] | None = None) -> Prelaid:
    """The copy of `model`'s experts (`layout`, each layer's in `pools[layer]`'s layout and
    re-laid as that pool is, by `lay`), opened where a valid one is kept in `folder`, else
    written there first (`note` says so: a copy takes a while; the model read with
    O_DIRECT where `o_direct`). `prepare` readies a scratch pool of a layer's layout as
    `pools[layer]` is."""
    path = prelaid_path(folder, model)
    st = model.stat()
    header = {"format": FORMAT, "model": str(model.resolve()), "size": st.st_size,
              "mtime_ns": st.st_mtime_ns,
              "layers": [{"layout": asdict(pool.layout), "repack": list(pool.repack)}
                         for pool in pools]}
    blob = json.dumps(header).encode() + b"\0"  # its end: the header's pages are padded
    for le, pool in zip(layout, pools):
        if pool.layout != le.slot_layout:
            raise EngineError("a layer's slot pool holds another layout than its experts'")
    plan = _plan([(pool.layout, tuple(pool.repack), le.gate.shape[0])  # type: ignore[misc]
                  for le, pool in zip(layout, pools)], whole_pages(len(blob)))
    scratch = _Scratch(prepare)
    try:
        first = _first_expert(model, layout, plan, lay, scratch)
        if _read_header(path, plan[0].base) == header and \
                _copy_of_first(path, plan[0]) == first:
            return Prelaid(path, tuple(plan))
        if note is not None:
            size = _total(plan, layout[0].gate.shape[0])
            note(f"pre-laying {model.name}'s experts for ggml's repacked kernels into "
                 f"{path} (once, {size / 2**30:.2f} GiB)")
        t0 = time.perf_counter()
        _write(path, blob, model, layout, plan, lay, scratch, o_direct)
        if note is not None:
            note(f"pre-laid in {time.perf_counter() - t0:.1f} s")
        return Prelaid(path, tuple(plan))
    finally:
        scratch.trim()


def opened(path: Path, layout: Sequence[LayerExperts]) -> Prelaid:
    """A copy written before, opened to read only (benches measure its disk): each layer's
    place found from its header's length, as `open_prelaid` laid the copy out."""
    with open(path, "rb") as f:
        end = f.read(HEADER_MAX).find(b"\0") + 1
    header = _read_header(path, end) if end else None
    if header is None or header.get("format") != FORMAT or \
            len(header.get("layers", ())) != len(layout):  # type: ignore[arg-type]
        raise EngineError(f"{path} is not a pre-laid copy of these experts")
    plan = _plan([(le.slot_layout, tuple(h["repack"]), le.gate.shape[0])  # type: ignore[misc]
                  for le, h in zip(layout, header["layers"])], whole_pages(end))  # type: ignore[arg-type]
    if _total(plan, layout[-1].gate.shape[0]) > path.stat().st_size:
        raise EngineError(f"{path} is shorter than the experts it lays out")
    return Prelaid(path, tuple(plan))


def _plan(layers: Sequence[tuple[SlotLayout, tuple[bool, bool, bool], int]],
          header_bytes: int) -> list[PrelaidLayer]:
    """Each layer's place in the copy — (its slot layout, re-laid parts, experts) — one
    after another from the header's end on."""
    plan, at = [], header_bytes
    for lay, repack, n_expert in layers:
        plan.append(PrelaidLayer(lay, repack, at))
        at += lay.stride * n_expert
    return plan


def _total(plan: Sequence[PrelaidLayer], n_expert: int) -> int:
    last = plan[-1]
    return last.base + last.layout.stride * n_expert


def _read_header(path: Path, nbytes: int) -> dict[str, object] | None:
    """The copy's header, read from its first `nbytes`, or None where there is no
    readable copy."""
    try:
        with open(path, "rb") as f:
            raw = f.read(nbytes)
    except OSError:
        return None
    try:
        got = json.loads(raw.split(b"\0", 1)[0].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return got if isinstance(got, dict) else None


class _Scratch:
    """A slot of its own per layout (and re-laying) the copy's layers have, made as their
    pools are (`prepare`); `trim` gives their pages back once the copy is done with."""

    def __init__(self, prepare: Prepare) -> None:
        self.prepare = prepare
        self._slots: dict[tuple[SlotLayout, tuple[bool, bool, bool]], RawSlot] = {}

    def slot(self, layer: PrelaidLayer) -> RawSlot:
        key = (layer.layout, layer.repack)
        if key not in self._slots:
            pool = SlotPool(layer.layout, 1)
            self.prepare(pool)
            if tuple(pool.repack) != layer.repack:
                raise EngineError("a scratch pool is re-laid otherwise than its layer's")
            self._slots[key] = pool.new()
        return self._slots[key]

    def trim(self) -> None:
        for slot in self._slots.values():
            slot.trim()


def _first_expert(model: Path, layout: Sequence[LayerExperts],
                  plan: Sequence[PrelaidLayer], lay: Lay, scratch: _Scratch) -> bytes:
    """Layer 0's expert 0 as re-laid here now: how this CPU lays experts."""
    slot = scratch.slot(plan[0])
    reader = SliceReader(model, 1, False)
    try:
        reader.read_now(layout[0].slices(0, True), slot)
    finally:
        reader.close()
    lay(slot)
    return slot.data.tobytes()


def _copy_of_first(path: Path, first: PrelaidLayer) -> bytes | None:
    """Layer 0's expert 0 as the copy holds it (None: cut short)."""
    try:
        with open(path, "rb") as f:
            got = os.pread(f.fileno(), first.layout.stride, first.base)
    except OSError:
        return None
    return got if len(got) == first.layout.stride else None


def _write(path: Path, blob: bytes, model: Path,
           layout: Sequence[LayerExperts], plan: Sequence[PrelaidLayer], lay: Lay,
           scratch: _Scratch, o_direct: bool) -> None:
    """Every expert read from `model`, re-laid and written at its place, into a temporary
    file renamed to `path` once whole."""
    n_expert = layout[0].gate.shape[0]
    size = _total(plan, n_expert)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < size:
        raise ConfigError(f"--prelaid: {path.parent} has {free / 2**30:.1f} GiB free; the "
                          f"copy of the experts takes {size / 2**30:.1f} GiB",
                          tip="free some space, set ABBENCH_CACHE to another folder, or "
                          "run without --prelaid")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    reader = SliceReader(model, 4, o_direct)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, blob.ljust(plan[0].base, b"\0"), 0)
            for le, p in zip(layout, plan):
                slot = scratch.slot(p)
                for e in range(n_expert):
                    reader.read_now(le.slices(e, True), slot)
                    lay(slot)
                    os.pwrite(fd, slot.data, p.base + e * p.layout.stride)
                # written out of the page cache: the copy is read with O_DIRECT, and a
                # model past memory would leave the cache full of it
                os.fsync(fd)
                with contextlib.suppress(AttributeError, OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        reader.close()
