"""Batched prefill (docs/engine.md#how-a-token-is-computed): the prompt as one batch per layer.

- Equal to token-by-token prefill up to float summation order: logits and every layer's
  keys and values within TOLERANCE of the token-by-token values (relative to their largest
  magnitude; measured here 1.4e-7 to 3.1e-7 on tiny, small and default, F32 rounding), and
  greedy tokens equal on the presets.
- Each routed expert is looked up and read once per layer for the whole batch: with the
  cache off, the batch's misses are the union of its tokens' routings, layer by layer.
- A prompt longer than PREFILL_BATCH runs as several batches with the same result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from abbench.engine.config import EngineConfig
from abbench.engine.kernels import partner
from abbench.engine.run import session
from abbench.engine.run.session import Engine, TokenRecord

TOLERANCE = 1e-5
PROMPT = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen jugs."


def _config(model: Path, **overrides: object) -> EngineConfig:
    settings: dict[str, object] = {"prompt": PROMPT, "n_tokens": 24, "temp": 0.0,
                                   "ignore_eos": True, "threads": 1, "resident": True}
    return EngineConfig(model=str(model), **(settings | overrides))


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _token_by_token(engine: Engine, tokens: list[int], pos: int, step: int) -> TokenRecord:
    """The reference: each prompt token through the decode path's forward pass."""

    def work() -> None:
        for i, t in enumerate(tokens):
            engine.model.forward(t, pos + i, 0)

    return engine._measure(step, 0, tokens, work, pos)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_batched_prefill_equals_token_by_token(preset: str,
                                               request: pytest.FixtureRequest) -> None:
    model: Path = request.getfixturevalue(f"{preset}_model")
    cfg = _config(model)
    with Engine(cfg, model) as batched, Engine(cfg, model) as reference:
        prompt = batched.prompt_ids
        n = len(prompt)
        assert n > 32
        batched.model.prefill(prompt[:-1], 0)
        for pos, t in enumerate(prompt[:-1]):
            reference.model.forward(t, pos, 0)
        logits = batched.model.forward(prompt[-1], n - 1, 1)
        expected = reference.model.forward(prompt[-1], n - 1, 1)
        assert _relative(logits, expected) <= TOLERANCE
        for mine, theirs in zip(batched.model.layers, reference.model.layers):
            a, b = mine.attention, theirs.attention
            assert _relative(a.k_cache[:, :n], b.k_cache[:, :n]) <= TOLERANCE
            assert _relative(a.v_cache[:, :n], b.v_cache[:, :n]) <= TOLERANCE


def _greedy(model: Path, monkeypatch: pytest.MonkeyPatch | None,
            **overrides: object) -> session.RunResult:
    with Engine(_config(model, **overrides), model) as engine:
        if monkeypatch is not None:
            monkeypatch.setattr(engine, "_prefill",
                                lambda tokens, pos, step: _token_by_token(engine, tokens, pos,
                                                                          step))
        return engine.run()


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_greedy_tokens_equal_token_by_token_prefill(preset: str,
                                                    request: pytest.FixtureRequest,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model: Path = request.getfixturevalue(f"{preset}_model")
    batched = _greedy(model, None)
    reference = _greedy(model, monkeypatch)
    assert len(batched.prefill) == 1 and batched.prefill[0].tokens == len(batched.prompt_ids) - 1
    assert batched.output_ids == reference.output_ids


@pytest.mark.slow
def test_greedy_tokens_equal_on_the_default_preset(default_model: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    batched = _greedy(default_model, None, n_tokens=16)
    reference = _greedy(default_model, monkeypatch, n_tokens=16)
    assert batched.output_ids == reference.output_ids


def test_each_expert_is_read_once_per_layer_for_the_batch(small_model: Path) -> None:
    routed: dict[int, set[int]] = {}
    cfg = _config(small_model, resident=False, cache_mib=0, n_tokens=2)
    with Engine(cfg, small_model) as engine:

        def hook(layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int,
                 *fused: np.ndarray) -> None:
            if phase == 0:
                assert ids.shape == (len(engine.prompt_ids) - 1, engine.model.k)
                routed[layer] = set(ids.ravel().tolist())

        engine.model.routing_hook = hook
        result = engine.run()
    (pre,) = result.prefill
    union = sum(len(experts) for experts in routed.values())
    assert len(routed) == result.model["n_layer"]
    assert pre.misses == union < pre.experts_routed == pre.tokens * len(routed) * engine.model.k
    assert pre.hits == 0 and pre.read_bytes == union * int(result.model["expert_bytes"])


def test_a_long_prompt_runs_in_batches(small_model: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _greedy(small_model, None)
    monkeypatch.setattr(session, "PREFILL_BATCH", 16)
    chunked = _greedy(small_model, None)
    n = len(whole.prompt_ids) - 1
    assert [r.tokens for r in chunked.prefill] == [16] * (n // 16) + [n % 16] * (n % 16 > 0)
    assert [r.step for r in chunked.prefill] == list(range(1, len(chunked.prefill) + 1))
    assert chunked.output_ids == whole.output_ids


@pytest.mark.parametrize("resident", [True, False])
def test_the_batch_is_the_same_bits_on_one_thread_or_two(small_model: Path,
                                                         resident: bool) -> None:
    """Two threads run the batch's experts on the partner process (resident) or the
    prefill threads (streaming): every expert's GEMMs are still one thread's, so the keys,
    values and logits are the very bits of one thread's."""
    extra: dict[str, object] = {} if resident else {"resident": False, "cache_mib": 64}
    one, two = _config(small_model, **extra), _config(small_model, threads=2, **extra)
    # BLAS on one thread, as `Engine.run` sets it (a GEMM's bits depend on BLAS's threads)
    with Engine(one, small_model) as a, Engine(two, small_model) as b, \
            threadpool_limits(limits=1, user_api="blas"):
        prompt = a.prompt_ids
        n = len(prompt)
        if resident and partner.supported():
            assert b.runner.team.max_rows == n - 1  # sized for this prompt's batch
        a.model.prefill(prompt[:-1], 0)
        b.model.prefill(prompt[:-1], 0)
        for mine, theirs in zip(a.model.layers, b.model.layers):
            np.testing.assert_array_equal(mine.attention.k_cache[:, :n],
                                          theirs.attention.k_cache[:, :n])
            np.testing.assert_array_equal(mine.attention.v_cache[:, :n],
                                          theirs.attention.v_cache[:, :n])
        np.testing.assert_array_equal(a.model.forward(prompt[-1], n - 1, 1),
                                      b.model.forward(prompt[-1], n - 1, 1))
