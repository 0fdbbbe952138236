"""What a run takes from its configuration and, where the configuration leaves it open,
from the model file: the experts used per token, the prompt's ids, the context size and
the sampling settings. Each is checked against the model here, before anything loads."""

from __future__ import annotations

from abbench.engine.config import MAX_REPEAT_LAST_N, MAX_REPEAT_PENALTY, EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.tokenizer import Tokenizer, tokenizer_for
from abbench.errors import ConfigError


def experts_used(config: EngineConfig, expert_count: int, stored: int) -> int:
    """`--n-expert-used`, else the model's own `stored` top-k; never more than it has."""
    k = config.n_expert_used or stored
    if k > expert_count:
        raise ConfigError(
            f"`--n-expert-used` {k} exceeds the model's {expert_count} experts"
        )
    return k


def prompt_of(config: EngineConfig, mf: ModelFile,
              vocab_size: int) -> tuple[list[int], Tokenizer | None]:
    """The prompt's token ids, and the tokenizer that made them (None for ids given as
    `--prompt-tokens`, which must lie in the vocabulary)."""
    if config.prompt_tokens is not None:
        bad = [t for t in config.prompt_tokens if not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(
                f"`--prompt-tokens`: ids {bad[:5]} outside the vocabulary "
                f"(0..{vocab_size - 1})"
            )
        return list(config.prompt_tokens), None
    tokenizer = tokenizer_for(mf)
    return tokenizer.encode(config.prompt), tokenizer


def context_size(config: EngineConfig, n_prompt: int, context_length: int) -> int:
    """`--ctx-size`, else just what the prompt and `-n` need; either within the model's."""
    need = n_prompt + config.n_tokens
    n_ctx = config.n_ctx or need
    if need > n_ctx or n_ctx > context_length:
        raise ConfigError(
            f"prompt ({n_prompt} tokens) + `-n` {config.n_tokens} = {need} "
            f"does not fit the context ({n_ctx} asked, model maximum {context_length})"
        )
    return n_ctx


def sampling_settings(config: EngineConfig, mf: ModelFile) -> tuple[float, float, int]:
    """(temperature, repetition penalty, its window): the configuration's, else the
    model's usable stored values, else 0 (greedy), 1.0 (off) and 64."""
    temp = config.temp
    if temp is None:
        stored = mf.get("general.sampling.temp")  # a file's: any type, any value
        usable = isinstance(stored, (int, float)) and not isinstance(stored, bool) \
            and 0 <= stored < float("inf")
        temp = float(stored) if usable else 0.0
    stored_penalty, stored_last_n = _stored_penalty(mf)
    repeat_penalty = (stored_penalty if config.repeat_penalty is None
                      else float(config.repeat_penalty))
    repeat_last_n = (stored_last_n if config.repeat_last_n is None
                     else int(config.repeat_last_n))
    return temp, repeat_penalty, repeat_last_n


def _stored_penalty(mf: ModelFile) -> tuple[float, int]:
    """The model's repetition penalty and window (`general.sampling.penalty_repeat`,
    `penalty_last_n`) where they are usable values, else 1.0 (off) and 64."""
    penalty, last_n = 1.0, 64
    value = mf.get("general.sampling.penalty_repeat")
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 0 < value <= MAX_REPEAT_PENALTY:
        penalty = float(f"{value:.7g}")  # stored as float32: 1.1, not 1.100000023841858
    value = mf.get("general.sampling.penalty_last_n")
    if isinstance(value, int) and 0 <= value <= MAX_REPEAT_LAST_N:
        last_n = value
    return penalty, last_n
