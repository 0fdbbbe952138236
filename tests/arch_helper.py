"""What the architecture tests (tests/test_engine_arch_*.py) share: a model file missing one
header key, a tiny file's numpy engine, the sliding-window check on a numpy model, batched
prefill against token-by-token on a file with sliding layers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine
from abbench.errors import ModelFileError


class Without:
    """A model file whose header lacks `key` (the rest is the file's)."""

    def __init__(self, mf: ModelFile, key: str) -> None:
        self.mf, self.key = mf, key

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mf, name)

    def get(self, key: str, default: Any = None) -> Any:
        return default if key == self.key else self.mf.get(key, default)

    def array(self, key: str) -> Any:
        return None if key == self.key else self.mf.array(key)

    def require(self, key: str) -> Any:
        if key == self.key:
            raise ModelFileError(f"{self.mf.path}: missing metadata key `{key}`")
        return self.mf.require(key)


@contextmanager
def numpy_engine(path: Path) -> Iterator[Engine]:
    """The numpy model of `path`, resident, one thread, on a short prompt (64 greedy
    tokens)."""
    cfg = EngineConfig(model=str(path), prompt="The quick brown fox jumps over it",
                       n_tokens=64, temp=0.0, ignore_eos=True, threads=1, resident=True,
                       kernels="numpy")
    with Engine(cfg, path) as engine:
        yield engine


def check_the_window(model: Any, full_layer: int, window: int = 16) -> None:
    """Layer 0 of the numpy `model` slides (`window`): what is in its cache further back
    than the window does not change its output; `full_layer` attends in full, and it
    does."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, model.args.embedding_length)).astype(np.float32)
    pos = 40
    for layer, sees_old in ((0, False), (full_layer, True)):
        att = model.layers[layer].attention
        cos, sin = (t[pos:pos + 1] for t in model.tables[model.layers[layer].swa])
        att.k_cache[:, :pos] = rng.standard_normal(att.k_cache[:, :pos].shape)
        att.v_cache[:, :pos] = rng.standard_normal(att.v_cache[:, :pos].shape)
        before = att(x, pos, cos, sin)
        att.k_cache[:, : pos - window] += 1.0  # only what lies beyond the window
        att.v_cache[:, : pos - window] += 1.0
        assert np.array_equal(att(x, pos, cos, sin), before) != sees_old


def check_batched_prefill(path: Path) -> None:
    """The numpy model of `path` (sliding window 16) prefilling a prompt past the window as
    one batch gives the last token's logits token-by-token prefill gives, within 1e-5 of
    their largest."""
    cfg = EngineConfig(model=str(path), prompt="The quick brown fox jumps over the "
                       "lazy dog, and the dog sleeps in the sun all afternoon long.",
                       n_tokens=4, temp=0.0, ignore_eos=True, threads=1, resident=True,
                       kernels="numpy")
    with Engine(cfg, path) as batched, Engine(cfg, path) as reference:
        prompt = batched.prompt_ids
        n = len(prompt)
        assert n > 16  # past a sliding layer's window
        batched.model.prefill(prompt[:-1], 0)
        for pos, t in enumerate(prompt[:-1]):
            reference.model.forward(t, pos, 0)
        logits = batched.model.forward(prompt[-1], n - 1, 1)
        expected = reference.model.forward(prompt[-1], n - 1, 1)
        assert np.abs(logits - expected).max() <= 1e-5 * np.abs(expected).max()
