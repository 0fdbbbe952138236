"""The route trace reader: the real reference trace, columns by name, and every malformed
input raising `TraceError` naming the file and the line (fuzzed with hypothesis)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from conftest import REFERENCE as BMOE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abbench.analysis.replay import replay
from abbench.errors import AbbenchError, TraceError
from abbench.records.route_trace import parse_route_trace, read_route_trace

REFERENCE = BMOE / "route-trace-2026-07-15" / "qwen.route.csv"
needs_reference = pytest.mark.skipif(not REFERENCE.exists(), reason="reference trace absent")

HEADER = "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped"
GOOD = """\
# route_trace v1
# model=/models/tiny model.gguf arch=qwen3moe n_layer=2 n_expert=4 n_expert_used=2
# layer=0 expert_bytes=1000 dense_bytes=5000
# layer=1 expert_bytes=2000 dense_bytes=5000
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
0,0,0,0,0,1,0.6,0,1000,0
0,0,0,0,1,2,0.4,0,1000,0
0,0,0,1,0,3,0.7,0,2000,0
0,0,0,1,1,0,0.3,0,2000,0
0,1,1,0,0,1,0.5,1,0,0
0,1,1,0,1,3,0.5,0,1000,0
0,1,1,1,0,3,0.9,1,0,0
0,1,1,1,1,2,0.1,0,0,1
"""


def parse_error(text: str) -> str:
    with pytest.raises(TraceError) as err:
        parse_route_trace(text, "t.csv")
    return err.value.message


# -- good input ----------------------------------------------------------------------------


@needs_reference
def test_reads_the_reference_trace() -> None:
    t = read_route_trace(REFERENCE)
    assert (t.n_layer, t.n_expert, t.n_expert_used, t.rows) == (48, 128, 6, 44766)
    assert t.arch == "qwen3moe" and t.model is not None and t.model.endswith("Q4_K_M.gguf")
    assert t.expert_bytes[0] == 3059712 and t.expert_bytes[6] == 2654208
    assert t.dense_bytes[6] == 11682816
    assert not t.has_dropped and not t.dropped.any()   # the reference has no `dropped` column
    assert int((t.phase == 0).sum()) == 7902 and int((t.phase == 1).sum()) == 36864
    # Prefill runs layer-major (every prompt token through layer 0, then layer 1, ...), and
    # its last layer only routes the last prompt token: 28 x 47 x 6 + 6 rows.
    pre = np.flatnonzero(t.phase == 0)
    assert t.layer[pre][:28 * 6].tolist() == [0] * (28 * 6)
    assert len(pre) == 28 * 47 * 6 + 6
    assert set(t.step[pre][t.layer[pre] == 47].tolist()) == {27}


def test_reads_columns_by_name() -> None:
    t = parse_route_trace(GOOD, "t.csv")
    assert (t.n_layer, t.n_expert, t.n_expert_used, t.rows) == (2, 4, 2, 8)
    assert t.model == "/models/tiny model.gguf"      # a path with a space survives
    assert t.expert_bytes == (1000, 2000) and t.dense_bytes == (5000, 5000)
    assert t.dropped.tolist() == [0] * 7 + [1] and t.has_dropped
    assert t.weight.tolist()[:2] == [0.6, 0.4]

    # Shuffled columns, an unknown extra column, no `dropped`: the same routing.
    lines = GOOD.splitlines()
    names = HEADER.split(",")
    order = [9, 5, 0, 3, 7, 1, 6, 2, 8, 4]
    shuffled = [",".join([names[i] for i in order if names[i] != "dropped"] + ["extra"])]
    for row in lines[5:]:
        f = row.split(",")
        shuffled.append(",".join([f[i] for i in order if names[i] != "dropped"] + ["x"]))
    u = parse_route_trace("\n".join(lines[:4] + shuffled) + "\n", "u.csv")
    assert not u.has_dropped and not u.dropped.any()
    for col in ("turn", "phase", "step", "layer", "slot", "expert", "weight", "residency"):
        assert getattr(u, col).tolist() == getattr(t, col).tolist(), col


def test_tolerates_crlf_blank_lines_bom_and_a_trailer() -> None:
    text = "\ufeff" + GOOD.replace("\n", "\r\n") + "\r\n# summary rows=8\r\n\r\n"
    assert parse_route_trace(text.encode("utf-8"), "t.csv").rows == 8


def test_layer_lines_in_any_order() -> None:
    lines = GOOD.splitlines()
    lines[2], lines[3] = lines[3], lines[2]
    assert parse_route_trace("\n".join(lines), "t.csv").expert_bytes == (1000, 2000)


# -- bad input: one message naming the file and the line -----------------------------------


def _edit(line: int, new: str | None) -> str:
    """GOOD with line `line` (1-based) replaced, or removed when `new` is None."""
    lines = GOOD.splitlines()
    if new is None:
        del lines[line - 1]
    else:
        lines[line - 1] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("text", "where", "says"), [
    ("", "t.csv:1:", "empty file"),
    ("\n\n  \n", "t.csv:1:", "empty file"),
    (HEADER + "\n0,1,0,0,0,1,0.5,0,10,0\n", "t.csv:1:", "no route trace preamble"),
    (_edit(1, "# route_trace v2"), "t.csv:1:", "unsupported version"),
    (_edit(2, "# model=x arch=qwen3moe n_layer=2 n_expert_used=2"), "t.csv:2:", "`n_expert=`"),
    (_edit(2, "# model=x n_layer=two n_expert=4 n_expert_used=2"), "t.csv:2:", "n_layer=two"),
    (_edit(2, "# model=x n_layer=2 n_expert=4 n_expert_used=5"), "t.csv:2:", "n_expert_used=5"),
    (_edit(2, None), "t.csv:4:", "no `n_layer=`, `n_expert=`, `n_expert_used=`"),
    (_edit(4, None), "t.csv:4:", "no `# layer=1 expert_bytes=...` line"),
    (_edit(4, "# layer=0 expert_bytes=2000 dense_bytes=5000"), "t.csv:4:", "second `# layer=0`"),
    (_edit(4, "# layer=7 expert_bytes=2000"), "t.csv:4:", "n_layer=2"),
    (_edit(4, "# layer=1 expert_bytes=0 dense_bytes=5000"), "t.csv:4:", "expert_bytes=0"),
    (_edit(4, "# layer=1 dense_bytes=5000"), "t.csv:4:", "no `expert_bytes=`"),
    (_edit(5, None), "t.csv:5:", "expected the CSV header"),
    (_edit(5, HEADER.replace("expert,", "exprt,")), "t.csv:5:", "did you mean `exprt`?"),
    (_edit(5, HEADER.replace("weight", "turn")), "t.csv:5:", "`turn` appears twice"),
    (_edit(7, "0,0,0,0,1,2,0.4,0,1000"), "t.csv:7:", "9 fields, the header has 10"),
    (_edit(7, "0,0,0,0,1,2,0.4,0,1000,0,9"), "t.csv:7:", "11 fields"),
    (_edit(7, "0,0,0,0,1,two,0.4,0,1000,0"), "t.csv:7:", "`expert` is `two`"),
    (_edit(7, "0,0,0,0,1,4,0.4,0,1000,0"), "t.csv:7:", "`expert` is 4, outside 0..3"),
    (_edit(7, "0,2,0,0,1,2,0.4,0,1000,0"), "t.csv:7:", "`phase` is 2"),
    (_edit(7, "0,0,0,0,1,2,0.4,3,1000,0"), "t.csv:7:", "`residency` is 3"),
    (_edit(7, "0,0,0,2,1,2,0.4,0,1000,0"), "t.csv:7:", "`layer` is 2"),
    (_edit(7, "0,0,-1,0,1,2,0.4,0,1000,0"), "t.csv:7:", "`step` is -1"),
    (_edit(7, "0,0,0,0,1,2,nan,0,1000,0"), "t.csv:7:", "`weight` is nan"),
    (_edit(7, "0,0,0,0,1,2,0.4x,0,1000,0"), "t.csv:7:", "`weight` is `0.4x`"),
    ("\n".join(GOOD.splitlines()[:5]) + "\n", "t.csv:", "no rows after the CSV header"),
    ("\n".join(GOOD.splitlines()[:4]) + "\n", "t.csv:", "no CSV header"),
])
def test_malformed_trace_names_file_and_line(text: str, where: str, says: str) -> None:
    message = parse_error(text)
    assert message.startswith(where) and says in message, message
    assert "\n" not in message


def test_undecodable_bytes_name_their_line() -> None:
    data = GOOD.encode().replace(b"0.7", b"0.\xff")
    with pytest.raises(TraceError, match=r"^t\.csv:8: not UTF-8"):
        parse_route_trace(data, "t.csv")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read route trace"):
        read_route_trace(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="cannot read route trace"):
        read_route_trace(tmp_path)


# -- fuzz: random input raises TraceError or parses, and what parses replays ---------------


def _survive(data: bytes) -> None:
    """Parse; whatever parses must also replay. Only TraceError may escape."""
    try:
        trace = parse_route_trace(data, "fuzz.csv")
    except TraceError as e:
        assert isinstance(e, AbbenchError) and e.message.startswith("fuzz.csv:")
        return
    replay(trace, budgets_mib=[0.001, 1.0])


def _mutate(seed: int, n: int) -> bytes:
    """GOOD with `n` random byte edits (replace, delete, insert, duplicate or drop a line)."""
    rng = random.Random(seed)
    data = bytearray(GOOD.encode())
    alphabet = b"0123456789,.-#=\n\r eanx\xff"
    for _ in range(n):
        op = rng.randrange(5)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] = rng.choice(alphabet)
        elif op == 1 and data:
            del data[min(at, len(data) - 1)]
        elif op == 2:
            data[at:at] = bytes([rng.choice(alphabet)])
        else:
            lines = bytes(data).split(b"\n")
            i = rng.randrange(len(lines))
            if op == 3:
                lines.insert(i, lines[rng.randrange(len(lines))])
            else:
                del lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


_FUZZ = settings(max_examples=200, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])
_FUZZ_SLOW = settings(max_examples=5000, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=600))
def test_fuzz_random_bytes(data: bytes) -> None:
    _survive(data)
    _survive(GOOD.encode()[:200] + data)


@_FUZZ
@given(st.integers(0, 2**32), st.integers(1, 8))
def test_fuzz_mutations_of_a_valid_trace(seed: int, n: int) -> None:
    _survive(_mutate(seed, n))


@pytest.mark.slow
@_FUZZ_SLOW
@given(st.integers(0, 2**32), st.integers(1, 20))
def test_fuzz_mutations_of_a_valid_trace_at_full_count(seed: int, n: int) -> None:
    _survive(_mutate(seed, n))


@pytest.mark.slow
@_FUZZ_SLOW
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes_at_full_count(data: bytes) -> None:
    _survive(GOOD.encode()[:300] + data)
