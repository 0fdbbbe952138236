"""Synthetic models: `model synth` / `model info` end to end, the GGUF they write as llama.cpp's
reader sees it, determinism, and atomic writing (no half-written file, no `.part` left)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from abbench.engine import synth
from abbench.errors import UsageError

TINY = synth.preset("tiny")
# (the written file, `model synth`'s process, `model info` processes: "text" and "json")
Proc = subprocess.CompletedProcess[str]
SynthRun = tuple[Path, Proc, dict[str, Proc]]


def abbench(*args: str | os.PathLike[str]) -> Proc:
    return subprocess.run(
        [sys.executable, "-m", "abbench", *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )


def field(r: GGUFReader, key: str) -> object:
    f = r.fields.get(key)
    assert f is not None, f"missing key `{key}`"
    return f.contents()


# -- the commands, as a user runs them -------------------------------------------------


@pytest.fixture(scope="module")
def synth_cli(
    tmp_path_factory: pytest.TempPathFactory,
) -> SynthRun:
    """`model synth --preset tiny -o FILE`, then `model info FILE` with and without --json."""
    out = tmp_path_factory.mktemp("synth-cli") / "tiny.gguf"
    made = abbench("model", "synth", "--preset", "tiny", "-o", out)
    assert made.returncode == 0, made.stderr
    with ThreadPoolExecutor(max_workers=2) as pool:
        text, js = pool.map(lambda extra: abbench("model", "info", out, *extra), [(), ("--json",)])
    return out, made, {"text": text, "json": js}


def test_model_synth_writes_the_file(synth_cli: SynthRun, tiny_model: Path) -> None:
    out, made, _ = synth_cli
    assert out.is_file()
    assert "Traceback" not in made.stderr
    assert f"wrote {out}" in made.stdout
    # the same preset and seed as the session fixture: the same bytes but the name
    assert out.stat().st_size == tiny_model.stat().st_size
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no .part left behind


def test_model_info_prints_sizes(synth_cli: SynthRun) -> None:
    _, _, runs = synth_cli
    p = runs["text"]
    assert p.returncode == 0, p.stderr
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in p.stdout.splitlines())
    assert rows["architecture"].startswith("qwen3moe")
    assert rows["layers"] == str(TINY.n_layer)
    assert rows["experts"] == f"{TINY.n_expert} per layer, top-{TINY.n_expert_used}"
    slice_bytes = TINY.expert_ff * TINY.d_model * 4
    assert rows["expert slice bytes"] == (
        f"gate {slice_bytes}, up {slice_bytes}, down {slice_bytes}")
    dense = json.loads(runs["json"].stdout)["dense_bytes"]
    assert rows["dense bytes"] == f"{dense / 2**20:.2f} MiB"
    assert rows["sampling defaults"] == "temp 1, repeat penalty 1.1 over the last 64 tokens"


def test_model_info_json(synth_cli: SynthRun) -> None:
    out, _, runs = synth_cli
    p = runs["json"]
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["n_layer"] == TINY.n_layer
    assert info["n_expert"] == TINY.n_expert
    assert info["architecture"] == "qwen3moe"
    f32_slice = TINY.expert_ff * TINY.d_model * 4
    assert info["expert_slice_bytes"] == {"gate": f32_slice, "up": f32_slice, "down": f32_slice}
    # dense bytes: every tensor that is not an expert tensor, as the file stores them
    r = GGUFReader(out)
    dense = sum(int(t.n_bytes) for t in r.tensors if "_exps." not in t.name)
    experts = sum(int(t.n_bytes) for t in r.tensors if "_exps." in t.name)
    assert info["dense_bytes"] == dense
    assert info["expert_file_bytes"] == experts == 3 * TINY.n_layer * TINY.n_expert * f32_slice
    assert info["dense_bytes"] + info["expert_file_bytes"] < info["file_bytes"]


# -- the file, as llama.cpp's reader sees it -------------------------------------------


def test_written_gguf_is_standard(tiny_model: Path) -> None:
    r = GGUFReader(tiny_model)
    assert field(r, "general.architecture") == "qwen3moe"
    assert field(r, "general.alignment") == synth.ALIGNMENT
    assert field(r, "qwen3moe.block_count") == TINY.n_layer
    assert field(r, "qwen3moe.expert_count") == TINY.n_expert
    assert field(r, "qwen3moe.expert_used_count") == TINY.n_expert_used
    assert field(r, "qwen3moe.embedding_length") == TINY.d_model
    assert field(r, "qwen3moe.expert_feed_forward_length") == TINY.expert_ff
    # the tokenizer keys a GGUF consumer expects, a byte-fallback vocabulary
    assert field(r, "tokenizer.ggml.model") == "llama"
    tokens = field(r, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) == synth.N_VOCAB
    assert tokens[:3] == synth.VOCAB_SPECIAL and tokens[3] == "<0x00>" and tokens[-1] == "<0xFF>"
    assert len(field(r, "tokenizer.ggml.scores")) == synth.N_VOCAB  # type: ignore[arg-type]
    types = field(r, "tokenizer.ggml.token_type")
    assert len(types) == synth.N_VOCAB  # type: ignore[arg-type]
    assert types[3] == gguf.TokenType.BYTE  # type: ignore[index]
    assert field(r, "tokenizer.ggml.bos_token_id") == synth.BOS_ID
    assert field(r, "tokenizer.ggml.eos_token_id") == synth.EOS_ID
    assert field(r, "general.sampling.temp") == pytest.approx(1.0)
    assert field(r, "general.sampling.penalty_repeat") == pytest.approx(1.1)
    assert field(r, "general.sampling.penalty_last_n") == 64


def test_written_tensors_shapes_and_alignment(tiny_model: Path) -> None:
    r = GGUFReader(tiny_model)
    assert r.data_offset % synth.ALIGNMENT == 0
    by_name = {t.name: t for t in r.tensors}
    e, ff, d = TINY.n_expert, TINY.expert_ff, TINY.d_model
    for i in range(TINY.n_layer):
        for proj, shape in (("gate", (e, ff, d)), ("up", (e, ff, d)), ("down", (e, d, ff))):
            t = by_name[f"blk.{i}.ffn_{proj}_exps.weight"]
            assert t.data.shape == shape, t.name  # numpy order: experts outermost
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert by_name[f"blk.{i}.ffn_gate_inp.weight"].data.shape == (e, d)
    assert by_name["token_embd.weight"].data.shape == (synth.N_VOCAB, d)
    for t in r.tensors:
        assert t.data_offset % synth.ALIGNMENT == 0, t.name


@pytest.mark.parametrize("type_name", ["F16", "BF16", "Q8_0"])
def test_expert_and_dense_types_are_stored_as_asked(type_name: str, tmp_path: Path) -> None:
    path = tmp_path / "typed.gguf"
    synth.write_model(replace(TINY, expert_type=type_name, dense_type=type_name), path)
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.0.ffn_down_exps.weight"] == type_name
    assert types["output.weight"] == type_name
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"  # the router stays exact
    assert types["output_norm.weight"] == "F32"
    ftype = field(GGUFReader(path), "general.file_type")
    assert ftype == {"F16": gguf.LlamaFileType.MOSTLY_F16, "BF16": gguf.LlamaFileType.MOSTLY_BF16,
                     "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[type_name]


def test_the_file_says_its_type_and_others_can_read_it(tmp_path: Path) -> None:
    # llama.cpp prints `general.file_type` and a server of another user must read the file.
    path = tmp_path / "m.gguf"
    old = os.umask(0o022)
    try:
        synth.write_model(TINY, path)
    finally:
        os.umask(old)
    assert field(GGUFReader(path), "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# -- qwen3moe files are the files written before the architecture dimension -------------

# sha256 of the header (every key, the description, each tensor's name, shape, type and
# offset: the file up to its data) as the writer wrote it before `arch`, under the name the
# cache gives it. The tensor data come from the same generators in the same rng order
# (whole files compared equal when this was added); a changed qwen3moe header would also
# change the bytes the cached files and the parity tests were made with.
QWEN3MOE_HEADERS = {
    "tiny": "e0208d10fb729f8c8536585c771e84b6c3e2b891969fe7f741918ca03dc6db9d",
    "tiny-gpt2": "b9410f45ac08b04faf9cd9f0414eddc32160b3b067634c31fe82306bd27e030f",
    "small": "fef57746c66aaa8bb3b7038af9f2ecd242047e9756f6779cbaea663b368e6b86",
    "tiny-q8": "b4e94e91dacc67e5061907d5dcad6e9190813de5e66f293e8de8d1626ca969d7",
}


@pytest.mark.parametrize("name", list(QWEN3MOE_HEADERS))
def test_qwen3moe_headers_are_unchanged(name: str, tmp_path: Path) -> None:
    import hashlib

    spec = synth.preset(name.split("-")[0])
    if name.endswith("gpt2"):
        spec = replace(spec, tokenizer="gpt2")
    elif name.endswith("q8"):
        spec = replace(spec, expert_type="Q8_0", dense_type="Q8_0")
    path = tmp_path / "m.gguf"
    synth.write_model(spec, path, name=f"abbench-synthetic-{name}")
    r = GGUFReader(path)
    assert "abbench.synthetic.arch" not in r.fields
    header = path.read_bytes()[:r.data_offset]
    assert hashlib.sha256(header).hexdigest() == QWEN3MOE_HEADERS[name]


def test_qwen3moe_is_the_default_architecture() -> None:
    assert synth.named("tiny").arch == "qwen3moe"
    assert synth.arch_preset("qwen3moe", "small") == synth.preset("small")
    assert "arch" not in synth.preset("default").described()
    assert synth.named("gpt-oss-tiny").described()["arch"] == "gpt-oss"


# -- determinism and knobs ------------------------------------------------------------


def test_same_spec_same_bytes_other_seed_other_weights(tmp_path: Path, tiny_model: Path) -> None:
    again = tmp_path / "again.gguf"
    synth.write_model(TINY, again)
    assert again.read_bytes() == tiny_model.read_bytes()
    other = tmp_path / "seed1.gguf"
    synth.write_model(synth.preset("tiny", seed=1), other)
    a = {t.name: np.array(t.data) for t in GGUFReader(tiny_model).tensors}
    b = {t.name: np.array(t.data) for t in GGUFReader(other).tensors}
    assert a.keys() == b.keys()
    assert not np.array_equal(a["blk.0.ffn_gate_exps.weight"], b["blk.0.ffn_gate_exps.weight"])


def test_spec_validation() -> None:
    with pytest.raises(UsageError, match="n_expert_used"):
        replace(TINY, n_expert_used=TINY.n_expert + 1)
    with pytest.raises(UsageError, match="n_head_kv"):
        replace(TINY, n_head_kv=3)
    with pytest.raises(UsageError, match="head_dim"):
        replace(TINY, head_dim=15)


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(UsageError) as e:
        synth.preset("NOPE")
    assert "NOPE" in e.value.message
    assert e.value.tip is not None
    for name in synth.PRESETS:
        assert name in e.value.tip


def test_layer_update_scale_decays_from_early_to_late() -> None:
    spec = synth.preset("default")
    scales = [synth.layer_update_scale(spec, i) for i in range(spec.n_layer)]
    assert scales[0] == pytest.approx(spec.update_early)
    assert all(a > b for a, b in zip(scales, scales[1:]))
    assert spec.update_late < scales[-1] < spec.update_late + 0.01


# -- atomic writing -------------------------------------------------------------------


def test_write_leaves_no_part_file(tmp_path: Path) -> None:
    synth.write_model(TINY, tmp_path / "m.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


class Boom(Exception):
    pass


def _explode(*args: object, **kwargs: object) -> None:
    raise Boom


@pytest.mark.parametrize("step", ["write_kv_data_to_file", "write_ti_data_to_file",
                                  "add_tensor_info", "write_tensor_data"])
def test_interrupted_write_leaves_no_file(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gguf.GGUFWriter, step, _explode)
    target = tmp_path / "m.gguf"
    with pytest.raises(Boom):
        synth.write_model(TINY, target)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # the temp file went too


def test_interrupted_tensor_data_write_keeps_the_old_file(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash half way through the tensor data leaves the previous model untouched."""
    target = tmp_path / "m.gguf"
    target.write_bytes(tiny_model.read_bytes())
    real = gguf.GGUFWriter.write_padding
    reached = []

    def die_in_tensor_data(self: gguf.GGUFWriter, fp: object, n: int, *a: object) -> None:
        if fp.tell() > 100_000:  # type: ignore[attr-defined]
            reached.append(fp.tell())  # type: ignore[attr-defined]
            raise Boom
        real(self, fp, n, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf.GGUFWriter, "write_padding", die_in_tensor_data)
    with pytest.raises(Boom):
        synth.write_model(replace(TINY, seed=3), target)
    assert reached  # it really died with tensor data half written
    assert target.read_bytes() == tiny_model.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_writing_a_model_holds_one_tensor_at_a_time(tmp_path: Path) -> None:
    """The default preset is 1.6 GiB: the writer streams tensors instead of holding them
    all (it once peaked at the whole file's size)."""
    spec = synth.preset("small")
    code = (
        "import resource, sys\n"
        "from abbench.engine import synth\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "synth.write_model(synth.preset('small'), sys.argv[1])\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n"
    )
    out = tmp_path / "small.gguf"
    p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    grown = int(p.stdout)
    largest = spec.n_expert * spec.expert_ff * spec.d_model * 4  # one expert tensor, F32
    assert out.stat().st_size > 8 * largest
    assert grown < 2 * largest + 8 * 2**20, (grown, largest, out.stat().st_size)


def test_synth_writes_the_bpe_vocabulary_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "bpe.gguf"
    p = abbench("model", "synth", "--preset", "tiny", "--tokenizer", "gpt2", "-o", out)
    assert p.returncode == 0, p.stderr
    r = gguf.GGUFReader(out)
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == "qwen2"
    tokens = field(r, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) == synth.BPE_VOCAB_SIZE
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert embd.data.shape[0] == len(tokens)
