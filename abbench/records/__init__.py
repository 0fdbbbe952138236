"""The run folder and every file format: what `campaign` (and importers) write and `analysis` reads.

A run folder is the single source of truth; every report is re-rendered from it.

```
RUN/
  campaign.toml          the campaign file as resolved (every cell's full configuration)
  plan.json              Plan: the cells in execution order
  journal.jsonl          one CellRecord per finished cell (appended, flushed, fsync'd)
  samples.jsonl          one Sample per sampler tick
  noise-floor.json       NoiseFloor: the device history's cell-to-cell noise when the run began
  cells/NN-NAME/         tokens.csv, summary.json (the engine's --json), stderr.txt;
                         slices.jsonl where the cell took turns (interleave = "slices")
  report.md|json|html    rendered by `abbench report RUN`
```

Everything here is a frozen dataclass with `to_json()` / `from_json()`; unknown keys in a
file are ignored on read (newer writers), missing optional keys take their defaults, and
every other key is checked against its annotation: a value of the wrong type, a number
that is not finite or beyond `LIMIT`, or a label that is not a folder name is a
`RecordError` naming the file, the line and the key.

One module per format: `journal` (journal.jsonl, samples.jsonl), `plan` (plan.json),
`history` (the device history and noise-floor.json), `provenance` (import.json), `cell_files`
(a cell's summary.json and tokens.csv read as `CellFiles`), `cell_doc` (the summary.json
document each kind of cell writes, its top-level keys), `tokens` (the per-token column
names), `slices` (the turn protocol of an interleaved pair, and a cell's slices.jsonl),
`bmoe_csv` (the seed engine's per-token CSV),
`route_trace` (route-trace CSV), `summary` (`RunSummary`, a cell's run summary with every
key it carries, kept as the cell reported it, a value of the wrong type included; the
engine's run JSON and `generation:` line),
`keys` (every sample key), `fleet` (a fleet folder: fleet.json, fleet-journal.jsonl),
`jsonl` (the file mechanics), `schema` (the one validator).
"""

from abbench.errors import RecordError
from abbench.records.cell_files import CellFiles, read_cell_files
from abbench.records.history import (
    NOISE_FLOOR_FILE,
    NoiseFloor,
    RepeatRecord,
    SentinelLine,
    append_repeats,
    history_file,
    read_noise_floor,
    read_repeats,
    read_sentinels,
)
from abbench.records.journal import (
    FORMAT,
    CellRecord,
    EntryState,
    GateWait,
    MemoryUse,
    Sample,
    SampleLog,
    check_label,
    read_journal,
    read_samples,
)
from abbench.records.jsonl import (
    append_jsonl,
    document_text,
    numbered_jsonl,
    read_jsonl,
    read_record,
)
from abbench.records.plan import (
    EXPECT,
    DecisionSpec,
    GateSpec,
    Look,
    MatchSpec,
    Plan,
    PlannedCell,
    Sequential,
    config_key,
    read_plan,
)
from abbench.records.provenance import (
    FACT_KINDS,
    IMPORT_FILE,
    IMPORT_FORMAT,
    Fact,
    ImportedCell,
    ImportInfo,
    NotImported,
    read_import_info,
)
from abbench.records.summary import RunSummary

__all__ = [
    "CellFiles",
    "CellRecord",
    "EXPECT",
    "EntryState",
    "FACT_KINDS",
    "FORMAT",
    "Fact",
    "GateWait",
    "IMPORT_FILE",
    "IMPORT_FORMAT",
    "ImportInfo",
    "ImportedCell",
    "Look",
    "MemoryUse",
    "DecisionSpec",
    "GateSpec",
    "MatchSpec",
    "NOISE_FLOOR_FILE",
    "NotImported",
    "NoiseFloor",
    "Plan",
    "PlannedCell",
    "RecordError",
    "RepeatRecord",
    "RunSummary",
    "Sample",
    "SampleLog",
    "SentinelLine",
    "Sequential",
    "append_jsonl",
    "append_repeats",
    "check_label",
    "config_key",
    "document_text",
    "history_file",
    "numbered_jsonl",
    "read_cell_files",
    "read_import_info",
    "read_journal",
    "read_jsonl",
    "read_noise_floor",
    "read_plan",
    "read_record",
    "read_repeats",
    "read_samples",
    "read_sentinels",
]
