"""Every folder in `shared/reference/bmoe/` imports with no option, and its report agrees with
the authors' own tables there (`pr23-2026-07-12/summary.md`, `matrix-2026-07-13/summary.md`):
tok/s, hit rate, device pressure; the order and time sources are stated
(docs/import.md#provenance-measured-derived-unknown)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REFERENCE

from abbench.cli import main

needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason="no shared/reference")
FOLDERS = sorted(p for p in REFERENCE.iterdir() if p.is_dir()) if REFERENCE.is_dir() else []

# The authors' table rows -> the runs (file stems) they describe.
PR23 = {
    "Qwen3-30B-A3B-Q4_K_M — base": {"baseline (overlap)": "qwen_base",
                                     "+ prefetch 2": "qwen_pf2", "+ spec-gate": "qwen_sg",
                                     "+ spec-gate + prefetch 2": "qwen_sg_pf2"},
    "Gemma-4-26B-A4B-it-Q4_K_M — base": {"baseline (overlap)": "gemma_base",
                                         "+ prefetch 2": "gemma_pf2", "+ spec-gate": "gemma_sg",
                                         "+ spec-gate + prefetch 2": "gemma_sg_pf2"},
    "Qwen3-30B-A3B-Q4_K_M — MAX": {"baseline (overlap)": "qwen5k_base",
                                    "+ prefetch 1": "qwen5k_pf1"},
}
MATRIX_ROWS = {"fixed cache + overlap (reference)": "base_ov",
               "adaptive cache (--cache-mb auto) + overlap": "auto_ov",
               "adaptive cache, capped + overlap": "autocap_ov",
               "fixed cache + overlap + speculative gating": "sg_ov"}
MATRIX = {"Qwen3-30B-A3B-Q4_K_M": "qwen", "Gemma-4-26B-A4B-it-Q4_K_M": "gemma"}


def tables(md: str) -> dict[str, list[list[str]]]:
    """Every table of a summary.md by the heading line above it (`###` or `**...**`), its
    rows as cells, the header and rule rows dropped."""
    out: dict[str, list[list[str]]] = {}
    heading = ""
    section = ""
    for line in md.splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
            heading = section
        elif line.startswith("**"):
            heading = f"{section} / {line.split('**')[1]}"
        elif line.startswith("| ") and not line.startswith("| Config") and "---" not in line:
            out.setdefault(heading, []).append([c.strip() for c in line.strip("|").split("|")])
    return out


def number(cell: str) -> float:
    return float(re.sub(r"[^0-9.]", "", cell.split("(")[0]))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict, str]]:
    out = {}
    for src in FOLDERS:
        run = tmp_path_factory.mktemp("ref") / src.name
        rc = main(["import", str(src), "--out", str(run), "--style", "plain"])
        out[src.name] = (rc, json.loads((run / "report.json").read_text()),
                         (run / "report.md").read_text())
    return out


def cells_by_file(report: dict) -> dict[str, dict]:
    return {c["label"].split("-", 1)[1]: c for c in report["cells"]}


@needs_reference
@pytest.mark.parametrize("name", [p.name for p in FOLDERS])
def test_every_reference_folder_imports_with_no_option(reports, name: str) -> None:
    rc, r, md = reports[name]
    assert rc in (0, 1, 3)
    assert all(c["status"] == "ok" for c in r["cells"])
    # the order's source and every cell's start and end are stated, unknown as unknown
    assert "Execution order: **" in md
    assert "| # | run | files | start | end | tok/s | configuration |" in md
    if "unknown" in md.split("Execution order: **")[1].split("**")[0]:
        assert "EXECUTION ORDER UNKNOWN" in md
        assert not any(p["state"] in ("matched", "unverified") for p in r["pairs"])
    assert "✓ gap: 0 s" not in md


@needs_reference
def test_pr23_report_agrees_with_the_authors_tables(reports) -> None:
    _, r, _ = reports["pr23-2026-07-12"]
    cells = cells_by_file(r)
    authors = tables((REFERENCE / "pr23-2026-07-12" / "summary.md").read_text())
    checked = 0
    for heading, rows in PR23.items():
        (table,) = [t for h, t in authors.items() if h.startswith(heading)]
        for row in table:
            run = rows.get(row[0])
            if run is None:
                continue
            c = cells[run]
            assert f"{c['tokens_per_s']['estimate']:.2f}" == f"{number(row[1]):.2f}", run
            assert round(c["hit_pct"]) == number(row[4]), run
            assert round(c["read_mib_per_token"]) == number(row[5]), run
            assert f"{c['peak_rss_mib'] / 1024:.2f}" == f"{number(row[11]):.2f}", run
            assert round(c["during"]["cpu_temp_c"][1]) == number(row[12]), run
            checked += 1
    assert checked == 10


@needs_reference
def test_matrix_report_agrees_with_the_authors_tables(reports) -> None:
    _, r, _ = reports["matrix-2026-07-13"]
    cells = cells_by_file(r)
    authors = tables((REFERENCE / "matrix-2026-07-13" / "summary.md").read_text())
    checked = 0
    for model, prefix in MATRIX.items():
        speed = authors[next(h for h in authors if h.startswith(model) and "Throughput" in h)]
        pressure = authors[next(h for h in authors
                                if h.startswith(model) and "Device pressure" in h)]
        for row in speed:
            if row[0] in MATRIX_ROWS and row[1] != "—":
                c = cells[f"{prefix}_{MATRIX_ROWS[row[0]]}"]
                assert f"{c['tokens_per_s']['estimate']:.2f}" == f"{number(row[1]):.2f}"
                assert round(c["hit_pct"]) == number(row[8]), row[0]
                checked += 1
        for row in pressure:
            if row[0] in MATRIX_ROWS and row[1] != "—":
                c = cells[f"{prefix}_{MATRIX_ROWS[row[0]]}"]
                d = c["during"]
                assert f"{c['peak_rss_mib'] / 1024:.2f}" == f"{number(row[1]):.2f}", row
                assert f"{d['mem_available_floor_mib'] / 1024:.2f}" == f"{number(row[2]):.2f}"
                assert f"{c['entry']['cpu_temp_c']:.1f}" == f"{number(row[3]):.1f}", row
                assert f"{d['cpu_temp_c'][1]:.1f}" == f"{number(row[4]):.1f}", row
                assert f"{d['battery_temp_c'][1]:.1f}" == f"{number(row[5]):.1f}", row
                checked += 1
    assert checked == 16


@needs_reference
def test_imported_configurations_set_the_runs_apart(reports) -> None:
    # No preamble, no command line: each run is its own arm, its model from the file
    # name (derived), the keys its logs do state shown as what sets it apart.
    _, r, md = reports["pr23-2026-07-12"]
    assert len({c["name"] for c in r["cells"]}) == 10
    assert "model=gemma" in md and "spec_gate=1" in md
    _, r, md = reports["v1-desktop-2026-07-24"]  # the preamble: whole configurations
    assert "io_threads=8" in md and "drop_cold_frac=0.75" in md
