"""records/cell_doc.py: the summary.json each kind of cell writes, built through its one
definition of the keys, is byte for byte what the writers wrote before it (every run
folder fixture's summary.json and the llama.cpp cells' written by the old code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abbench.records.cell_doc import (
    IMPORT_DOC_FORMAT,
    TOP_LEVEL_KEYS,
    Resolved,
    engine_doc,
    import_doc,
    llama_bench_doc,
    llama_completion_doc,
)
from abbench.records.llamacpp import bench_summary, completion_summary, parse_bench_jsonl
from abbench.records.summary import JSON_FORMAT, RunSummary, finite

FIXTURES = Path(__file__).parent / "fixtures"
RUNS = FIXTURES / "runs"


def _documents(fmt: str) -> list[Path]:
    return [p for p in sorted(RUNS.glob("*/cells/*/summary.json"))
            if json.loads(p.read_text(encoding="utf-8")).get("format") == fmt]


def _ids(path: Path) -> str:
    return str(path.parent.relative_to(RUNS))


@pytest.mark.parametrize("path", _documents(JSON_FORMAT), ids=_ids)
def test_an_engine_document_written_again_is_the_same_bytes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    d: dict[str, Any] = json.loads(text)
    doc = engine_doc(
        config=d["config"], resolved=Resolved(**d["resolved"]), model=d["model"],
        fingerprint=d["fingerprint"], summary=RunSummary.from_json(d["summary"]),
        lines=d["lines"], prompt_ids=d["prompt_ids"], output_ids=d["output_ids"],
        text=d["text"], per_token=d["per_token"], prefill=d["prefill"],
        sections={k: v for k, v in d.items() if k not in TOP_LEVEL_KEYS})
    assert json.dumps(doc, indent=1, allow_nan=False) + "\n" == text  # as --json writes it


@pytest.mark.parametrize("path", _documents(IMPORT_DOC_FORMAT), ids=_ids)
def test_an_imported_document_written_again_is_the_same_bytes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    d: dict[str, Any] = json.loads(text)
    doc = import_doc(
        files=d["files"], tps_source=d["tok/s_source"],
        summary=RunSummary.from_json(d["summary"]), fingerprint=d["fingerprint"],
        preamble=d["preamble"], resolved=Resolved(**d["resolved"]), metrics=d["metrics"],
        per_token=d["per_token"])
    assert json.dumps(doc, allow_nan=False) + "\n" == text  # as importers/write.py writes it


def test_the_run_folders_hold_both_writers_documents() -> None:
    assert len(_documents(JSON_FORMAT)) >= 3 and len(_documents(IMPORT_DOC_FORMAT)) >= 3


def _as_written(doc: dict[str, Any]) -> str:
    return json.dumps(finite(doc)) + "\n"  # as campaign/output.py writes a llama.cpp cell's


def test_a_llama_bench_document_is_the_same_bytes_as_before() -> None:
    stdout = (FIXTURES / "llamacpp" / "bench-tiny.jsonl").read_text(encoding="utf-8")
    summary, columns, fingerprint = bench_summary(parse_bench_jsonl(stdout))
    doc = llama_bench_doc(RunSummary.from_json(summary), columns, fingerprint)
    before = FIXTURES / "cell_files" / "llama-bench" / "summary.json"
    assert _as_written(doc) == before.read_text(encoding="utf-8")


def test_a_llama_completion_document_is_the_same_bytes_as_before() -> None:
    stdout = (FIXTURES / "llamacpp" / "completion-tiny.stdout").read_bytes()
    stderr = (FIXTURES / "llamacpp" / "completion-tiny.stderr").read_text(encoding="utf-8")
    summary, fingerprint, note = completion_summary(stdout, stderr)
    doc = llama_completion_doc(RunSummary.from_json(summary), fingerprint,
                               [note] if note else [])
    before = FIXTURES / "cell_files" / "llama-completion" / "summary.json"
    assert _as_written(doc) == before.read_text(encoding="utf-8")
    noted = llama_completion_doc(RunSummary(tok_per_s=2.0), None, ["why"])
    assert _as_written(noted) == '{"summary": {"tok/s": 2.0}, "fingerprint": null, ' \
        '"notes": ["why"]}\n'


def test_resolved_leaves_out_what_is_not_known() -> None:
    assert Resolved().to_json() == {}
    assert Resolved(threads=4).to_json() == {"threads": 4}
    assert list(Resolved(0.0, 1.1, 64, 2, False).to_json()) == \
        ["temp", "repeat_penalty", "repeat_last_n", "threads", "o_direct"]


def test_a_run_section_may_not_replace_a_key_of_the_document() -> None:
    with pytest.raises(ValueError, match="summary"):
        engine_doc(config={}, resolved=Resolved(), model={}, fingerprint="sha256:x",
                   summary=RunSummary(), lines=[], prompt_ids=[], output_ids=[], text="",
                   per_token={}, prefill={}, sections={"summary": {}})
