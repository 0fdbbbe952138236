"""Memory checked before it is spent (issue 42, class 2; docs/engine.md#memory): what a
run allocates against the smallest of MemAvailable, its memory cgroup's room (v1 and v2)
and its address-space limit, refused with one error and the way out; an allocation that
fails anyway is one `ERROR:` line, never a traceback.

Before: `engine run --resident --kernels numpy` on a Q4_0 file whose experts become
1.5 GiB in F32, in an 800 MiB cgroup, was OOM-killed after 15 s with no message (exit
137); under `ulimit -v` it was a traceback (`OSError: [Errno 12]` from the slot arena).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_main
from gguf import GGMLQuantizationType

from abbench.engine import synth
from abbench.engine.experts import runner as experts
from abbench.engine.streaming import memory
from abbench.engine.streaming.memory import Room, model_memory, rooms
from abbench.engine.units import MIB

ROOT = Path(__file__).resolve().parents[1]


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


MEMINFO = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"


def test_a_v1_cgroups_room_is_its_limit_less_what_it_holds_but_page_cache(
        tmp_path: Path) -> None:
    """The limit of the cgroup above the process's own applies too; the page cache it
    holds is room (the kernel reclaims it first)."""
    root = tree(tmp_path, {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "9:name=systemd:/\n4:memory:/outer/inner\n0::/\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/outer/memory.limit_in_bytes": f"{800 * MIB}\n",
        "sys/fs/cgroup/memory/outer/memory.usage_in_bytes": f"{300 * MIB}\n",
        "sys/fs/cgroup/memory/outer/memory.stat": f"cache 0\ntotal_cache {200 * MIB}\n",
        "sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/outer/inner/memory.usage_in_bytes": f"{300 * MIB}\n",
    })
    (least, *_) = rooms(root)
    assert least.bytes == 700 * MIB  # 800 less (300 used - 200 page cache)
    assert least.what == "the memory cgroup /outer's limit 800 MiB less 100 MiB in use"


def test_a_v2_cgroups_room_and_no_limit(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "0::/user.slice/run-1.scope\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
        "sys/fs/cgroup/user.slice/memory.max": "max\n",
        "sys/fs/cgroup/user.slice/run-1.scope/memory.max": f"{512 * MIB}\n",
        "sys/fs/cgroup/user.slice/run-1.scope/memory.current": f"{112 * MIB}\n",
        "sys/fs/cgroup/user.slice/run-1.scope/memory.stat": f"anon 1\nfile {12 * MIB}\n",
    })
    found = rooms(root)
    assert [r.bytes for r in found[:2]] == [412 * MIB, 20000000 * 1024]
    assert found[0].what.startswith("the memory cgroup /user.slice/run-1.scope's limit 512")
    # no limit anywhere: MemAvailable alone
    (root / "sys/fs/cgroup/user.slice/run-1.scope/memory.max").write_text("max\n")
    assert [r.what for r in rooms(root)] == ["MemAvailable"]


def test_the_experts_converted_to_f32_are_what_numpy_kernels_need() -> None:
    """A Q4_0 expert takes 18 bytes per 32 weights in the file, 128 in F32."""
    q40 = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.F32)
    mm = model_memory({"e": ((8, 64, 64), q40[0], 0), "norm": ((64,), q40[1], 256),
                       "embd": ((100, 64), q40[0], 3600)},
                      {"e"}, [(3 * 64 * 64 * 18 // 32, 3 * 64 * 64 * 4)] * 2, 8)
    f32, file = 2 * 8 * 3 * 64 * 64 * 4, 2 * 8 * 3 * 64 * 64 * 18 // 32
    assert mm.all_experts("numpy") == f32 and mm.all_experts("ggml") == file
    need = {n.what: n.bytes for n in mm.needs("numpy", True, 0, False)}
    assert need == {"every expert resident, converted to F32 (--kernels numpy)": f32,
                    "the dense weights in F32": 100 * 64 * 4}  # the embedding converted
    cache = mm.needs("ggml", False, 1e6, False)  # a budget past the model: all of it
    assert [n.bytes for n in cache] == [file]


@pytest.mark.parametrize("kind", ["F32", "Q4_0", "Q4_K_M", "MXFP4"])
def test_a_synthetic_models_expert_bytes_from_its_definition_are_its_files(
        tmp_path: Path, kind: str) -> None:
    """The dry run's sizes (nothing built) against the file written: a mix (Q4_K_M: some
    layers' down projections in Q6_K) differs by layer, as the file does."""
    from abbench.campaign.model_check import expert_file_bytes
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.streaming.streamer import expert_layout

    spec = replace(synth.preset("small"), n_layer=9, n_expert=4, d_model=256,
                   expert_ff=256, expert_type=kind)
    path = tmp_path / "m.gguf"
    synth.write_model(spec, path)
    mf = ModelFile(path)
    try:
        written = tuple(le.file_bytes for le in expert_layout(mf, spec.n_layer, spec.n_expert))
    finally:
        mf.close()
    assert expert_file_bytes(spec) == written
    assert (len(set(written)) > 1) == (kind == "Q4_K_M")


def test_a_run_past_its_room_is_refused_before_anything_is_allocated(
        tiny_model: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "rooms", lambda root=None: [
        Room("the memory cgroup /t's limit 1 MiB less 0 MiB in use", 300 * 1024)])

    def never(*a: object, **k: object) -> None:
        raise AssertionError("allocated before the check")

    monkeypatch.setattr(experts.ExpertRunner, "__init__", never)
    rc, _, err = run_main(["engine", "run", "-m", str(tiny_model), "--resident", "-n", "2"],
                          capsys)
    assert rc == 2 and "Traceback" not in err
    line, tip = err.splitlines()
    assert line.startswith(f"ERROR: {tiny_model}: this run needs ")
    assert "every expert resident" in line and "more than the 300 KiB this process may " \
        "have now (the memory cgroup /t's limit" in line
    assert tip.startswith("TIP: it fits with --cache-mib ") or "free memory" in tip


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """192 MiB of F32 experts (4 layers of 16, 3 MiB each) and little else."""
    path = tmp_path_factory.mktemp("mem") / "m.gguf"
    spec = replace(synth.preset("small"), n_layer=4, n_expert=16, d_model=512, expert_ff=512)
    synth.write_model(spec, path)
    return path


@pytest.mark.parametrize("mib", [350, 450, 550, 650, 750])
def test_under_an_address_space_limit_a_run_ends_in_one_line(f32_model: Path,
                                                             mib: int) -> None:
    """`ulimit -v` at sizes where the run fits, where the check refuses it, and where an
    allocation fails anyway (the thread stacks and the buffers the check does not count):
    each ends in at most one `ERROR:` line, exit 0 or 2."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mib * MIB, mib * MIB))

    p = subprocess.run([sys.executable, "-m", "abbench", "engine", "run", "-m", str(f32_model),
                        "--resident", "-n", "2"], cwd=ROOT, capture_output=True, text=True,
                       preexec_fn=limit, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR:")]
    assert (p.returncode, len(errors)) in ((0, 0), (2, 1)), p.stderr
    if errors:
        assert "ulimit -v" in errors[0] or "out of memory" in errors[0], errors


def _cgroup(limit: int) -> Path | None:
    """A fresh memory cgroup (v1, else v2) of `limit` bytes, where this process may make
    one (root, a writable hierarchy); None elsewhere."""
    name = f"abbench-test-{uuid.uuid4().hex[:8]}"
    for base, limit_file in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
                             (Path("/sys/fs/cgroup"), "memory.max")):
        if not (base / limit_file).exists() and not (base / "cgroup.subtree_control").exists():
            continue
        try:
            folder = base / name
            folder.mkdir()
            (folder / limit_file).write_text(str(limit))
            return folder
        except OSError:
            continue
    return None


def test_a_cgroups_limit_refuses_the_run_before_it_is_oom_killed(f32_model: Path) -> None:
    folder = _cgroup(200 * MIB)
    if folder is None:
        pytest.skip("no memory cgroup can be made here (root and a writable hierarchy)")
    try:
        p = subprocess.run(
            ["sh", "-c", f'echo $$ > {folder}/cgroup.procs && exec "$@"', "sh",
             sys.executable, "-m", "abbench", "engine", "run", "-m", str(f32_model),
             "--resident", "-n", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        folder.rmdir()
    assert p.returncode == 2, (p.returncode, p.stderr)  # not 137: killed with no word
    (line, tip) = p.stderr.splitlines()[-2:]
    assert f"the memory cgroup /{folder.name}'s limit 200 MiB less" in line, line
    assert "every expert resident, in F32, as the file holds them 192 MiB" in line
    assert tip.startswith("TIP: it fits with --cache-mib ")
