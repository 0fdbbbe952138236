"""Configuration identity (issue 29, classes 1, 2 and 7; issue 41, classes 1 and 2): a
run's configuration is every option its files record — the engine's own lines in a driver
log's section included — what llama.cpp ran with beats the model's metadata, and a decision
whose arms differ in more than it names is at most UNVERIFIED
(docs/import.md#configuration-identity-arms).

The fixtures (`tests/fixtures/imports/`, built by its `build.py` from the engine's and
llama.cpp's own formats; each folder's README cites the lines):

- `identity-banner/`: an A/B of the expert sidecar, a1 b1 a2 b2, whose CSV preambles are
  identical: the only trace of the sidecar is the engine's `bmoe: expert sidecar ON  (...)`
  in the b cells' sections of the driver log.
- `identity-override/`: llama.cpp's loader output on the synthetic model (top-2 in its
  metadata), once with `--override-kv qwen3moe.expert_used_count=int:1`; no CSV preamble.
- `identity-confound/`: ABAB of `prefetch=1` at `cache_mb=4000` and `prefetch=0` at 2000,
  each with its `.state` before and after.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import llamacpp
import pytest

from abbench.campaign.tables import Decision as CampaignDecision
from abbench.cli import main
from abbench.errors import AbbenchError
from abbench.importers import enginelog, identity
from abbench.records import DecisionSpec, Plan, read_plan

FIXTURES = Path(__file__).parent / "fixtures" / "imports"


def run_import(src: Path, out: Path, *args: str) -> tuple[int, str, dict, dict]:
    """The CLI's exit status, report.md, report.json and import.json."""
    rc = main(["import", str(src), "--out", str(out), "--style", "plain", *args])
    if rc == 2:
        return rc, "", {}, {}
    return (rc, (out / "report.md").read_text(), json.loads((out / "report.json").read_text()),
            json.loads((out / "import.json").read_text()))


@pytest.mark.parametrize("decision", ["cell-b1:cell-a1", "expert_sidecar=1:expert_sidecar=0"])
def test_the_engines_line_in_a_cells_section_sets_two_arms_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], decision: str) -> None:
    rc, md, report, info = run_import(FIXTURES / "identity-banner", tmp_path / "run",
                                      "--decision", decision)
    out = capsys.readouterr()
    assert "against itself" not in out.err
    assert rc == 3, out.err  # no times recorded: unverified at best
    assert "(2 arms)" in out.out
    plan = read_plan(tmp_path / "run")
    # the order is the driver log's sections: a1 b1 a2 b2
    assert [c.label for c in plan.cells] == ["01-cell-a1", "02-cell-b1", "03-cell-a2",
                                             "04-cell-b2"]
    assert [c.name for c in plan.cells] == ["cell-a1", "cell-b1", "cell-a1", "cell-b1"]
    (d,) = report["decisions"]
    assert (d["candidate"], d["baseline"], d["verdict"]) == ("cell-b1", "cell-a1",
                                                             "UNVERIFIED")
    assert "confound" not in d  # one key apart: the one the decision asks about
    assert "— ratio 1.1" in md  # faster with the sidecar, as the sections' rates say
    assert "| expert_sidecar=1 |" in md and "| expert_sidecar=(not recorded) |" in md
    fact = info["cells"][1]["facts"]["config.expert_sidecar"]
    assert fact == {"kind": "measured", "source": "ab-sidecar.log:13"}
    # the cap before each banner is that cell's entry
    entries = [c["facts"]["entry.caps_khz"]["source"] for c in info["cells"]]
    assert entries == ["ab-sidecar.log:1", "ab-sidecar.log:10", "ab-sidecar.log:20",
                       "ab-sidecar.log:29"]


def test_what_llama_cpp_ran_with_beats_the_models_metadata(tmp_path: Path) -> None:
    rc, md, _, info = run_import(FIXTURES / "identity-override", tmp_path / "run")
    assert rc in (0, 3)
    cells = {c["label"].split("-", 1)[1]: c for c in info["cells"]}
    assert cells["qwen_k1"]["config"]["n_expert_used"] == "1"
    assert cells["qwen_kdef"]["config"]["n_expert_used"] == "2"  # no override: the model's
    fact = cells["qwen_k1"]["facts"]["config.n_expert_used"]
    assert fact["kind"] == "measured"
    # validate_override's line, with the metadata dump's value named as the model's default
    assert fact["source"] == ("qwen_k1.log:61, overriding the model's default "
                              "n_expert_used=2 (qwen_k1.log:25)")
    assert "overriding the model's default n_expert_used=2" in \
        cells["qwen_k1"]["facts"]["config"]["source"]
    assert "overriding" not in cells["qwen_kdef"]["facts"]["config.n_expert_used"]["source"]
    # llama.cpp's context as built is part of what ran
    assert cells["qwen_k1"]["config"]["n_ubatch"] == "512"
    rows = {line.split(" | ")[1]: line for line in md.splitlines()
            if line.startswith("| ") and " | n_expert_used=" in line}
    assert "n_expert_used=1" in rows["qwen_k1"] and "n_expert_used=2" not in rows["qwen_k1"]
    assert "n_expert_used=1 (qwen_k1.log:61, overriding the model's default" in md


@pytest.mark.slow
def test_the_fixtures_loader_lines_are_what_llama_cpp_prints_today(tmp_path: Path) -> None:
    """`llama/*.stderr` made again with the llama.cpp the parity tests build: the importer
    reads the same configuration, and the same model defaults, from the fresh output as
    from the fixture (a llama.cpp whose lines moved would fail here, not in the field)."""
    spec = importlib.util.spec_from_file_location("fixture_build", FIXTURES / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # its dataclasses look their module up
    spec.loader.exec_module(build)
    try:
        build.llama_outputs(tmp_path)
    except llamacpp.Unavailable as e:
        pytest.skip(str(e))
    for name in build.LLAMA_RUNS:
        fresh = enginelog.engine_log_config((tmp_path / name).read_text())
        kept = enginelog.engine_log_config((FIXTURES / "llama" / name).read_text())
        assert fresh.values == kept.values, name
        assert {k: v for k, (v, _) in fresh.defaults.items()} == \
            {k: v for k, (v, _) in kept.defaults.items()}, name
    overridden = enginelog.engine_log_config((tmp_path / "override-k1.stderr").read_text())
    assert overridden.values["n_expert_used"] == "1"
    assert overridden.defaults["n_expert_used"][0] == "2"


def test_a_decision_whose_arms_differ_in_more_than_it_names_is_unverified(
        tmp_path: Path) -> None:
    rc, md, report, _ = run_import(FIXTURES / "identity-confound", tmp_path / "run",
                                   "--decision", "prefetch=1:prefetch=0")
    assert rc == 3
    (d,) = report["decisions"]
    assert (d["candidate"], d["baseline"]) == ("qwen_pf_r1", "qwen_base_r1")
    assert (d["verdict"], d["unverified_verdict"]) == ("UNVERIFIED", "GO")
    assert d["confound"].startswith("the arms also differ in cache_mb (4000 vs 2000)")
    assert "UNVERIFIED (GO, confounded)" in md
    assert "the arms also differ in cache_mb (4000 vs 2000)" in md
    assert "what would settle it: runs of the two configurations with cache_mb alike" in md
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["decisions"][0]["confounds"] == ["cache_mb"]
    # the ratio is measured (matched pairs), so it is shown, with the warning beside it
    assert "qwen_pf_r1 ran 1.2" in md


def test_named_by_runs_more_than_one_key_apart_is_a_confound(tmp_path: Path) -> None:
    rc, md, report, _ = run_import(FIXTURES / "identity-confound", tmp_path / "run",
                                   "--decision", "qwen_pf_r1:qwen_base_r1")
    assert rc == 3
    (d,) = report["decisions"]
    assert d["verdict"] == "UNVERIFIED"
    assert d["confound"].startswith("the arms differ in more than one key — cache_mb (4000 vs "
                                    "2000), prefetch (1 vs 0)")


def test_the_same_folder_differing_only_in_the_named_key_decides(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "identity-confound", src)
    for path in src.glob("*.csv"):  # every run at one cache size: prefetch alone sets them apart
        path.write_text(path.read_text().replace("cache_mb=2000", "cache_mb=4000"))
    rc, md, report, _ = run_import(src, tmp_path / "run", "--decision", "prefetch=1:prefetch=0")
    assert rc == 0
    (d,) = report["decisions"]
    assert d["verdict"] == "GO" and "confound" not in d
    assert "differ in" not in md
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert "confounds" not in plan["decisions"][0]


def test_confounds_are_the_keys_apart_besides_those_named() -> None:
    confounds = identity.confounds
    a = {"model": "q", "spec_gate": "1", "cache_mb": "4000"}
    b = {"model": "q", "cache_mb": "2000"}
    assert confounds(a, b, {"spec_gate"}) == ("cache_mb",)
    assert confounds(a, b, {"spec_gate", "cache_mb"}) == ()
    assert confounds(a, b, set()) == ("cache_mb", "spec_gate")
    assert confounds(a, {**b, "cache_mb": "4000"}, set()) == ()  # one key apart: the question
    # a partial configuration's own-arm marker is not an option
    assert confounds({**a, "run": "x"}, {**a, "run": "y"}, set()) == ()


def test_plans_without_confounds_read_and_write_as_before() -> None:
    assert "confounds" not in DecisionSpec("a", "b").to_json()
    spec = DecisionSpec("a", "b", confounds=("cache_mb",))
    old = {"campaign": "c", "cells": [], "spacing_s": 0.0, "warmup_tokens": 0,
           "device": "imported", "decisions": [DecisionSpec("a", "b").to_json()]}
    assert Plan.from_json(old).decisions == (DecisionSpec("a", "b"),)
    new = {**old, "decisions": [spec.to_json()]}
    assert Plan.from_json(json.loads(json.dumps(new))).decisions == (spec,)
    with pytest.raises(AbbenchError, match="confounds"):  # not a cells.toml key
        CampaignDecision("a", "b", confounds=("cache_mb",))


def test_every_flag_and_line_the_engine_prints_is_read() -> None:
    """The seed engine's flags as cli/main.cpp reads them; its stderr and stdout lines
    (tests/bmoe_formats: the format strings, cited); llama.cpp's effective values."""
    import bmoe_formats as f

    command_options, banner_options = enginelog.command_options, enginelog.banner_options
    line = ('./bmoe-cli -m /d/Q.gguf --cache-mb 4000 --expert-sidecar auto --no-odirect '
            '--mtp --draft 3 --temp -1 -p "a b c" --drop-no-renorm --csv out.csv '
            '--route-trace t.csv')
    assert dict(command_options(line)) == {
        "cache_mb": "4000", "expert_sidecar": "auto", "o_direct": 0, "spec": "mtp",
        "spec_draft_max": "3", "temp": "-1", "prompt": "a b c", "drop_renorm": 0}
    sidecar = f.printf(f.SIDECAR_ON, "/d/Q.gguf.experts.bmoe", 1)
    assert banner_options(sidecar) == [("expert_sidecar", 1), ("o_direct", "1")]
    streaming = f.printf(f.STREAMING_ON, 128, 1, 8, 4000, 1)
    assert banner_options(streaming) == [("moe_stream", 1), ("o_direct", "1"),
                                         ("io_threads", "8")]
    assert banner_options(f.printf(f.DENSE, "anon", 512, 190, "anon")) == \
        [("dense_weights", "anon")]
    assert banner_options(f.printf(f.MOE_OVERLAP, 0.05)) == [("overlap", 1)]
    assert banner_options(f.printf(f.MOE_DROP, 40, 400, 10.0, 0.75)) == \
        [("drop_cold_frac", "0.75"), ("drops", 1)]
    assert banner_options(f.printf(f.MOE_CACHE_AUTO, 81.5, 4675.3, 4675.0)) == \
        [("cache_mb", "auto")]
    assert banner_options(f.printf(f.MOE_CACHE, 53.0, 1999.2)) == []
    assert banner_options("compute: 4 threads, cpu 0.1 s/token") == [("threads", "4")]
    cfg = enginelog.engine_log_config(
        "llama_model_loader: - kv  16:               qwen3moe.expert_used_count u32"
        "              = 8\n"
        "validate_override: Using metadata override (  int) 'qwen3moe.expert_used_count' = 6\n"
        "print_info: n_expert_used         = 6\n")
    assert cfg.values["n_expert_used"] == "6" and cfg.lines["n_expert_used"] == 2
    assert cfg.defaults == {"n_expert_used": ("8", 1)} and not cfg.command
