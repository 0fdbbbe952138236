"""The graph models' masks (`arch/shared/masks.py`): decode steps a sliding model's
masks and their F16 twins by a few cells instead of refilling them, with the same bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from abbench.engine import synth
from abbench.engine.architectures import TABLE, preset_name
from abbench.engine.config import EngineConfig
from abbench.engine.run.session import Engine


@pytest.mark.parametrize("name", [preset_name(a.name, "tiny") for a in TABLE
                                  if a.sliding_window])
def test_decode_steps_the_f16_masks_as_a_refill_would_make_them(
        tmp_path: Path, name: str) -> None:
    """Decode moves each mask by three cells and its F16 twin with it (no copy of the
    whole mask a token); refilled every step instead, the logits are the same to the bit,
    past the sliding window, and every twin is its mask in F16."""
    path = tmp_path / f"{name}.gguf"
    synth.write_model(synth.named(name), path)
    prompt = [int(t) for t in np.random.default_rng(5).integers(10, 200, 24)]
    cfg = EngineConfig(model=str(path), prompt_tokens=tuple(prompt), n_tokens=1, temp=0.0,
                       ignore_eos=True, threads=1, resident=True, kernels="ggml",
                       flash_attn=True)
    runs = []
    for refill in (False, True):
        with Engine(cfg, path) as engine:
            model = engine.model
            assert model.args.sliding_window < len(prompt) + 24
            model.prefill(prompt[:-1], 0)
            out, token = [], prompt[-1]
            for i in range(24):
                if refill:
                    model.sliding._decoded = None  # the step from the last pass forgotten
                out.append(model.forward(token, len(prompt) - 1 + i, 1))
                token = int(np.argmax(out[-1]))
            for mask, half in model._half.values():
                assert np.array_equal(half, mask.astype(np.float16))
        runs.append(np.array(out))
    assert np.array_equal(runs[0], runs[1])
