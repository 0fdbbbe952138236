"""llama.cpp built from source, once, for the parity tests and the P7/P8 benches.

The source is the copy the `llama-cpp-python` source distribution vendors (pinned below: the
llama.cpp commit the parity figures were measured at), fetched from PyPI with pip. Built
with CMake into `$ABBENCH_CACHE/llama.cpp/VERSION/bin/` (default `~/.cache/abbench`):
`llama-completion`, `llama-tokenize` and `llama-bench`, statically linked. A finished
build is reused, so only the first run pays its ~5 minutes on 2 cores; concurrent callers
wait on a lock; a failed build leaves nothing behind but its log.

`exit_linger()` builds beside it a small shared object that, preloaded, holds a tool's
exit back for a moment: llama.cpp's tools print through an asynchronous logger whose thread
is never joined, so without it the tail of their stdout can be lost at exit.

    python tests/llamacpp.py            # build (or find) and print the bin folder
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python, vendoring ggml-org/llama.cpp 0c1e570
TOOLS = ("llama-completion", "llama-tokenize", "llama-bench", "llama-quantize")
# What this version builds with here: no network, no TLS, no server, no tests; static so
# the binaries move into the cache folder on their own.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF")


class Unavailable(RuntimeError):
    """llama.cpp cannot be built here (no toolchain); the message says what is missing."""


# Read when this module is imported — at test collection, before the test session points
# ABBENCH_CACHE at a private folder — so that every session shares one build.
_CACHE_ROOT = os.environ.get("ABBENCH_CACHE", "~/.cache/abbench")


def cache_dir() -> Path:
    return Path(_CACHE_ROOT).expanduser() / "llama.cpp" / VERSION


def toolchain_problem() -> str | None:
    """What is missing to build llama.cpp here, or None."""
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        return (f"no C++ toolchain to build llama.cpp ({', '.join(missing)} not on PATH; "
                "apt-get install cmake g++)")
    return None


def built() -> Path | None:
    """The bin folder of a finished build, or None."""
    bin_dir = cache_dir() / "bin"
    return bin_dir if all((bin_dir / t).is_file() for t in TOOLS) else None


def build(log: bool = True) -> Path:
    """The bin folder, building llama.cpp first if no finished build is cached."""
    found = built()
    if found is not None:
        return found
    problem = toolchain_problem()
    if problem:
        raise Unavailable(problem)
    home = cache_dir()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        found = built()
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(dir=home, prefix=".build-") as tmp:
            work = Path(tmp)
            source = _source(work)
            log_path = home / "build.log"
            _run(["cmake", "-S", str(source), "-B", str(work / "build"), *CMAKE_FLAGS],
                 log_path, "configure", echo=log)
            jobs = str(os.cpu_count() or 2)
            _run(["cmake", "--build", str(work / "build"), "--target", *TOOLS, "-j", jobs],
                 log_path, "build", echo=log)
            staged = work / "bin"
            staged.mkdir()
            for tool in TOOLS:
                shutil.copy2(_find(work / "build", tool), staged / tool)
            if (home / "bin").exists():
                shutil.rmtree(home / "bin")
            os.replace(staged, home / "bin")
    return home / "bin"


# Preloaded (LD_PRELOAD), its destructor runs after main has returned and before the process
# ends: the logger's thread, still alive, writes what is queued while it sleeps. It changes
# when the process ends, not what it computes or prints.
LINGER_C = """#include <unistd.h>
__attribute__((destructor)) static void abbench_linger(void) { usleep(%d); }
"""
LINGER_US = 300_000


def exit_linger() -> Path | None:
    """The shared object that holds a preloading process's exit back LINGER_US, built once
    into the cache folder; None where no C compiler is on PATH."""
    target = cache_dir() / f"exit-linger-{LINGER_US}.so"
    if target.is_file():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".linger-") as tmp:
        source = Path(tmp) / "linger.c"
        source.write_text(LINGER_C % LINGER_US)
        staged = Path(tmp) / "linger.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(staged), str(source)],
                       check=True, capture_output=True)
        os.replace(staged, target)
    return target


def _source(work: Path) -> Path:
    """The vendored llama.cpp tree, unpacked from the pinned source distribution."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", f"llama-cpp-python=={VERSION}", "-d", str(work)],
                   check=True, stdout=subprocess.DEVNULL)
    (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and (m.isfile() or m.isdir()) and ".." not in Path(m.name).parts]
        tar.extractall(work, members=members)  # noqa: S202 - filtered to the vendored tree
    return work / prefix


def _run(argv: list[str], log_path: Path, what: str, echo: bool) -> None:
    if echo:
        print(f"llama.cpp {VERSION}: {what} ({' '.join(argv[:2])} ...), log in {log_path}",
              file=sys.stderr)
    with open(log_path, "a") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"llama.cpp {what} failed (exit {done.returncode}):\n{tail}")


def _find(build_dir: Path, tool: str) -> Path:
    for candidate in (build_dir / "bin" / tool, *build_dir.rglob(tool)):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(f"llama.cpp build produced no `{tool}` under {build_dir}")


if __name__ == "__main__":
    print(build())
