"""The MoE block's expert steps: `select` (the drop policy's choice) and the call (lookups,
reads, the experts), and what a failed read leaves behind."""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.experts.policies import Policies
from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine, model_info
from abbench.engine.streaming.streamer import ReadTicket, SliceReader, expert_layout
from abbench.errors import EngineError


def runner(path: Path, overlap: bool = False, policies: Policies | None = None) -> ExpertRunner:
    mf = ModelFile(path)
    info = model_info(mf)
    layout = expert_layout(mf, int(info["n_layer"]), int(info["n_expert"]))
    return ExpertRunner(mf, layout, cache_mib=64, resident=False, io_lanes=2, o_direct=False,
                        overlap=overlap, threads=1, max_k=4, policies=policies)


@pytest.mark.filterwarnings("ignore:--drop-cold-experts with top-:RuntimeWarning")
def test_select_keeps_the_routing_and_the_choice(tiny_model: Path) -> None:
    r = runner(tiny_model, policies=Policies(drop_frac=0.75))
    try:
        ids, w = np.array([3, 5, 1, 6]), np.array([0.12, 0.55, 0.25, 0.08], np.float32)
        chosen = r.select(0, ids, w, 0)  # prefill: no dropping by default
        assert chosen.keep is None and chosen.experts == [3, 5, 1, 6]
        assert chosen.weights is w
        chosen = r.select(0, ids, w, 1)
        assert chosen.routed == [3, 5, 1, 6] and chosen.routed_weights is w
        assert chosen.keep == [False, True, True, False] and chosen.experts == [5, 1]
        np.testing.assert_allclose(chosen.weights, [0.55 / 0.8, 0.25 / 0.8], rtol=1e-6)
        assert (r.tok.experts_routed, r.tok.experts_dropped) == (8, 2)
        y = r(0, np.ones(64, np.float32), chosen, 1)
        assert y.shape == (2, 64) and r.tok.misses == 2
    finally:
        r.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failed_read_leaves_no_entry_behind(tiny_model: Path, tmp_path: Path,
                                              overlap: bool) -> None:
    """The error reaches the caller; the expert it was read for is not resident after it,
    and the runner goes on serving the experts the file still holds."""
    path = tmp_path / "cut.gguf"
    shutil.copyfile(tiny_model, path)
    le = expert_layout(ModelFile(tiny_model), 4, 8)[3]
    os.truncate(path, max(s.offset for s in le.slices(7)) + 100)  # inside expert 7's last
    r = runner(tiny_model, overlap)
    r.reader.close()
    r.reader = SliceReader(path, 2, False)  # the model file checks its size: cut it later
    x = np.ones(le.d, np.float32)
    one = np.array([1.0], np.float32)
    try:
        with pytest.raises(EngineError, match="expert read failed"):
            r(3, x, r.select(3, np.array([0, 7]), np.array([0.5, 0.5], np.float32), 1), 1)
        assert not r.cache.peek((3, 7))
        y = r(3, x, r.select(3, np.array([0]), one, 1), 1)
        assert y.shape == (1, le.d) and np.isfinite(y).all()
    finally:
        r.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failed_read_in_a_prefill_batch_leaves_no_entry_behind(tiny_model: Path,
                                                                 tmp_path: Path,
                                                                 threads: int) -> None:
    """The batch's experts run on `threads` threads: the error still reaches the caller,
    after every expert of the batch has finished, and the failed one is not resident."""
    path = tmp_path / "cut.gguf"
    shutil.copyfile(tiny_model, path)
    le = expert_layout(ModelFile(tiny_model), 4, 8)[3]
    os.truncate(path, max(s.offset for s in le.slices(7)) + 100)  # inside expert 7's last
    r = runner(tiny_model, overlap=True)
    r.threads = threads
    r.reader.close()
    r.reader = SliceReader(path, 2, False)
    x = np.ones((3, le.d), np.float32)  # (n, d)
    ids = np.array([[0, 7], [1, 0], [2, 1]])  # (n, k): expert 7 in the first token's routing
    w = np.full((3, 2), 0.5, np.float32)
    try:
        with pytest.raises(EngineError, match="expert read failed"):
            r.prefill(3, x, ids, w)
        assert not r.cache.peek((3, 7))
        y = r.prefill(3, x, ids[:, ::-1][:, 1:], w[:, :1])  # experts 0, 1, 2: still served
        assert y.shape == (3, le.d) and np.isfinite(y).all()
    finally:
        r.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_a_speculative_read_under_way_for_a_routed_expert_is_adopted(tiny_model: Path,
                                                                    overlap: bool) -> None:
    """Settling before a layer leaves a speculative read still in flight for an expert
    the layer routed to go on: the layer waits for it as it lands instead of cancelling
    it and reading the expert again. It is read once, counted as speculation's, and the
    output is the bits of the same expert read as a miss; one not routed is cancelled."""
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    w = np.array([0.6, 0.4], np.float32)
    plain = runner(tiny_model, overlap)
    try:
        want = plain(2, x, plain.select(2, np.array([5, 1]), w, 1), 1).copy()
    finally:
        plain.close()
    r = runner(tiny_model, overlap, Policies(predict_prefetch=True, spec_max=2))
    try:
        held = {}
        for e in (5, 6):  # speculative reads of layer 2's experts 5 and 6, not yet started
            buf, cached = r.cache.admit((2, e), r.kinds[2], set(), speculative=True)
            assert cached
            held[e] = ReadTicket(r.slices(2, e), buf)
            r.spec.pending.append(((2, e), held[e]))
        # The lanes get both reads only once settling has begun (the timer).
        lands = threading.Timer(0.2, lambda: [r.reader._queue.put((t, s)) for t in
                                               held.values() for s in t.slices])
        lands.start()
        chosen = r.select(2, np.array([5, 1]), w, 1)
        assert list(r.spec.adopted) == [(2, 5)] and not r.spec.pending
        assert held[6].cancelled and not r.cache.peek((2, 6))  # not routed: cancelled
        assert r.tok.spec_cancelled == 1
        y = r(2, x, chosen, 1)
        lands.join()
        np.testing.assert_array_equal(y, want)
        assert r.tok.misses == 1 and r.tok.hits == 1  # expert 1 read; 5 a speculation's hit
        assert r.tok.spec_useful == 1 and r.tok.spec_experts == 1 and not r.spec.adopted
        assert r.tok.spec_read_bytes == held[5].nbytes > 0
        assert r.tok.read_bytes < 2 * held[5].nbytes  # expert 5 was not read again
    finally:
        r.close()


def _present_pages(address: int, nbytes: int) -> int:
    """How many of the pages over [address, address + nbytes) are in memory now: bit 63 of
    each page's entry in /proc/self/pagemap (readable without privileges)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = address // page, (address + nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = np.frombuffer(f.read((last - first + 1) * 8), np.uint64)
    return int(np.count_nonzero(raw >> np.uint64(63)))


@pytest.mark.parametrize("expert_type", ["F32", "Q8_0"])
def test_closing_gives_the_caches_memory_back(tmp_path: Path, expert_type: str) -> None:
    """A closed runner's expert buffers leave the process's memory as it closes, not when
    Python's collector finds what holds them (an engine's objects refer to each other)."""
    path = tmp_path / f"small-{expert_type}.gguf"
    synth.write_model(replace(synth.preset("small"), expert_type=expert_type), path)
    with Engine(EngineConfig(model=str(path), prompt_tokens=(5, 9, 30), n_tokens=4,
                             ignore_eos=True, cache_mib=64, overlap=True), path) as engine:
        engine.run()
        held = [(b.data.ctypes.data, b.data.nbytes)
                for b in engine.runner.cache.entries.values()]
        assert held and all(_present_pages(*b) > 0 for b in held)
    assert sum(_present_pages(*b) for b in held) == 0
