"""bmoe cells (docs/cells.md#bmoe-cells): the phone-streaming engine's CLI as a cell kind —
its options mapped to its flags, the exclusions its source enforces refused when the plan
is made, each cell's own CSV read as its tokens, its preamble checked against what the cell
asked, and the `.metrics` the cell's wrapper writes read as its pressure readings.

The binary is tests/bmoe_standin.py, built from the engine's source formats
(tests/bmoe_formats.py); the campaign runs through the real CLI on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bmoe_standin
import pytest
from sshd import processes_matching
from test_campaign_run import abbench, run_folder, write_campaign

from abbench.campaign import bmoe
from abbench.campaign.bmoe import BmoeCell
from abbench.campaign.child import stated_reason
from abbench.campaign.schema import load_campaign
from abbench.errors import CampaignFileError
from abbench.records import read_journal
from abbench.records.metrics_file import parse_metrics

B = {"moe_stream": True, "cache_mb": 2048, "dense_weights": "ahwb", "drop_cold_experts": 0.75}
R = {"moe_stream": True, "cache_mb": 2048, "predict_prefetch": True, "predict_spec_max": 0}


def cell(**options: object) -> BmoeCell:
    return BmoeCell(model="/m.gguf", tokens=8, prompt="hi", options=tuple(options.items()))


def table(options: dict[str, object]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items()) + " }"


def test_options_are_the_clis_flags_in_file_order_under_its_overrides_unset() -> None:
    argv = cell(threads=2, **B, no_odirect=False, chatml=True).argv(
        "/data/local/tmp/bmoe-cli", "/sd/m.gguf", "bmoe.csv")
    assert argv[:1] == ["env"] and argv.count("-u") == len(bmoe.ENV_OVERRIDES)
    assert "LD_LIBRARY_PATH=/data/local/tmp" in argv
    at = argv.index("/data/local/tmp/bmoe-cli")
    assert argv[at:] == ["/data/local/tmp/bmoe-cli", "-m", "/sd/m.gguf", "-p", "hi", "-n", "8",
                         "-t", "2", "--moe-stream", "--cache-mb", "2048", "--dense-weights",
                         "ahwb", "--drop-cold-experts", "0.75", "--chatml", "--csv",
                         "bmoe.csv"]


@pytest.mark.parametrize(("options", "key", "says"), [
    ({"overlap": True}, "overlap", "moe.overlap requires moe.enabled"),
    ({"route_ahead": 2}, "route_ahead", "moe.route_ahead requires moe.enabled"),
    ({"moe_stream": True, "cache_mb": 1000}, "cache_mb", "pathological band"),
    ({"moe_stream": True, "drop_cold_experts": 0.5}, "drop_cold_experts",
     "requires the LRU cache"),
    ({"moe_stream": True, "cache_mb": "auto", "io_two_wave": True}, "io_two_wave",
     "requires moe.overlap"),
    ({"moe_stream": True, "cache_mb": 2048, "predict_prefetch": True, "prefetch": 1},
     "predict_prefetch", "mutually exclusive"),
    ({"moe_stream": True, "cache_mb": 2048, "route_ahead": 1, "predict_log": True},
     "route_ahead", "excludes predict_log"),
    ({"moe_stream": True, "route_ahead": 1, "mtp": True}, "route_ahead",
     "self-speculative decoding are mutually exclusive"),
    ({"moe_stream": True, "io_threads": 9}, "io_threads", "must be in [1, 8]"),
    ({"mtp": True, "ngram": True}, "ngram", "two draft sources"),
    ({"mtp": True, "draft": 9}, "draft", "must be in [1, 8]"),
    ({"ngram": True, "mtp_p_min": 0.5}, "mtp_p_min", "MTP knob"),
    ({"mtp": True, "ubatch": 2}, "ubatch", "narrower than the verify batch (4 positions)"),
    ({"ubatch": 4096}, "ubatch", "exceeds n_ctx=2048"),
])
def test_the_sources_exclusions_are_refused_naming_the_key(options: dict[str, object],
                                                            key: str, says: str) -> None:
    with pytest.raises(CampaignFileError) as e:
        cell(**options)
    assert e.value.key == ("bmoe", key) and says in e.value.problem
    assert "validate()" in e.value.problem


def test_what_the_source_allows_is_allowed() -> None:
    cell(**B)
    cell(**R)
    cell(moe_stream=True, cache_mb=1000, force_cache=True)
    cell(moe_stream=True, cache_mb="auto", overlap=True, io_two_wave=True, prefetch=2)
    cell(mtp=True, draft=3, ubatch=4)
    cell(io_threads=20)  # the source checks it only with streaming on


@pytest.mark.parametrize(("options", "key", "says"), [
    ({"csv": "x.csv"}, "csv", "is set by abbench"),
    ({"temp": 0.8}, "temp", "greedy decoding"),
    ({"drop_cold_expert": 0.5}, "drop_cold_expert", "not a bmoe-cli option"),
    ({"dense_weights": "pinned"}, "dense_weights", "expects mmap|warm|anon|ahwb"),
    ({"cache_mb": 2048.5}, "cache_mb", '"auto"'),
    ({"overlap": 1}, "overlap", "is a switch"),
])
def test_table_mistakes_name_the_key(options: dict[str, object], key: str, says: str) -> None:
    with pytest.raises(CampaignFileError) as e:
        cell(**options)
    assert e.value.key == ("bmoe", key) and says in e.value.problem


def test_the_expected_preamble_is_what_the_cli_writes(tiny_model: Path, tmp_path: Path) -> None:
    """For several configurations, the preamble the stand-in writes (RunInfo as
    session.cpp fills it) is what the cell expects, and one ignored flag is found."""
    binary = bmoe_standin.install(tmp_path / "bin")
    for options in (B, R, {}, {"mtp": True, "draft": 2}, {"ngram": True, "ngram_min_match": 4},
                    {"moe_stream": True, "cache_mb": "auto", "no_odirect": True,
                     "threads": 2, "chatml": True}):
        c = cell(**options)
        csv = tmp_path / "out.csv"
        subprocess.run([str(binary), "-m", str(tiny_model), "-n", "2", *c.flags(), "--csv",
                        str(csv)], check=True, capture_output=True,
                       env={**os.environ, "BMOE_STANDIN_DIR": str(tmp_path)})
        preamble = {}
        for line in csv.read_text().splitlines()[1:5]:
            preamble.update(w.split("=", 1) for w in line[2:].split())
        assert bmoe.preamble_mismatches(c.expected_preamble(), preamble) == [], options
    wrong = dict(preamble, overlap="1")
    assert bmoe.preamble_mismatches(c.expected_preamble(), wrong) == \
        ["overlap=1 (the cell asked 0)"]


def test_the_wrapper_writes_metrics_and_passes_the_exit_status_on(tmp_path: Path) -> None:
    metrics = tmp_path / "m.metrics"
    grow = [sys.executable, "-c", "import time; b = bytearray(64 << 20); b[::4096] = "
            "b'1' * len(b[::4096]); time.sleep(1.5); raise SystemExit(3)"]
    done = subprocess.run(bmoe.wrapped(grow, str(metrics)), capture_output=True, timeout=30)
    assert done.returncode == 3
    read = parse_metrics(metrics.read_text())
    assert list(read) == ["peak_rss_kb", "mem_avail_before_kb", "mem_avail_floor_kb",
                          "mem_avail_after_kb"]
    assert read["peak_rss_kb"] is not None and read["peak_rss_kb"] > 64 * 1024
    floor, before = read["mem_avail_floor_kb"], read["mem_avail_before_kb"]
    assert floor is not None and before is not None and floor <= before


def test_a_cli_that_ends_before_the_first_reading_has_no_peak_rss(tmp_path: Path) -> None:
    """Not the few kB of the instant it started: unknown, and said so (an empty value)."""
    metrics = tmp_path / "m.metrics"
    subprocess.run(bmoe.wrapped(["sleep", "0.3"], str(metrics)), check=True, timeout=30)
    read = parse_metrics(metrics.read_text())
    assert read["peak_rss_kb"] is None and read["mem_avail_before_kb"] is not None


def test_bmoes_own_failure_lines_are_the_reason() -> None:
    assert stated_reason("exited with status 1", "x\nconfig error: moe.overlap requires "
                         "moe.enabled\n") == ("exited with status 1: config error: moe.overlap "
                                              "requires moe.enabled")
    assert stated_reason("exited with status 1", "unknown arg: --bogus\nusage: ...") == \
        "exited with status 1: unknown arg: --bogus"


def bmoe_campaign(tmp: Path, model: Path, cells: str, order: str) -> Path:
    return write_campaign(tmp, model, cells, head=f"order = {order}")


def test_a_bmoe_campaign_reads_each_cells_own_csv_and_metrics(tiny_model: Path,
                                                              tmp_path: Path) -> None:
    binary = bmoe_standin.install(tmp_path / "bin")
    cells = bmoe_campaign(tmp_path, tiny_model, f"""
        [cells.B]
        engine = "bmoe"
        bmoe_bin = "{binary.parent}"
        tokens = 24
        bmoe = {table(B)}

        [cells.R]
        base = "B"
        bmoe = {table({"drop_cold_experts": 0.0, "predict_prefetch": True,
                       "predict_spec_max": 0})}

        [[decision]]
        candidate = "B"
        baseline = "R"
        """, '["B", "R", "R", "B"]')
    # an override the CLI would apply where a flag is absent: the cell's command unsets it
    env = {**os.environ, "BMOE_OVERLAP": "1"}
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", cells, "--out",
                        tmp_path / "r", "--no-live"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode in (0, 1, 3), p.stderr
    folder = run_folder(tmp_path / "r")
    records = read_journal(folder)
    assert [r.status for r in records] == ["ok"] * 4, [r.error for r in records]
    reads = []
    for r in records:
        own = folder / "cells" / r.label
        rows = [ln for ln in (own / "tokens.csv").read_text().splitlines()
                if ln and ln[0].isdigit()]
        assert len(rows) == 24
        doc = json.loads((own / "summary.json").read_text())
        assert doc["preamble"]["overlap"] == "0" and doc["preamble"]["moe_stream"] == "1"
        assert set(doc["metrics"]) >= {"peak_rss_kb", "mem_avail_floor_kb"}
        assert (own / "bmoe.metrics").is_file() and not (own / "bmoe.csv").exists()
        reads.append(r.fingerprint)
    b1, r1, r2, b2 = reads
    assert b1 == b2 and r1 == r2 and b1 != r1  # identical work, told apart from the other
    report = (folder / "report.md").read_text()
    assert "bmoe.drop_cold_experts=0.75" in report
    assert "peak_rss" not in p.stderr


def test_a_binary_that_ignores_an_option_or_writes_no_csv_fails_its_cell(
        tiny_model: Path, tmp_path: Path) -> None:
    old = bmoe_standin.install(tmp_path / "old", ignore=["--overlap"])
    silent = bmoe_standin.install(tmp_path / "silent", no_csv=True)
    cells = bmoe_campaign(tmp_path, tiny_model, f"""
        [cells.old]
        engine = "bmoe"
        bmoe_bin = "{old.parent}"
        bmoe = {table({"moe_stream": True, "overlap": True})}

        [cells.silent]
        engine = "bmoe"
        bmoe_bin = "{silent.parent}"
        """, '["old", "silent"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--no-live")
    assert p.returncode != 2, p.stderr
    old_cell, silent_cell = read_journal(run_folder(tmp_path / "r"))
    assert old_cell.status == "failed"
    assert old_cell.error is not None and "ran another configuration" in old_cell.error
    assert "overlap=0 (the cell asked 1)" in old_cell.error
    assert silent_cell.status == "failed" and silent_cell.error is not None
    assert "bmoe-cli wrote no CSV" in silent_cell.error
    assert "warning: could not open csv" in silent_cell.error


def test_a_hung_cell_is_killed_with_what_it_started(tiny_model: Path, tmp_path: Path) -> None:
    """The wrapper runs bmoe-cli in the background: the timeout kills both."""
    hung = bmoe_standin.install(tmp_path / "hung", hang=True)
    marker = f"hang-{os.getpid()}-{tmp_path.name}"  # in the stand-in's own command line
    cells = bmoe_campaign(tmp_path, tiny_model, f"""
        [cells.h]
        engine = "bmoe"
        bmoe_bin = "{hung.parent}"
        prompt = "{marker}"
        timeout_s = 2
        """, '["h"]')
    abbench("campaign", cells, "--out", tmp_path / "r", "--no-live")
    (h,) = read_journal(run_folder(tmp_path / "r"))
    assert h.status == "timeout"
    assert processes_matching(marker) == []


def test_bmoe_keys_in_the_campaign_file_name_the_key(tiny_model: Path, tmp_path: Path) -> None:
    binary = bmoe_standin.install(tmp_path / "bin")
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.a]
        engine = "bmoe"
        bmoe_bin = "{binary.parent}"
        bmoe = {{ moe_stream = true, cache_mb = 1000 }}
        """)
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--dry-run")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "`cells.a.bmoe.cache_mb`" in p.stderr and "pathological band" in p.stderr
    cells.write_text(cells.read_text().replace("cache_mb = 1000", "cache_mb = 2048")
                     .replace(f'bmoe_bin = "{binary.parent}"', 'bmoe_bin = "/nonexistent"'))
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--dry-run")
    assert p.returncode == 2 and "`cells.a.bmoe_bin`: no `bmoe-cli` in /nonexistent" in p.stderr
    cells.write_text(cells.read_text().replace('bmoe_bin = "/nonexistent"',
                                               f'bmoe_bin = "{binary.parent}"\ncache_mib = 4'))
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--dry-run")
    assert p.returncode == 2 and "`cells.a.cache_mib`: cell `a` runs bmoe-cli" in p.stderr


def test_the_documented_phone_campaign_loads_and_every_option_is_documented(
        tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cells.md").read_text("utf-8")
    section = doc[doc.index("## bmoe cells"):doc.index("## `[[sweep]]`")]
    for key in bmoe.OPTIONS:
        assert f"`{key}`" in section, key
    body = section[section.index("```toml") + len("```toml"):]
    (tmp_path / "phone.toml").write_text(body[:body.index("```")])
    spec = load_campaign(tmp_path / "phone.toml")
    b = spec.cells["B"].bmoe
    spec2 = spec.cells["spec2"].bmoe
    assert b is not None and spec2 is not None
    assert dict(spec2.options)["predict_spec_max"] == 2
    assert dict(spec2.options)["drop_cold_experts"] == 0.0 and dict(b.options)["chatml"]
