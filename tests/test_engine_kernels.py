"""The engine on quantized files (`--kernels`): computed in the file's own types by ggml,
against the float64 reference (test_reference.py), the numpy path, and itself."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main
from test_reference import forward, load

from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.kernels import ggml
from abbench.engine.run.session import Engine, model_info

MIB = 1 << 20
N_POSITIONS = 12


@pytest.fixture(scope="module")
def q4km_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small preset as a Q4_K_M file (gate/up Q4_K; the down rows of 128 values fall
    back to Q5_0 / Q8_0 as llama-quantize's do; attn_v and output Q6_K)."""
    path = tmp_path_factory.mktemp("quant") / "small-q4km.gguf"
    synth.write_model(replace(synth.preset("small"), expert_type="Q4_K_M",
                              dense_type="Q4_K_M"), path)
    return path


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quant") / "small-q8.gguf"
    synth.write_model(replace(synth.preset("small"), expert_type="Q8_0", dense_type="Q8_0"),
                      path)
    return path


def logits_of(path: Path, tokens: list[int], **config: object) -> np.ndarray:
    cfg = EngineConfig(model=str(path), prompt_tokens=tuple(tokens), n_tokens=1,
                       n_ctx=len(tokens) + 1, ignore_eos=True, **config)  # type: ignore[arg-type]
    with Engine(cfg, path) as engine:
        return np.stack([engine.model.forward(t, pos, 1) for pos, t in enumerate(tokens)])


def test_the_file_holds_the_mix_llama_quantize_writes(q4km_model: Path) -> None:
    mf = ModelFile(q4km_model)
    types = {n: t.type_name for n, t in mf.tensors.items()}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.attn_q.weight"] == "Q4_K"
    assert types["output.weight"] == "Q6_K"
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.0.attn_norm.weight"] == "F32"
    more = [i for i in range(8) if synth.use_more_bits(i, 8)]
    assert more == [0, 3, 6, 7]
    for i in range(8):
        assert types[f"blk.{i}.attn_v.weight"] == ("Q6_K" if i in more else "Q4_K")
        assert types[f"blk.{i}.ffn_down_exps.weight"] == ("Q8_0" if i in more else "Q5_0")


@pytest.mark.parametrize("which", ["q8_model", "q4km_model"])
@pytest.mark.parametrize("streaming", [{"cache_mib": 0}, {"resident": True}],
                         ids=["cache-off", "resident"])
def test_logits_match_the_reference_to_the_inputs_quantization(
        which: str, streaming: dict[str, object], request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(which)
    ref = load(path)
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 259, N_POSITIONS)]
    want = forward(ref, tokens).logits
    got = logits_of(path, tokens, kernels="ggml", **streaming)
    scale = float(np.abs(want).max())
    # ggml quantizes each GEMV's input per block (Q8_K / Q8_0) as llama.cpp does; the F32
    # path matches the reference to 1e-4 (test_reference.py), this one to about 1%.
    assert np.abs(got - want).max() < 0.03 * scale
    numpy_path = logits_of(path, tokens, kernels="numpy", **streaming)
    assert np.abs(numpy_path - want).max() < 1e-3 * scale
    assert not np.array_equal(got, numpy_path)  # two computations, not one


@pytest.mark.parametrize("repack", [False, True], ids=["plain", "repacked"])
@pytest.mark.parametrize("speculation", [{}, {"predict_prefetch": True, "predict_spec_max": 4}],
                         ids=["reads", "speculated"])
def test_streaming_and_resident_give_the_same_bits(q4km_model: Path, repack: bool,
                                                   speculation: dict[str, object]) -> None:
    """A miss computed as its read lands (one expert a graph), a speculative read that
    joined the cache, and a resident expert (a layer's experts in one graph) give the same
    bits: routing sums do not depend on what was resident. With `--repack` every slot is
    re-laid as its read is first waited for, streamed as at load, so all run the same
    kernels."""
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, 259, N_POSITIONS)]
    resident = logits_of(q4km_model, tokens, kernels="ggml", resident=True, repack=repack)
    info = model_info(ModelFile(q4km_model))
    budget = 6 * max(info["expert_resident_bytes"]) / MIB  # a few experts: misses every layer
    cfg = dict(kernels="ggml", cache_mib=budget, overlap=True, repack=repack, **speculation)
    streamed = logits_of(q4km_model, tokens, **cfg)
    np.testing.assert_array_equal(streamed, resident)


def test_a_streaming_run_maps_its_budget_in_at_load_and_a_resident_one_does_not(
        q4km_model: Path) -> None:
    """The runner hands its slot pools the streaming cache's budget (`slots.fault_in`):
    each pool's share is mapped before the first read, within the budget; a resident run
    maps nothing ahead (its preload writes every slot)."""
    info = model_info(ModelFile(q4km_model))
    budget = 10 * max(info["expert_resident_bytes"])
    base = dict(model=str(q4km_model), prompt_tokens=(5, 9), n_tokens=1, kernels="ggml")
    with Engine(EngineConfig(cache_mib=budget / MIB, **base), q4km_model) as engine:  # type: ignore[arg-type]
        pools = list(dict.fromkeys(engine.runner.kinds))
        assert all(p.faulted > 0 for p in pools)  # type: ignore[attr-defined]
        mapped = sum(p.faulted * p.nbytes for p in pools)  # type: ignore[attr-defined]
        assert budget - len(pools) * max(p.nbytes for p in pools) < mapped <= budget
    with Engine(EngineConfig(resident=True, **base), q4km_model) as engine:  # type: ignore[arg-type]
        assert all(p.faulted == 0 for p in engine.runner.kinds)  # type: ignore[attr-defined]


def test_a_resident_ggml_run_takes_the_short_way_and_counts_as_the_general_one(
        q4km_model: Path) -> None:
    """With every expert resident, the ggml team runs a layer's experts by their buffers
    (`QuantTeam.run_resident`) rather than through the lookups: the same tokens, and the
    same hits and routed experts counted, as the general path over the same cache."""
    cfg = EngineConfig(model=str(q4km_model), prompt_tokens=(5, 9, 30, 41), n_tokens=6,
                       temp=0.0, ignore_eos=True, kernels="ggml", resident=True,
                       repack=False, threads=1)
    with Engine(cfg, q4km_model) as engine:
        assert engine.runner.direct is not None
        short = engine.run()
        engine.runner.direct = None
        general = engine.run()
    assert short.output_ids == general.output_ids
    counted = ("experts_routed", "hits", "misses")
    assert [[getattr(t, c) for c in counted] for t in short.records] == \
        [[getattr(t, c) for c in counted] for t in general.records]


def test_repacked_weights_give_the_same_results_to_rounding(q4km_model: Path) -> None:
    """--repack (the default) lays resident Q4_K weights out for ggml's repacked kernels
    where this CPU has them, as llama.cpp does: other kernels, the same products."""
    tokens = [int(t) for t in np.random.default_rng(6).integers(0, 259, N_POSITIONS)]
    plain = logits_of(q4km_model, tokens, kernels="ggml", resident=True, repack=False)
    cfg = EngineConfig(model=str(q4km_model), prompt_tokens=tuple(tokens), n_tokens=1,
                       n_ctx=N_POSITIONS + 1, ignore_eos=True, kernels="ggml", resident=True)
    with Engine(cfg, q4km_model) as engine:
        repacked = np.stack([engine.model.forward(t, pos, 1) for pos, t in enumerate(tokens)])
        info = engine.kernel_info()
    assert np.abs(repacked - plain).max() < 0.03 * np.abs(plain).max()
    if info["repacked"]["experts"] or info["repacked"]["dense"]:  # this CPU has layouts
        assert not np.array_equal(repacked, plain)
    assert set(info["repacked"]["dense"]) <= {"Q4_K", "Q6_K", "Q4_0", "Q8_0"}


def test_the_cache_holds_the_files_bytes(q4km_model: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    info = model_info(ModelFile(q4km_model))
    assert info["kernels"] == "ggml"
    per_layer = info["expert_resident_bytes"]
    assert per_layer == [sum(ModelFile(q4km_model).tensors[f"blk.{i}.ffn_{p}_exps.weight"].nbytes
                             for p in ("gate", "up", "down")) // 16 for i in range(8)]
    budget_mib = 40 * max(per_layer) / MIB
    out = tmp_path / "run.json"
    rc, _, err = run_main(["engine", "run", "-m", str(q4km_model), "-n", "4", "-q",
                           f"--cache-mib={budget_mib}", "--json", str(out)], capsys)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    held = doc["summary"]["cache_resident_MiB"] * MIB
    assert budget_mib * MIB - max(per_layer) < held <= budget_mib * MIB
    assert held / min(per_layer) > 39  # F32 buffers would hold 40 / 6.7 of them
    kernels = doc["kernels"]
    assert kernels["backend"] == "ggml"
    assert kernels["experts"]["gate"] == ["Q4_K"]
    assert kernels["experts"]["down"] == ["Q5_0", "Q8_0"]
    assert "Q4_K" in kernels["dense"] and "Q6_K" in kernels["dense"]
    assert kernels["ggml"]["cpu"]


def test_kernels_auto_is_numpy_for_f32_experts(tiny_model: Path) -> None:
    cfg = EngineConfig(model=str(tiny_model), n_tokens=1)
    with Engine(cfg, tiny_model) as engine:
        assert engine.kernels == "numpy"
        assert engine.kernel_info()["experts"] == {"gate": ["F32"], "up": ["F32"],
                                                  "down": ["F32"]}


def test_without_ggml_auto_warns_and_ggml_is_refused(q8_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ggml.LIB_ENV, str(tmp_path))  # no library there
    rc, _, err = run_main(["engine", "run", "-m", str(q8_model), "-n", "2", "-q",
                           "--kernels", "ggml"], capsys)
    assert rc == 2
    assert err.count("ERROR:") == 1 and "libggml-base.so" in err and "Traceback" not in err
    with pytest.warns(RuntimeWarning, match="converted to F32 by numpy"):
        cfg = EngineConfig(model=str(q8_model), n_tokens=1)
        with Engine(cfg, q8_model) as engine:
            assert engine.kernels == "numpy"


def test_model_info_says_the_resident_size_is_the_files(q4km_model: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    rc, out, _ = run_main(["model", "info", str(q4km_model)], capsys)
    assert rc == 0
    info = model_info(ModelFile(q4km_model))
    line = next(x for x in out.splitlines() if x.startswith("all experts"))
    mib = f"{info['expert_file_bytes'] / MIB:.1f} MiB"
    assert line.count(mib) == 2, line  # in the file, and resident
    assert "computed by ggml" in out and "cache budgets" in out


def test_synth_shapes_and_mixes() -> None:
    spec = synth.shape("qwen3-30b-a3b", 2)
    assert (spec.n_layer, spec.n_expert, spec.n_expert_used, spec.d_model, spec.expert_ff,
            spec.n_head, spec.n_head_kv, spec.head_dim) == (2, 128, 8, 2048, 768, 32, 4, 128)
    # llama-quantize's use_more_bits on the real 48 layers: the first and last six, and
    # every third between
    assert [i for i in range(48) if synth.use_more_bits(i, 48)] == [
        0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46,
        47]
    full = replace(spec, n_layer=48, expert_type="Q4_K_M")
    assert synth.tensor_type(full, "blk.1.ffn_down_exps.weight", "Q4_K_M", 768) == "Q6_K"
    assert synth.tensor_type(full, "blk.6.ffn_down_exps.weight", "Q4_K_M", 768) == "Q4_K"
    assert synth.tensor_type(full, "blk.6.ffn_up_exps.weight", "Q4_K_M", 2048) == "Q4_K"
    assert synth.tensor_type(full, "output.weight", "Q4_K_M", 2048) == "Q6_K"
    assert synth.tensor_type(full, "blk.0.ffn_norm.weight", "F32", 2048) == "F32"
    assert synth.tensor_type(full, "blk.6.ffn_up_exps.weight", "Q6_K", 100) == "Q8_0"
    with pytest.raises(synth.UsageError, match="expert_type"):
        replace(spec, expert_type="Q4_K_X")
    with pytest.raises(synth.UsageError, match="unknown model shape"):
        synth.shape("qwen9", 2)


def test_model_synth_cli_refuses_mixed_geometry_flags(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    out = str(tmp_path / "m.gguf")
    rc, _, err = run_main(["model", "synth", "--shape", "qwen3-30b-a3b", "--preset", "tiny",
                           "-o", out], capsys)
    assert rc == 2 and "exclusive" in err
    rc, _, err = run_main(["model", "synth", "--layers", "2", "-o", out], capsys)
    assert rc == 2 and "--shape" in err
    # more layers than the real model has: once taken at its word, writing until the disk
    # filled (issue 33, class 9)
    rc, _, err = run_main(["model", "synth", "--shape", "qwen3-30b-a3b", "--layers",
                           "100000000", "-o", out], capsys)
    assert rc == 2 and "must be in 1 .. 48" in err
    assert not Path(out).exists() and not list(tmp_path.iterdir())


def test_a_real_shape_is_named_like_a_preset() -> None:
    from abbench.engine.run.models import context_length, parse_synthetic

    spec = synth.named("qwen3-30b-a3b-4L-Q4_K_M", 3)
    assert (spec.n_layer, spec.n_expert, spec.d_model, spec.seed) == (4, 128, 2048, 3)
    assert spec.expert_type == spec.dense_type == "Q4_K_M"
    assert synth.named("default") == synth.preset("default")
    assert parse_synthetic("synthetic:qwen3-30b-a3b-2L-Q8_0@5") == ("qwen3-30b-a3b-2L-Q8_0", 5)
    assert context_length("synthetic:qwen3-30b-a3b-2L-Q8_0") == 4096
    with pytest.raises(synth.UsageError, match="unknown type"):
        synth.named("qwen3-30b-a3b-2L-Q9_9")
    with pytest.raises(synth.UsageError, match="unknown synthetic preset") as e:
        synth.named("qwen9-2L-Q8_0")
    assert "SHAPE-NL-TYPE" in str(e.value.tip)
