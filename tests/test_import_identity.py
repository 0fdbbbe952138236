"""Configuration identity (issue 29, classes 1, 2 and 7): a run's configuration is every
option its files record, a logged override beats the model's default, and a decision whose
arms differ in more than it names is at most UNVERIFIED
(docs/import.md#configuration-identity-arms).

The fixtures under `tests/fixtures/imports/` are made-up runs in the seed engine's formats:

- `identity-sidecar/`: `qwen_b_1` .. `qwen_b_4`, one CSV preamble for all four; the logs of
  runs 1 and 3 show `--expert-sidecar` on the command line and `moe-expert-sidecar:` banner
  lines, those of 2 and 4 neither; a driver log gives the order (ABAB).
- `identity-topk/`: the loader prints the model's `n_expert_used = 8`; `qwen_k6` overrides it
  on its command line and in a `moe-topk: override 6 (model 8)` banner, `qwen_k6b` in the
  banner only, `qwen_k8` not at all. No preamble: the logs are the configuration.
- `identity-confound/`: ABAB of `--spec-gate` runs at `--cache-mb 4000` and runs without it
  at 2000 (the preambles say the same cache sizes), with a driver log.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


@pytest.mark.parametrize("decision", ["qwen_b_1:qwen_b_2", "expert_sidecar=1:expert_sidecar=0"])
def test_an_option_only_the_logs_record_sets_two_arms_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], decision: str) -> None:
    rc, md, report, _ = run_import(FIXTURES / "identity-sidecar", tmp_path / "run",
                                   "--decision", decision)
    out = capsys.readouterr()
    assert "against itself" not in out.err
    assert rc == 0, out.err  # ran 1.18 times faster, with the repeats' noise: GO
    # two arms, not one: the names share a stem and the preambles are equal, the logs differ
    # (and the per-run `--metrics-out PATH` is where a run wrote, not what it ran)
    assert "(2 arms)" in out.out
    plan = read_plan(tmp_path / "run")
    assert [c.name for c in plan.cells] == ["qwen_b_1", "qwen_b_2", "qwen_b_1", "qwen_b_2"]
    assert [c.sentinel_of for c in plan.cells] == [None, None, 0, 1]
    (d,) = report["decisions"]
    assert (d["candidate"], d["baseline"], d["verdict"]) == ("qwen_b_1", "qwen_b_2", "GO")
    assert "confound" not in d  # one key apart: the one the decision asks about
    # the cells table names the key that sets them apart, though only the logs record it
    assert "| expert_sidecar=1 |" in md and "| expert_sidecar=(not recorded) |" in md


def test_a_logged_override_beats_the_models_default(tmp_path: Path) -> None:
    rc, md, _, info = run_import(FIXTURES / "identity-topk", tmp_path / "run")
    assert rc in (0, 3)
    cells = {c["label"].split("-", 1)[1]: c for c in info["cells"]}
    # the command line's `--n-expert-used 6` and the banner's override, not the loader's 8
    assert cells["qwen_k6"]["config"]["n_expert_used"] == "6"
    assert cells["qwen_k6b"]["config"]["n_expert_used"] == "6"  # the banner alone
    assert cells["qwen_k8"]["config"]["n_expert_used"] == "8"  # no override: the model's
    fact = cells["qwen_k6"]["facts"]["config.n_expert_used"]
    assert fact["kind"] == "measured"
    assert fact["source"] == ("qwen_k6.log:9, overriding the model's default "
                              "n_expert_used=8 (qwen_k6.log:4)")
    assert "overriding the model's default n_expert_used=8" in \
        cells["qwen_k6b"]["facts"]["config"]["source"]
    plan = read_plan(tmp_path / "run")
    arms = {c.label.split("-", 1)[1]: c.name for c in plan.cells}
    assert arms == {"qwen_k6": "qwen_k6", "qwen_k6b": "qwen_k6", "qwen_k8": "qwen_k8"}
    rows = {line.split(" | ")[1]: line for line in md.splitlines()
            if line.startswith("| ") and " | n_expert_used=" in line}
    assert "n_expert_used=6" in rows["qwen_k6"] and "n_expert_used=8" not in rows["qwen_k6"]
    assert "n_expert_used=8" in rows["qwen_k8"]
    assert "n_expert_used=6 (qwen_k6.log:9, overriding the model's default" in md


def test_a_decision_whose_arms_differ_in_more_than_it_names_is_unverified(
        tmp_path: Path) -> None:
    rc, md, report, _ = run_import(FIXTURES / "identity-confound", tmp_path / "run",
                                   "--decision", "spec_gate=1:spec_gate=0")
    assert rc == 3
    (d,) = report["decisions"]
    assert (d["candidate"], d["baseline"]) == ("qwen_sg_r1", "qwen_base_r1")
    assert (d["verdict"], d["unverified_verdict"]) == ("UNVERIFIED", "GO")
    assert d["confound"].startswith("the arms also differ in cache_mb (4000 vs 2000)")
    assert "UNVERIFIED (GO, confounded)" in md
    assert "the arms also differ in cache_mb (4000 vs 2000)" in md
    assert "what would settle it: runs of the two configurations with cache_mb alike" in md
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["decisions"][0]["confounds"] == ["cache_mb"]
    # the ratio is measured (matched pairs), so it is shown, with the warning beside it
    assert "qwen_sg_r1 ran 1.22" in md


def test_named_by_runs_more_than_one_key_apart_is_a_confound(tmp_path: Path) -> None:
    rc, md, report, _ = run_import(FIXTURES / "identity-confound", tmp_path / "run",
                                   "--decision", "qwen_sg_r1:qwen_base_r1")
    assert rc == 3
    (d,) = report["decisions"]
    assert d["verdict"] == "UNVERIFIED"
    assert d["confound"].startswith("the arms differ in more than one key — cache_mb (4000 vs "
                                    "2000), spec_gate (1 vs not recorded)")


def test_the_same_folder_differing_only_in_the_named_key_decides(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "identity-confound", src)
    for path in src.iterdir():  # every run at one cache size: spec_gate alone sets them apart
        text = path.read_text()
        path.write_text(text.replace("cache_mb=2000", "cache_mb=4000")
                        .replace("--cache-mb 2000", "--cache-mb 4000"))
    rc, md, report, _ = run_import(src, tmp_path / "run", "--decision", "spec_gate=1:spec_gate=0")
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


def test_every_flag_and_banner_option_is_read() -> None:
    command_options, banner_options = enginelog.command_options, enginelog.banner_options
    line = ('args: ./bmoe-cli -m /d/Q.gguf --cache-mb=4000 --expert-sidecar --no-mmap '
            '--temp -1 -p "a b c" --lanes 4 --log-file /d/x.log -o out.csv --route-trace t.csv')
    assert dict(command_options(line)) == {
        "cache_mb": "4000", "expert_sidecar": 1, "mmap": 0, "temp": "-1", "prompt": "a b c",
        "lanes": "4"}
    assert banner_options("moe-expert-sidecar: 812 MiB mapped") == [("expert_sidecar", 1)]
    assert banner_options("moe-spec-gate: 88% router prediction recall") == [("spec_gate", 1)]
    assert banner_options("moe-stream: read 1 MiB (1 MiB/token) o_direct=0") == [("o_direct", "0")]
    assert banner_options("moe-cache: 53.0% hit, resident 1999.2 MiB") == []
    assert banner_options("compute: 4 threads, cpu 0.1 s/token") == [("threads", "4")]
    assert banner_options("moe-io: 8 lanes") == [("io_threads", "8")]
    cfg = enginelog.engine_log_config("print_info: n_expert_used = 8\n"
                                      "moe-topk: override 6 (model 8)\n")
    assert cfg.values["n_expert_used"] == "6" and cfg.lines["n_expert_used"] == 2
    assert cfg.defaults == {"n_expert_used": ("8", 1)} and not cfg.command
