"""The engine's run as llama.cpp users expect it: it stops at EOS unless told to ignore it
(campaign cells do), and the printed text hides control tokens."""

from __future__ import annotations

from pathlib import Path

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.session import Engine, RunResult

N_TOKENS = 96


def _run(path: Path, seed: int, ignore_eos: bool) -> RunResult:
    cfg = EngineConfig(model=str(path), prompt="Stop here", n_tokens=N_TOKENS, seed=seed,
                       cache_mib=0, ignore_eos=ignore_eos)
    with Engine(cfg, path) as engine:
        return engine.run()


def test_a_run_stops_at_eos_unless_it_ignores_it(tiny_model: Path) -> None:
    # Sampled runs of the random-weight model draw EOS now and then: find one that does.
    for seed in range(40):
        full = _run(tiny_model, seed, ignore_eos=True)
        if synth.EOS_ID in full.output_ids:
            break
    else:
        raise AssertionError("no seed of 40 sampled EOS in 96 tokens")
    first = full.output_ids.index(synth.EOS_ID)
    assert len(full.output_ids) == N_TOKENS  # --ignore-eos: all N, EOS included
    stopped = _run(tiny_model, seed, ignore_eos=False)
    # The same tokens up to EOS, and nothing after it (llama.cpp's default).
    assert stopped.output_ids == full.output_ids[:first + 1]
    assert len(stopped.decode) == first + 1
    # EOS is a control token: it is not printed.
    assert stopped.text_bytes == full.text_bytes[:len(stopped.text_bytes)]
    assert b"</s>" not in full.text_bytes
