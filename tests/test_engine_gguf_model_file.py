"""Model files: what `ModelFile` reads, and one clean error for every way a file is bad.

Bad files are built from the session's tiny model (cut, patched, or rewritten through
`gguf.GGUFWriter` without a tensor or with another type) and each goes through the real
command line, `engine run` and `model info`: exit status 2, exactly one `ERROR:` line (a
`TIP:` may follow) naming what is wrong, never a traceback.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abbench.engine import synth
from abbench.engine.gguf.model_file import SUPPORTED_TYPES, ModelFile, to_f32
from abbench.errors import ModelFileError

# -- building bad files -----------------------------------------------------------------


def rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    arch: str | None = None,
    drop: Iterable[str] = (),
    drop_keys: Iterable[str] = (),
    retype: dict[str, Callable[[np.ndarray], np.ndarray]] | None = None,
    set_keys: dict[str, object] | None = None,
) -> Path:
    """Copy a GGUF file through `GGUFWriter`: optionally another architecture (its
    `ARCH.*` keys renamed with it), without some tensors or keys, some tensors converted."""
    r = GGUFReader(src)
    old = r.fields["general.architecture"].contents()
    arch = arch or old
    drop, drop_keys, retype = set(drop), set(drop_keys), retype or {}
    w = GGUFWriter(dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        if key == "general.alignment":
            w.add_custom_alignment(field.contents())
            continue
        if key.startswith(old + "."):
            key = arch + key[len(old):]
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = (set_keys or {}).get(key, field.contents())
        w.add_key_value(key, value, vtype, sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        a = np.array(t.data)  # F32 tensors only in the tiny model: numpy shape, float32
        w.add_tensor(t.name, retype[t.name](a) if t.name in retype else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def string_value_offset(path: Path, key: str) -> int:
    """Byte offset of the first byte of string metadata value `key`."""
    f = GGUFReader(path).fields[key]
    # key: u64 length + bytes | value type u32 | value: u64 length + bytes
    return int(f.offset) + 8 + len(key.encode()) + 4 + 8


def tensor_type_offset(path: Path, name: str) -> int:
    """Byte offset of the type field of tensor `name` in the tensor table."""
    r = GGUFReader(path)
    t = next(t for t in r.tensors if t.name == name)
    # name: u64 length + bytes | n_dims u32 | dims u64 x n_dims | type u32 | offset u64
    return int(t.field.offset) + 8 + len(name.encode()) + 4 + 8 * len(t.shape)


# -- the real command line ----------------------------------------------------------------


def abbench(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "abbench", *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )


def assert_clean_error(p: subprocess.CompletedProcess[str], *names: str) -> str:
    """Exit 2, `ERROR:` as the first line of stderr, naming `names`, then at most a `TIP:`
    line; no traceback anywhere."""
    everything = p.stdout + p.stderr
    assert "Traceback" not in everything, everything
    assert p.returncode == 2, everything
    lines = p.stderr.splitlines()
    errors = [i for i, ln in enumerate(lines) if ln.startswith("ERROR:")]
    assert len(errors) == 1, p.stderr
    at = errors[0]
    assert at == 0, p.stderr
    after = lines[at + 1 :]
    assert after == [] or (len(after) == 1 and after[0].startswith("TIP: ")), p.stderr
    for name in names:
        assert name.lower() in lines[at].lower(), f"`{name}` not named in: {lines[at]}"
    return lines[at]


# -- the bad-file matrix ------------------------------------------------------------------

# case id -> what the ERROR line must name
BAD_CASES: dict[str, tuple[str, ...]] = {
    "wrong-magic": ("magic",),
    "empty": ("empty",),
    "nonexistent": ("no such",),
    "directory": ("folder",),
    "cut-in-magic": ("truncated",),
    "cut-in-header-counts": ("truncated", "header"),
    "cut-in-metadata": ("truncated", "metadata"),
    "cut-in-tokenizer": ("truncated", "tokenizer.ggml.tokens"),
    "cut-in-tensor-table": ("truncated", "tensor table"),
    "cut-at-data-start": ("truncated", "token_embd.weight"),
    "cut-in-expert-data": ("truncated", "ffn_gate_exps"),
    "cut-last-bytes": ("truncated", "blk.3.ffn_down_exps.weight"),
    "unknown-architecture": ("llama4x",),
    "missing-expert-tensor": ("missing", "blk.0.ffn_down_exps.weight"),
    "unsupported-expert-type": ("blk.1.ffn_up_exps.weight", "I32"),
    "unknown-type-id": ("blk.2.ffn_gate_exps.weight", "unknown type"),
    "unsupported-version": ("version 9",),
    "duplicate-tensor": ("duplicate", "blk.0.attn_k.weight"),
    "missing-metadata-key": ("qwen3moe.expert_count",),
    "metadata-not-utf8": ("general.name", "UTF-8"),
}
# Each case runs through `abbench.cli.main` in-process; one case per kind of defect also
# runs as a real process (a fresh interpreter costs ~0.5 s, so not all of them).
REAL_PROCESS_CASES = (
    "wrong-magic", "empty", "nonexistent", "directory", "cut-in-header-counts",
    "cut-in-tensor-table", "cut-in-expert-data", "unknown-architecture",
    "missing-expert-tensor", "unsupported-expert-type",
)
COMMANDS = {
    "engine-run": ("engine", "run", "-n", "2", "-m"),
    "model-info": ("model", "info"),
}


def build_bad_files(tiny: Path, folder: Path) -> dict[str, Path]:
    data = tiny.read_bytes()
    r = GGUFReader(tiny)
    data_start = int(r.data_offset)
    table_start = int(r.tensors[0].field.offset)
    tokens_at = int(r.fields["tokenizer.ggml.tokens"].offset)
    gate1 = next(t for t in r.tensors if t.name == "blk.1.ffn_gate_exps.weight")
    del r
    cuts = {
        "cut-in-magic": 3,
        "cut-in-header-counts": 12,  # inside the tensor/metadata counts
        "cut-in-metadata": 100,
        "cut-in-tokenizer": tokens_at + 200,
        "cut-in-tensor-table": (table_start + data_start) // 2,
        "cut-at-data-start": data_start,
        "cut-in-expert-data": int(gate1.data_offset) + 1000,
        "cut-last-bytes": len(data) - 1,
    }
    assert 12 < 100 < tokens_at < table_start < data_start < len(data)
    paths: dict[str, Path] = {}

    def put(case: str, content: bytes) -> None:
        paths[case] = folder / f"{case}.gguf"
        paths[case].write_bytes(content)

    put("wrong-magic", b"GGML" + data[4:])
    put("empty", b"")
    paths["nonexistent"] = folder / "no-such-model.gguf"
    paths["directory"] = folder / "a-folder.gguf"
    paths["directory"].mkdir()
    for case, n in cuts.items():
        put(case, data[:n])
    put("unsupported-version", data[:4] + struct.pack("<I", 9) + data[8:])
    # same length, so every offset stays valid: two tensors now share a name
    put("duplicate-tensor", data.replace(b"blk.0.attn_q.weight", b"blk.0.attn_k.weight", 1))
    patched = bytearray(data)
    at = tensor_type_offset(tiny, "blk.2.ffn_gate_exps.weight")
    patched[at : at + 4] = struct.pack("<I", 200)
    put("unknown-type-id", bytes(patched))
    patched = bytearray(data)
    patched[string_value_offset(tiny, "general.name")] = 0xFF
    put("metadata-not-utf8", bytes(patched))
    d = folder
    paths["unknown-architecture"] = rewrite_gguf(tiny, d / "arch.gguf", arch="llama4x")
    paths["missing-expert-tensor"] = rewrite_gguf(
        tiny, d / "missing.gguf", drop={"blk.0.ffn_down_exps.weight"})
    paths["unsupported-expert-type"] = rewrite_gguf(
        tiny, d / "i32.gguf", retype={"blk.1.ffn_up_exps.weight": lambda a: a.astype(np.int32)})
    paths["missing-metadata-key"] = rewrite_gguf(
        tiny, d / "nokey.gguf", drop_keys={"qwen3moe.expert_count"})
    assert set(paths) == set(BAD_CASES)
    return paths


@pytest.fixture(scope="module")
def bad_files(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_bad_files(tiny_model, tmp_path_factory.mktemp("bad-models"))


@pytest.fixture(scope="module")
def bad_runs(
    bad_files: dict[str, Path],
) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """The real-process cases through every command, in parallel (each a fresh process)."""
    jobs = [(case, cmd) for case in REAL_PROCESS_CASES for cmd in COMMANDS]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        done = pool.map(lambda j: abbench(*COMMANDS[j[1]], bad_files[j[0]]), jobs)
        return dict(zip(jobs, done, strict=True))


def run_main(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """`abbench.cli.main(argv)` in-process, as a finished process would report it."""
    from abbench.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["abbench", *argv], rc, out, err)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", REAL_PROCESS_CASES)
def test_bad_model_file_real_process(
    case: str, command: str, bad_runs: dict[tuple[str, str], subprocess.CompletedProcess[str]],
) -> None:
    p = bad_runs[(case, command)]
    assert_clean_error(p, *BAD_CASES[case])
    assert p.stdout == ""


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_model_file_cli(
    case: str, command: str, bad_files: dict[str, Path], capsys: pytest.CaptureFixture[str],
) -> None:
    p = run_main([*COMMANDS[command], str(bad_files[case])], capsys)
    assert_clean_error(p, *BAD_CASES[case])
    assert p.stdout == ""


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_model_file_raises_model_file_error(case: str, bad_files: dict[str, Path]) -> None:
    """The same files in-process: the loading path raises `ModelFileError`, nothing else."""
    from abbench.engine.config import EngineConfig
    from abbench.engine.run.session import Engine

    with pytest.raises(ModelFileError) as e:
        Engine(EngineConfig(model=str(bad_files[case]), n_tokens=1), bad_files[case]).close()
    for name in BAD_CASES[case]:
        assert name.lower() in e.value.message.lower()


def test_bad_file_names_the_path(bad_files: dict[str, Path]) -> None:
    with pytest.raises(ModelFileError) as e:
        ModelFile(bad_files["cut-in-tensor-table"])
    assert str(bad_files["cut-in-tensor-table"]) in e.value.message


def test_token_string_not_utf8_is_a_model_file_error(tiny_model: Path, tmp_path: Path) -> None:
    data = bytearray(tiny_model.read_bytes())
    f = GGUFReader(tiny_model).fields["tokenizer.ggml.tokens"]
    # key | value type u32 | item type u32 | count u64 | first string: u64 length + bytes
    data[int(f.offset) + 8 + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8 + 8] = 0xFF
    path = tmp_path / "bad-token.gguf"
    path.write_bytes(bytes(data))
    mf = ModelFile(path)  # the header is sound; the strings are decoded when asked for
    try:
        with pytest.raises(ModelFileError, match="tokenizer.ggml.tokens"):
            mf.array("tokenizer.ggml.tokens")
    finally:
        mf.close()


def test_every_cut_through_the_header_is_named_truncated(tiny_model: Path, tmp_path: Path) -> None:
    data = tiny_model.read_bytes()
    data_start = int(GGUFReader(tiny_model).data_offset)
    path = tmp_path / "cut.gguf"
    for n in [*range(1, data_start + 1, 61), data_start + 1, len(data) - 4096, len(data) - 1]:
        path.write_bytes(data[:n])
        with pytest.raises(ModelFileError, match="truncated"):
            ModelFile(path)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flips=st.lists(st.tuples(st.integers(4, 12287), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 12288 + 4096)),
)
def test_fuzzed_header_opens_or_raises_model_file_error(
    tiny_model: Path, tmp_path: Path, flips: list[tuple[int, int]], cut: int | None,
) -> None:
    """A mutated header (and maybe a cut) opens, or fails with `ModelFileError`: never
    another exception, not even from the tokenizer strings read later."""
    data = bytearray(tiny_model.read_bytes())
    for at, value in flips:
        data[at] = value
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(data[:cut] if cut is not None else data))
    try:
        mf = ModelFile(path)
    except ModelFileError:
        return
    try:
        mf.array("tokenizer.ggml.tokens")
        mf.get("general.name")
    except ModelFileError:
        pass
    finally:
        mf.close()


# -- what a good file reads as -----------------------------------------------------------


def test_tiny_model_layout(tiny_model: Path) -> None:
    spec = synth.preset("tiny")
    mf = ModelFile(tiny_model)
    try:
        assert mf.architecture == "qwen3moe"
        assert mf.alignment == synth.ALIGNMENT
        assert mf.data_offset % synth.ALIGNMENT == 0
        assert mf.get("qwen3moe.expert_count") == spec.n_expert
        e, ff, d = spec.n_expert, spec.expert_ff, spec.d_model
        gate = mf.tensor("blk.0.ffn_gate_exps.weight")
        down = mf.tensor("blk.0.ffn_down_exps.weight")
        assert gate.shape == (e, ff, d) and down.shape == (e, d, ff)
        assert gate.nbytes == e * ff * d * 4
        for t in mf.tensors.values():
            assert t.offset % synth.ALIGNMENT == 0, t.name
            assert t.offset + t.nbytes <= mf.file_size
        ends = sorted((t.offset, t.offset + t.nbytes) for t in mf.tensors.values())
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends, ends[1:]))
    finally:
        mf.close()


def test_read_dense_matches_the_gguf_reader(tiny_model: Path) -> None:
    reference = {t.name: np.array(t.data) for t in GGUFReader(tiny_model).tensors}
    mf = ModelFile(tiny_model)
    try:
        for name in ("token_embd.weight", "blk.3.attn_output.weight", "output_norm.weight"):
            for pinned in (True, False):
                got = mf.read_dense(name, pinned)
                assert got.dtype == np.float32
                np.testing.assert_array_equal(got, reference[name])
    finally:
        mf.close()


def test_unknown_tensor_name_is_a_model_file_error(tiny_model: Path) -> None:
    mf = ModelFile(tiny_model)
    try:
        with pytest.raises(ModelFileError, match="missing tensor `blk.9.attn_q.weight`"):
            mf.tensor("blk.9.attn_q.weight")
        with pytest.raises(ModelFileError, match="missing metadata key `qwen3moe.nope`"):
            mf.require("qwen3moe.nope")
    finally:
        mf.close()


def test_row_bytes_refuses_partial_quant_blocks(tiny_model: Path) -> None:
    mf = ModelFile(tiny_model)
    try:
        gate = mf.tensor("blk.0.ffn_gate_exps.weight")
    finally:
        mf.close()
    q8 = replace(gate, ggml_type=GGMLQuantizationType.Q8_0)
    assert q8.row_bytes(64) == 2 * 34
    with pytest.raises(ModelFileError, match="whole number of Q8_0 blocks"):
        q8.row_bytes(48)


def test_i32_and_f64_are_outside_the_supported_types() -> None:
    # The bad-file cases rely on these being refused; F16/BF16/Q8_0 must be accepted.
    assert GGMLQuantizationType.I32 not in SUPPORTED_TYPES
    assert {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
            GGMLQuantizationType.Q8_0} <= SUPPORTED_TYPES


# -- supported storage types -------------------------------------------------------------

TYPES = ("F16", "BF16", "Q8_0")
# worst relative error of one weight after the round trip, against its tensor's scale
TOLERANCE = {"F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2}


@pytest.fixture(scope="module")
def typed_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("typed-models")
    out = {}
    for t in TYPES:
        spec = replace(synth.preset("tiny"), expert_type=t, dense_type=t)
        out[t] = folder / f"tiny-{t}.gguf"
        synth.write_model(spec, out[t])
    return out


@pytest.mark.parametrize("type_name", TYPES)
def test_typed_expert_slices_decode_to_the_f32_weights(
    type_name: str, typed_models: dict[str, Path], tiny_model: Path,
) -> None:
    """Expert e of a typed tensor, read at `offset + e * slice_bytes` and converted, is the
    F32 model's expert e (the generator draws the same weights whatever the type)."""
    ref, mf = ModelFile(tiny_model), ModelFile(typed_models[type_name])
    raw = np.frombuffer(mf.path.read_bytes(), np.uint8)
    raw_ref = np.frombuffer(ref.path.read_bytes(), np.uint8)
    tol = TOLERANCE[type_name]
    try:
        for name in ("blk.0.ffn_gate_exps.weight", "blk.2.ffn_down_exps.weight"):
            t, r = mf.tensor(name), ref.tensor(name)
            assert t.type_name == type_name and t.shape == r.shape
            n_expert = t.shape[0]
            per, per_ref = t.nbytes // n_expert, r.nbytes // n_expert
            assert per * n_expert == t.nbytes
            assert per == t.row_bytes(t.shape[1] * t.shape[2])  # whole quant blocks
            for e in (0, 3, n_expert - 1):
                got = to_f32(raw[t.offset + e * per : t.offset + (e + 1) * per].copy(),
                             t.ggml_type, t.shape[1:])
                want = raw_ref[r.offset + e * per_ref : r.offset + (e + 1) * per_ref]
                want = want.view(np.float32).reshape(r.shape[1:])
                assert np.abs(got - want).max() <= tol * np.abs(want).max(), (name, e)
        want = ref.read_dense("blk.1.attn_q.weight", pinned=True)
        for pinned in (True, False):
            got = mf.read_dense("blk.1.attn_q.weight", pinned)
            assert got.dtype == np.float32 and got.shape == want.shape
            assert np.abs(got - want).max() <= tol * np.abs(want).max()
    finally:
        mf.close()
        ref.close()


def test_typed_models_run_through_the_cli(typed_models: dict[str, Path], tmp_path: Path) -> None:
    def run(t: str) -> subprocess.CompletedProcess[str]:
        return abbench("engine", "run", "-m", typed_models[t], "-n", "4", "--cache-mib", "0",
                       "--json", tmp_path / f"{t}.json")

    with ThreadPoolExecutor(max_workers=len(TYPES)) as pool:
        runs = dict(zip(TYPES, pool.map(run, TYPES), strict=True))
    for t, p in runs.items():
        assert p.returncode == 0, f"{t}: {p.stderr}"
        assert "Traceback" not in p.stderr
        assert "generation: 4 tokens" in p.stdout
        doc = json.loads((tmp_path / f"{t}.json").read_text())
        assert len(doc["output_ids"]) == 4
        assert all(0 <= i < synth.N_VOCAB for i in doc["output_ids"])
        assert t in doc["model"]["tensor_types"]
        assert doc["summary"] and sum(doc["per_token"]["read_bytes"]) > 0  # cache off: streamed


# -- headers whose numbers disagree with the tensors ---------------------------------------

HEADER_CASES = {
    "no layers": ({"qwen3moe.block_count": 0}, "block_count"),
    "no heads": ({"qwen3moe.attention.head_count": 0}, "head_count"),
    "kv heads not dividing": ({"qwen3moe.attention.head_count_kv": 3}, "head_count_kv"),
    "heads disagree with attn_q": ({"qwen3moe.attention.head_count": 2,
                                    "qwen3moe.attention.head_count_kv": 2}, "attn_q.weight"),
    "negative epsilon": ({"qwen3moe.attention.layer_norm_rms_epsilon": -1.0}, "epsilon"),
    "top-k above experts": ({"qwen3moe.expert_used_count": 99}, "expert_used_count"),
    "bos outside vocabulary": ({"tokenizer.ggml.bos_token_id": 100_000}, "bos_token_id"),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_header_disagreeing_with_tensors_is_one_clear_error(
    case: str, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, named = HEADER_CASES[case]
    path = rewrite_gguf(tiny_model, tmp_path / "bad.gguf", set_keys=keys)
    p = run_main(["engine", "run", "-m", str(path), "-n", "2"], capsys)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("ERROR:") and named in p.stderr.splitlines()[0], p.stderr
    assert "Traceback" not in p.stdout + p.stderr


def test_model_info_refuses_a_missing_dense_tensor(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_gguf(tiny_model, tmp_path / "no-k.gguf", drop=["blk.2.attn_k.weight"])
    p = run_main(["model", "info", str(path)], capsys)
    assert p.returncode == 2 and "blk.2.attn_k.weight" in p.stderr, p.stderr


def test_a_tensor_read_whole_lets_the_page_cache_copy_go(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller keeps its own copy, so the page cache's is advised away: under a memory
    limit it would be charged to the process twice."""
    advised: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise",
                        lambda fd, offset, length, advice: advised.append((offset, length, advice)))
    mf = ModelFile(tiny_model)
    name = next(iter(mf.tensors))
    raw = mf.read_raw(name)
    info = mf.tensor(name)
    assert raw.nbytes == info.nbytes
    assert advised == [(info.offset, info.nbytes, os.POSIX_FADV_DONTNEED)]
