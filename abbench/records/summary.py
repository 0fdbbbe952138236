"""A cell's run summary (`RunSummary`: the one definition of every key it carries), the
engine's run JSON document (`--json`, a cell's summary.json) and the `generation:` console
line, which the seed engine, abbench's engine and an external cell's
`output = "stdout-summary"` all print:

```
generation: 64 tokens, 0.105 s/token (9.524 tok/s)
```

The summary crosses the cell boundary: the engine's child writes it, the campaign keeps it
in the journal, the analysis, the reports and the importers read it. Outside `records/`
it is read and built by attribute only; its JSON keys are spelt here and in the readers
of the formats that carry them (`bmoe_csv`, `llamacpp`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from abbench.errors import BadField, CellOutputError, Key
from abbench.records.schema import annotations_of, as_table, fail, is_number, typed

JSON_FORMAT = "abbench-engine-run v1"
NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
GENERATION = re.compile(
    rf"generation:\s*{NUMBER}\s+tokens,\s*{NUMBER}\s*s/token\s*\(\s*{NUMBER}\s*tok/s\)")


def generation_line(tokens: int, s_per_token: float, tokens_per_s: float) -> str:
    return f"generation: {tokens} tokens, {s_per_token:.3f} s/token ({tokens_per_s:.3f} tok/s)"


def read_generation(text: str) -> dict[str, Any] | None:
    """tokens, s/tok and tok/s of the last `generation:` line in `text`; None without one."""
    found = list(GENERATION.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {"tokens": int(float(m[1])), "s/tok": float(m[2]), "tok/s": float(m[3])}


def read_engine_json(path: Path) -> tuple[dict[str, Any], str | None]:
    """The summary and fingerprint of an engine run JSON; CellOutputError when it is absent
    or not one."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        summary = doc["summary"]
        if not isinstance(summary, dict):
            raise TypeError("summary is not an object")
    except FileNotFoundError:
        raise CellOutputError(f"the cell wrote no {path.name}") from None
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CellOutputError(f"{path.name} is not an engine run JSON ({e})") from None
    fp = doc.get("fingerprint")
    return summary, fp if isinstance(fp, str) else None


# -- the run summary -------------------------------------------------------------------------


def _key(name: str) -> Any:
    """A summary field: `name` is its JSON key, unit included as the files spell it."""
    return field(default=None, metadata={"key": name})


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """A cell's run summary: abbench's engine's, a llama.cpp tool's, an external command's
    or an imported run's figures, as the journal and summary.json hold them.

    Every field is one key of the JSON object (`metadata["key"]`), None where the summary
    does not give it. Numbers are finite: a non-finite one given is written null, as JSON
    has no NaN. A figure is a `float` and keeps an integer as written (256 from abbench's
    engine, 256.0 from a `# summary` line, which writes every number as a float); `int`
    only where a reader needs a whole number. `extra` keeps what no field reads, as written:
    a foreign engine's own keys, and a named key whose value is not of its type (so the
    record says what the cell reported). `keys` are the object's keys in the order
    written, nulls included, so that a summary read and written again is the same bytes;
    built by attribute, they are the fields that are set, in field order, then `extra`."""

    # decode (the engine's phase 1, after the prompt): what the `generation:` line gives
    tokens: float | None = _key("tokens")  # decode tokens
    s_per_tok: float | None = _key("s/tok")
    tok_per_s: float | None = _key("tok/s")
    # where the time between decodes is recorded (the seed engine's v2 CSV), `tok/s` and
    # `s/tok` are what a user waits through, and these the decode alone and the gap
    decode_tok_per_s: float | None = _key("decode_tok/s")
    between_s_per_tok: float | None = _key("loop_overhead_s/tok")
    turns: float | None = _key("turns")  # a session's turns, each with its own trailer
    # expert reads, time per token, the expert cache
    read_mib: float | None = _key("read_MiB")
    read_mib_per_tok: float | None = _key("read_MiB/tok")
    io_s: float | None = _key("io_s")  # time reads were in flight
    io_s_per_tok: float | None = _key("io_s/tok")
    bandwidth_mib_per_s: float | None = _key("bandwidth_MiB/s")  # read bytes / io_s
    compute_s_per_tok: float | None = _key("compute_s/tok")
    mgmt_s_per_tok: float | None = _key("mgmt_s/tok")  # cache management
    stall_s_per_tok: float | None = _key("stall_s/tok")  # compute waiting on a read
    cache_hit_pct: float | None = _key("cache_hit_pct")  # negative: the cache was off
    hits: float | None = _key("hits")
    misses: float | None = _key("misses")
    evictions: float | None = _key("evictions")
    cache_resident_mib: float | None = _key("cache_resident_MiB")
    cache_budget_mib: float | None = _key("cache_budget_MiB")
    majflt_per_tok: float | None = _key("majflt/tok")
    cpu_s_per_tok: float | None = _key("cpu_s/tok")
    cpu_occupancy: float | None = _key("cpu_occupancy")  # cpu time / (wall x threads)
    peak_rss_mib: float | None = _key("peak_rss_MiB")
    dense_mib: float | None = _key("dense_MiB")
    # the prompt (prefill) and the model's load
    n_prompt: float | None = _key("n_prompt")  # prompt tokens
    prefill_s: float | None = _key("prefill_s")
    ttft_s: float | None = _key("ttft_s")  # time to first token, load excluded
    prefill_tok_per_s: float | None = _key("prefill_tok/s")
    load_s: float | None = _key("load_s")
    # routing: drops and speculative reads
    experts_routed: float | None = _key("experts_routed")
    experts_dropped: float | None = _key("experts_dropped")
    spec_read_mib: float | None = _key("spec_read_MiB")
    spec_experts: float | None = _key("spec_experts")
    spec_useful: float | None = _key("spec_useful")
    spec_cancelled: float | None = _key("spec_cancelled")
    # self-speculative decoding (the seed engine's --mtp / --ngram) and route-ahead
    mtp_drafted: float | None = _key("mtp_drafted")  # tokens proposed
    mtp_accepted: float | None = _key("mtp_accepted")  # of them, confirmed
    mtp_decodes: float | None = _key("mtp_decodes")  # verify decodes
    ra_agree_pct: float | None = _key("ra_agree_pct")  # committed routing = the router's
    retained: float | None = _key("retained")  # predicted residents kept from eviction
    o_direct: int | None = _key("o_direct")  # 1: reads bypassed the page cache
    threads: int | None = _key("threads")  # compute threads
    # llama.cpp's tools (`records.llamacpp`)
    n_tokens: int | None = _key("n_tokens")  # tokens generated over all repetitions
    repetitions: int | None = _key("repetitions")
    tokens_per_repetition: int | None = _key("tokens_per_repetition")
    engine: str | None = _key("engine")  # "llama-bench" | "llama-completion"
    build: str | None = _key("build")  # llama-bench's build_commit
    llama_bench_avg_ts: float | None = _key("llama_bench_avg_ts")  # its own mean of rates

    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        hints = annotations_of(RunSummary)
        present = list(self.keys)
        for key, name in _NAME.items():
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                object.__setattr__(self, name, None)
            elif value is None:
                continue
            else:
                typed(value, hints[name], (key,))
            if key in self.extra:
                fail((key,), "is given twice: as a field and in `extra`")
            if key not in present:
                present.append(key)
        for key in self.keys:
            if key not in _NAME and key not in self.extra:
                fail((key,), "is in `keys` but neither a field nor in `extra`")
        present += [key for key in self.extra if key not in present]
        if len(set(present)) != len(present):
            fail(("keys",), "names a key twice")
        object.__setattr__(self, "keys", tuple(present))

    @classmethod
    def from_json(cls, d: Any, key: Key = ()) -> RunSummary:
        """A summary as a file holds it (`key` names it in a problem): only a value that is
        not an object is refused. A named key whose value is not of its type is kept in
        `extra`; non-finite numbers become null (an external command's JSON may hold
        them)."""
        hints = annotations_of(cls)
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in as_table(key, d, strict=False).items():
            v = finite(v)
            name = _NAME.get(k)
            if name is not None and _fits(v, hints[name]):
                if v is not None:
                    values[name] = v
            else:
                extra[k] = v
        return cls(**values, extra=extra, keys=tuple(d))

    def to_json(self) -> dict[str, Any]:
        return {k: self.extra[k] if k in self.extra else getattr(self, _NAME[k])
                for k in self.keys}

    def with_values(self, **changes: Any) -> RunSummary:
        """A copy with the fields in `changes` set; None leaves a key out (an unknown figure
        is not written null). A key set keeps its place, a new one goes last."""
        touched = {_KEY[name] for name in changes if name in _KEY}
        gone = {_KEY[name] for name, v in changes.items() if v is None and name in _KEY}
        return dataclasses.replace(
            self, **changes, extra={k: v for k, v in self.extra.items() if k not in touched},
            keys=tuple(k for k in self.keys if k not in gone))


# JSON key -> field name, and back, for the named keys.
_NAME = {f.metadata["key"]: f.name for f in fields(RunSummary) if "key" in f.metadata}
_KEY = {name: key for key, name in _NAME.items()}


def _fits(value: Any, hint: Any) -> bool:
    try:
        typed(value, hint, ())
    except BadField:
        return False
    return True


def finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, inf) in it replaced by None: garbage in a
    record, and not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def usable_throughput(doc: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """A summary document's tok/s when it is a usable throughput (a finite number above
    0); else None and, when the document reports a throughput that is not usable,
    `tok/s = VALUE` as reported."""
    if "tok/s" not in doc:
        return None, None
    value = doc["tok/s"]
    if is_number(value) and 0 < value < math.inf:
        return float(value), None
    return None, f"tok/s = {value!r}"
