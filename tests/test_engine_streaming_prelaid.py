"""`--prelaid` (engine/streaming/prelaid.py): quantized experts read from a copy laid out
for ggml's repacked kernels, written once into the model cache; `--relay`: re-laid by the
reader lanes as they land, or kept as the file has them. A run reading the copy
computes the bits of one that re-lays each expert as it is read; the copy is written
once, read as it is, and written again where it no longer fits the model, the pools or
this CPU; what cannot work is refused with one message."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main

from abbench.engine import config as config_module
from abbench.engine import synth
from abbench.engine.config import EngineConfig
from abbench.engine.gguf.model_file import ModelFile
from abbench.engine.run.session import Engine, model_info
from abbench.engine.streaming import prelaid
from abbench.engine.streaming.streamer import SliceReader, expert_layout
from abbench.errors import ConfigError, EngineError

MIB = 1 << 20


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small preset as a Q4_K_M file: gate and up Q4_K, which this CPU's repacked
    kernels take (down Q5_0 / Q8_0)."""
    path = tmp_path_factory.mktemp("prelaid") / "small-q4km.gguf"
    synth.write_model(replace(synth.preset("small"), expert_type="Q4_K_M",
                              dense_type="Q4_K_M"), path)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ABBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "prelaid"


def streamed(path: Path, **extra: object) -> EngineConfig:
    """A streaming run whose cache holds a few experts: misses on every layer; the lanes
    re-lay what they read (`--relay lanes`) unless `relay` or `prelaid` says otherwise."""
    budget = 6 * max(model_info(ModelFile(path))["expert_resident_bytes"]) / MIB
    extra = {"relay": "auto" if extra.get("prelaid") else "lanes", **extra}
    return EngineConfig(model=str(path), prompt_tokens=(5, 9, 30, 41, 7, 99), n_tokens=8,
                        temp=0.0, ignore_eos=True, kernels="ggml", cache_mib=budget,
                        **extra)  # type: ignore[arg-type]


def logits(cfg: EngineConfig, path: Path) -> tuple[np.ndarray, int, object]:
    """Every position's logits, the misses counted, and the runner's copy (or None)."""
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, 259, 12)]
    cfg = replace(cfg, prompt_tokens=tuple(tokens), n_tokens=1, n_ctx=len(tokens) + 1)
    with Engine(cfg, path) as engine:
        out = np.stack([engine.model.forward(t, pos, 1) for pos, t in enumerate(tokens)])
        return out, engine.runner.tok.misses, engine.runner.prelaid


@pytest.mark.parametrize("extra", [{}, {"resident": True},
                                   {"predict_prefetch": True, "predict_spec_max": 4}],
                         ids=["misses", "resident", "speculated"])
def test_a_run_reading_the_copy_computes_the_bits_of_one_that_relays(
        q4km: Path, cache: Path, extra: dict[str, object]) -> None:
    relaid, _, none = logits(streamed(q4km, **extra), q4km)
    read, misses, copy = logits(streamed(q4km, prelaid=True, **extra), q4km)
    assert none is None and copy is not None
    np.testing.assert_array_equal(read, relaid)
    assert misses > 0 or extra.get("resident")


def test_a_lane_lays_each_part_as_the_compute_thread_would(q4km: Path, cache: Path) -> None:
    """Re-laid by the reader lane that reads each part (`QuantTeam.relay_part`), a slot
    holds the bytes `repack_slot` lays from the plain read, on every lane at once, and the
    part a pool keeps as the file has it lands as it is."""
    with Engine(streamed(q4km), q4km) as engine:
        runner, team = engine.runner, engine.runner.team
        assert runner.reader.relay is not None and runner.prelaid is None
        plain = SliceReader(q4km, 1, False)
        try:
            for layer in (0, 3):
                pool = runner.kinds[layer]
                assert any(pool.repack) and not all(pool.repack)  # type: ignore[union-attr]
                slots = [pool.new() for _ in range(4)]  # type: ignore[union-attr]
                tickets = [runner.reader.submit(runner.layout[layer].slices(e, True), slot)
                           for e, slot in enumerate(slots)]  # four lanes at once
                for e, (ticket, slot) in enumerate(zip(tickets, slots)):
                    ticket.wait()
                    want = pool.new()  # type: ignore[union-attr]
                    plain.read_now(runner.layout[layer].slices(e, True), want)
                    before = want.data.copy()
                    team.repack_slot(want)  # type: ignore[union-attr]
                    assert not np.array_equal(before, want.data)
                    np.testing.assert_array_equal(slot.data, want.data)
        finally:
            plain.close()


def test_relay_off_keeps_streamed_experts_as_the_file_has_them(q4km: Path,
                                                                cache: Path) -> None:
    """`--relay off`: the lanes lay nothing and the slots hold the file's bytes, computed
    by ggml's plain kernels to the re-laid run's values in all but the last places; a
    resident run still re-lays its experts."""
    with Engine(streamed(q4km, relay="off"), q4km) as engine:
        runner = engine.runner
        assert not any(any(k.repack) for k in runner.kinds)  # type: ignore[union-attr]
        assert runner.repacked == []
        slot = runner.kinds[0].new()  # type: ignore[union-attr]
        runner.reader.submit(runner.layout[0].slices(2, True), slot).wait()
        want = runner.kinds[0].new()  # type: ignore[union-attr]
        plain = SliceReader(q4km, 1, False)
        try:
            plain.read_now(runner.layout[0].slices(2, True), want)
        finally:
            plain.close()
        np.testing.assert_array_equal(slot.data, want.data)
    off, misses, _ = logits(streamed(q4km, relay="off"), q4km)
    lanes, _, _ = logits(streamed(q4km, relay="lanes"), q4km)
    assert misses > 0
    np.testing.assert_allclose(off, lanes, rtol=1e-3, atol=1e-3 * np.abs(lanes).max())
    with Engine(streamed(q4km, relay="off", resident=True), q4km) as engine:
        assert "gate" in engine.runner.repacked


@pytest.mark.parametrize("cores,threads,relays", [(2, 2, False), (2, 1, True),
                                                  (8, 4, True), (1, 0, False)])
def test_relay_auto_lays_where_a_core_is_left_beside_the_compute_threads(
        monkeypatch: pytest.MonkeyPatch, cores: int, threads: int, relays: bool) -> None:
    monkeypatch.setattr(config_module, "workers", lambda: cores)
    monkeypatch.setattr(config_module.os, "cpu_count", lambda: cores)
    cfg = EngineConfig(model="m.gguf", threads=threads)
    assert cfg.relays_streamed is relays
    assert EngineConfig(model="m.gguf", threads=threads, relay="lanes").relays_streamed
    assert not EngineConfig(model="m.gguf", threads=threads, relay="off").relays_streamed


@pytest.mark.parametrize("flags,says", [
    (["--relay", "off", "--prelaid"], "--prelaid"),
    (["--relay", "lanes", "--no-repack"], "--no-repack"),
    (["--relay", "lanes", "--kernels", "numpy"], "--kernels numpy"),
])
def test_relay_where_it_cannot_hold_is_refused(
        q4km: Path, cache: Path, flags: list[str], says: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["engine", "run", "-m", str(q4km), "-p", "hi", "-n", "2",
                             *flags], capsys)
    assert code == 2 and "relay" in err and says in err and "Traceback" not in err
    assert not cache.exists()


def test_the_copy_is_written_once_and_read_as_it_is(q4km: Path, cache: Path) -> None:
    """Each expert in the copy is the slot a read from the model re-lays; the runner
    reads the copy with nothing left to do on the compute thread; a second run opens
    the copy written by the first."""
    with Engine(streamed(q4km, prelaid=True), q4km) as engine:
        copy = engine.runner.prelaid
        assert copy is not None and copy.path.parent == cache
        assert engine.runner.reader.path == str(copy.path)
        assert engine.runner.reader.relay is None
        runner, team = engine.runner, engine.runner.team
        layer, expert = 3, 5
        slot, want = (runner.kinds[layer].new() for _ in range(2))  # type: ignore[union-attr]
        runner.reader.read_now(copy.slices(layer, expert), slot)
        model = SliceReader(q4km, 1, False)
        try:
            model.read_now(runner.layout[layer].slices(expert, True), want)
        finally:
            model.close()
        plain = want.data.copy()
        team.repack_slot(want)  # type: ignore[union-attr]
        assert any(runner.kinds[layer].repack)  # type: ignore[union-attr]
        assert not np.array_equal(plain, want.data)  # re-laying changed it
        assert np.array_equal(slot.data, want.data)
        engine.run()
    written = copy.path.stat().st_mtime_ns
    with Engine(streamed(q4km, prelaid=True), q4km) as engine:
        engine.run()
        assert engine.runner.prelaid is not None
        assert engine.runner.prelaid.path == copy.path
    assert copy.path.stat().st_mtime_ns == written
    assert [p.name for p in cache.iterdir()] == [copy.path.name]  # no temporary left


Damage = namedtuple("Damage", "name how")


@pytest.mark.parametrize("damage", [
    Damage("header", lambda f, p: os.pwrite(f, b"{not json", 0)),
    Damage("expert 0", lambda f, p: os.pwrite(f, b"\xff" * 64, p.layers[0].base + 100)),
    Damage("cut short", lambda f, p: os.ftruncate(f, p.layers[0].base + 10)),
], ids=lambda d: d.name)
def test_a_damaged_copy_is_written_again(q4km: Path, cache: Path, damage: Damage) -> None:
    before, _, copy = logits(streamed(q4km, prelaid=True), q4km)
    assert isinstance(copy, prelaid.Prelaid)
    fd = os.open(copy.path, os.O_RDWR)
    try:
        damage.how(fd, copy)
    finally:
        os.close(fd)
    after, _, again = logits(streamed(q4km, prelaid=True), q4km)
    np.testing.assert_array_equal(after, before)
    assert again == copy
    header = prelaid._read_header(copy.path, copy.layers[0].base)
    assert header is not None and header["format"] == prelaid.FORMAT


@pytest.mark.slow  # 26 s on one worker (three runs of a 48-layer file): the slow phase has it
def test_a_copy_of_many_layers_has_a_header_past_one_page(cache: Path,
                                                         tmp_path: Path) -> None:
    """48 layers (as Qwen3-30B-A3B has) describe themselves in more than 4 KiB: the
    header takes as many pages as it needs, and the copy reads back."""
    model = tmp_path / "deep.gguf"
    synth.write_model(replace(synth.preset("tiny"), n_layer=48, d_model=256, n_head=4,
                              expert_ff=256, expert_type="Q4_K_M", dense_type="Q8_0"),
                      model)
    relaid, _, _ = logits(streamed(model), model)
    read, _, copy = logits(streamed(model, prelaid=True), model)
    assert isinstance(copy, prelaid.Prelaid) and copy.layers[0].base > 4096
    np.testing.assert_array_equal(read, relaid)
    _, _, again = logits(streamed(model, prelaid=True), model)
    assert again == copy


def test_a_model_written_again_gets_a_copy_of_its_own(q4km: Path, cache: Path,
                                                      tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    shutil.copyfile(q4km, model)
    first = prelaid.prelaid_path(cache, model)
    logits(streamed(model, prelaid=True), model)
    os.utime(model, ns=(1, 1))
    assert prelaid.prelaid_path(cache, model) != first
    _, _, copy = logits(streamed(model, prelaid=True), model)
    assert copy.path.exists() and copy.path != first  # type: ignore[attr-defined]


def test_a_disk_too_small_for_the_copy_is_one_message(
        q4km: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = shutil.disk_usage(q4km.parent)
    monkeypatch.setattr(prelaid.shutil, "disk_usage",
                        lambda _: usage._replace(free=4096))
    with pytest.raises(ConfigError, match="GiB free"):
        Engine(streamed(q4km, prelaid=True), q4km)
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.parametrize("flags,says", [
    (["--no-repack"], "--no-repack"),
    (["--kernels", "numpy"], "--kernels numpy"),
])
def test_prelaid_where_nothing_is_relaid_is_refused(
        q4km: Path, cache: Path, flags: list[str], says: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["engine", "run", "-m", str(q4km), "-p", "hi", "-n", "2",
                             "--prelaid", *flags], capsys)
    assert code == 2 and "prelaid" in err and says in err and "Traceback" not in err


def test_prelaid_on_f32_experts_is_refused(tiny_model: Path, cache: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["engine", "run", "-m", str(tiny_model), "-p", "hi", "-n", "2",
                             "--prelaid"], capsys)
    assert code == 2 and "--prelaid" in err and "numpy" in err


def test_a_copy_opened_to_read_lays_out_what_the_engine_reads(q4km: Path, cache: Path) -> None:
    """`opened` (benches measure the copy's disk with it) finds every layer where the engine
    that wrote the copy reads it, from the header alone; a file that is not a copy, or is
    cut short, is one message."""
    _, _, copy = logits(streamed(q4km, prelaid=True), q4km)
    assert isinstance(copy, prelaid.Prelaid)
    mf = ModelFile(q4km)
    info = model_info(mf)
    layout = expert_layout(mf, info["n_layer"], info["n_expert"])
    found = prelaid.opened(copy.path, layout)
    assert [(a.layout, a.base) for a in found.layers] == \
        [(b.layout, b.base) for b in copy.layers]
    with pytest.raises(EngineError, match="not a pre-laid copy"):
        prelaid.opened(q4km, layout)
    os.truncate(copy.path, copy.layers[-1].base + 4096)
    with pytest.raises(EngineError, match="shorter than the experts"):
        prelaid.opened(copy.path, layout)
