"""`workers.map_all`: the order of `map`, on every core, and workers that leave signals to
their parent."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from abbench import workers


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    if workers.workers() < 2:
        pytest.skip("one core: map_all is map itself")
    monkeypatch.setattr(workers, "MIN_ITEMS", 4)


def _square(offset: int, x: int) -> int:
    return x * x + offset


def _handlers(_context: None, _x: int) -> tuple[int, object, object]:
    return os.getpid(), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


@pytest.fixture
def sigterm_raises() -> Iterator[None]:
    """The parent's SIGTERM raises KeyboardInterrupt, as an import's does."""
    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_results_come_in_the_order_of_the_items(pooled: None) -> None:
    assert workers.map_all(_square, 1, list(range(100))) == [x * x + 1 for x in range(100)]


def test_a_worker_ignores_ctrl_c_and_dies_at_sigterm(pooled: None, sigterm_raises: None) -> None:
    seen = workers.map_all(_handlers, None, list(range(64)))
    in_workers = [(sigint, sigterm) for pid, sigint, sigterm in seen if pid != os.getpid()]
    assert in_workers, "no item ran in a worker"
    assert set(in_workers) == {(signal.SIG_IGN, signal.SIG_DFL)}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the parent's own
