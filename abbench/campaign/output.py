"""Reading what a cell produced: the engine's JSON, or an external command's output.

`output` of an external cell: `bmoe-csv:PATH` (a per-token CSV in the seed engine's layout,
with or without preamble and `# summary`), `json:PATH` (an engine run JSON), or
`stdout-summary` (the `generation:` line in the command's stdout). A PATH on a remote
device is read with `cat` over the device's transport. A llama.cpp cell's stdout (and, for
llama-completion, its stderr's timings) are read by `records.llamacpp`, and kept as the
cell's summary.json: for llama-bench each repetition is one sample of the cell
(`samples` = "repetitions" there: no warm-up is cut from them, llama-bench warms up
itself).

`read_result` judges it: output that cannot be read, or that reports no usable tokens/s,
fails the cell (with the reason in its journal line) and never the campaign.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import abbench.campaign.bmoe as bmoe
from abbench.errors import AbbenchError, CellOutputError, ForeignRunError
from abbench.records.bmoe_csv import BmoeRun, parse_bmoe_csv, work_fingerprint
from abbench.records.bmoe_view import run_summary
from abbench.records.cell_config import (
    BmoeConfig,
    EmbeddedConfig,
    ExternalConfig,
    LaunchedConfig,
    LlamaConfig,
)
from abbench.records.cell_doc import bmoe_doc, llama_bench_doc, llama_completion_doc
from abbench.records.llamacpp import bench_summary, completion_summary, parse_bench_jsonl
from abbench.records.metrics_file import parse_metrics
from abbench.records.summary import (
    RunSummary,
    finite,
    read_engine_json,
    read_generation,
    usable_throughput,
)
from abbench.sensors import Device


@dataclass(frozen=True)
class CellResult:
    """What a finished cell's output gave: its summary (non-finite numbers as None), the
    work fingerprint, its tokens/s, and why the cell failed (None: it did not)."""

    summary: RunSummary = field(default_factory=RunSummary)
    fingerprint: str | None = None
    tokens_per_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class CellOutput:
    """What a cell's output says, read once: its summary (non-finite numbers as None), its
    work fingerprint, and its tok/s where that is a usable throughput, else why not (as
    the output spelled it, before the summary made a non-finite number None)."""

    summary: RunSummary
    fingerprint: str | None
    tokens_per_s: float | None
    unusable: str | None

    @classmethod
    def of(cls, doc: dict[str, Any], fingerprint: str | None) -> CellOutput:
        speed, unusable = usable_throughput(doc)
        return cls(RunSummary.from_json(doc), fingerprint, speed, unusable)


def read_result(cfg: LaunchedConfig, out: Path, device: Device,
                there: str | None = None) -> CellResult:
    """Read and judge the output of a cell whose process exited with status 0 (`there`:
    its folder on an adb/ssh device, where a relative output path starts)."""
    try:
        got = read_cell_output(cfg, out, device, there)
    except AbbenchError as e:
        return CellResult(error=e.message)
    except Exception as e:  # noqa: BLE001 — garbage output must not end the campaign
        return CellResult(error=f"its output could not be read ({type(e).__name__}: {e})")
    error = f"it reported no usable throughput ({got.unusable})" if got.unusable else None
    return CellResult(summary=got.summary, fingerprint=got.fingerprint,
                      tokens_per_s=got.tokens_per_s, error=error)


def read_cell_output(cfg: LaunchedConfig, out: Path, device: Device,
                     there: str | None = None) -> CellOutput:
    if isinstance(cfg, EmbeddedConfig):
        return CellOutput.of(*read_engine_json(out / "summary.json"))
    if isinstance(cfg, LlamaConfig):
        return _llama(cfg.tool, out)
    if isinstance(cfg, BmoeConfig):
        return _bmoe(cfg, out)
    kind = cfg.output.partition(":")[0]
    where = cfg.output_path(out.name) or ""
    if kind == "stdout-summary":
        text = (out / "stdout.txt").read_text(encoding="utf-8", errors="replace")
        summary = read_generation(text)
        if summary is None:
            raise CellOutputError("no `generation:` line in the command's stdout")
        return CellOutput.of(summary, None)
    if there is not None and not where.startswith("/"):
        where = f"{there}/{where}"
    text = _fetch(where, device)
    if kind == "json":
        (out / "summary.json").write_text(text, encoding="utf-8")
        return CellOutput.of(*read_engine_json(out / "summary.json"))
    (out / "tokens.csv").write_text(text, encoding="utf-8")
    return summarize_bmoe_csv(text, where)


def _llama(tool: str, out: Path) -> CellOutput:
    """A llama.cpp cell's summary and fingerprint, kept as its summary.json."""
    stdout = (out / "stdout.txt").read_bytes()
    doc: dict[str, Any]
    if tool == "llama-bench":
        summary, columns, fingerprint = bench_summary(parse_bench_jsonl(
            stdout.decode("utf-8", errors="replace")))
        got = CellOutput.of(summary, fingerprint)
        doc = llama_bench_doc(got.summary, columns, fingerprint)
    else:
        stderr = (out / "stderr.txt").read_text(encoding="utf-8", errors="replace")
        summary, fingerprint, note = completion_summary(stdout, stderr)
        got = CellOutput.of(summary, fingerprint)
        doc = llama_completion_doc(got.summary, fingerprint, [note] if note else [])
    (out / "summary.json").write_text(json.dumps(finite(doc)) + "\n", encoding="utf-8")
    return got


def _bmoe(cfg: BmoeConfig, out: Path) -> CellOutput:
    """A bmoe cell's summary and fingerprint from the CSV it wrote (kept as tokens.csv),
    its preamble checked against the cell's options, and its `.metrics` as the pressure
    readings; all kept in its summary.json."""
    csv = out / bmoe.CSV
    try:
        text = csv.read_text(encoding="utf-8", errors="replace")
    except OSError:
        said = [line.strip() for line in (out / "stderr.txt").read_text(
            encoding="utf-8", errors="replace").splitlines() if "could not open csv" in line] \
            if (out / "stderr.txt").is_file() else []
        raise CellOutputError(f"bmoe-cli wrote no CSV ({bmoe.CSV}): it exits 0 when it cannot "
                              "open it" + (f" ({said[-1]})" if said else "")) from None
    run, got = _bmoe_run(text, bmoe.CSV)
    csv.replace(out / "tokens.csv")  # the cell's per-token columns, as the engine wrote them
    cell = bmoe.BmoeCell(model=cfg.model, tokens=cfg.tokens, prompt=cfg.prompt,
                         bin_dir=cfg.bin_dir, options=cfg.options)
    notes = []
    if not run.preamble:
        notes.append("the CSV has no preamble: what bmoe-cli ran is not confirmed")
    wrong = bmoe.preamble_mismatches(cell.expected_preamble(), run.preamble)
    if wrong:
        raise CellOutputError("bmoe-cli ran another configuration than the cell's: its CSV "
                              "preamble says " + ", ".join(wrong[:4])
                              + (f" and {len(wrong) - 4} more" if len(wrong) > 4 else ""))
    try:
        metrics = parse_metrics((out / bmoe.METRICS).read_text(encoding="utf-8",
                                                               errors="replace"), bmoe.METRICS)
    except OSError:
        metrics = {}
        notes.append(f"no {bmoe.METRICS}: the cell's pressure readings are not measured")
    except ForeignRunError as e:
        metrics = {}
        notes.append(f"{bmoe.METRICS} could not be read: {e.message}")
    doc = bmoe_doc(got.summary, got.fingerprint, run.preamble, metrics, notes)
    (out / "summary.json").write_text(json.dumps(finite(doc)) + "\n", encoding="utf-8")
    return got


def clear_output(cfg: LaunchedConfig, out: Path, device: Device) -> str | None:
    """Remove the file an external cell on this machine writes its result to, before it
    runs (on an adb/ssh device the launch removes it there): a cell that writes nothing
    must fail, not read the previous cell's file. None, or why it could not be removed."""
    if not isinstance(cfg, ExternalConfig) or device.kind in ("adb", "ssh"):
        return None
    path = cfg.output_path(out.name)
    try:
        if path:
            Path(path).unlink(missing_ok=True)
    except OSError as e:
        return f"cannot remove the previous output {path}: {e.strerror or e}"
    return None


def _fetch(path: str, device: Device) -> str:
    if device.transport == "local":
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise CellOutputError(f"cannot read the cell's output {path}: {e.strerror}") from None
    done = device.run(["cat", path], timeout=60)
    if done.returncode != 0:
        raise CellOutputError(f"cannot read {path} on {device.name}: {done.stderr.strip()[:200]}")
    return done.stdout


def summarize_bmoe_csv(text: str, name: str) -> CellOutput:
    """tok/s from a bmoe_metrics CSV (its `# summary` line, else the rows' wall times) and
    the work it reports."""
    return _bmoe_run(text, name)[1]


def _bmoe_run(text: str, name: str) -> tuple[BmoeRun, CellOutput]:
    """A bmoe_metrics CSV read, and what it says; CellOutputError where it gives no tok/s."""
    try:
        run = parse_bmoe_csv(text, name)
    except ForeignRunError as e:
        raise CellOutputError(f"not a bmoe_metrics CSV: {e.message}") from None
    got = CellOutput.of(run_summary(run), work_fingerprint(run))
    if got.summary.tok_per_s is None:  # a `# summary` tok/s is a number
        raise CellOutputError(f"{name}: no token rows and no `# summary` line")
    return run, got
