"""A cell's `summary.json` document: its top-level keys, spelled once, and the document
each kind of cell writes.

```
the embedded engine (`abbench engine run --json`, indented):
  format config resolved model fingerprint summary lines prompt_ids output_ids text
  per_token prefill, then the run's own sections (policies, kernels, predict)
a llama.cpp cell (campaign/output.py):
  llama-bench:       summary per_token fingerprint samples="repetitions"
  llama-completion:  summary fingerprint notes
an imported run (importers/write.py):
  format files tok/s_source summary fingerprint preamble resolved metrics per_token
```

Each writer keeps its own key order, as the files written before this module have it, so
that a document written again is the same bytes. `per_token` and `prefill` are columns
named by `records.tokens`; `summary` is a `RunSummary`. The reader is
`records.cell_files.read_cell_files`. Outside `records/` these keys are named by the
constants here only (`tests/test_architecture.py` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from abbench.records.summary import JSON_FORMAT, RunSummary

FORMAT = "format"  # which writer: JSON_FORMAT, IMPORT_DOC_FORMAT; absent for llama.cpp
CONFIG = "config"  # the engine's configuration as run (`EngineConfig.to_dict`)
RESOLVED = "resolved"  # what the engine settled that the configuration left open
MODEL = "model"  # the model file's description
FINGERPRINT = "fingerprint"  # the work done, never a timing ("sha256:...")
SUMMARY = "summary"  # the RunSummary
LINES = "lines"  # the console's summary lines
PROMPT_IDS = "prompt_ids"
OUTPUT_IDS = "output_ids"
TEXT = "text"
PER_TOKEN = "per_token"  # decode columns (records.tokens), one value per token
PREFILL = "prefill"  # prefill columns, one value per batch
SAMPLES = "samples"  # what a per_token value is when it is not one token
NOTES = "notes"  # what the cell's reader noted about its output
FILES = "files"  # an import's source files
TPS_SOURCE = "tok/s_source"  # where an import's tok/s came from
PREAMBLE = "preamble"  # the bmoe CSV's `key=value` preamble, as read or to write
METRICS = "metrics"  # an imported run's `.metrics` file, as read

TOP_LEVEL_KEYS = (FORMAT, CONFIG, RESOLVED, MODEL, FINGERPRINT, SUMMARY, LINES, PROMPT_IDS,
                  OUTPUT_IDS, TEXT, PER_TOKEN, PREFILL, SAMPLES, NOTES, FILES, TPS_SOURCE,
                  PREAMBLE, METRICS)

REPETITIONS = "repetitions"  # `samples`: each value is one repetition (llama-bench)
IMPORT_DOC_FORMAT = "abbench-import v1"


@dataclass(frozen=True)
class Resolved:
    """`resolved`: the sampling settings and machine facts the engine settled (the model's
    defaults, the threads it ran, whether O_DIRECT held); an import knows the thread count
    at most. A field that is None is left out; each field's name is its key."""

    temp: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    threads: int | None = None
    o_direct: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def engine_doc(*, config: Mapping[str, Any], resolved: Resolved, model: Mapping[str, Any],
               fingerprint: str, summary: RunSummary, lines: Sequence[str],
               prompt_ids: Sequence[int], output_ids: Sequence[int], text: str,
               per_token: Mapping[str, list[Any]], prefill: Mapping[str, list[Any]],
               sections: Mapping[str, Any]) -> dict[str, Any]:
    """The embedded engine's run JSON. `sections`: the run's own top-level sections, after
    the columns; one may not take a key of the document."""
    taken = set(sections) & set(TOP_LEVEL_KEYS)
    if taken:
        raise ValueError(f"a run section may not replace the document's {sorted(taken)}")
    return {
        FORMAT: JSON_FORMAT, CONFIG: config, RESOLVED: resolved.to_json(), MODEL: model,
        FINGERPRINT: fingerprint, SUMMARY: summary.to_json(), LINES: list(lines),
        PROMPT_IDS: list(prompt_ids), OUTPUT_IDS: list(output_ids), TEXT: text,
        PER_TOKEN: dict(per_token), PREFILL: dict(prefill), **sections,
    }


def llama_bench_doc(summary: RunSummary, per_token: Mapping[str, list[float]],
                    fingerprint: str) -> dict[str, Any]:
    """A llama-bench cell's document: each repetition is one sample (no warm-up is cut
    from them: llama-bench warms up itself)."""
    return {SUMMARY: summary.to_json(), PER_TOKEN: dict(per_token), FINGERPRINT: fingerprint,
            SAMPLES: REPETITIONS}


def llama_completion_doc(summary: RunSummary, fingerprint: str | None,
                         notes: Sequence[str]) -> dict[str, Any]:
    """A llama-completion cell's document: no per-token times."""
    return {SUMMARY: summary.to_json(), FINGERPRINT: fingerprint, NOTES: list(notes)}


def bmoe_doc(summary: RunSummary, fingerprint: str | None, preamble: Mapping[str, str],
             metrics: Mapping[str, Any], notes: Sequence[str]) -> dict[str, Any]:
    """A bmoe cell's document: its columns are its tokens.csv (the CSV bmoe-cli wrote),
    its preamble what bmoe-cli says it ran, its metrics the `.metrics` read around it."""
    return {SUMMARY: summary.to_json(), FINGERPRINT: fingerprint, PREAMBLE: dict(preamble),
            METRICS: dict(metrics), NOTES: list(notes)}


def import_doc(*, files: Sequence[str], tps_source: str, summary: RunSummary,
               fingerprint: str | None, preamble: Mapping[str, str], resolved: Resolved,
               metrics: Mapping[str, Any],
               per_token: Mapping[str, list[float | None]]) -> dict[str, Any]:
    """An imported run's document: its figures, where tok/s came from, and its per-token
    columns as an external cell's output is kept."""
    return {
        FORMAT: IMPORT_DOC_FORMAT, FILES: list(files), TPS_SOURCE: tps_source,
        SUMMARY: summary.to_json(), FINGERPRINT: fingerprint, PREAMBLE: dict(preamble),
        RESOLVED: resolved.to_json(), METRICS: metrics, PER_TOKEN: dict(per_token),
    }


__all__ = [
    "CONFIG", "FILES", "FINGERPRINT", "FORMAT", "IMPORT_DOC_FORMAT", "LINES", "METRICS",
    "MODEL", "NOTES", "OUTPUT_IDS", "PER_TOKEN", "PREAMBLE", "PREFILL", "PROMPT_IDS",
    "REPETITIONS", "RESOLVED", "Resolved", "SAMPLES", "SUMMARY", "TEXT", "TOP_LEVEL_KEYS",
    "TPS_SOURCE", "bmoe_doc", "engine_doc", "import_doc", "llama_bench_doc", "llama_completion_doc",
]
