"""Finding, loading and checking ggml's library, and the lookups every caller makes on it.

The library is the `libggml-base` / `libggml-cpu` pair that `llama-cpp-python` builds and
ships in `llama_cpp/lib/` (a dependency of abbench, built for this machine at install
time); `ABBENCH_GGML_LIB=DIR` points at another build (a folder holding both). The package
itself is never imported — it would load libllama too — only its folder is found.

The `struct ggml_tensor` mirror (`abi.TensorStruct`) is checked against the library when
it is loaded (its size, and fields read back after ggml wrote them), so a library of
another layout is refused with a message instead of corrupting memory.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
from ctypes import POINTER, c_int64, c_void_p
from pathlib import Path

import numpy as np

from abbench.engine.kernels.ggml.abi import (
    GGML_OBJECT_SIZE,
    LOG_CALLBACK,
    LOG_WARN,
    PROTOTYPES,
    Q8_0,
    InitParams,
    TensorStruct,
)
from abbench.errors import EngineError, GgmlUnavailable

LIB_ENV = "ABBENCH_GGML_LIB"


def library_dir() -> Path | None:
    """The folder holding libggml-base and libggml-cpu: `ABBENCH_GGML_LIB`, else the
    `llama_cpp/lib` folder of the installed llama-cpp-python (found, not imported)."""
    env = os.environ.get(LIB_ENV)
    if env:
        return Path(env)
    return _installed_dir()


@functools.cache
def _installed_dir() -> Path | None:
    """llama-cpp-python's library folder, looked up once: `lib()` is called per graph op
    setup (`row_bytes`), and an import-system lookup each time cost milliseconds a pass."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _declare(lib: ctypes.CDLL, name: str, restype: object, *argtypes: object) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


class Lib:
    """The loaded pair and its declared functions (`base` and `cpu`)."""

    def __init__(self, folder: Path) -> None:
        names = {"base": "libggml-base.so", "cpu": "libggml-cpu.so"}
        paths = {k: folder / v for k, v in names.items()}
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            raise GgmlUnavailable(f"ggml's library is not there: {', '.join(missing)}")
        try:
            self.base = ctypes.CDLL(str(paths["base"]), mode=ctypes.RTLD_GLOBAL)
            self.cpu = ctypes.CDLL(str(paths["cpu"]), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise GgmlUnavailable(f"ggml's library in {folder} does not load: {e}") from e
        self.folder = folder
        libraries = {"base": self.base, "cpu": self.cpu}
        try:
            for library, name, restype, argtypes in PROTOTYPES:
                _declare(libraries[library], name, restype, *argtypes)
        except AttributeError as e:
            raise GgmlUnavailable(f"ggml's library in {folder} lacks a function: {e}") from e
        self.cpu.ggml_cpu_init()
        self._check_layout()
        # ggml's informational lines (one per repacked tensor, ...) would interleave with
        # abbench's output: only its warnings and errors reach stderr.
        self._log = LOG_CALLBACK(_log_warnings)
        self.base.ggml_log_set(ctypes.cast(self._log, c_void_p), None)

    def extra_buffer_type(self, name: str) -> int | None:
        """The CPU backend's extra buffer type called `name` (CPU_REPACK, AMX), or None."""
        reg = self.cpu.ggml_backend_cpu_reg()
        dev = self.base.ggml_backend_reg_dev_get(reg, 0)
        fn = self.base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if not dev or not fn:
            return None
        types = ctypes.CFUNCTYPE(POINTER(c_void_p), c_void_p)(fn)(dev)
        i = 0
        while types and types[i]:
            if self.base.ggml_backend_buft_name(types[i]) == name.encode():
                return int(types[i])
            i += 1
        return None

    def _check_layout(self) -> None:
        """Refuse a library whose `struct ggml_tensor` is not the mirror's: its size, then
        one tensor's fields as ggml set them, read through the mirror."""
        b = self.base
        if b.ggml_tensor_overhead() != GGML_OBJECT_SIZE + ctypes.sizeof(TensorStruct):
            raise GgmlUnavailable(
                f"ggml in {self.folder}: struct ggml_tensor has another size "
                f"({b.ggml_tensor_overhead() - GGML_OBJECT_SIZE} bytes, this module mirrors "
                f"{ctypes.sizeof(TensorStruct)})")
        # A context of two tensor headers, as `context.Context(self, 2)` makes it (that
        # module builds on this one, so the probe makes its own).
        mem = np.zeros(2 * b.ggml_tensor_overhead() + 1024, np.uint8)
        ctx = b.ggml_init(InitParams(mem.nbytes, mem.ctypes.data, True))
        if not ctx:
            raise EngineError("ggml_init failed")
        try:
            ne = (64, 3)
            t = b.ggml_new_tensor(ctx, Q8_0, len(ne), (c_int64 * len(ne))(*ne))
            if not t:
                raise EngineError("ggml_new_tensor failed: the context is full")
            TensorStruct.from_address(t).data = 0x1000
            b.ggml_set_name(t, b"probe")
            s = TensorStruct.from_address(t)
            if (s.type != Q8_0 or tuple(s.ne[:2]) != ne or s.nb[1] != b.ggml_row_size(Q8_0, 64)
                    or b.ggml_get_data(t) != 0x1000 or s.name != b"probe"
                    or b.ggml_nbytes(t) != 3 * b.ggml_row_size(Q8_0, 64)):
                raise GgmlUnavailable(f"ggml in {self.folder}: struct ggml_tensor's fields "
                                      "are not where this module expects them")
        finally:
            b.ggml_free(ctx)

    def cpu_features(self) -> str:
        c = self.cpu
        have = [n for n, f in (("avx2", c.ggml_cpu_has_avx2), ("avx512", c.ggml_cpu_has_avx512),
                               ("neon", c.ggml_cpu_has_neon), ("dotprod", c.ggml_cpu_has_dotprod))
                if f()]
        return "+".join(have) or "generic"


def _log_warnings(level: int, text: bytes | None, _: object) -> None:
    if level >= LOG_WARN and level != 5 and text:
        sys.stderr.write("ggml: " + text.decode(errors="replace"))


@functools.cache
def _load(folder: str) -> Lib:
    return Lib(Path(folder))


def lib() -> Lib:
    """ggml, loaded once per process; `GgmlUnavailable` says why not."""
    folder = library_dir()
    if folder is None:
        raise GgmlUnavailable(
            "ggml's library was not found: llama-cpp-python is not installed",
            tip=f"pip install -e . installs it; or set {LIB_ENV} to a folder with "
                "libggml-base.so and libggml-cpu.so")
    return _load(str(folder))


def type_name(gtype: int) -> str:
    return lib().base.ggml_type_name(gtype).decode()


def row_bytes(gtype: int, n: int) -> int:
    return int(lib().base.ggml_row_size(gtype, n))


def block_size(gtype: int) -> int:
    return int(lib().base.ggml_blck_size(gtype))
