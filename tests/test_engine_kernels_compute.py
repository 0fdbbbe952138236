"""The compute team: the stall measure, SwiGLU results against numpy, late and failed reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from abbench.engine.kernels.compute import ComputeTeam, Job, matvec, split_rows, starved_seconds
from abbench.engine.streaming.streamer import ExpertBuffer, ReadTicket
from abbench.errors import EngineError

FF, D = 16, 24

# -- starved_seconds -----------------------------------------------------------------------


def test_starved_one_thread_is_its_waits_plus_the_tail() -> None:
    assert starved_seconds([[(1.0, 2.0), (3.0, 4.0)]], [5.0], 0.0, 6.0) == pytest.approx(3.0)


def test_starved_one_thread_never_waiting_is_only_the_tail() -> None:
    assert starved_seconds([[]], [6.0], 0.0, 6.0) == 0.0
    assert starved_seconds([[]], [4.5], 0.0, 6.0) == pytest.approx(1.5)


def test_starved_two_threads_overlapping_waits() -> None:
    # A starves on [1,3] and [5,6]; B on [2,4] and [4.5,6]; both on [2,3] and [5,6].
    got = starved_seconds([[(1.0, 3.0)], [(2.0, 4.0)]], [5.0, 4.5], 0.0, 6.0)
    assert got == pytest.approx(2.0)


def test_starved_two_threads_disjoint_waits_is_zero() -> None:
    assert starved_seconds([[(1.0, 2.0)], [(3.0, 4.0)]], [6.0, 6.0], 0.0, 6.0) == 0.0


def test_starved_one_thread_done_while_the_other_waits() -> None:
    # B finished at 2 and has nothing left; A waits on [3,5] and finishes at 5.5.
    got = starved_seconds([[(3.0, 5.0)], []], [5.5, 2.0], 0.0, 6.0)
    assert got == pytest.approx(2.5)


def test_starved_both_done_early_counts_from_the_later_finish() -> None:
    assert starved_seconds([[], []], [2.0, 4.0], 0.0, 5.0) == pytest.approx(1.0)


def test_starved_counts_a_threads_overlapping_spans_once() -> None:
    # A helper that ran no task (finish 0: starved on all of [0, 6]) also logged its wait
    # for the batch, [0, 3]; the caller waits on a read over [1, 4] and finishes at 5.
    # Both starve on [1, 4] and [5, 6]: 4 s, never more than the window. Seen in a
    # decode record under load whose stall exceeded its wall time.
    got = starved_seconds([[(1.0, 4.0)], [(0.0, 3.0)]], [5.0, 0.0], 0.0, 6.0)
    assert got == pytest.approx(4.0)


def test_starved_is_clipped_to_the_window() -> None:
    assert starved_seconds([[(-1.0, 1.0)]], [3.0], 0.0, 3.0) == pytest.approx(1.0)


# -- ComputeTeam.run -------------------------------------------------------------------------


def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def reference(buf: ExpertBuffer, x: np.ndarray) -> np.ndarray:
    """A plain SwiGLU expert in float64: down @ (silu(gate @ x) * (up @ x))."""
    w = buf.floats.astype(np.float64)
    gate = w[: FF * D].reshape(FF, D)
    up = w[FF * D : 2 * FF * D].reshape(FF, D)
    down = w[2 * FF * D :].reshape(D, FF)
    xx = x.astype(np.float64)
    return down @ (silu(gate @ xx) * (up @ xx))


def make_buffers(rng: np.random.Generator, n: int, ff: int = FF,
                 d: int = D) -> list[ExpertBuffer]:
    """`n` resident experts of random weights (gate, up, down), scaled like a model's."""
    bufs = []
    for _ in range(n):
        b = ExpertBuffer(ff, d)
        b.floats[:] = rng.standard_normal(b.floats.size).astype(np.float32) / np.sqrt(d)
        bufs.append(b)
    return bufs


@pytest.fixture(params=[1, 2, 3])
def team(request: pytest.FixtureRequest) -> Iterator[ComputeTeam]:
    t = ComputeTeam(request.param, FF, max_k=6)
    yield t
    t.close()


def test_run_matches_numpy_reference(team: ComputeTeam) -> None:
    rng = np.random.default_rng(1)
    for k in (6, 3, 1):  # also fewer jobs than threads; the team is reused across calls
        bufs = make_buffers(rng, k)
        x = rng.standard_normal(D).astype(np.float32)
        out = np.full((6, D), np.nan, np.float32)
        slots = rng.permutation(k)
        jobs = [Job(int(s), b, None) for s, b in zip(slots, bufs)]
        stall = team.run(jobs, x, out)
        assert stall == 0.0
        for s, b in zip(slots, bufs):
            np.testing.assert_allclose(out[s], reference(b, x), rtol=1e-4, atol=1e-5)
        assert np.isnan(out[k:]).all()  # rows past k untouched


def test_run_with_no_jobs_returns_zero(team: ComputeTeam) -> None:
    out = np.zeros((6, D), np.float32)
    assert team.run([], np.zeros(D, np.float32), out) == 0.0


def test_team_reused_across_layers_gives_the_same_bits(team: ComputeTeam) -> None:
    rng = np.random.default_rng(2)
    bufs = make_buffers(rng, 4)
    x = rng.standard_normal(D).astype(np.float32)
    outs = []
    for _ in range(3):
        out = np.zeros((6, D), np.float32)
        team.run([Job(i, b, None) for i, b in enumerate(bufs)], x, out)
        outs.append(out.copy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_split_rows_halves_large_matrices_on_a_16_row_boundary() -> None:
    assert split_rows(np.zeros((768, 512), np.float32)) == 384
    assert split_rows(np.zeros((259, 512), np.float32)) == 128
    assert split_rows(np.zeros((64, 64), np.float32)) == 0  # 16 KiB: one GEMV


@pytest.mark.parametrize("rows", [768, 259, 40])
def test_matvec_is_the_product(rows: int) -> None:
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((rows, 512)).astype(np.float32)
    x = rng.standard_normal(512).astype(np.float32)
    np.testing.assert_allclose(matvec(w, x), w.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)
    out = np.full(rows, np.nan, np.float32)
    assert matvec(w, x, out) is out
    np.testing.assert_array_equal(out, matvec(w, x))


def late_tickets(
    bufs: list[ExpertBuffer], sources: list[np.ndarray], delay: float
) -> tuple[list[ReadTicket], threading.Timer]:
    """Tickets whose bytes land (all at once) `delay` seconds from now, like a slow read."""
    tickets = [ReadTicket((), b) for b in bufs]

    def land() -> None:
        for t, src in zip(tickets, sources):
            t.buffer.floats[:] = src
            t.t_done = time.perf_counter()
            t.event.set()

    timer = threading.Timer(delay, land)
    timer.start()
    return tickets, timer


def test_run_waits_for_late_reads_and_reports_the_stall(team: ComputeTeam) -> None:
    rng = np.random.default_rng(3)
    k, delay = 4, 0.15
    sources = [b.floats.copy() for b in make_buffers(rng, k)]
    bufs = [ExpertBuffer(FF, D) for _ in range(k)]  # zeros until the "read" lands
    x = rng.standard_normal(D).astype(np.float32)
    out = np.zeros((6, D), np.float32)
    tickets, timer = late_tickets(bufs, sources, delay)
    t0 = time.perf_counter()
    stall = team.run([Job(i, b, t) for i, (b, t) in enumerate(zip(bufs, tickets))], x, out)
    elapsed = time.perf_counter() - t0
    timer.join()
    assert elapsed >= delay * 0.9
    # Every job waits on a read, so (nearly) all of the delay is a stall.
    assert 0.6 * delay <= stall <= elapsed + 1e-3
    for i, b in enumerate(bufs):
        np.testing.assert_allclose(out[i], reference(b, x), rtol=1e-4, atol=1e-5)


def test_run_with_reads_already_done_stalls_little(team: ComputeTeam) -> None:
    rng = np.random.default_rng(4)
    bufs = make_buffers(rng, 4)
    tickets = [ReadTicket((), b) for b in bufs]
    for t in tickets:
        t.event.set()
    x = rng.standard_normal(D).astype(np.float32)
    out = np.zeros((6, D), np.float32)
    stall = team.run([Job(i, b, t) for i, (b, t) in enumerate(zip(bufs, tickets))], x, out)
    assert 0.0 <= stall < 0.05
    for i, b in enumerate(bufs):
        np.testing.assert_allclose(out[i], reference(b, x), rtol=1e-4, atol=1e-5)


def test_run_mixes_resident_and_late_experts(team: ComputeTeam) -> None:
    rng = np.random.default_rng(5)
    resident = make_buffers(rng, 3)
    sources = [b.floats.copy() for b in make_buffers(rng, 2)]
    late = [ExpertBuffer(FF, D) for _ in range(2)]
    x = rng.standard_normal(D).astype(np.float32)
    out = np.zeros((6, D), np.float32)
    tickets, timer = late_tickets(late, sources, 0.05)
    jobs = [Job(i, b, None) for i, b in enumerate(resident)]
    jobs += [Job(3 + i, b, t) for i, (b, t) in enumerate(zip(late, tickets))]
    stall = team.run(jobs, x, out)
    timer.join()
    assert stall > 0.0
    for i, b in enumerate(resident + late):
        np.testing.assert_allclose(out[i], reference(b, x), rtol=1e-4, atol=1e-5)


def test_failed_read_raises_from_run_and_the_team_survives(team: ComputeTeam) -> None:
    rng = np.random.default_rng(6)
    bufs = make_buffers(rng, 4)
    tickets = [ReadTicket((), b) for b in bufs]
    tickets[2].error = OSError(5, "Input/output error")
    for t in tickets:
        t.event.set()
    x = rng.standard_normal(D).astype(np.float32)
    out = np.zeros((6, D), np.float32)
    jobs = [Job(i, b, t) for i, (b, t) in enumerate(zip(bufs, tickets))]
    with pytest.raises(EngineError, match="expert read failed: .*Input/output error"):
        team.run(jobs, x, out)
    # The helpers are still there and the next layer computes normally.
    jobs = [Job(i, b, None) for i, b in enumerate(bufs)]
    assert team.run(jobs, x, out) == 0.0
    for i, b in enumerate(bufs):
        np.testing.assert_allclose(out[i], reference(b, x), rtol=1e-4, atol=1e-5)
