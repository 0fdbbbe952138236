"""Turn-taking (`--turn-tokens N`, engine/run/turns.py): a run pauses after its prefill and
after every N decode tokens until its driver says `go`, out of every token's clock, with
nothing in flight; each token carries its slice; `stop` or end of file ends it cleanly,
with the normal outputs for the tokens done."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from abbench.engine.config import EngineConfig
from abbench.engine.run.session import Engine, RunResult
from abbench.engine.run.telemetry import csv_text, json_doc
from abbench.engine.run.turns import TurnPipe, slice_of
from abbench.errors import UsageError
from abbench.records.bmoe_csv import parse_bmoe_csv
from abbench.records.cell_doc import CONFIG, PER_TOKEN
from abbench.records.slices import TurnLine
from abbench.records.tokens import SLICE


class SlowInbox(io.StringIO):
    """A driver that answers each turn line after `delay_s`: the other run's turn."""

    def __init__(self, text: str, delay_s: float = 0.0) -> None:
        super().__init__(text)
        self.delay_s = delay_s
        self.reads = 0

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        self.reads += 1
        time.sleep(self.delay_s)
        return super().readline()


def run(model: Path, inbox: io.StringIO, n: int = 8, every: int = 3,
        **kw: object) -> tuple[RunResult, list[TurnLine]]:
    cfg = EngineConfig(model=str(model), n_tokens=n, turn_tokens=every, cache_mib=0.2,
                       ignore_eos=True, **kw)  # type: ignore[arg-type]
    out = io.StringIO()
    with Engine(cfg, model) as engine:
        result = engine.run(turns=TurnPipe(inbox, out))
    lines = [TurnLine.parse(x) for x in out.getvalue().splitlines()]
    assert None not in lines, out.getvalue()
    return result, lines  # type: ignore[return-value]


def test_a_run_pauses_after_its_prefill_and_every_n_tokens(tiny_model: Path) -> None:
    inbox = SlowInbox("go\ngo\ngo\n")
    result, lines = run(tiny_model, inbox)
    assert [(x.event, x.tokens) for x in lines] == [
        ("ready", 0), ("paused", 3), ("paused", 6), ("done", 8)]
    assert inbox.reads == 3  # no wait after the last token
    assert [r.slice for r in result.decode] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert all(r.slice is None for r in result.prefill)
    assert len(result.output_ids) == 8


def test_the_pause_is_in_no_tokens_time(tiny_model: Path) -> None:
    # Each wait for `go` takes 0.4 s; a token of the tiny model takes milliseconds.
    result, _ = run(tiny_model, SlowInbox("go\ngo\ngo\n", delay_s=0.4))
    assert max(r.wall_ms for r in result.records) < 300
    assert max(r.cpu_ms for r in result.records) < 300


def test_the_same_tokens_with_turns_as_without(tiny_model: Path) -> None:
    taking, _ = run(tiny_model, SlowInbox("go\n" * 3), prefetch=1, prefetch_sync=True)
    cfg = EngineConfig(model=str(tiny_model), n_tokens=8, cache_mib=0.2, ignore_eos=True,
                       prefetch=1, prefetch_sync=True)
    with Engine(cfg, tiny_model) as engine:
        alone = engine.run()
    assert taking.output_ids == alone.output_ids


@pytest.mark.parametrize(("said", "tokens"), [("", 0), ("go\n", 3), ("go\ngo\nstop\n", 6)])
def test_end_of_file_or_stop_ends_the_run_with_what_it_did(tiny_model: Path, said: str,
                                                          tokens: int) -> None:
    result, lines = run(tiny_model, SlowInbox(said))
    assert len(result.decode) == len(result.output_ids) == tokens
    assert (lines[-1].event, lines[-1].tokens) == ("done", tokens)
    assert [r.slice for r in result.decode] == [slice_of(s, 3) for s in range(1, tokens + 1)]


def test_a_word_that_is_not_go_or_stop_is_an_error(tiny_model: Path) -> None:
    with pytest.raises(UsageError, match="expected `go` or `stop`"):
        run(tiny_model, SlowInbox("go\nnext\n"))


def test_a_driver_gone_is_a_stop(tiny_model: Path) -> None:
    class Gone(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    cfg = EngineConfig(model=str(tiny_model), n_tokens=8, turn_tokens=3, cache_mib=0.2,
                       ignore_eos=True)
    with Engine(cfg, tiny_model) as engine:
        result = engine.run(turns=TurnPipe(io.StringIO("go\n" * 3), Gone()))
    assert result.decode == ()  # it never heard its first `go`


def test_the_slice_column_is_in_the_json_and_the_csv_of_a_run_that_took_turns(
        tiny_model: Path) -> None:
    result, _ = run(tiny_model, SlowInbox("go\n" * 3))
    assert json_doc(result)[PER_TOKEN][SLICE] == [0, 0, 0, 1, 1, 1, 2, 2]
    table = parse_bmoe_csv(csv_text(result), "tokens.csv")
    assert table.columns[SLICE] == [0, 0, 0, 1, 1, 1, 2, 2]
    # ... and in no other run's files
    cfg = EngineConfig(model=str(tiny_model), n_tokens=4, cache_mib=0.2)
    with Engine(cfg, tiny_model) as engine:
        alone = engine.run()
    assert SLICE not in json_doc(alone)[PER_TOKEN]
    assert SLICE not in parse_bmoe_csv(csv_text(alone), "tokens.csv").columns


def test_the_command_takes_turns_on_stdin_and_stdout(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    p = subprocess.run([sys.executable, "-m", "abbench", "engine", "run", "-m",
                        str(tiny_model), "-n", "16", "--turn-tokens", "8", "-q",
                        "--cache-mib", "0.2", "--json", str(out)],
                       input="go\n", capture_output=True, text=True, timeout=120)
    # The driver went away after its first `go`: the run ends cleanly with 8 tokens.
    assert p.returncode == 0, p.stderr
    assert p.stdout == "abbench-turn ready 0\nabbench-turn paused 8\nabbench-turn done 8\n"
    doc = json.loads(out.read_text())
    assert doc[PER_TOKEN][SLICE] == [0] * 8
    assert doc[CONFIG]["turn_tokens"] == 8


def test_the_command_refuses_a_bad_turn_count(tiny_model: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "abbench", "engine", "run", "-m",
                        str(tiny_model), "--turn-tokens", "-1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "`--turn-tokens`" in p.stderr and "Traceback" not in p.stderr
