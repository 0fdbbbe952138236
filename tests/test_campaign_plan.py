"""Planning: execution order, sentinels, repeats, labels, configurations, the printed plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abbench.campaign import describe_plan, load_campaign, plan_campaign
from abbench.campaign.plan import MAX_CELLS, estimate_s, run_order
from abbench.engine.config import EngineConfig
from abbench.errors import CampaignFileError
from abbench.records import DecisionSpec, Plan
from abbench.records.cell_config import EmbeddedConfig, ExternalConfig

ROOT = Path(__file__).resolve().parents[1]

CELLS = """\
[workload]
model = "synthetic:tiny"
tokens = 32
cache_mib = 64

[cells.A]

[cells.B]
io_lanes = 2

[cells.C]
overlap = true

[cells.D]
command = ["sh", "-c", "true"]
output = "json:out.json"
timeout_s = 60
"""


def plan_of(tmp_path: Path, campaign: str = "", extra: str = "", cells: str = CELLS) -> Plan:
    path = tmp_path / "cells.toml"
    path.write_text(f"[campaign]\nname = \"t\"\n{campaign}\n{cells}\n{extra}", encoding="utf-8")
    return plan_campaign(load_campaign(path))


def names(plan: Plan) -> list[str]:
    return [c.name for c in plan.cells]


def twins(plan: Plan) -> list[int | None]:
    return [c.sentinel_of for c in plan.cells]


def test_file_order_by_default(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    assert names(plan) == ["A", "B", "C", "D"]
    assert twins(plan) == [None] * 4
    assert [c.index for c in plan.cells] == [0, 1, 2, 3]
    assert [c.label for c in plan.cells] == ["01-A", "02-B", "03-C", "04-D"]


def test_an_explicit_order_runs_exactly_those_names(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'order = ["C", "A", "C", "B", "A", "C"]')
    assert names(plan) == ["C", "A", "C", "B", "A", "C"]
    # a repeated name is a sentinel of the name's *first* run
    assert twins(plan) == [None, None, 0, None, 1, 0]
    assert [c.label for c in plan.cells][-1] == "06-C"


def test_abba_uses_the_first_cell_without_decisions(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'order = "abba"')
    assert names(plan) == ["A", "B", "B", "A", "C", "C", "A", "D", "D", "A"]
    assert twins(plan) == [None, None, 1, 0, None, 4, 0, None, 7, 0]


def test_abba_uses_the_first_decisions_baseline(tmp_path: Path) -> None:
    decisions = ('[[decision]]\ncandidate = "A"\nbaseline = "C"\n'
                 '[[decision]]\ncandidate = "B"\nbaseline = "A"\n')
    plan = plan_of(tmp_path, 'order = "abba"', decisions)
    assert names(plan) == ["C", "A", "A", "C", "B", "B", "C", "D", "D", "C"]
    assert plan.decisions == (DecisionSpec("A", "C"), DecisionSpec("B", "A"))


@pytest.mark.parametrize(("every", "expected"), [
    (1, ["A", "B", "A", "C", "A", "D", "A"]),
    (2, ["A", "B", "C", "A", "D", "A"]),
    (3, ["A", "B", "C", "D", "A"]),
    (10, ["A", "B", "C", "D", "A"]),
])
def test_sentinel_every(tmp_path: Path, every: int, expected: list[str]) -> None:
    plan = plan_of(tmp_path, f"sentinel_every = {every}")
    assert names(plan) == expected
    assert all(c.sentinel_of == 0 for c in plan.cells if c.name == "A" and c.index > 0)


def test_sentinel_every_puts_the_baseline_first(tmp_path: Path) -> None:
    decision = '[[decision]]\ncandidate = "A"\nbaseline = "C"\n'
    plan = plan_of(tmp_path, "sentinel_every = 2", decision)
    assert names(plan) == ["C", "A", "B", "C", "D", "C"]


def test_repeat(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'order = ["A", "B"]\nrepeat = 3')
    assert names(plan) == ["A", "B"] * 3
    assert twins(plan) == [None, None, 0, 1, 0, 1]
    # a round that ends with the cell the next one starts with runs it once at the seam
    plan = plan_of(tmp_path, 'order = ["A", "B", "C", "A"]\nrepeat = 2')
    assert names(plan) == ["A", "B", "C", "A", "B", "C", "A"]
    plan = plan_of(tmp_path, 'order = "abba"\nrepeat = 2',
                   cells=CELLS.split("[cells.C]")[0])
    assert names(plan) == ["A", "B", "B", "A", "B", "B", "A"]
    plan = plan_of(tmp_path, "sentinel_every = 3\nrepeat = 2")
    assert names(plan) == ["A", "B", "C", "D", "A", "B", "C", "D", "A"]
    # a single cell repeated is a drift check: every run is kept
    plan = plan_of(tmp_path, 'order = ["B"]\nrepeat = 3')
    assert names(plan) == ["B", "B", "B"] and twins(plan) == [None, 0, 0]


def test_labels_widen_past_99_cells(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'order = ["A", "B"]\nrepeat = 60')
    assert len(plan.cells) == 120
    assert plan.cells[0].label == "001-A" and plan.cells[119].label == "120-B"
    labels = [c.label for c in plan.cells]
    assert labels == sorted(labels)


def test_plans_have_a_size_limit(tmp_path: Path) -> None:
    order = json.dumps(["A", "B"] * (MAX_CELLS // 100 + 1))
    with pytest.raises(CampaignFileError, match=r"cells.toml:\d+: `campaign.repeat`: is 100: "
                       r"the plan would run 20200 cells"):
        plan_of(tmp_path, f"order = {order}\nrepeat = 100")
    # no `repeat` in the file: the order that makes the plan is named (issue 42, class 5)
    order = json.dumps(["A", "B"] * (MAX_CELLS // 2 + 1))
    with pytest.raises(CampaignFileError, match=r"cells.toml:\d+: `campaign.order`: names "
                       r"10002 cells: the plan would run 10002 cells"):
        plan_of(tmp_path, f"order = {order}")


def test_configurations(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    a = plan.cells[0].config
    # A cell decodes exactly its tokens (ignore_eos), unlike the command line's default.
    config = EngineConfig(model="synthetic:tiny", n_tokens=32, cache_mib=64.0, ignore_eos=True)
    # every engine option a cell may set; the one the campaign sets itself (`turn_tokens`,
    # from `interleave`) is no part of it, so plans stay as they were
    expected = {f: getattr(config, f) for f in EngineConfig.__dataclass_fields__
                if f != "turn_tokens"}
    assert isinstance(a, EmbeddedConfig)
    assert a.to_json() == {"engine": "embedded", **expected, "timeout_s": 900.0}
    assert (a.model, a.n_tokens, a.timeout_s) == ("synthetic:tiny", 32, 900.0)
    assert plan.cells[1].config.resolved["io_lanes"] == 2
    external = plan.cells[3].config
    assert isinstance(external, ExternalConfig)
    assert (external.command, external.output, external.timeout_s) == (
        ("sh", "-c", "true"), "json:out.json", 60.0)
    assert external.to_json() == {"engine": "external", "command": ["sh", "-c", "true"],
                                  "output": "json:out.json", "timeout_s": 60.0}
    json.dumps(plan.to_json(), allow_nan=False)  # JSON-able throughout
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_prompt_tokens_are_a_list(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, extra="[cells.E]\nprompt_tokens = [3, 1, 2]\n")
    cell = plan.cells[-1].config
    assert cell.to_json()["prompt_tokens"] == [3, 1, 2]
    assert isinstance(cell, EmbeddedConfig) and cell.prompt_tokens == (3, 1, 2)


def test_plan_fields(tmp_path: Path) -> None:
    extra = ("[device]\ntransport = \"sim:phone\"\n[gate]\ncaps_at_max = true\n"
             "[match]\nprobe_tol = 0.05\n")
    plan = plan_of(tmp_path, "spacing_s = 12.5\nwarmup_tokens = 4", extra)
    assert (plan.campaign, plan.spacing_s, plan.warmup_tokens, plan.device) == (
        "t", 12.5, 4, "sim:phone")
    assert plan.match.probe_tol == 0.05 and plan.match.max_gap_s == 900.0
    assert plan.gate is not None and plan.gate.caps_at_max is True
    assert plan.gate.cpu_temp_max_c is None and plan.gate.timeout_s == 600.0
    on_disk = json.loads(json.dumps(plan.to_json()))
    assert on_disk["gate"]["caps_at_max"] is True  # the JSON is as it was: a table
    assert Plan.from_json(on_disk).gate == plan.gate  # and typed again when read
    assert plan_of(tmp_path).gate is None


def test_spec_built_orders_are_checked_again(tmp_path: Path) -> None:
    # run_order is what plan_campaign follows
    path = tmp_path / "cells.toml"
    path.write_text(CELLS + '[campaign]\norder = "abba"\n', encoding="utf-8")
    spec = load_campaign(path)
    assert run_order(spec) == names(plan_campaign(spec))


# -- the printed plan ---------------------------------------------------------------------


def test_describe_plan(tmp_path: Path) -> None:
    decision = '[[decision]]\ncandidate = "C"\nbaseline = "A"\nmin_effect = 0.05\n'
    plan = plan_of(tmp_path, 'order = ["A", "B", "C", "D", "A"]\nspacing_s = 30', decision)
    lines = describe_plan(plan, tok_per_s=10.0)
    assert lines[0] == "plan t: 5 cells on local, 30 s apart"
    assert lines[1].split() == ["01-A", "~0:12", "synthetic:tiny:", "tokens=32", "cache_mib=64"]
    assert lines[2].split()[2:] == ["io_lanes=2"]
    assert lines[3].split()[2:] == ["overlap=true"]
    assert lines[4].split()[1] == "?" and "external: sh -c true -> json:out.json" in lines[4]
    assert lines[5].split()[2:] == ["sentinel", "of", "01"]
    assert lines[6] == "decision: C vs A, GO above 1.05x, NO-GO below 1x"
    assert lines[7].startswith("expected duration ~2:48 (an estimate: 30 s spacing")
    assert "1 external cell not counted" in lines[7]
    # the estimate: (prompt bytes + tokens) / tok/s + start, per embedded cell
    first = plan.cells[0].config
    assert isinstance(first, EmbeddedConfig) and first.prompt is not None
    assert estimate_s(first, 10.0) == pytest.approx((len(first.prompt) + 32) / 10.0 + 3.0)
    assert estimate_s(plan.cells[3].config, 10.0) is None  # an external cell


def test_describe_plan_sentinel_that_differs_from_the_first_cell(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'order = ["A", "B", "B"]')
    assert describe_plan(plan)[3].split()[2:] == ["sentinel", "of", "02;", "io_lanes=2"]


def test_describe_plan_with_a_gate(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, extra="[gate]\ncpu_temp_max_c = 45\ncaps_at_max = true\n")
    lines = describe_plan(plan)
    assert "gate before each cell: cpu_temp_max_c=45 caps_at_max=true (gives up after 600 s)" \
        in lines
    assert lines[-1].endswith("gate waits not counted)")


# -- the seed's campaign, shipped --------------------------------------------------------


def test_predict_4cell_campaign() -> None:
    spec = load_campaign(ROOT / "cells" / "predict-4cell.toml")
    plan = plan_campaign(spec)
    assert names(plan) == ["B", "retention-only", "spec-2", "B"]
    assert twins(plan) == [None, None, None, 0]
    assert plan.spacing_s == 30.0
    b, retention, spec2, again = (c.config.resolved for c in plan.cells)
    assert again == b
    assert (b["model"], b["n_tokens"], b["cache_mib"], b["io_lanes"], b["overlap"]) == (
        "synthetic:default", 128, 384.0, 4, True)
    assert (b["drop_cold_experts"], b["dense"], b["predict_prefetch"]) == (0.75, "pinned", False)
    assert {k: v for k, v in retention.items() if b[k] != v} == {
        "predict_prefetch": True, "predict_spec_max": 0}
    assert {k: v for k, v in spec2.items() if b[k] != v} == {"predict_prefetch": True}
    assert spec2["predict_spec_max"] == 2
    assert plan.decisions == (DecisionSpec("spec-2", "B", 0.03),)


def test_the_reference_shows_the_real_printed_plan() -> None:
    doc = (ROOT / "docs" / "cells.md").read_text(encoding="utf-8")
    shown = doc.split("--dry-run` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    plan = plan_campaign(load_campaign(ROOT / "cells" / "predict-4cell.toml"))
    assert shown.rstrip("\n").split("\n") == describe_plan(plan)


def test_describe_plan_on_a_simulated_device_counts_simulated_seconds(tmp_path: Path) -> None:
    """`sim:phone` runs 8 simulated seconds per wall second: 30 s of spacing is 3.75 s."""
    plan = plan_of(tmp_path, "spacing_s = 30", "[device]\ntransport = \"sim:phone\"\n"
                   "[gate]\ncaps_at_max = true\ntimeout_s = 900\n")
    lines = describe_plan(plan, tok_per_s=10.0)
    assert lines[0].endswith("30 s apart (simulated: 3.75 s of wall time)")
    assert "(gives up after 900 s simulated)" in lines[-2]
    assert "3.75 s spacing between cells" in lines[-1]


# -- interleaved pairs (interleave = "slices", docs/cells.md#interleaved-slices) -----------

PAIRS = """\
[workload]
model = "synthetic:tiny"
tokens = 32

[cells.B]

[cells.C]
io_lanes = 1

[cells.E]
overlap = true

[[decision]]
candidate = "C"
baseline = "B"
"""


def pairs(plan: Plan) -> list[tuple[str, str]]:
    return [(a.name, b.name) for a, b in plan.pairs()]


def test_interleaved_abba_runs_abba_blocks_of_invocations(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'interleave = "slices"', cells=PAIRS)
    assert pairs(plan) == [("B", "C"), ("C", "B"), ("B", "E"), ("E", "B")]
    assert [c.interleaved_with for c in plan.cells] == [1, 0, 3, 2, 5, 4, 7, 6]
    assert twins(plan) == [None, None, 1, 0, 0, None, 5, 0]
    assert (plan.interleave, plan.slice_tokens) == ("slices", 16)
    # "abba", written, is the same; `repeat` runs the pairs again, whole
    assert plan_of(tmp_path, 'interleave = "slices"\norder = "abba"', cells=PAIRS) == plan
    again = plan_of(tmp_path, 'interleave = "slices"\nslice_tokens = 8\nrepeat = 2',
                    cells=PAIRS)
    assert pairs(again) == pairs(plan) * 2 and again.slice_tokens == 8


def test_an_explicit_interleaved_order_is_read_as_pairs(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'interleave = "slices"\norder = ["C", "B", "E", "C"]',
                   cells=PAIRS)
    assert pairs(plan) == [("C", "B"), ("E", "C")]


def test_a_plan_that_does_not_interleave_has_no_pairs(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'interleave = "cells"', cells=PAIRS)
    assert plan.pairs() == [] and plan.interleave == "cells" and plan.slice_tokens is None
    assert all(c.interleaved_with is None for c in plan.cells)
    assert "interleave" not in plan.to_json()


def test_describe_plan_shows_the_pairs(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 'interleave = "slices"\norder = ["B", "C", "C", "B"]\n'
                   "spacing_s = 30", cells=PAIRS)
    lines = describe_plan(plan, tok_per_s=10.0)
    assert lines[0] == "plan t: 4 cells in 2 interleaved pairs on local, 30 s apart"
    assert [line.split("  ")[-1].split("]")[0] + "]" for line in lines[1:5]] == [
        "[pair 1, first turn]", "[pair 1]", "[pair 2, first turn]", "[pair 2]"]
    assert "taking turns every 16 decode tokens" in lines[6]
    # one spacing between the two pairs, not three between the cells
    assert lines[-1].startswith("expected duration ~1:18 ")
    assert "30 s spacing between pairs" in lines[-1]


def test_the_reference_shows_the_real_printed_interleaved_plan(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "cells.md").read_text(encoding="utf-8")
    shown = doc.split("takes the first turn), and a line says how the pairs run:\n\n```\n",
                      1)[1].split("```", 1)[0]
    cells = PAIRS.split("[cells.E]")[0] + '[[decision]]\ncandidate = "C"\nbaseline = "B"\n'
    plan = plan_of(tmp_path, 'interleave = "slices"', cells=cells)
    assert shown.rstrip("\n").split("\n") == describe_plan(plan)
