"""Parity with llama.cpp (docs/engine.md#tokens), against binaries built from source
(tests/llamacpp.py: the first run builds them, about 5 minutes on 2 cores, then they are
cached).

- The same text gives the same token ids as `llama-tokenize` on the same file, with the
  synthetic SentencePiece vocabulary and with the synthetic byte-level BPE one (`gpt2`,
  Qwen's `qwen2` pre-tokenizer).
- The same for gpt-oss's harmony vocabulary (the `gpt-4o` pre-tokenizer, its special tokens).
- `abbench engine run --show-text` prints, byte for byte, what `llama-completion` prints
  for the same prompt: 64 greedy tokens on the tiny, small and default presets (and tiny
  with the BPE vocabulary), and on gpt-oss's tiny and small files (its graph model: MXFP4
  experts computed in their type, as llama.cpp's graph), with
  llama.cpp's attention in F32 (`-fa off -ctk f32 -ctv f32`: its default flash attention
  rounds K/V to F16 and swaps near-tie routings; the engine's `--flash-attn` is held to
  it in tests/test_llamacpp_flash_attn.py). On the SentencePiece vocabulary (byte
  tokens and three control tokens) equal bytes are equal tokens; on the BPE one a token
  that differed would change every token after it.

- The same on quantized files (Q8_0, Q4_K_M, Q6_K; the small preset and the real
  Qwen3-30B-A3B geometry at 2 layers; gpt-oss tiny and small with MXFP4 experts, dense
  F32 or Q8_0), which the engine computes with ggml
  (`--kernels ggml`, llama.cpp's own graph): the text is llama-completion's, and the
  logits at every one of the 64 positions are llama.cpp's to the bit (max abs difference
  printed; against llama.cpp in this process, through llama-cpp-python). Both engines run
  them with `--no-repack` (by default each re-lays resident quantized weights for other
  kernels at load — llama.cpp to 8-row interleaved or AMX layouts, the engine to the
  former — which sum in another order; on this project's VM llama.cpp's AMX path dies of
  SIGILL in llama-completion) and llama.cpp with the engine's
  passes (`-b`/`-ub`: the prompt but its last token, then that token; a pass's size
  changes the bits in both engines alike).

Skipped, with the reason, only where no C++ toolchain exists.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llamacpp import LINGER_US, Unavailable, build, exit_linger

from abbench.engine import synth
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.text.tokenizer import tokenizer_for

pytestmark = pytest.mark.slow

TEXTS = ["Hello world", "naïve café – 東京 🚀", "  two  spaces  ", "3.14159 and 2026",
         "line\nbreak\ttab", "</s> control <s> tokens", "a",
         "<|endoftext|>it's <|im_start|>DON'T\n\n  x", "Ελληνικά русский 中文 🔥🔥"]
PROMPT = "The quick brown fox"
N_TOKENS = 64
# Pure greedy on both sides: the synthetic files carry sampling defaults (temperature 1,
# repeat penalty 1.1) that both engines would otherwise apply.
GREEDY = ("--temp", "0", "--repeat-penalty", "1")
# One thread on both sides: the comparison is of numerics, not of how a reduction splits.
THREADS = 1
# llama-completion prints tokens through an asynchronous logger that it never joins (its
# singleton is leaked by design, common/log.cpp), so its stdout can lose its tail at exit:
# two CI runs printed 35 of 64 tokens, exit status 0, and a third lost the tail of a tiny
# file's fast decode three times in a row. So it runs with `exit_linger` preloaded, which
# gives the logger's thread time to write its queue. Its last write is "\n\n"; the queue
# is written in order, so output ending in it is whole.
END = b"\n\n"
ATTEMPTS = 3


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    try:
        return build()
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny_bpe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset with the synthetic byte-level BPE vocabulary (`gpt2`, `qwen2`)."""
    path = tmp_path_factory.mktemp("bpe") / "tiny-bpe.gguf"
    synth.write_model(replace(synth.preset("tiny"), tokenizer="gpt2"), path)
    return path


@pytest.fixture(scope="module")
def gpt_oss_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpt-oss at the tiny size: YaRN, sinks, sliding layers, MXFP4 experts, the harmony
    vocabulary with the `gpt-4o` pre-tokenizer."""
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tiny.gguf"
    synth.write_model(synth.named("gpt-oss-tiny"), path)
    return path


@pytest.fixture(scope="module")
def gpt_oss_small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-small.gguf"
    synth.write_model(synth.named("gpt-oss-small"), path)
    return path


VOCAB_MODELS = {"spm": "tiny_model", "bpe": "tiny_bpe_model", "gpt-oss": "gpt_oss_tiny_model"}
# the harmony format's tokens and the `gpt-4o` split's cases (letters by case, digits by 3)
HARMONY = ["<|start|>assistant<|channel|>final<|message|>Hi<|end|>x<|return|>",
           "camelCase HTTPServer ALLCAPS DON'T", "caféÉTÉ e\u0301té 12345"]


@pytest.mark.parametrize("vocab,text", [(v, t) for v in VOCAB_MODELS for t in TEXTS]
                         + [("gpt-oss", t) for t in HARMONY])
def test_the_same_text_gives_llama_cpps_token_ids(llama_bin: Path, text: str, vocab: str,
                                                  request: pytest.FixtureRequest) -> None:
    model: Path = request.getfixturevalue(VOCAB_MODELS[vocab])
    assert tokenizer_for(ModelFile(model)).encode(text) == llama_token_ids(llama_bin, model,
                                                                            text)


def llama_token_ids(llama_bin: Path, model: Path, text: str) -> list[int]:
    """What llama-tokenize makes of `text` with `model`'s vocabulary."""
    out = subprocess.run([str(llama_bin / "llama-tokenize"), "-m", str(model), "-p", text,
                          "--ids"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def write_presets(folder: Path, names: tuple[str, ...]) -> dict[str, Path]:
    """The synthetic files of the presets `names`, written into `folder`, by name."""
    paths = {name: folder / f"{name}.gguf" for name in names}
    for name, path in paths.items():
        synth.write_model(synth.named(name), path)
    return paths


# llama.cpp's attention: in F32, as the engine computes it by default, or its default
# flash attention over an F16 cache (the engine's --flash-attn)
F32_ATTENTION = ("-fa", "off", "-ctk", "f32", "-ctv", "f32")
FLASH_ATTENTION = ("-fa", "on")


def _llama_completion(llama_bin: Path, model: Path, *extra: str, flash: bool = False
                      ) -> bytes:
    attention = FLASH_ATTENTION if flash else F32_ATTENTION
    for _ in range(ATTEMPTS):
        out = subprocess.run(
            [str(llama_bin / "llama-completion"), "-m", str(model), "-p", PROMPT,
             "-n", str(N_TOKENS), *GREEDY, *attention,
             "--ignore-eos", "--no-display-prompt", "-no-cnv", "-t", str(THREADS), "-s", "0",
             *extra],
            capture_output=True, timeout=600, env=_lingering_env())
        assert out.returncode == 0, out.stderr[-2000:]
        if out.stdout.endswith(END):
            return out.stdout.removesuffix(END)
    pytest.fail(f"llama-completion's stdout was cut short {ATTEMPTS} times "
                f"(last: {out.stdout[-80:]!r})")


def _lingering_env() -> dict[str, str]:
    """This process's environment with `exit_linger` preloaded, where it can be built."""
    env = dict(os.environ)
    linger = exit_linger()
    if linger is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, (env.get("LD_PRELOAD"), str(linger))))
    return env


def test_the_exit_linger_holds_exit_back_and_changes_no_output() -> None:
    linger = exit_linger()
    if linger is None:
        pytest.skip("no C compiler to build the exit linger")
    argv = [sys.executable, "-c", "print('whole')"]
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, env=_lingering_env(), timeout=60)
    held = time.perf_counter() - start
    assert out.returncode == 0 and out.stdout == b"whole\n"
    assert held >= LINGER_US / 1e6  # usleep sleeps at least that long


def _abbench_text(model: Path, *extra: str) -> bytes:
    out = subprocess.run(
        [sys.executable, "-m", "abbench", "engine", "run", "-m", str(model), "-p", PROMPT,
         "-n", str(N_TOKENS), *GREEDY, "--ignore-eos", "--threads", str(THREADS),
         "--no-repack", "--show-text", "-q", *extra],
        capture_output=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.removesuffix(b"\n")


@pytest.mark.parametrize("preset", ["tiny", "small", "default", "tiny_bpe", "gpt_oss_tiny",
                                    "gpt_oss_small"])
def test_64_greedy_tokens_print_what_llama_completion_prints(
        llama_bin: Path, preset: str, request: pytest.FixtureRequest) -> None:
    model: Path = request.getfixturevalue(f"{preset}_model")
    ours = _abbench_text(model)  # gpt-oss: `--kernels auto` takes its graph model (MXFP4)
    theirs = _llama_completion(llama_bin, model, *(
        ("--no-repack",) if preset.startswith("gpt_oss") else ()))
    assert theirs == ours, (ours, theirs)
    assert ours  # the tokens printed something: equal empty outputs would prove nothing


# (geometry, type): the small preset, and the real shape at 2 layers; gpt-oss's tiny and
# small presets with their MXFP4 experts, the dense matrices F32 (`MXFP4`) or Q8_0 as
# llama-quantize's MXFP4_MOE mix makes them (`MXFP4_MOE`)
QUANTIZED = [("small", "Q8_0"), ("small", "Q4_K_M"), ("small", "Q6_K"),
             ("qwen3-30b-a3b", "Q8_0"), ("qwen3-30b-a3b", "Q4_K_M"), ("qwen3-30b-a3b", "Q6_K"),
             ("gpt-oss-tiny", "MXFP4"), ("gpt-oss-small", "MXFP4"),
             ("gpt-oss-tiny", "MXFP4_MOE"), ("gpt-oss-small", "MXFP4_MOE")]
GPT_OSS_DENSE = {"MXFP4": "F32", "MXFP4_MOE": "Q8_0"}


@pytest.fixture(scope="module")
def quantized_models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    return {}


def _quantized(models: dict[tuple[str, str], Path], folder: Path, geometry: str,
               qtype: str) -> Path:
    """The file, written once per module (every matrix in `qtype`, or by the mix's rules)."""
    key = (geometry, qtype)
    if key not in models:
        path = folder / f"{geometry}-{qtype}.gguf"
        if geometry.startswith("gpt-oss"):
            spec = replace(synth.named(geometry), dense_type=GPT_OSS_DENSE[qtype])
        else:
            spec = replace(synth.preset("small") if geometry == "small"
                           else synth.shape(geometry, 2), expert_type=qtype, dense_type=qtype)
        synth.write_model(spec, path)
        models[key] = path
    return models[key]


def _greedy(llm: Any, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp's greedy continuation of `prompt` by `llm` (a llama-cpp-python Llama,
    closed after), its prompt evaluated at once and then a token a pass → the prompt and
    the n tokens chosen, and the logits (vocab,) at the last prompt position and the n-1
    after."""
    seq = list(prompt)
    llm.eval(seq)
    theirs = []
    for _ in range(n):
        logits = np.array(llm.scores[len(seq) - 1], np.float32)
        theirs.append(logits)
        seq.append(int(np.argmax(logits)))
        llm.eval(seq[-1:])
    llm.close()
    return seq, theirs


def numpy_logits(model: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's greedy continuation of PROMPT and its logits at the last prompt position
    and the n-1 after (`_greedy`); then the numpy model's at the same positions (its prompt
    prefilled, the rest decoded) → ours (n, vocab), theirs (n, vocab)."""
    import llama_cpp.llama as high

    from abbench.engine.config import EngineConfig
    from abbench.engine.run.session import Engine

    prompt = tokenizer_for(ModelFile(model)).encode(PROMPT)
    llm = high.Llama(model_path=str(model), n_ctx=256, n_threads=THREADS,
                     n_threads_batch=THREADS, logits_all=True, flash_attn=False,
                     type_k=0, type_v=0, verbose=False)
    seq, theirs = _greedy(llm, prompt, n)
    cfg = EngineConfig(model=str(model), prompt_tokens=tuple(seq), n_tokens=1,
                       n_ctx=len(seq) + 1, ignore_eos=True, threads=THREADS, kernels="numpy")
    with Engine(cfg, model) as engine:
        engine.model.prefill(seq[: len(prompt) - 1], 0)
        ours = [engine.model.forward(t, pos, 1)
                for pos, t in enumerate(seq[:-1]) if pos >= len(prompt) - 1]
    return np.array(ours), np.array(theirs)


def _max_logit_difference(model: Path, n: int, flash: bool = False) -> float:
    """llama.cpp's greedy continuation of PROMPT (in this process: llama-cpp-python over the
    same ggml, weights not re-laid), then the engine's logits at every position of it: the
    largest absolute difference over the n decode positions. flash: both with flash
    attention over an F16 cache (llama.cpp's default, the engine's --flash-attn)."""
    import llama_cpp
    import llama_cpp.llama as high

    from abbench.engine.config import EngineConfig
    from abbench.engine.run.session import Engine

    def plain_weights() -> object:  # as llama-completion --no-repack
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = False
        return params

    prompt = tokenizer_for(ModelFile(model)).encode(PROMPT)
    original = high.llama_cpp.llama_model_default_params
    high.llama_cpp.llama_model_default_params = plain_weights
    try:
        attention = {"flash_attn": True} if flash else {"flash_attn": False, "type_k": 0,
                                                        "type_v": 0}  # 0: F32
        llm = high.Llama(model_path=str(model), n_ctx=256, n_threads=THREADS,
                         n_threads_batch=THREADS, logits_all=True, verbose=False, n_batch=1,
                         n_ubatch=1, **attention)  # type: ignore[arg-type]
    finally:
        high.llama_cpp.llama_model_default_params = original
    seq, theirs = _greedy(llm, prompt, n)
    cfg = EngineConfig(model=str(model), prompt_tokens=tuple(seq), n_tokens=1,
                       n_ctx=len(seq) + 1, ignore_eos=True, threads=THREADS, kernels="ggml",
                       repack=False, flash_attn=flash)
    with Engine(cfg, model) as engine:
        ours = [engine.model.forward(t, pos, 1) for pos, t in enumerate(seq[:-1])]
    return float(np.abs(np.array(ours[len(prompt) - 1 :]) - np.array(theirs)).max())


@pytest.mark.parametrize("geometry,qtype", QUANTIZED)
def test_a_quantized_file_decodes_as_llama_cpp_decodes_it(
        llama_bin: Path, quantized_models: dict[tuple[str, str], Path],
        tmp_path_factory: pytest.TempPathFactory, geometry: str, qtype: str) -> None:
    folder = tmp_path_factory.getbasetemp() / "quantized"
    folder.mkdir(exist_ok=True)
    model = _quantized(quantized_models, folder, geometry, qtype)
    decodes_as_llama_cpp(llama_bin, model, f"{geometry} {qtype}")


def decodes_as_llama_cpp(llama_bin: Path, model: Path, label: str, *extra: str,
                         drop_nul: bool = False, flash: bool = False) -> None:
    """The engine's greedy text (`extra`: its options) is llama-completion's, both
    `--no-repack`, and its logits at all N_TOKENS positions are llama.cpp's to the bit.
    llama.cpp runs the passes the engine makes: the prompt but its last token in one
    batch, then that token alone (a pass's token count picks ggml's kernels, and a GEMM
    over several tokens sums in another order than a GEMV: both engines' bits depend on
    it), then the decode steps. drop_nul: the engine's NUL bytes set aside (llama.cpp's
    logger cannot print them). flash: both with flash attention over an F16 cache
    (llama.cpp's default; the engine's --flash-attn)."""
    ours = _abbench_text(model, *extra, *(("--flash-attn",) if flash else ()))
    n = len(tokenizer_for(ModelFile(model)).encode(PROMPT))
    theirs = _llama_completion(llama_bin, model, "--no-repack", "-b", str(n - 1), "-ub",
                               str(n - 1), flash=flash)
    assert theirs == (ours.replace(b"\x00", b"") if drop_nul else ours), (ours, theirs)
    assert ours
    diff = _max_logit_difference(model, N_TOKENS, flash)
    print(f"{label}: logits' max abs difference over {N_TOKENS} positions {diff}")
    assert diff == 0.0
