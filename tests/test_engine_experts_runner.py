"""The MoE block's expert steps: `select` (the drop policy's choice) and the call (lookups,
reads, the experts), and what a failed read leaves behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from abbench.engine.experts.policies import Policies
from abbench.engine.experts.runner import ExpertRunner
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import model_info
from abbench.engine.streaming.streamer import SliceReader, expert_layout
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
