"""Memory a run will spend, checked before it is spent: what a load allocates (experts
converted to F32 or held as the file has them, a cache's budget, dense weights copied or
converted, the context) against what this process may have now.

What the process may have is the smallest of:

- **MemAvailable** (/proc/meminfo): what the kernel could hand out without swapping;
- **its memory cgroup's room** (v2 `memory.max` less `memory.current`, v1
  `memory.limit_in_bytes` less `memory.usage_in_bytes`, at its own cgroup and each one
  above it), the page cache it holds counted as room (the kernel reclaims it before it
  kills): MemAvailable ignores a cgroup's limit, and a run past it is OOM-killed with no
  message;
- **its address-space limit** (`ulimit -v`, RLIMIT_AS) less the address space it maps
  already: an allocation past it fails (ENOMEM) however much memory is free.

A need that does not fit is one `ConfigError` (exit 2) naming each part, what is there
and the way out, before anything is allocated. Where an allocation fails anyway (another
process took the memory meanwhile) the CLI says so in one line (`cli.main`).

The readers take a root folder so that tests run them against fixture trees.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gguf import GGMLQuantizationType

from abbench.engine.units import MIB
from abbench.errors import ConfigError, EngineError

if TYPE_CHECKING:  # the model code only where a model is read
    from abbench.engine.gguf.header import TensorInfo
    from abbench.engine.gguf.model_file import ModelFile

GIB = 2**30
# A cgroup without a limit reads as `max` (v2) or as a number near 2^63 (v1).
NO_LIMIT = 2**60


@dataclass(frozen=True)
class Room:
    """One limit on what the process may allocate, and how much of it is left."""

    what: str  # "MemAvailable", "the memory cgroup /x's limit 800 MiB less 20 MiB in use"
    bytes: int


@dataclass(frozen=True)
class Need:
    """One part of what a run allocates."""

    what: str  # "every expert resident, converted to F32 (--kernels numpy)"
    bytes: int
    experts: bool = False  # the experts' part: what the kernels and the cache move


# -- what there is --------------------------------------------------------------------------


def rooms(root: Path = Path("/")) -> list[Room]:
    """Every limit that applies to this process now (MemAvailable always, where /proc has
    it), smallest first."""
    out = [r for r in (mem_available(root), *cgroup_rooms(root), address_space(root))
           if r is not None]
    return sorted(out, key=lambda r: r.bytes)


def mem_available(root: Path = Path("/")) -> Room | None:
    try:
        text = (root / "proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return Room("MemAvailable", int(line.split()[1]) * 1024)
    return None


def cgroup_rooms(root: Path = Path("/")) -> list[Room]:
    """The room left under each memory cgroup limit above this process (its own cgroup
    and every ancestor's: each one's limit applies)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out: list[Room] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: the unified hierarchy
            out += _walk(root, ("sys/fs/cgroup", "sys/fs/cgroup/unified"), path, V2)
        elif "memory" in controllers.split(","):
            out += _walk(root, ("sys/fs/cgroup/memory",), path, V1)
    return out


@dataclass(frozen=True)
class CgroupFiles:
    """Where one cgroup version keeps a group's limit, its use and its page cache (a
    `memory.stat` key: cache the kernel reclaims before it kills)."""

    limit: str
    usage: str
    cache_key: str
    unified: bool  # v2: its mount holds `cgroup.controllers`


V1 = CgroupFiles("memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache", False)
V2 = CgroupFiles("memory.max", "memory.current", "file", True)


def _walk(root: Path, mounts: Sequence[str], path: str, files: CgroupFiles) -> list[Room]:
    """The rooms under the cgroup `path` and each one above it, in the first of `mounts`
    that holds that hierarchy."""
    rel = Path(path.strip("/"))
    for mount in mounts:
        base = root / mount
        if not (base / rel).is_dir() or (files.unified and
                                         not (base / "cgroup.controllers").is_file()):
            continue
        out = []
        for folder in [rel, *rel.parents]:
            name = "/" if folder == Path(".") else "/" + folder.as_posix()
            if (room := _cgroup_room(base / folder, name, files)) is not None:
                out.append(room)
        return out
    return []


def cgroup_number(path: Path) -> int | None:
    """A cgroup file's one number (`memory.max`, `memory.peak`, ...); None where it is
    absent, unreadable or no limit (`max`, or v1's number near 2^63)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= NO_LIMIT else value


def cgroup_key(path: Path, key: str) -> int | None:
    """`key N` from a cgroup's flat-keyed file (`memory.stat`, `memory.events`, v1's
    `memory.oom_control`); None where the file or the key is not there."""
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        return None
    return None


def _cgroup_room(folder: Path, name: str, files: CgroupFiles) -> Room | None:
    """A group's limit less what it holds but page cache; None without a limit."""
    limit = cgroup_number(folder / files.limit)
    if limit is None:
        return None
    held = max(0, (cgroup_number(folder / files.usage) or 0)
               - (cgroup_key(folder / "memory.stat", files.cache_key) or 0))
    return Room(f"the memory cgroup {name}'s limit {limit / MIB:.0f} MiB less "
                f"{held / MIB:.0f} MiB in use", max(0, limit - held))


def address_space(root: Path = Path("/")) -> Room | None:
    """RLIMIT_AS (`ulimit -v`) less what the process maps now (VmSize)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        for line in (root / "proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return Room(f"the address-space limit (ulimit -v) {soft / MIB:.0f} MiB less "
                f"{mapped / MIB:.0f} MiB mapped", max(0, soft - mapped))


# -- what a run needs -------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelMemory:
    """A model's sizes that decide what a run of it allocates: one expert of each layer
    as the file holds it and in F32, the experts per layer, and the dense tensors' bytes
    in the file and in F32 (those the file does not hold as F32 counted apart)."""

    expert_file: tuple[int, ...]  # per layer: one expert's bytes as the file has them
    expert_f32: tuple[int, ...]  # per layer: one expert's bytes in F32
    n_expert: int
    dense_file: int
    dense_f32: int
    dense_not_f32: int  # F32 bytes of the dense tensors the file holds in another type

    def one_expert(self, kernels: str) -> int:
        """The bytes one expert takes in the cache (the largest layer's)."""
        per = self.expert_file if kernels == "ggml" else self.expert_f32
        return max(per, default=0)

    def all_experts(self, kernels: str) -> int:
        per = self.expert_file if kernels == "ggml" else self.expert_f32
        return sum(per) * self.n_expert

    def needs(self, kernels: str, resident: bool, cache_mib: float, pinned: bool,
              context: int = 0, n_ctx: int = 0) -> list[Need]:
        """What a run with these settings allocates as it loads and fills its cache."""
        if kernels == "ggml":
            form = "as the file holds them (--kernels ggml)"
        elif self.expert_file == self.expert_f32:
            form = "in F32, as the file holds them"
        else:
            form = "converted to F32 (--kernels numpy)"
        total = self.all_experts(kernels)
        out = []
        if resident:
            out.append(Need(f"every expert resident, {form}", total, experts=True))
        elif cache_mib > 0:
            budget = min(total, int(cache_mib * MIB))
            out.append(Need(f"the expert cache's budget ({cache_mib:g} MiB"
                            + (f", all the experts {form}" if budget == total else "")
                            + ")", budget, experts=True))
        if kernels == "ggml":
            dense = self.dense_file if pinned else 0
        else:
            dense = self.dense_f32 if pinned else self.dense_not_f32
        if dense:
            what = ("copied to memory (dense = pinned)" if pinned and kernels == "ggml"
                    else "in F32")
            out.append(Need(f"the dense weights {what}", dense))
        if context:
            out.append(Need(f"a context of {n_ctx} positions (KV cache and RoPE tables)",
                            context))
        return out


def model_memory(tensors: dict[str, tuple[tuple[int, ...], int, int]],
                 expert_names: set[str], layers: Sequence[tuple[int, int]],
                 n_expert: int) -> ModelMemory:
    """`ModelMemory` from each tensor's (shape, GGML type, file bytes), which of them are
    experts, and per layer one expert's (file bytes, F32 bytes)."""
    dense = {n: t for n, t in tensors.items() if n not in expert_names}
    f32 = {n: math.prod(shape) * 4 for n, (shape, _, _) in dense.items()}
    return ModelMemory(
        expert_file=tuple(f for f, _ in layers), expert_f32=tuple(b for _, b in layers),
        n_expert=n_expert, dense_file=sum(t[2] for t in dense.values()),
        dense_f32=sum(f32.values()),
        dense_not_f32=sum(f32[n] for n, t in dense.items()
                          if t[1] != GGMLQuantizationType.F32))


class LayerExperts(Protocol):
    """What `of_model` reads of one layer's experts (`streamer.LayerExperts`: the streamer
    imports this module, so the type is a protocol here)."""

    @property
    def gate(self) -> TensorInfo: ...
    @property
    def up(self) -> TensorInfo: ...
    @property
    def down(self) -> TensorInfo: ...
    @property
    def file_bytes(self) -> int: ...
    @property
    def buffer_bytes(self) -> int: ...


def of_model(mf: ModelFile, layout: Sequence[LayerExperts]) -> ModelMemory:
    """A model file's `ModelMemory` (its header and expert layout: nothing is read)."""
    experts = {t.name for le in layout for t in (le.gate, le.up, le.down)}
    n_expert = layout[0].gate.shape[0] if layout else 0
    return model_memory({n: (tuple(t.shape), t.ggml_type, t.nbytes)
                         for n, t in mf.tensors.items()}, experts,
                        [(le.file_bytes, le.buffer_bytes) for le in layout], n_expert)


# How the settings `way_out` proposes are spelled: on the command line, in a cells.toml.
FLAGS = {"cache": "--cache-mib {}", "ggml": "--kernels ggml", "resident": "--resident",
         "not resident": "without --resident"}
KEYS = {"cache": "cache_mib = {}", "ggml": 'kernels = "ggml"', "resident": "resident = true",
        "not resident": "resident = false"}


def way_out(mm: ModelMemory, kernels: str, resident: bool, pinned: bool, context: int,
            n_ctx: int, room: int, spelled: dict[str, str] = FLAGS) -> str:
    """The settings that would fit `room`: the largest cache with these kernels, and —
    for a file whose experts are not F32 — the same with `--kernels ggml`, which holds
    them as the file does."""
    def total(k: str, res: bool, cache_mib: float) -> int:
        return sum(n.bytes for n in mm.needs(k, res, cache_mib, pinned, context, n_ctx))

    options = [kernels] + (["ggml"] if kernels != "ggml"
                           and mm.all_experts("ggml") < mm.all_experts(kernels) else [])
    ways = []
    for k in options:
        flag = "" if k == kernels else ", " + spelled["ggml"]
        if resident and total(k, True, 0) <= room:
            ways.append(f"{spelled['resident']}{flag} ({size(total(k, True, 0))} in all)")
            continue
        cache = (room - total(k, False, 0)) // MIB
        if cache * MIB >= mm.one_expert(k):
            ways.append(spelled["cache"].format(cache) + flag
                        + (", " + spelled["not resident"] if resident else "")
                        + " (the experts it does not hold are streamed)")
    if not ways:
        return (f"the dense weights and the context alone need {size(total(kernels, False, 0))}"
                ": free memory, or raise the limit named")
    return "it fits with " + "; or with ".join(ways)


def check(path: str | os.PathLike[str], needs: Sequence[Need],
          tip: Callable[[int], str], root: Path = Path("/")) -> None:
    """Refuse a run whose `needs` do not fit the smallest room there is now; `tip` says
    the way out for that room's bytes."""
    need = sum(n.bytes for n in needs)
    there = rooms(root)
    if not there or need <= there[0].bytes:
        return
    least = there[0]
    parts = ", ".join(f"{n.what} {size(n.bytes)}" for n in needs if n.bytes)
    raise ConfigError(f"{path}: this run needs {size(need)} ({parts}), more than the "
                      f"{size(least.bytes)} this process may have now ({least.what})",
                      tip=tip(least.bytes))


def size(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB"


def out_of_memory(nbytes: int, what: str, e: OSError) -> EngineError:
    """The engine's error for an allocation the system refused, with the limits there are."""
    limits = "; ".join(f"{r.what}: {size(r.bytes)} left" for r in rooms()[:2])
    return EngineError(f"cannot allocate {size(nbytes)} more for {what}: "
                       f"{e.strerror or e} ({limits})",
                       tip="a smaller --cache-mib, or --kernels ggml (the experts as the "
                       "file holds them); `abbench model info MODEL` gives their sizes")
