"""The engine's run as llama.cpp users expect it: it stops at EOS unless told to ignore it
(campaign cells do), and the printed text hides control tokens."""

from __future__ import annotations

from pathlib import Path

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.run.session import Engine, RunResult

N_TOKENS = 96


def _run(path: Path, seed: int, ignore_eos: bool) -> RunResult:
    cfg = EngineConfig(model=str(path), prompt="Stop here", n_tokens=N_TOKENS, seed=seed,
                       cache_mib=0, ignore_eos=ignore_eos)
    with Engine(cfg, path) as engine:
        return engine.run()


def test_a_run_stops_at_eos_unless_it_ignores_it(tiny_model: Path) -> None:
    # Sampled runs of the random-weight model draw EOS now and then: find one that does.
    for seed in range(40):
        stopped = _run(tiny_model, seed, ignore_eos=False)
        if len(stopped.output_ids) < N_TOKENS:
            break
    else:
        raise AssertionError("no seed of 40 sampled EOS in 96 tokens")
    # Stopped at EOS, as llama.cpp stops by default; the EOS itself is the last token.
    assert stopped.output_ids[-1] == synth.EOS_ID
    assert synth.EOS_ID not in stopped.output_ids[:-1]
    assert len(stopped.decode) == len(stopped.output_ids)
    # --ignore-eos: all N tokens, and EOS never among them (llama.cpp bans it: a logit
    # bias of -inf), so what it sampled is never a token the model ends on.
    full = _run(tiny_model, seed, ignore_eos=True)
    assert len(full.output_ids) == N_TOKENS
    assert synth.EOS_ID not in full.output_ids
    # EOS is a control token: it is not printed.
    assert b"</s>" not in stopped.text_bytes
