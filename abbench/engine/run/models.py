"""Resolving a model argument: a path to a .gguf, or `synthetic:PRESET[@SEED]` built once.

Synthetic models are cached in `$ABBENCH_CACHE` (default `~/.cache/abbench`) under a name
that carries the preset, the seed and the generator's format version. Concurrent builders
(two campaign cells at once, say) serialise on a lock file; the file appears by rename, so
nobody ever reads a half-written model.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from abbench.engine import synth
from abbench.errors import ConfigError, UsageError

PREFIX = "synthetic:"


def cache_dir() -> Path:
    root = os.environ.get("ABBENCH_CACHE") or os.path.join(Path.home(), ".cache", "abbench")
    return Path(root)


def parse_synthetic(spec: str) -> tuple[str, int]:
    body = spec[len(PREFIX):]
    name, _, seed = body.partition("@")
    if seed and not seed.isdigit():
        raise UsageError(f"`{spec}`: the seed after `@` must be a whole number")
    synth.named(name)  # raises with the list of presets and shapes
    return name, int(seed or 0)


def resolve_model(spec: str, quiet: bool = False) -> Path:
    if not spec.startswith(PREFIX):
        return Path(spec)
    name, seed = parse_synthetic(spec)
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the model cache {folder}: {e.strerror}",
                         tip="set ABBENCH_CACHE to a writable folder") from e
    path = folder / f"synthetic-{name}-s{seed}-v{synth.FORMAT_VERSION}.gguf"
    if path.exists():
        return path
    with open(folder / (path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            spec_ = synth.named(name, seed)
            if not quiet:
                size = spec_.expert_bytes * spec_.n_expert * spec_.n_layer / 2**20
                # a real shape's quantized layers take ggml minutes; a preset's, moments
                what = (f"~{size:.0f} MiB of experts" if spec_.expert_type == "F32"
                        or name in synth.PRESETS
                        else f"{spec_.n_layer} layers, quantized by ggml: minutes")
                print(f"building {spec} ({what}) into {path} (once)",
                      file=sys.stderr, flush=True)
            try:
                synth.write_model(spec_, path, name=f"abbench-synthetic-{name}")
            except OSError as e:  # the half-written file is already gone (write_model)
                raise UsageError(f"cannot build {spec} into {path}: {e.strerror or e}",
                                 tip="free some space, or set ABBENCH_CACHE to another "
                                 "folder") from e
    return path


def prepare_models(specs: list[str]) -> list[Path]:
    """Build every synthetic model in `specs` that is not built yet (a campaign does this
    before its first cell, so that no cell's time, memory or heat includes a build)."""
    return [resolve_model(s) for s in dict.fromkeys(specs) if s.startswith(PREFIX)]


def context_length(spec: str) -> int | None:
    """The model's context length without loading it (a preset's from its definition, a
    file's from its header); None where this machine cannot tell (a path that is not here,
    as on a remote device, or a file the engine would reject with its own message)."""
    if spec.startswith(PREFIX):
        name, seed = parse_synthetic(spec)
        return synth.named(name, seed).context_length
    if not Path(spec).is_file():
        return None
    from abbench.engine.arch import architecture  # the model code only where a file is read
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.errors import AbbenchError

    try:
        mf = ModelFile(spec)
        return int(architecture(mf.architecture, mf.path).ModelArgs.from_file(mf).context_length)
    except (AbbenchError, OSError, ValueError):
        return None


def check_context_memory(path: str | os.PathLike[str], n_ctx: int, need: int) -> None:
    """Refuse a context whose allocations (`need` bytes, the architecture's
    `ModelArgs.context_bytes`) exceed the memory available now, before any is made: numpy
    raised MemoryError for a 477 GiB cache, and a size the kernel does hand out (it
    overcommits) would be killed once the cache's pages are written."""
    import psutil  # only where a model is loaded

    available = psutil.virtual_memory().available  # Linux: /proc/meminfo MemAvailable
    if need > available:
        fits = max(0, available * n_ctx // max(need, 1))
        raise ConfigError(
            f"{path}: a context of {n_ctx} positions needs {need / 2**30:.1f} GiB (KV cache "
            f"and RoPE tables), more than the {available / 2**30:.1f} GiB of memory "
            "available",
            tip=f"give `--n-ctx` (or prompt + `-n`) at most {fits} on this machine now")
