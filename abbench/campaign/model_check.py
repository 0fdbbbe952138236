"""What a campaign knows of its models before the first cell runs, and the checks of an
embedded cell against them.

The engine refuses a prompt id outside the vocabulary, a context past the model's and a
top-k above its expert count only when a cell opens the model; found there, every cell
fails and the campaign measures nothing. `ModelHeaders` reads each distinct model's header
once per campaign file (a header walk costs ~45 ms: a sweep of thousands of cells over one
model reads it once, not once per cell) and `cell_problems` makes the engine's checks on
what it gives.

A context is checked against the model's context length and, for a model file, against
the memory its allocations need on this machine now (`engine.models.check_context_memory`,
the engine's own check). A cache that holds no expert is named for any model; what a
model file's load, cache and context need together is checked against this machine's
room (`engine.memory`, as the engine checks it at start). A synthetic model's size beyond
its experts is known only once built, and a cell on an ssh host is checked there, by the
engine that runs it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.run.models import PREFIX, check_context_memory, parse_synthetic
from abbench.engine.streaming.memory import KEYS, ModelMemory, check, of_model, size, way_out
from abbench.engine.units import MIB
from abbench.errors import ConfigError, ModelFileError


@dataclass(frozen=True)
class ModelFacts:
    """The figures of one model that a cell's configuration must fit."""

    model: str  # as the cell names it: a synthetic spec, or the file's absolute path
    context_length: int
    vocab_size: int
    n_expert: int
    # Bytes a context of n positions allocates at load (`ModelArgs.context_bytes`); None
    # where not known without building the model (a synthetic one).
    context_bytes: Callable[[int], int] | None = field(default=None, compare=False)
    # What its experts and dense weights take (`engine.memory`), and the kernels
    # `--kernels auto` picks for it.
    memory: ModelMemory | None = field(default=None, compare=False)
    auto_kernels: str = "numpy"
    # Whether `memory` is the file's (its dense weights too): a synthetic model's experts
    # are known from its definition, the rest only once it is built.
    whole: bool = False


class ModelHeaders:
    """Each model's `ModelFacts`, read on first use and kept for the campaign file."""

    def __init__(self) -> None:
        self._facts: dict[str, ModelFacts] = {}

    def facts(self, model: str) -> ModelFacts:
        """Raises `UsageError` for an unknown synthetic preset and `ModelFileError` for a
        file the engine cannot read (each naming the model)."""
        if model not in self._facts:
            self._facts[model] = _read(model)
        return self._facts[model]


def _read(model: str) -> ModelFacts:
    if model.startswith(PREFIX):  # from its definition: nothing is built for a dry run
        name, seed = parse_synthetic(model)
        spec = synth.named(name, seed)
        vocab = synth.N_VOCAB if spec.tokenizer == "llama" else synth.BPE_VOCAB_SIZE
        quant = spec.expert_type != "F32"
        one = ModelMemory(expert_file_bytes(spec),
                          (spec.expert_bytes,) * spec.n_layer, spec.n_expert, 0, 0, 0)
        from abbench.engine.arch import GRAPHS

        return ModelFacts(model, spec.context_length, vocab, spec.n_expert, memory=one,
                          auto_kernels="ggml" if quant and spec.arch in GRAPHS else "numpy")
    # The model code only where a file is read (as engine.models.context_length does).
    from abbench.engine.arch import GRAPH_FOR_F32, GRAPHS, architecture
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.run.model_info import choose_kernels
    from abbench.engine.streaming.streamer import expert_layout

    try:
        mf = ModelFile(model)
        try:
            args = architecture(mf.architecture, mf.path).ModelArgs.from_file(mf)
            layout = expert_layout(mf, args.block_count, args.expert_count)
            mm = of_model(mf, layout)
            with warnings.catch_warnings():  # a description: a run warns of its own
                warnings.simplefilter("ignore", RuntimeWarning)
                auto = choose_kernels("auto", layout, mf.architecture in GRAPHS,
                                      mf.architecture in GRAPH_FOR_F32)
        finally:
            mf.close()
    except OSError as e:
        raise ModelFileError(f"{model}: cannot be read: {e.strerror or e}") from None
    except (ValueError, OverflowError) as e:  # what the header walk has no message for
        raise ModelFileError(f"{model}: not a model file the engine can read ({e})") from None
    return ModelFacts(model, args.context_length, args.vocab_size, args.expert_count,
                      args.context_bytes, mm, auto, whole=True)


def expert_file_bytes(spec: synth.SynthSpec) -> tuple[int, ...]:
    """One expert's bytes in each layer of a synthetic model's file (its three projections
    in the types `expert_type` gives them: a mix such as Q4_K_M gives some layers' down
    projections more bits), from the definition: nothing is built for a dry run."""
    from abbench.engine.synth.tensors import tensor_type

    d, ff = spec.d_model, spec.expert_ff

    def one(name: str, cols: int) -> int:
        block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[
            tensor_type(spec, name, spec.expert_type, cols)]]
        return (ff * d // block) * type_bytes

    return tuple(one(f"blk.{i}.ffn_gate_exps.weight", d) + one(f"blk.{i}.ffn_up_exps.weight", d)
                 + one(f"blk.{i}.ffn_down_exps.weight", ff) for i in range(spec.n_layer))


def cell_problems(config: EngineConfig, facts: ModelFacts) -> Iterator[tuple[str, str, str]]:
    """(TOML key, problem, tip) for each value of an embedded cell that its model cannot
    run — what `Engine` would refuse in the cell."""
    where = facts.model
    vocab, ctx, experts = facts.vocab_size, facts.context_length, facts.n_expert
    if config.prompt_tokens is not None:
        bad = [t for t in config.prompt_tokens if not 0 <= t < vocab]
        if bad:
            yield ("prompt_tokens", f"ids {bad[:5]} outside the model's vocabulary "
                   f"(0..{vocab - 1}: {where})", f"token ids from 0 to {vocab - 1}")
    k = config.n_expert_used
    if k is not None and k > experts:
        yield ("n_expert_used", f"{k} is more than the model's {experts} experts ({where})",
               f"at most {experts} on this model")
    if config.n_ctx is not None and config.n_ctx > ctx:
        yield ("n_ctx", f"{config.n_ctx} is more than the model's context ({ctx} tokens: "
               f"{where})", f"at most {ctx} on this model")
        return
    # A text prompt's length is known only once tokenized: it counts as one token here.
    prompt = len(config.prompt_tokens) if config.prompt_tokens is not None else 1
    need = prompt + config.n_tokens
    if need > ctx:
        what = (f"{config.n_tokens} tokens and a prompt" if config.prompt_tokens is None
                else f"{config.n_tokens} tokens and the prompt's {prompt}")
        yield ("tokens", f"{what} do not fit the model's context ({ctx} tokens: {where})",
               f"at most {ctx - prompt} tokens on this model")
        return
    if config.n_ctx is not None and need > config.n_ctx:
        what = ("a prompt" if config.prompt_tokens is None
                else f"the prompt's {prompt} tokens")
        yield ("n_ctx", f"{config.n_ctx} does not hold `tokens` ({config.n_tokens}) and "
               f"{what}", f"`n_ctx` of at least {need}, or none: the default holds both")
        return
    if facts.context_bytes is not None:
        n_ctx = config.n_ctx or need
        try:
            check_context_memory(facts.model, n_ctx, facts.context_bytes(n_ctx))
        except ConfigError as e:  # its tip names the engine's flags, not these keys
            key = "n_ctx" if config.n_ctx is not None else "tokens"
            yield (key, e.message, f"a smaller `{key}`: this machine has not the memory "
                   "for that context now")
            return
    if facts.memory is not None:
        yield from _memory_problems(config, facts, facts.memory, need)


def _memory_problems(config: EngineConfig, facts: ModelFacts, mm: ModelMemory,
                     need: int) -> Iterator[tuple[str, str, str]]:
    """A cache that holds no expert; what the cell's load and cache need against what
    this machine has now (a model file's: a synthetic one's size is known once built)."""
    kernels = facts.auto_kernels if config.kernels == "auto" else config.kernels
    one = mm.one_expert(kernels)
    form = ("as the file holds it, computed by ggml" if kernels == "ggml"
            else "in F32, as --kernels numpy computes it")
    if not config.resident and 0 < config.cache_mib * MIB < one:
        least = -(-one // MIB)
        yield ("cache_mib", f"{config.cache_mib:g} MiB holds no expert of {facts.model}: one "
               f"takes {size(one)} ({form}), so every expert would be read from disk as "
               "if there were no cache", f"at least {least} MiB holds one; 0 streams every "
               "expert with no cache")
        return
    if not facts.whole:
        return
    n_ctx = config.n_ctx or need
    context = facts.context_bytes(n_ctx) if facts.context_bytes is not None else 0
    pinned = config.dense == "pinned"
    needs = mm.needs(kernels, config.resident, config.cache_mib, pinned, context, n_ctx)
    try:
        check(facts.model, needs, lambda room: way_out(mm, kernels, config.resident,
                                                        pinned, context, n_ctx, room, KEYS))
    except ConfigError as e:
        yield ("resident" if config.resident else "cache_mib", e.message, e.tip or "")
