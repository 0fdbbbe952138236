"""The compute partner process: the same bits as the thread team, and it ends with its parent."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_engine_kernels_compute import make_buffers
from threadpoolctl import threadpool_limits

from abbench.engine.config import EngineConfig
from abbench.engine.experts.policies import Policies
from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.kernels import partner
from abbench.engine.kernels.compute import ComputeTeam, Job, matmul_t, matvec, rows_task, split_rows
from abbench.engine.kernels.partner import SPIN_S, Partner
from abbench.engine.run.session import Engine
from abbench.engine.streaming.streamer import ExpertBuffer
from abbench.errors import EngineError

FF, D, K = 32, 48, 6

pytestmark = pytest.mark.skipif(not partner.supported(), reason="x86-64 with 2 CPUs only")


def buffers(rng: np.random.Generator, n: int) -> list[ExpertBuffer]:
    return make_buffers(rng, n, FF, D)


@pytest.fixture
def setup() -> Iterator[tuple[Partner, list[ExpertBuffer], list[np.ndarray]]]:
    rng = np.random.default_rng(0)
    bufs = buffers(rng, 8)
    mats = [rng.standard_normal((r, D)).astype(np.float32) for r in (768, 259, 40)]
    p = Partner(mats, bufs, D, FF, K)
    yield p, bufs, mats
    p.close()


def test_experts_are_the_same_bits_as_the_thread_team(setup) -> None:
    p, bufs, _ = setup
    team = ComputeTeam(2, FF, K)
    rng = np.random.default_rng(1)
    try:
        for k in (6, 5, 1):
            x = rng.standard_normal(D).astype(np.float32)
            slots = rng.permutation(k)
            jobs = [Job(int(s), b, None) for s, b in zip(slots, bufs[:k])]
            ours, theirs = np.full((K, D), np.nan, np.float32), np.full((K, D), np.nan, np.float32)
            assert p.run(jobs, x, ours) == 0.0
            team.run(jobs, x, theirs)
            np.testing.assert_array_equal(ours, theirs)  # NaN rows (past k) included
    finally:
        team.close()


def test_resident_experts_are_the_same_bits_as_the_thread_team(setup) -> None:
    p, bufs, _ = setup
    team = ComputeTeam(2, FF, K)
    rng = np.random.default_rng(5)
    try:
        for k in (6, 5, 2, 1):
            x = rng.standard_normal(D).astype(np.float32)
            chosen = [bufs[int(i)] for i in rng.permutation(len(bufs))[:k]]
            ours, theirs = np.full((K, D), np.nan, np.float32), np.full((K, D), np.nan, np.float32)
            ours[:k] = p.run_resident(chosen, x)
            team.run([Job(j, b, None) for j, b in enumerate(chosen)], x, theirs)
            np.testing.assert_array_equal(ours, theirs)  # NaN rows (past k) included
    finally:
        team.close()


def test_an_unknown_buffer_is_computed_by_the_caller(setup) -> None:
    p, bufs, _ = setup
    stranger = buffers(np.random.default_rng(2), 1)[0]  # made after the fork
    x = np.ones(D, np.float32)
    jobs = [Job(0, bufs[0], None), Job(1, stranger, None)]
    out, ref = np.zeros((K, D), np.float32), np.zeros((K, D), np.float32)
    p.run(jobs, x, out)
    ComputeTeam(1, FF, K).run(jobs, x, ref)
    np.testing.assert_array_equal(out, ref)


def test_matvec_is_the_same_bits_as_the_callers_split(setup) -> None:
    p, _, mats = setup
    rng = np.random.default_rng(3)
    for w in mats:
        x = rng.standard_normal(D).astype(np.float32)
        np.testing.assert_array_equal(p.matvec(w, x), matvec(w, x))
    unregistered = rng.standard_normal((512, D)).astype(np.float32)
    np.testing.assert_array_equal(p.matvec(unregistered, x), matvec(unregistered, x))


def test_a_sleeping_partner_wakes_for_the_next_request(setup) -> None:
    p, _, mats = setup
    x = np.ones(D, np.float32)
    p.matvec(mats[0], x)
    time.sleep(SPIN_S * 20)  # long past its spin: asleep on the pipe
    assert p._ctl[partner.SLEEPING] == 1
    np.testing.assert_array_equal(p.matvec(mats[0], x), matvec(mats[0], x))


@pytest.mark.parametrize("retention", [False, True], ids=["plain", "predict-retention"])
def test_resident_layers_skip_the_lookups_but_count_and_trace_as_they_would(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        retention: bool) -> None:
    """With the partner, each decode layer takes its buffers straight from the complete
    cache (`ExpertRunner._call_resident`): the same tokens, counters and route trace as
    the lookups' path gives. So does stale-gate retention without reads (P4's setting),
    which over a complete cache only counts its predictions."""
    lookups = []  # the decode passes' lookups (a prefill pass always looks its experts up)
    load = ExpertRunner.load

    def counted_load(self: ExpertRunner, layer: int, experts: list[int]):
        if self.phase == 1:
            lookups.append((layer, experts))
        return load(self, layer, experts)

    monkeypatch.setattr(ExpertRunner, "load", counted_load)
    runs = []
    for direct in (True, False):
        trace = tmp_path / f"{direct}.route.csv"
        cfg = EngineConfig(model=str(tiny_model), prompt_tokens=(3, 4, 5, 6), n_tokens=12,
                           resident=True, threads=2, route_trace=str(trace),
                           predict_prefetch=retention, predict_spec_max=0)
        lookups.clear()
        with Engine(cfg, tiny_model) as engine:
            assert isinstance(engine.runner.team, Partner)
            assert engine.runner.direct is not None
            if not direct:
                engine.runner.direct = None
            result = engine.run()
            counters = engine.runner.cache.counters
        assert bool(lookups) != direct  # the path under test was the one taken
        counts = [(r.phase, r.hits, r.misses, r.evictions, r.experts_routed, r.read_bytes,
                   r.retained) for r in result.records]
        runs.append((result.output_ids, counts, counters, trace.read_text()))
    (ids, counts, counters, text), slow = runs
    assert (ids, counts, counters, text) == slow
    assert all(hits == routed and not misses for phase, hits, misses, _, routed, _, _ in counts
               if phase == 1)
    assert any(r[-1] for r in counts) == retention


def test_an_input_computed_in_the_shared_block_gives_the_same_bits(setup) -> None:
    """`input(n)` is where a GEMV's input can be computed (the norms write there): one view
    per length, read as it is; any other array is copied there first."""
    p, bufs, mats = setup
    rng = np.random.default_rng(8)
    assert p.input(D) is p.input(D)
    for w in mats:
        x = rng.standard_normal(D).astype(np.float32)
        np.multiply(x, 1.0, p.input(D))  # computed in place, as rms_norm(..., out=) does
        np.testing.assert_array_equal(p.matvec(w, p.input(D)), matvec(w, x))
        np.testing.assert_array_equal(p.matvec(w, x * 2), matvec(w, x * 2))
        if split_rows(w):  # the partner took half of it: the input went to the shared block
            np.testing.assert_array_equal(p.input(D), x * 2)
    team = ComputeTeam(1, FF, K)
    x = rng.standard_normal(D).astype(np.float32)
    theirs = np.full((K, D), np.nan, np.float32)
    team.run([Job(j, b, None) for j, b in enumerate(bufs[:K])], x, theirs)
    np.multiply(x, 1.0, p.input(D))
    np.testing.assert_array_equal(p.run_resident(bufs[:K], p.input(D)), theirs)


def test_policies_set_between_tokens_take_effect_on_the_short_path(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode layer over the partner's complete cache takes `run_routed`'s short way only
    while no drop policy is set; the policies may change between runs or tokens (the P3/P4
    bench swaps them), and what follows takes the way the new ones call for."""
    selected = []  # decode layers that went through `select` (the long way)
    select = ExpertRunner.select

    def counted_select(self: ExpertRunner, layer: int, ids, weights, phase: int):
        if phase == 1:
            selected.append(layer)
        return select(self, layer, ids, weights, phase)

    monkeypatch.setattr(ExpertRunner, "select", counted_select)
    cfg = EngineConfig(model=str(tiny_model), prompt_tokens=(3, 4, 5, 6), n_tokens=6,
                       resident=True, threads=2, ignore_eos=True)
    runs = []
    with Engine(cfg, tiny_model) as engine:
        for policies in (Policies(), Policies(drop_frac=0.9), Policies()):
            engine.runner.policies = policies
            selected.clear()
            result = engine.run()
            runs.append((result.output_ids, len(selected)))
    n_layers = result.model["n_layer"]
    (plain, long_way), (dropping, dropped_way), (again, back) = runs
    assert long_way == back == 0
    assert dropped_way == n_layers * cfg.n_tokens  # every decode layer: a drop policy is set
    assert plain == dropping == again  # resident: nothing is cold, so nothing is dropped


def test_close_ends_the_child(setup) -> None:
    p, _, _ = setup
    pid = p._pid
    p.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no such child any more
    p.close()  # twice is harmless


@pytest.mark.parametrize("asleep", [False, True])
def test_a_dead_child_is_an_engine_error(setup, asleep: bool) -> None:
    p, _, mats = setup
    x = np.ones(D, np.float32)
    p.matvec(mats[0], x)
    if asleep:
        time.sleep(SPIN_S * 20)
    os.kill(p._pid, signal.SIGKILL)
    time.sleep(0.05)
    with pytest.raises(EngineError, match="partner process died"):
        p.matvec(mats[0], x)


CHILD_OF_A_DEAD_PARENT = """
import os, sys
import numpy as np
from abbench.engine.kernels.partner import Partner
p = Partner([np.ones((768, 48), np.float32)], [], 48, 32, 4)
print(p._pid, flush=True)
os._exit(0)  # dies without closing the partner
"""


def test_the_child_ends_when_its_parent_dies() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD_OF_A_DEAD_PARENT], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    pid = int(out.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the partner {pid} outlived its parent")


def test_a_prefill_batch_is_the_same_bits_as_the_callers(setup) -> None:
    p, bufs, _ = setup
    rng = np.random.default_rng(4)
    n, k = 5, 3
    p.close()
    p = Partner([], bufs, D, FF, k, max_rows=n)
    try:
        x = rng.standard_normal((n, D)).astype(np.float32)
        ids = np.array([rng.choice(len(bufs), k, replace=False) for _ in range(n)])
        tasks = [(bufs[e], np.flatnonzero(ids.ravel() == e)) for e in np.unique(ids)]
        ours, ref = np.full((n * k, D), np.nan, np.float32), np.full((n * k, D), np.nan,
                                                                     np.float32)
        assert p.run_rows(x, k, tasks, ours)
        for buf, slots in tasks:
            rows_task(buf, x, k, slots, ref)
        np.testing.assert_array_equal(ours, ref)
        assert not np.isnan(ours).any()  # every slot computed, half of them there
        # Declined, computing nothing: a batch past the shared block, an unknown expert.
        assert not p.run_rows(np.zeros((n + 1, D), np.float32), k, tasks, ours)
        stranger = buffers(np.random.default_rng(5), 1)[0]
        assert not p.run_rows(x, k, [(stranger, np.arange(2))], ours)
    finally:
        p.close()


def test_a_batch_through_a_dense_matrix_is_the_same_bits_as_the_callers_split(setup) -> None:
    p, bufs, mats = setup
    p.close()
    n = 7
    p = Partner(mats, bufs, D, FF, K, max_rows=n)
    rng = np.random.default_rng(6)
    try:
        with threadpool_limits(limits=1, user_api="blas"):  # as in a run: BLAS's threads
            for w in mats:  # change a GEMM's bits
                x = rng.standard_normal((n, D)).astype(np.float32)
                np.testing.assert_array_equal(p.matmul_t(x, w), matmul_t(x, w))
            more = rng.standard_normal((n + 1, D)).astype(np.float32)  # past the block
            np.testing.assert_array_equal(p.matmul_t(more, mats[0]), matmul_t(more, mats[0]))
    finally:
        p.close()


def _resident_kib(pid: int, start: int, size: int) -> int:
    """Rss of the mapping at `start` in process `pid` (/proc/PID/smaps), in KiB."""
    with open(f"/proc/{pid}/smaps") as f:
        lines = iter(f.read().splitlines())
    for line in lines:
        lo, _, rest = line.partition("-")
        if rest and int(lo, 16) == start and int(rest.split()[0], 16) - start == size:
            for field in lines:
                if field.startswith("Rss:"):
                    return int(field.split()[1])
    raise AssertionError(f"no mapping at {start:#x} in {pid}")


def test_the_shared_block_is_mapped_in_both_processes_before_the_first_pass() -> None:
    """Before any request, every page of the shared block (a prefill batch's megabytes)
    is in both page tables: no fault per 4 KiB during the first pass."""
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        probe.madvise(partner.MADV_POPULATE_WRITE)
    except OSError:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    finally:
        probe.close()
    rng = np.random.default_rng(7)
    p = Partner([rng.standard_normal((768, D)).astype(np.float32)], buffers(rng, 2), D, FF,
                K, max_rows=512)
    try:
        start = ctypes.addressof(ctypes.c_char.from_buffer(p._mm))
        size = -(-len(p._mm) // mmap.PAGESIZE) * mmap.PAGESIZE
        assert size >= 1 << 20  # big enough that touching only the control words shows
        for pid in (os.getpid(), p._pid):
            assert _resident_kib(pid, start, size) * 1024 == size, pid
    finally:
        p.close()
