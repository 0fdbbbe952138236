"""engine/kernels/qcompute.py and streaming/slots.py: quantized experts on ggml from the
cache's slots, against the numpy reference (the weights dequantized to F32, then the F32
engine's own SwiGLU)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from abbench.engine.kernels import ggml
from abbench.engine.kernels.compute import Job, expert_down, expert_up
from abbench.engine.kernels.qcompute import QuantTeam, routing, weighted_sum
from abbench.engine.streaming.slots import ALIGN, Part, RawSlot, SlotLayout, SlotPool
from abbench.engine.streaming.streamer import ExpertBuffer, ReadTicket, Slice

D, FF = 256, 512
# ggml quantizes the input per block (Q8_K / Q8_0): agreement to about a percent of the
# output's scale, which is what llama.cpp's own results show against F32 ones.
TOL = 0.03


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.abs(got - want).max() <= TOL * np.abs(want).max())


def deq(raw: np.ndarray, gtype: int, shape: tuple[int, int]) -> np.ndarray:
    if gtype == ggml.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    return dequantize(raw.reshape(shape[0], -1), GGMLQuantizationType(gtype)).reshape(shape)


def quantized(rng: np.random.Generator, rows: int, cols: int, gtype: int) -> np.ndarray:
    w = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
    if gtype == ggml.F16:
        return w.astype(np.float16).view(np.uint8).reshape(rows, -1)
    return ggml.quantize(w, gtype)


@pytest.fixture(scope="module")
def team() -> QuantTeam:
    t = QuantTeam(2)
    yield t
    t.close()


def test_routing_renormalises_the_top_k_as_llama_cpp_does() -> None:
    probs = np.array([0.1, 0.4, 0.05, 0.3, 0.15], np.float32)
    order = np.argsort(-probs).astype(np.int32)
    ids, w = routing(probs, order, 3)
    assert ids.tolist() == [1, 3, 4]
    total = np.float32(0.4 + 0.3 + 0.15)  # in double, rounded once
    np.testing.assert_array_equal(w, probs[[1, 3, 4]] / total)
    assert w.dtype == np.float32


def test_weighted_sum_adds_in_routing_order() -> None:
    rng = np.random.default_rng(2)
    y = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.random(4).astype(np.float32)
    want = y[0] * w[0]
    for j in range(1, 4):
        want = want + y[j] * w[j]
    np.testing.assert_array_equal(weighted_sum(w, y), want)


def layout_of(gtype: int, down: int | None = None) -> SlotLayout:
    def part(rows: int, cols: int, t: int) -> Part:
        return Part(t, rows, cols, rows * ggml.row_bytes(t, cols))
    return SlotLayout(part(FF, D, gtype), part(FF, D, gtype), part(D, FF, down or gtype))


def fill(pool: SlotPool, rng: np.random.Generator, n: int) -> list:
    """n slots with random experts; each with its F32 reference as an ExpertBuffer."""
    lay = pool.layout
    out = []
    for _ in range(n):
        slot = pool.new()
        f32 = ExpertBuffer(FF, D)
        parts = []
        for part, offset in zip((lay.gate, lay.up, lay.down), lay.offsets):
            raw = quantized(rng, part.rows, part.cols, part.ggml_type).ravel()
            slot.data[offset : offset + raw.size] = raw
            parts.append(deq(raw, part.ggml_type, (part.rows, part.cols)))
        f32.gate_up[...] = np.concatenate(parts[:2])
        f32.down[...] = parts[2]
        out.append((slot, f32))
    return out


def reference(buf: ExpertBuffer, x: np.ndarray) -> np.ndarray:
    h = np.empty(2 * FF, np.float32)
    act = np.empty(FF, np.float32)
    rows = (h, h[:FF], h[FF:], act)
    expert_up(buf, x, rows)
    out = np.empty(D, np.float32)
    expert_down(buf, act, out)
    return out


@pytest.mark.parametrize("gtype,down", [(ggml.Q4_K, ggml.Q6_K), (ggml.Q8_0, None),
                                        (ggml.Q5_K, None), (ggml.Q4_0, None)])
def test_experts_from_slots_match_the_reference(team: QuantTeam, gtype: int,
                                                down: int | None) -> None:
    rng = np.random.default_rng(gtype)
    pool = SlotPool(layout_of(gtype, down), 12)
    experts = fill(pool, rng, 10)
    chosen = [7, 2, 9, 0]
    x = rng.standard_normal(D).astype(np.float32)
    out = np.zeros((4, D), np.float32)
    assert team.run([Job(j, experts[e][0], None) for j, e in enumerate(chosen)], x, out) == 0
    for j, e in enumerate(chosen):
        assert close(out[j], reference(experts[e][1], x)), (j, e)


def test_an_expert_alone_or_among_others_gives_the_same_bits(team: QuantTeam) -> None:
    """What the overlap path computes one by one (as reads land) equals what the resident
    path computes in one graph: the routing's sum does not depend on residency."""
    rng = np.random.default_rng(5)
    pool = SlotPool(layout_of(ggml.Q4_K, ggml.Q6_K), 8)
    experts = fill(pool, rng, 6)
    x = rng.standard_normal(D).astype(np.float32)
    together = np.zeros((6, D), np.float32)
    team.run([Job(j, experts[j][0], None) for j in range(6)], x, together)
    for j in range(6):
        alone = np.zeros((1, D), np.float32)
        team.run([Job(0, experts[j][0], None)], x, alone)
        np.testing.assert_array_equal(alone[0], together[j])


def test_resident_experts_run_by_their_buffers_give_runs_bits_in_routing_order(
        team: QuantTeam) -> None:
    """`run_resident` (a complete cache's short way) computes what `run` computes for the
    same experts, bit for bit, in routing order."""
    rng = np.random.default_rng(8)
    pool = SlotPool(layout_of(ggml.Q4_K, ggml.Q6_K), 8)
    experts = fill(pool, rng, 6)
    x = rng.standard_normal(D).astype(np.float32)
    chosen = [4, 1, 5]
    out = np.zeros((3, D), np.float32)
    team.run([Job(j, experts[e][0], None) for j, e in enumerate(chosen)], x, out)
    got = team.run_resident([experts[e][0] for e in chosen], x, chosen)
    np.testing.assert_array_equal(got, out)


def test_late_experts_run_as_their_reads_land_and_the_wait_is_stall(team: QuantTeam) -> None:
    rng = np.random.default_rng(6)
    pool = SlotPool(layout_of(ggml.Q8_0), 8)
    experts = fill(pool, rng, 3)
    x = rng.standard_normal(D).astype(np.float32)
    slices = (Slice(0, 1, GGMLQuantizationType.Q8_0, (1, 1), 0, raw=True),)
    ticket = ReadTicket(slices, experts[2][0])
    threading.Timer(0.3, lambda: ticket._slice_done(1, None)).start()
    out = np.zeros((3, D), np.float32)
    jobs = [Job(0, experts[0][0], None), Job(1, experts[1][0], None),
            Job(2, experts[2][0], ticket)]
    stall = team.run(jobs, x, out)
    assert 0.1 < stall < 2.0
    for j in range(3):
        assert close(out[j], reference(experts[j][1], x))


def test_landed_reads_run_in_one_graph_with_the_resident_experts(
        team: QuantTeam, monkeypatch: pytest.MonkeyPatch) -> None:
    """An expert whose read has landed runs in the resident experts' graph; those still
    being read run together once the first of them lands, not one graph each."""
    rng = np.random.default_rng(7)
    pool = SlotPool(layout_of(ggml.Q8_0), 8)
    experts = fill(pool, rng, 5)
    x = rng.standard_normal(D).astype(np.float32)
    slices = (Slice(0, 1, GGMLQuantizationType.Q8_0, (1, 1), 0, raw=True),)
    tickets = [ReadTicket(slices, experts[e][0]) for e in (2, 3, 4)]
    tickets[0]._slice_done(1, None)  # landed before the run

    def land() -> None:
        for t in tickets[1:]:
            t._slice_done(1, None)

    threading.Timer(0.3, land).start()
    graphs: list[list[int]] = []
    compute = team._compute
    monkeypatch.setattr(team, "_compute", lambda jobs, *a: (
        graphs.append([j.slot for j in jobs]), compute(jobs, *a)))
    out = np.zeros((5, D), np.float32)
    jobs = [Job(0, experts[0][0], None), Job(1, experts[1][0], None),
            *(Job(e, experts[e][0], t) for e, t in zip((2, 3, 4), tickets))]
    assert team.run(jobs, x, out) > 0.1
    assert graphs == [[0, 1, 2], [3, 4]]
    for j in range(5):
        assert close(out[j], reference(experts[j][1], x))


def test_a_failed_read_raises_from_run(team: QuantTeam) -> None:
    pool = SlotPool(layout_of(ggml.Q8_0), 2)
    slot = pool.new()
    ticket = ReadTicket((Slice(0, 1, GGMLQuantizationType.Q8_0, (1, 1), 0, raw=True),), slot)
    ticket._slice_done(0, OSError("disk gone"))
    with pytest.raises(ggml.EngineError, match="disk gone"):
        team.run([Job(0, slot, ticket)], np.zeros(D, np.float32), np.zeros((1, D), np.float32))


def test_a_prefill_batch_matches_each_token_alone(team: QuantTeam) -> None:
    rng = np.random.default_rng(7)
    pool = SlotPool(layout_of(ggml.Q4_K), 8)
    experts = fill(pool, rng, 5)
    x = rng.standard_normal((3, D)).astype(np.float32)
    ids = np.array([[0, 3], [4, 1], [2, 0]], np.int32)
    y = team.rows(pool, x, np.array([[experts[e][0].index for e in row] for row in ids],
                                    np.int32))
    assert y.shape == (3, 2, D)
    for t in range(3):
        for j, e in enumerate(ids[t]):
            assert close(y[t, j], reference(experts[e][1], x[t]))


def test_slots_sit_at_one_stride_with_each_part_on_a_page() -> None:
    lay = layout_of(ggml.Q4_K, ggml.Q6_K)
    assert all(o % ALIGN == 0 for o in lay.offsets) and lay.stride % ALIGN == 0
    assert lay.file_bytes == lay.gate.nbytes + lay.up.nbytes + lay.down.nbytes
    pool = SlotPool(lay, 3)
    a, b = pool.new(), pool.new()
    assert (b.offset - a.offset, b.index) == (lay.stride, 1)
    assert a.nbytes == pool.nbytes == lay.file_bytes  # what a budget counts
    assert pool.address % ALIGN == 0
    pool.new()
    with pytest.raises(ggml.EngineError, match="exhausted"):
        pool.new()


def test_trim_gives_a_slots_pages_back() -> None:
    pool = SlotPool(layout_of(ggml.Q8_0), 2)
    slot = pool.new()
    slot.data[:] = 7
    slot.trim()
    assert not slot.data.any()  # anonymous memory reads back as zeros once given back



def test_a_repacked_pool_computes_the_plain_pools_products() -> None:
    """Slots re-laid for ggml's repacked kernels (where this CPU has a layout for a part)
    give the plain slots' results to rounding; a part without a layout stays plain."""
    rng = np.random.default_rng(9)
    plain_pool = SlotPool(layout_of(ggml.Q4_K, ggml.Q6_K), 6)
    experts = fill(plain_pool, rng, 5)
    team = QuantTeam(2, repack=True)
    pool = SlotPool(layout_of(ggml.Q4_K, ggml.Q6_K), 6)
    team.repack_pool(pool)
    for slot, _ in experts:
        mine = pool.new()
        mine.data[:] = slot.data
        team.repack_slot(mine)
    x = rng.standard_normal(D).astype(np.float32)
    want = np.zeros((5, D), np.float32)
    got = np.zeros((5, D), np.float32)
    QuantTeam(2).run([Job(j, experts[j][0], None) for j in range(5)], x, want)
    team.run([Job(j, RawSlot(pool, j), None) for j in range(5)], x, got)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    if pool.repack[0]:  # re-laid: other bytes in the slot
        assert not np.array_equal(RawSlot(pool, 0).data, experts[0][0].data)
    team.close()
