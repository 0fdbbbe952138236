"""`route_trace v1` files, read and written: one row per routed expert, in run order. The
engine writes them (`--route-trace`); `abbench replay` reads them
(docs/formats.md#route-trace-route_trace-v1).

    # route_trace v1
    # model=PATH arch=NAME n_layer=L n_expert=E n_expert_used=K     [more key=value pairs]
    # layer=0 expert_bytes=B dense_bytes=D                           one per layer
    turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
    0,0,0,0,0,49,0.221297,0,3059712,0

`phase` 0 prefill, 1 decode; `residency` 0 miss, 1 hit, 2 hit on a speculative read;
`expert_bytes` what the row read (0 on a hit); `dropped` 0/1. Columns are found by name:
`dropped` is optional (older traces, like the reference one, lack it: read as 0) and
unknown columns are ignored. `#` lines after the header (a trailer) and blank lines are
skipped. Anything else that does not fit raises `TraceError` naming the file and line.

The writer puts a dropped expert in a row with residency 0, expert_bytes 0 and dropped 1
(it was not read). A trace is written beside its destination and renamed into place when
the run ends, so a crash never leaves half a trace.
"""

from __future__ import annotations

import difflib
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from abbench.errors import TraceError, WriteError
from abbench.fsutil import file_mode, whole_file_target
from abbench.records.bmoe_csv import CACHE_BUDGET
from abbench.records.text import ascii_clip

MAGIC = "# route_trace v1"
REQUIRED = ("turn", "phase", "step", "layer", "slot", "expert", "weight", "residency",
            "expert_bytes")
OPTIONAL = ("dropped",)
HEADER = ",".join(REQUIRED + OPTIONAL)  # what the writer writes
_INT_COLUMNS = tuple(c for c in REQUIRED + OPTIONAL if c != "weight")
_MAX_INDEX = 1 << 40     # steps and turns; keeps every integer column inside int64
_MAX_LAYERS = 1 << 14
_MAX_EXPERTS = 1 << 20
_TIP = "a route trace starts with `# route_trace v1`, a `# model=... n_layer= n_expert= " \
       "n_expert_used=` line and one `# layer=L expert_bytes=B dense_bytes=D` line per " \
       "layer (docs/replay.md)"




@dataclass(frozen=True, eq=False)
class RouteTrace:
    """One route trace: preamble facts and one numpy column per CSV column, in file order."""

    source: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    expert_bytes: tuple[int, ...]        # per layer: bytes one expert slice costs to read
    dense_bytes: tuple[int | None, ...]  # per layer, None where the preamble left it out
    meta: dict[str, str]                 # every key=value of the model line, as written
    has_dropped: bool                    # False: the file had no `dropped` column
    turn: np.ndarray = field(repr=False)          # (rows,) int64
    phase: np.ndarray = field(repr=False)         # (rows,) int64, 0 prefill / 1 decode
    step: np.ndarray = field(repr=False)          # (rows,) int64
    layer: np.ndarray = field(repr=False)         # (rows,) int64
    slot: np.ndarray = field(repr=False)          # (rows,) int64
    expert: np.ndarray = field(repr=False)        # (rows,) int64
    weight: np.ndarray = field(repr=False)        # (rows,) float64
    residency: np.ndarray = field(repr=False)     # (rows,) int64, 0 miss / 1 hit / 2 spec hit
    row_bytes: np.ndarray = field(repr=False)     # (rows,) int64, the `expert_bytes` column
    dropped: np.ndarray = field(repr=False)       # (rows,) int64, 0/1

    @property
    def rows(self) -> int:
        return len(self.layer)

    @property
    def model(self) -> str | None:
        return self.meta.get("model")

    @property
    def arch(self) -> str | None:
        return self.meta.get("arch")

    @property
    def cache_budget_mib(self) -> float | None:
        """The run's own cache budget in MiB, where the model line states it: `cache_mib=`,
        or `cache_mb=` as the seed engine's bmoe_metrics preamble names it."""
        for key in ("cache_mib", CACHE_BUDGET):
            try:
                value = float(self.meta.get(key, ""))
            except ValueError:
                continue
            if 0 < value < math.inf:
                return value
        return None


def read_route_trace(path: str | Path) -> RouteTrace:
    """Read a `route_trace v1` file; raise `TraceError` (naming file and line) on bad input."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read route trace {path}: {e.strerror or e}") from None
    return parse_route_trace(data, str(path))


def parse_route_trace(data: bytes | str, source: str = "<trace>") -> RouteTrace:
    """Parse the text of a route trace; `source` names it in error messages."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise TraceError(f"{source}:{line}: not UTF-8 text (byte {data[e.start]:#04x})",
                             tip=_TIP) from None
    else:
        text = data
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    return _Parser(source, lines).parse()


def _fail(source: str, line: int, what: str, tip: str | None = None) -> TraceError:
    return TraceError(f"{source}:{line}: {what}", tip=tip)


def _pairs(body: str) -> dict[str, str]:
    """`key=value key=value` → dict. A token without `key=` continues the previous value,
    so a model path with spaces survives."""
    out: dict[str, str] = {}
    last: str | None = None
    for tok in body.split():
        key, eq, value = tok.partition("=")
        if eq and key.isidentifier():
            out[key] = value
            last = key
        elif last is not None:
            out[last] += " " + tok
    return out


def _int(text: str, fail: TraceError, lo: int = 0, hi: int = _MAX_INDEX) -> int:
    try:
        value = int(text)
    except ValueError:
        raise fail from None
    if not lo <= value <= hi:
        raise fail
    return value


class _Parser:
    """One pass over the lines: preamble, header, rows."""

    def __init__(self, source: str, lines: list[str]) -> None:
        self.source = source
        self.lines = lines
        self.model_at = 0        # line number of the model line, once the preamble is read

    def fail(self, line: int, what: str, tip: str | None = None) -> TraceError:
        return _fail(self.source, line, what, tip)

    def parse(self) -> RouteTrace:
        if not any(ln.strip() for ln in self.lines):
            raise self.fail(1, "empty file, expected a route trace", tip=_TIP)
        first = self.lines[0].lstrip("\ufeff").strip()
        if first != MAGIC:
            what = (f"unsupported version `{ascii_clip(first[2:])}`, this abbench reads "
                    "route_trace v1"
                    if first.startswith("# route_trace") else
                    f"expected `{MAGIC}`, got `{ascii_clip(first)}` (no route trace preamble)")
            raise self.fail(1, what, tip=_TIP)
        meta, layers, at = self.preamble()
        n_layer, n_expert, k = self.model_line(meta, at)
        expert_bytes, dense_bytes = self.layer_table(layers, n_layer, at)
        columns, at = self.header(at)
        cols = self.rows(columns, at, n_layer, n_expert)
        return RouteTrace(
            source=self.source, n_layer=n_layer, n_expert=n_expert, n_expert_used=k,
            expert_bytes=expert_bytes, dense_bytes=dense_bytes, meta=meta,
            has_dropped="dropped" in columns, turn=cols["turn"], phase=cols["phase"],
            step=cols["step"], layer=cols["layer"], slot=cols["slot"], expert=cols["expert"],
            weight=cols["weight"], residency=cols["residency"], row_bytes=cols["expert_bytes"],
            dropped=cols["dropped"],
        )

    def preamble(self) -> tuple[dict[str, str], dict[int, tuple[int, dict[str, str]]], int]:
        """Model-line pairs, `layer=` lines by layer (with their line number), and the index
        of the first line after the preamble."""
        meta: dict[str, str] = {}
        layers: dict[int, tuple[int, dict[str, str]]] = {}
        i = 1
        while i < len(self.lines) and self.lines[i].lstrip().startswith("#"):
            pairs = _pairs(self.lines[i].lstrip()[1:])
            if "layer" in pairs:
                bad = self.fail(i + 1, f"layer index `{ascii_clip(pairs['layer'])}` is not a "
                                "whole number")
                index = _int(pairs["layer"], bad, hi=_MAX_LAYERS)
                if index in layers:
                    raise self.fail(i + 1, f"a second `# layer={index}` line (the first is "
                                    f"line {layers[index][0]})")
                layers[index] = (i + 1, pairs)
            else:
                if pairs and not self.model_at:
                    self.model_at = i + 1
                meta.update(pairs)
            i += 1
        return meta, layers, i

    def model_line(self, meta: dict[str, str], at: int) -> tuple[int, int, int]:
        at = self.model_at or at + 1
        missing = [key for key in ("n_layer", "n_expert", "n_expert_used") if key not in meta]
        if missing:
            raise self.fail(at, "preamble has no " + ", ".join(f"`{m}=`" for m in missing)
                            + " (expected on the `# model=...` line)", tip=_TIP)

        def number(key: str, hi: int) -> int:
            return _int(meta[key], self.fail(
                at, f"preamble `{key}={ascii_clip(meta[key])}` is not a whole number in 1..{hi}"),
                lo=1, hi=hi)
        n_layer = number("n_layer", _MAX_LAYERS)
        n_expert = number("n_expert", _MAX_EXPERTS)
        k = number("n_expert_used", n_expert)
        return n_layer, n_expert, k

    def layer_table(self, layers: dict[int, tuple[int, dict[str, str]]], n_layer: int,
                    at: int) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
        for index, (line, _) in layers.items():
            if index >= n_layer:
                raise self.fail(line, f"`# layer={index}` but the preamble says "
                                f"n_layer={n_layer}")
        absent = [i for i in range(n_layer) if i not in layers]
        if absent:
            raise self.fail(at + 1, f"preamble has no `# layer={absent[0]} expert_bytes=...` line"
                            + (f" ({len(absent)} layers missing)" if len(absent) > 1 else ""),
                            tip=_TIP)
        expert: list[int] = []
        dense: list[int | None] = []
        for i in range(n_layer):
            line, pairs = layers[i]
            if "expert_bytes" not in pairs:
                raise self.fail(line, f"`# layer={i}` line has no `expert_bytes=`")
            expert.append(_int(pairs["expert_bytes"], self.fail(
                line, f"`expert_bytes={ascii_clip(pairs['expert_bytes'])}` is not a positive "
                "whole number"), lo=1, hi=1 << 48))
            if "dense_bytes" in pairs:
                dense.append(_int(pairs["dense_bytes"], self.fail(
                    line, f"`dense_bytes={ascii_clip(pairs['dense_bytes'])}` is not a whole "
                    "number"), hi=1 << 48))
            else:
                dense.append(None)
        return tuple(expert), tuple(dense)

    def header(self, at: int) -> tuple[list[str], int]:
        while at < len(self.lines) and not self.lines[at].strip():
            at += 1
        if at >= len(self.lines):
            raise self.fail(at, "no CSV header after the preamble (and no rows)")
        columns = [c.strip() for c in self.lines[at].split(",")]
        if all(_looks_numeric(c) for c in columns):
            raise self.fail(at + 1, "expected the CSV header (" + ",".join(REQUIRED + OPTIONAL)
                            + "), got a data row")
        dup = sorted({c for c in columns if columns.count(c) > 1})
        if dup:
            raise self.fail(at + 1, f"column `{dup[0]}` appears twice in the header")
        missing = [c for c in REQUIRED if c not in columns]
        if missing:
            near = difflib.get_close_matches(missing[0], columns, n=1)
            hint = f" (did you mean `{near[0]}`?)" if near else ""
            raise self.fail(at + 1, "header has no " + ", ".join(f"`{m}`" for m in missing)
                            + " column" + ("s" if len(missing) > 1 else "") + hint)
        return columns, at + 1

    def rows(self, columns: list[str], at: int, n_layer: int,
             n_expert: int) -> dict[str, np.ndarray]:
        index = {c: columns.index(c) for c in REQUIRED + OPTIONAL if c in columns}
        hi = {"phase": 1, "residency": 2, "dropped": 1, "layer": n_layer - 1,
              "expert": n_expert - 1, "slot": n_expert - 1, "expert_bytes": 1 << 48}
        ints = [(c, index[c], hi.get(c, _MAX_INDEX)) for c in _INT_COLUMNS if c in index]
        w_at = index["weight"]
        values: dict[str, list[int]] = {c: [] for c, _, _ in ints}
        weights: list[float] = []
        width = len(columns)
        for n in range(at, len(self.lines)):
            line = self.lines[n]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split(",")
            if len(fields) != width:
                raise self.fail(n + 1, f"{len(fields)} fields, the header has {width}")
            for name, i, top in ints:
                text = fields[i]
                try:
                    v = int(text)
                except ValueError:
                    raise self.fail(n + 1, f"`{name}` is `{ascii_clip(text)}`, not a whole "
                                    "number") from None
                if not 0 <= v <= top:
                    raise self.fail(n + 1, f"`{name}` is {v}, outside 0..{top}")
                values[name].append(v)
            try:
                w = float(fields[w_at])
            except ValueError:
                raise self.fail(n + 1, f"`weight` is `{ascii_clip(fields[w_at])}`, not a "
                                "number") from None
            if not math.isfinite(w) or w < 0:
                raise self.fail(n + 1, f"`weight` is {w}, expected a finite number >= 0")
            weights.append(w)
        if not weights:
            raise self.fail(at, "no rows after the CSV header")
        out = {c: np.asarray(v, dtype=np.int64) for c, v in values.items()}
        if "dropped" not in out:
            out["dropped"] = np.zeros(len(weights), dtype=np.int64)
        out["weight"] = np.asarray(weights, dtype=np.float64)
        return out


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class RouteTraceWriter:
    def __init__(self, path: str | os.PathLike[str], model: str, arch: str, n_layer: int,
                 n_expert: int, n_expert_used: int,
                 layer_bytes: list[tuple[int, int]]) -> None:
        try:
            self.path = whole_file_target(path)  # a link's file; never a device renamed over
            fd, tmp = tempfile.mkstemp(prefix="." + self.path.name + ".", suffix=".tmp",
                                       dir=self.path.parent)
        except OSError as e:  # named as the file asked for, not a temp file beside it
            raise WriteError.from_os(OSError(e.errno, e.strerror, str(path)),
                                     "give another path") from None
        self._tmp = Path(tmp)
        os.fchmod(fd, file_mode(self.path))  # as the file it replaces, or as `open` makes one
        self._f: TextIO = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        self._f.write("# route_trace v1\n")
        self._f.write(f"# model={model.replace(' ', '_')} arch={arch} n_layer={n_layer} "
                      f"n_expert={n_expert} n_expert_used={n_expert_used}\n")
        for i, (expert_bytes, dense_bytes) in enumerate(layer_bytes):
            self._f.write(f"# layer={i} expert_bytes={expert_bytes} dense_bytes={dense_bytes}\n")
        self._f.write(HEADER + "\n")

    def layer(self, phase: int, step: int, layer: int, experts: list[int],
              weights: list[float], residency: list[int], dropped: list[int],
              expert_bytes: int) -> None:
        """One layer's routed experts; `expert_bytes` is what a miss at this layer reads (a
        row says what it read: that on a miss, 0 on a hit or a drop)."""
        self._f.writelines(
            f"0,{phase},{step},{layer},{slot},{e},{w:.6f},{r},"
            f"{expert_bytes if r == 0 and not dr else 0},{dr}\n"
            for slot, (e, w, r, dr) in enumerate(zip(experts, weights, residency, dropped))
        )

    def close(self) -> None:
        """Finish the file and move it into place."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abandon(self) -> None:
        self._f.close()
        self._tmp.unlink(missing_ok=True)
