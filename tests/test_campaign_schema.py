"""cells.toml: parsing, validation, resolution, messages, the resolved TOML, and fuzzing."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abbench.campaign import (
    describe_plan,
    load_campaign,
    plan_campaign,
    resolved_toml,
)
from abbench.engine.config import DEFAULT_PROMPT
from abbench.errors import AbbenchError, CampaignFileError, format_key
from abbench.records.toml import KeyLines, dump_value, parse

# A campaign file with every table (docs/cells.md documents each).
EXAMPLE = """\
[campaign]
name = "predict-4cell"
spacing_s = 30                 # fixed gap between cells
order = ["B", "retention-only", "spec-2", "B"]   # a repeated name is a sentinel
warmup_tokens = 16             # excluded from statistics

[device]
transport = "local"            # local | adb:SERIAL | ssh:HOST | sim:PROFILE
sample_hz = 2

[gate]                          # optional: cool on a condition before each cell
cpu_temp_max_c = 45.0
battery_temp_max_c = 36.0
mem_available_min_mib = 4000
caps_at_max = true
probe_min = 0.97
poll_s = 5
timeout_s = 600                # give up, run anyway, and record that the gate gave up

[match]
cpu_temp_tol_c = 3.0
battery_temp_tol_c = 0.5
mem_available_tol_frac = 0.15
probe_tol = 0.03

[workload]                      # defaults every cell inherits
engine = "embedded"
model = "synthetic:default"    # built once and cached; or a path to a .gguf
prompt = "Explain how a mixture-of-experts model routes each token."
tokens = 128
cache_mib = 384
io_lanes = 4
overlap = true

[cells.B]
drop_cold_experts = 0.75
dense = "pinned"

[cells.retention-only]
base = "B"
predict_prefetch = true
predict_spec_max = 0

[cells.spec-2]
base = "B"
predict_prefetch = true
predict_spec_max = 2

[cells.ext]                     # an external command instead of the embedded engine
command = ["sh", "-c", "echo 'generation: 8 tokens, 0.1 s/token (10.0 tok/s)'"]
output = "stdout-summary"      # how to read its result

[[decision]]
candidate = "spec-2"
baseline = "B"
min_effect = 0.03              # the smallest speed-up worth shipping
"""

MINIMAL = """\
[workload]
model = "synthetic:tiny"
tokens = 32

[cells.A]

[cells.B]
cache_mib = 64
"""


def write(tmp_path: Path, text: str, name: str = "cells.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problem(tmp_path: Path, text: str) -> CampaignFileError:
    path = write(tmp_path, text)
    with pytest.raises(CampaignFileError) as info:
        plan_campaign(load_campaign(path))
    return info.value


def edit(old: str, new: str, text: str = EXAMPLE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.split("\n"), 1) if needle in line)


# -- the full example ------------------------------------------------------------------


def test_full_example_loads(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE)
    spec = load_campaign(path)
    assert spec.path == path and spec.source_text == EXAMPLE
    c = spec.campaign
    assert (c.name, c.spacing_s, c.warmup_tokens, c.sentinel_every, c.repeat) == (
        "predict-4cell", 30.0, 16, None, 1)
    assert c.order == ("B", "retention-only", "spec-2", "B")
    assert (spec.device.transport, spec.device.sample_hz, spec.device.root) == ("local", 2.0, "/")
    g = spec.gate
    assert g is not None
    assert (g.cpu_temp_max_c, g.battery_temp_max_c, g.mem_available_min_mib, g.caps_at_max,
            g.probe_min, g.poll_s, g.timeout_s) == (45.0, 36.0, 4000.0, True, 0.97, 5.0, 600.0)
    assert isinstance(g.mem_available_min_mib, float)
    m = spec.match
    assert (m.cpu_temp_tol_c, m.battery_temp_tol_c, m.mem_available_tol_frac, m.probe_tol,
            m.max_gap_s, m.foreign_load_tol) == (3.0, 0.5, 0.15, 0.03, 900.0, 0.25)
    assert list(spec.cells) == ["B", "retention-only", "spec-2", "ext"]
    b = spec.cells["B"].config
    assert b is not None
    assert (b.model, b.n_tokens, b.cache_mib, b.io_lanes, b.overlap, b.drop_cold_experts,
            b.dense, b.predict_prefetch) == ("synthetic:default", 128, 384.0, 4, True, 0.75,
                                             "pinned", False)
    r = spec.cells["retention-only"]
    assert r.base == "B" and r.engine == "embedded" and r.timeout_s == 900.0
    assert r.config is not None and r.config.drop_cold_experts == 0.75  # inherited
    assert (r.config.predict_prefetch, r.config.predict_spec_max) == (True, 0)
    s2 = spec.cells["spec-2"].config
    assert s2 is not None and (s2.predict_prefetch, s2.predict_spec_max) == (True, 2)
    ext = spec.cells["ext"]
    assert ext.engine == "external" and ext.config is None
    assert ext.command[0] == "sh" and ext.output == "stdout-summary"
    assert [(d.candidate, d.baseline, d.min_effect) for d in spec.decisions] == [
        ("spec-2", "B", 0.03)]
    assert spec.baseline == "B" and spec.sweeps == ()


def test_defaults(tmp_path: Path) -> None:
    spec = load_campaign(write(tmp_path, "[cells.A]\n", name="my campaign.toml"))
    c = spec.campaign
    assert c.name == "my_campaign"  # the file's stem, made a folder name
    assert (c.spacing_s, c.order, c.warmup_tokens, c.sentinel_every, c.repeat) == (
        30.0, None, 16, None, 1)
    assert (spec.device.transport, spec.device.sample_hz, spec.device.root) == ("local", 2.0, "/")
    assert spec.gate is None and spec.decisions == ()
    assert spec.match.max_gap_s == 900.0
    a = spec.cells["A"]
    assert a.engine == "embedded" and a.timeout_s == 900.0 and a.base is None
    assert a.config is not None and a.config.model == "synthetic:default"
    assert a.config.prompt == DEFAULT_PROMPT and a.config.n_tokens == 64


def test_integer_where_a_number_is_expected(tmp_path: Path) -> None:
    spec = load_campaign(write(tmp_path, MINIMAL))
    assert spec.cells["B"].config is not None
    assert spec.cells["B"].config.cache_mib == 64.0
    assert isinstance(spec.cells["B"].config.cache_mib, float)


def test_error_is_an_abbench_error_with_status_2() -> None:
    assert issubclass(CampaignFileError, AbbenchError)
    assert CampaignFileError("x").exit_status == 2


# -- messages: FILE:LINE: `key`: problem, and a tip ---------------------------------------


@pytest.mark.parametrize(("old", "new", "key", "tip"), [
    ("spacing_s = 30", "spacng_s = 30", "campaign.spacng_s", "did you mean `spacing_s`?"),
    ("drop_cold_experts = 0.75", "drop_cold_expert = 0.75", "cells.B.drop_cold_expert",
     "did you mean `drop_cold_experts`?"),
    ("sample_hz = 2", "sampel_hz = 2", "device.sampel_hz", "did you mean `sample_hz`?"),
    ("probe_min = 0.97", "prob_min = 0.97", "gate.prob_min", "did you mean `probe_min`?"),
    ("probe_tol = 0.03", "probe_tl = 0.03", "match.probe_tl", "did you mean `probe_tol`?"),
    ("io_lanes = 4", "io_lane = 4", "workload.io_lane", "did you mean `io_lanes`?"),
    ("min_effect = 0.03", "min_efect = 0.03", "decision[0].min_efect",
     "did you mean `min_effect`?"),
    ("tokens = 128", "n_tokens = 128", "workload.n_tokens", "spells it `tokens`"),
])
def test_unknown_keys_suggest_the_closest(tmp_path: Path, old: str, new: str, key: str,
                                          tip: str) -> None:
    text = edit(old, new)
    e = problem(tmp_path, text)
    assert e.message == f"{tmp_path / 'cells.toml'}:{line_of(text, new)}: `{key}`: unknown key"
    assert tip in (e.tip or "")


def test_tables_must_be_tables(tmp_path: Path) -> None:
    e = problem(tmp_path, "device = 3\n[cells.A]\n")
    assert e.message.endswith(":1: `device`: expected a table, got an integer (3)")
    e = problem(tmp_path, "cells = []\n")
    assert ":1: `cells`: expected a table, got an array" in e.message


def test_unknown_table_and_a_key_above_every_table(tmp_path: Path) -> None:
    e = problem(tmp_path, edit("[cells.B]", "[cell.B]"))
    assert "`cell`: unknown table" in e.message and e.tip == "did you mean `cells`?"
    e = problem(tmp_path, "spacing_s = 3\n" + EXAMPLE)
    assert ":1: `spacing_s`: unknown table" in e.message
    assert e.tip == "`spacing_s` belongs in the `[campaign]` table"


@pytest.mark.parametrize(("old", "new", "key"), [
    ("spacing_s = 30", "spacing_s = true", "campaign.spacing_s"),
    ("sample_hz = 2", "sample_hz = false", "device.sample_hz"),
    ("tokens = 128", "tokens = true", "workload.tokens"),
    ("drop_cold_experts = 0.75", "drop_cold_experts = true", "cells.B.drop_cold_experts"),
    ("min_effect = 0.03", "min_effect = true", "decision[0].min_effect"),
    ("cpu_temp_max_c = 45.0", "cpu_temp_max_c = true", "gate.cpu_temp_max_c"),
    ("warmup_tokens = 16", "warmup_tokens = true", "campaign.warmup_tokens"),
])
def test_a_boolean_is_not_a_number(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = edit(old, new)
    e = problem(tmp_path, text)
    assert e.message.startswith(f"{tmp_path / 'cells.toml'}:{line_of(text, new)}: `{key}`: ")
    assert "got a boolean (true)" in e.message or "got a boolean (false)" in e.message


@pytest.mark.parametrize(("old", "new", "key", "words"), [
    ("tokens = 128", "tokens = 128.0", "workload.tokens", "expected an integer, got a float"),
    ("dense = \"pinned\"", "dense = 1", "cells.B.dense", "expected a string, got an integer"),
    ("overlap = true", "overlap = 1", "workload.overlap", "expected a boolean"),
    ('order = ["B", "retention-only", "spec-2", "B"]', "order = 3", "campaign.order",
     "expected an array of strings or a string"),
    ('order = ["B", "retention-only", "spec-2", "B"]', 'order = ["B", 3]',
     "campaign.order[1]", "expected a string"),
    ('command = ["sh", "-c",', 'command = ["sh", 1,', "cells.ext.command[1]",
     "expected a string"),
    ("spacing_s = 30", "spacing_s = 1979-05-27", "campaign.spacing_s", "got a date/time"),
    ("spacing_s = 30", "spacing_s = nan", "campaign.spacing_s", "must be a finite number"),
    ("[cells.B]", "[cells]\nB = 1\n[cells.C]", "cells.B", "expected a table"),
    ("[[decision]]", "[decision]", "decision", "expected an array of tables"),
])
def test_wrong_types(tmp_path: Path, old: str, new: str, key: str, words: str) -> None:
    e = problem(tmp_path, edit(old, new))
    assert f"`{key}`: " in e.message and words in e.message, e.message


@pytest.mark.parametrize(("old", "new", "key", "words"), [
    ("spacing_s = 30", "spacing_s = -1", "campaign.spacing_s", "between 0 and"),
    ("warmup_tokens = 16", "warmup_tokens = -1", "campaign.warmup_tokens", ">= 0"),
    ("warmup_tokens = 16", "warmup_tokens = 16\nrepeat = 0", "campaign.repeat", "between 1"),
    ("sample_hz = 2", "sample_hz = 0", "device.sample_hz", "in (0, 50]"),
    ("sample_hz = 2", "sample_hz = 51", "device.sample_hz", "in (0, 50]"),
    ("transport = \"local\"", "transport = \"usb\"", "device.transport", "not a transport"),
    ("transport = \"local\"", "transport = \"ssh:-oProxyCommand=x\"", "device.transport",
     "not a transport"),
    ("probe_min = 0.97", "probe_min = 1.5", "gate.probe_min", "in (0, 1]"),
    ("poll_s = 5", "poll_s = 0", "gate.poll_s", "in (0,"),
    ("probe_tol = 0.03", "probe_tol = -0.1", "match.probe_tol", "in [0, 1]"),
    ("probe_tol = 0.03", "probe_tol = 0.03\nforeign_load_tol = -0.5", "match.foreign_load_tol",
     "in [0, 4096] cores"),
    ("probe_tol = 0.03", "probe_tol = 0.03\nforeign_load_tol = nan", "match.foreign_load_tol",
     "must be a finite number"),
    ("mem_available_tol_frac = 0.15", "mem_available_tol_frac = 2",
     "match.mem_available_tol_frac", "in [0, 1]"),
    ("min_effect = 0.03", "min_effect = -0.03", "decision[0].min_effect", ">= 0"),
    ("engine = \"embedded\"", "engine = \"embeded\"", "workload.engine",
         "must be one of `embedded`, `external`, `llama-bench`"),
    ("tokens = 128", "tokens = 128\ntimeout_s = 0", "workload.timeout_s", "in (0,"),
    ('output = "stdout-summary"', 'output = "csv:/x"', "cells.ext.output", "not an output"),
    ('output = "stdout-summary"', 'output = "json:"', "cells.ext.output", "not an output"),
    ("tokens = 128", "tokens = 128\nseed = -1", "workload.seed", ">= 0"),
    ("warmup_tokens = 16", "warmup_tokens = 128", "campaign.warmup_tokens",
     "leaves no tokens to measure in cell `B`"),
])
def test_values_out_of_range(tmp_path: Path, old: str, new: str, key: str, words: str) -> None:
    text = edit(old, new)
    e = problem(tmp_path, text)
    assert f":{line_of(text, new.split(chr(10))[-1])}: `{key}`: " in e.message, e.message
    assert words in e.message, e.message


@pytest.mark.parametrize(("old", "new", "key", "words"), [
    ("min_effect = 0.03", 'min_effect = 0.03\nexpect = "faster-than"', "decision[0].expect",
     "did you mean `faster`?"),
    ("min_effect = 0.03", 'expect = "not-slower"', "decision[0].max_regression",
     'is needed with `expect = "not-slower"`'),
    ("min_effect = 0.03", 'expect = "not-slower"\nmax_regression = 1.5',
     "decision[0].max_regression", "in (0, 1)"),
    ("min_effect = 0.03", "min_effect = 0.03\nmax_regression = 0.1",
     "decision[0].max_regression", 'applies to `expect = "not-slower"` only'),
    ("min_effect = 0.03", 'min_effect = 0.03\nexpect = "not-slower"\nmax_regression = 0.1',
     "decision[0].min_effect", 'applies to `expect = "faster"` only'),
    ("warmup_tokens = 16", 'warmup_tokens = 16\nuntil = "decided"', "campaign.until",
     "needs a budget"),
    ("warmup_tokens = 16", 'warmup_tokens = 16\nuntil = "decide"', "campaign.until",
     "did you mean `decided`?"),
    ("warmup_tokens = 16", "warmup_tokens = 16\nmax_cells = 10", "campaign.max_cells",
     'applies only to a sequential campaign'),
    ("warmup_tokens = 16", 'warmup_tokens = 16\nuntil = "decided"\nmax_minutes = 0',
     "campaign.max_minutes", "in (0,"),
])
def test_decision_kinds_and_sequential_keys(tmp_path: Path, old: str, new: str, key: str,
                                            words: str) -> None:
    text = edit(old, new)
    e = problem(tmp_path, text)
    assert f"`{key}`: " in e.message, e.message
    assert words in e.message + " TIP: " + (e.tip or ""), (e.message, e.tip)


def test_sequential_plan_checks_budget_and_decisions(tmp_path: Path) -> None:
    short = edit("warmup_tokens = 16", 'warmup_tokens = 16\nuntil = "decided"\nmax_cells = 3')
    with pytest.raises(CampaignFileError, match="`campaign.max_cells`: is 3, fewer than the 4"):
        plan_campaign(load_campaign(write(tmp_path, short)))
    none = re.sub(r"(?s)\[\[decision\]\].*", "", edit(
        "warmup_tokens = 16", 'warmup_tokens = 16\nuntil = "decided"\nmax_cells = 8'))
    with pytest.raises(CampaignFileError, match="`campaign.until`: needs a `\\[\\[decision"):
        plan_campaign(load_campaign(write(tmp_path, none, "none.toml")))
    ok = edit("warmup_tokens = 16", 'warmup_tokens = 16\nuntil = "decided"\nmax_cells = 8')
    plan = plan_campaign(load_campaign(write(tmp_path, ok, "ok.toml")))
    assert plan.sequential is not None and plan.sequential.max_cells == 8
    assert plan.planned_cells == 4 and plan.looks == ()
    # the resolved campaign.toml reads back to the same sequential plan
    again = plan_campaign(load_campaign(write(tmp_path, resolved_toml(
        load_campaign(write(tmp_path, ok, "ok.toml"))), "again.toml")))
    assert again.sequential == plan.sequential


def test_engine_errors_name_the_toml_key(tmp_path: Path) -> None:
    text = edit("drop_cold_experts = 0.75", "drop_cold_experts = 1.5")
    e = problem(tmp_path, text)
    assert e.message == (f"{tmp_path / 'cells.toml'}:{line_of(text, 'drop_cold_experts')}: "
                         "`cells.B.drop_cold_experts`: must be in (0, 1] (got 1.5)")
    # the key the engine blames is set by [workload]; the cell that tripped it is named
    e = problem(tmp_path, edit("io_lanes = 4", "io_lanes = 99"))
    assert "`workload.io_lanes`: must be between 1 and 64 (got 99) (resolving cell `B`)" \
        in e.message
    # a flag that needs another: the engine's flag names become TOML keys
    e = problem(tmp_path, edit("cache_mib = 384", "cache_mib = 0"))
    assert "`cells.B.drop_cold_experts`: needs the expert cache (`cache_mib` > 0)" in e.message
    e = problem(tmp_path, edit("predict_spec_max = 2", "predict_spec_max = 2\nprefetch = 2"))
    assert "`cells.spec-2.predict_prefetch`: and `prefetch` are mutually exclusive" in e.message
    e = problem(tmp_path, edit("dense = \"pinned\"", "dense = \"pined\""))
    assert "`cells.B.dense`: must be `pinned` or `mmap` (got `pined`)" in e.message


def test_unknown_base_and_cycles(tmp_path: Path) -> None:
    text = edit('base = "B"\npredict_prefetch = true\npredict_spec_max = 0',
                'base = "b"\npredict_prefetch = true\npredict_spec_max = 0')
    e = problem(tmp_path, text)
    line = line_of(text, 'base = "b"')
    assert e.message == (f"{tmp_path / 'cells.toml'}:{line}: "
                         "`cells.retention-only.base`: no cell `b`")
    assert "`B`" in (e.tip or "")
    e = problem(tmp_path, "[cells.A]\nbase = \"B\"\n[cells.B]\nbase = \"A\"\n")
    assert e.message.endswith(":4: `cells.B.base`: `base` cycle: A → B → A")
    e = problem(tmp_path, "[cells.A]\nbase = \"A\"\n")
    assert "`cells.A.base`: `base` cycle: A → A" in e.message
    e = problem(tmp_path, "[cells.Z]\nbase = \"A\"\n[cells.A]\nbase = \"B\"\n"
                "[cells.B]\nbase = \"C\"\n[cells.C]\nbase = \"A\"\n")
    assert "cycle: A → B → C → A" in e.message


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "-x", "_x", "a b", "é",
                                  "x" * 101, "a\\b", "a:b"])
def test_cell_names_that_cannot_name_a_folder(tmp_path: Path, name: str) -> None:
    e = problem(tmp_path, f"[cells.{json.dumps(name)}]\n")
    assert f"`{format_key(('cells', name))}`: " in e.message
    assert "is not a valid cell name" in e.message and "folders" in (e.tip or "")


@pytest.mark.parametrize("name", ["B", "spec-2", "a.b_c-D9", "7"])
def test_valid_cell_names(tmp_path: Path, name: str) -> None:
    spec = load_campaign(write(tmp_path, f"[cells.{json.dumps(name)}]\n"))
    assert list(spec.cells) == [name]


def test_campaign_name_must_name_a_folder(tmp_path: Path) -> None:
    e = problem(tmp_path, '[campaign]\nname = "../up"\n[cells.A]\n')
    assert ":2: `campaign.name`: \"../up\" is not a valid campaign name" in e.message


def test_order_and_decisions_name_known_cells(tmp_path: Path) -> None:
    e = problem(tmp_path, edit('"spec-2", "B"]', '"spec-3", "B"]'))
    assert "`campaign.order[2]`: no cell `spec-3`" in e.message
    assert e.tip == "did you mean `spec-2`?"
    e = problem(tmp_path, edit('candidate = "spec-2"', 'candidate = "spec2"'))
    assert "`decision[0].candidate`: no cell `spec2`" in e.message
    assert e.tip == "did you mean `spec-2`?"
    e = problem(tmp_path, edit('baseline = "B"', 'baseline = "spec-2"'))
    assert "`decision[0].baseline`: is the candidate itself (`spec-2`)" in e.message
    e = problem(tmp_path, edit('candidate = "spec-2"', 'candidate = "ext"'))
    assert "`decision[0].candidate`: cell `ext` is not in `campaign.order`" in e.message
    e = problem(tmp_path, edit("[[decision]]\n", "[[decision]]\nbaseline = \"B\"\n[[decision]]\n"))
    assert "`decision[0]`: missing key `candidate`" in e.message


def test_order_forms(tmp_path: Path) -> None:
    order = 'order = ["B", "retention-only", "spec-2", "B"]'
    e = problem(tmp_path, edit(order, 'order = "ABBA"'))
    assert "`campaign.order`: must be an array of cell names or \"abba\"" in e.message
    assert e.tip == 'did you mean `"abba"`?'
    e = problem(tmp_path, edit(order, "order = []"))
    assert "`campaign.order`: must name at least one cell" in e.message
    e = problem(tmp_path, edit(order, order + "\nsentinel_every = 2"))
    assert "`campaign.sentinel_every`: cannot be combined with `order`" in e.message
    e = problem(tmp_path, '[campaign]\norder = "abba"\n[cells.A]\n')
    assert '`campaign.order`: "abba" needs at least two cells' in e.message


def test_external_cells(tmp_path: Path) -> None:
    cmd = 'command = ["sh", "-c",'
    e = problem(tmp_path, edit(cmd, "cache_mib = 3\n" + cmd))
    assert "`cells.ext.cache_mib`: cell `ext` runs an external command; engine keys do not " \
        "apply to it" in e.message
    e = problem(tmp_path, edit(cmd, 'engine = "embedded"\n' + cmd))
    assert "`cells.ext.command`: cell `ext` is both embedded" in e.message
    e = problem(tmp_path, edit(cmd, 'base = "B"\n' + cmd))  # inherits engine keys
    assert "cell `ext` runs an external command" in e.message
    e = problem(tmp_path, '[cells.X]\nengine = "external"\n')
    assert "`cells.X`: an external cell needs `command = [...]`" in e.message
    e = problem(tmp_path, '[cells.X]\ncommand = []\n')
    assert "`cells.X.command`: must be a non-empty array of strings" in e.message
    e = problem(tmp_path, '[cells.X]\ncommand = ["x"]\nengine = "remote"\n')
    assert "`cells.X.engine`: must be one of `embedded`, `external`, `llama-bench`" in e.message
    spec = load_campaign(write(tmp_path, '[cells.X]\ncommand = ["run", "a b"]\ntimeout_s = 5\n'))
    x = spec.cells["X"]
    assert (x.engine, x.command, x.output, x.timeout_s) == (
        "external", ("run", "a b"), "stdout-summary", 5.0)
    # [workload] engine keys are defaults for embedded cells only
    spec = load_campaign(write(tmp_path, EXAMPLE))
    assert spec.cells["ext"].to_config() == {
        "engine": "external", "command": list(spec.cells["ext"].command),
        "output": "stdout-summary", "timeout_s": 900.0}


def test_gate_needs_a_condition(tmp_path: Path) -> None:
    e = problem(tmp_path, "[gate]\npoll_s = 1\n[cells.A]\n")
    assert e.message.endswith(":1: `gate`: sets no condition")
    e = problem(tmp_path, "[gate]\ncaps_at_max = false\n[cells.A]\n")
    assert "sets no condition" in e.message
    spec = load_campaign(write(tmp_path, "[gate]\ncaps_at_max = true\n[cells.A]\n"))
    assert spec.gate is not None and spec.gate.conditions() == ["caps_at_max"]


def test_model_paths(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(tiny_model.read_bytes())
    spec = load_campaign(write(tmp_path, '[workload]\nmodel = "models/m.gguf"\n[cells.A]\n'))
    cfg = spec.cells["A"].config
    assert cfg is not None and cfg.model == str(tmp_path / "models" / "m.gguf")
    # A file the engine cannot read fails the campaign file, not every cell in turn.
    (tmp_path / "models" / "bad.gguf").write_bytes(b"GGUF")
    e = problem(tmp_path, '[workload]\nmodel = "models/bad.gguf"\n[cells.A]\n')
    assert f":2: `workload.model`: {tmp_path / 'models' / 'bad.gguf'}: " in e.message
    e = problem(tmp_path, '[workload]\nmodel = "models/missing.gguf"\n[cells.A]\n')
    assert ":2: `workload.model`: no model file at" in e.message
    e = problem(tmp_path, '[cells.A]\nmodel = "synthetic:tiny@x"\n')
    assert "`cells.A.model`: \"synthetic:tiny@x\" is not a synthetic model" in e.message
    spec = load_campaign(write(tmp_path, '[cells.A]\nmodel = "synthetic:small@3"\n'))
    assert spec.cells["A"].config is not None
    assert spec.cells["A"].config.model == "synthetic:small@3"


def test_an_integer_past_what_python_reads_is_invalid_toml(tmp_path: Path) -> None:
    """Found by the slow fuzz: tomllib raises a bare ValueError (not its TOMLDecodeError)
    for an integer of over 4300 digits."""
    e = problem(tmp_path, "[campaign]\nname = " + "9" * 5000 + "\n" + EXAMPLE)
    assert e.message.startswith(f"{tmp_path / 'cells.toml'}: invalid TOML: a value Python "
                                "cannot read"), e.message
    assert len(e.message) < 300


@pytest.mark.parametrize("where", ["order", "decision", "sweep"])
def test_a_long_unknown_cell_name_is_shortened_in_the_message(tmp_path: Path,
                                                             where: str) -> None:
    """Found by the slow fuzz: a 5000-character name in `order` made a 5 KB message."""
    name = "x" * 5000
    head = '[campaign]\nname = "n"\n'
    tail = '[cells.A]\nmodel = "synthetic:tiny"\n[cells.B]\nbase = "A"\ncache_mib = 8\n'
    text = {"order": head + f'order = ["A", "{name}"]\n' + tail,
            "decision": head + tail + f'[[decision]]\ncandidate = "{name}"\nbaseline = "A"\n',
            "sweep": head + tail + f'[[sweep]]\ncell = "{name}"\nkey = "cache_mib"\n'
                                   "values = [8, 16]\n"}[where]
    e = problem(tmp_path, text)
    assert "no cell `xxx" in e.message and "...`" in e.message, e.message[:200]
    assert len(e.message) < 300, e.message[:200]


def test_file_problems(tmp_path: Path) -> None:
    text = edit('dense = "pinned"', "dense = pinned")
    e = problem(tmp_path, text)
    line = line_of(text, "dense = pinned")
    assert e.message == f"{tmp_path / 'cells.toml'}:{line}:9: invalid TOML: Invalid value"
    assert "quotes" in (e.tip or "")
    e = problem(tmp_path, EXAMPLE + "\n[cells.B]\n")
    assert "invalid TOML" in e.message and "twice" in e.message
    e = problem(tmp_path, "[cells.A]\nx = [1,\n")
    assert re.match(rf"{re.escape(str(tmp_path))}/cells.toml:\d+:\d+: invalid TOML", e.message)
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[cells.A]\n# caf\xe9\n")
    with pytest.raises(CampaignFileError, match=r"latin1.toml:2: not UTF-8"):
        load_campaign(path)
    with pytest.raises(CampaignFileError, match=r"nope.toml: cannot read"):
        load_campaign(tmp_path / "nope.toml")
    with pytest.raises(CampaignFileError, match=r"nested too deeply|invalid TOML"):
        load_campaign(write(tmp_path, "x = " + "[" * 100_000))
    e = problem(tmp_path, "")
    assert e.message == f"{tmp_path / 'cells.toml'}: `cells`: no cells"
    e = problem(tmp_path, '[cells.A]\nprompt = "a\\u0000b"\n')
    assert "`cells.A.prompt`: must not contain a NUL character" in e.message


def test_inline_tables_and_dotted_keys_are_located(tmp_path: Path) -> None:
    text = '[cells]\nA = { io_lanes = 0 }\nB.cache_mib = -1\n'
    e = problem(tmp_path, text)
    assert e.message.endswith(":2: `cells.A.io_lanes`: must be between 1 and 64 (got 0)")
    e = problem(tmp_path, '[cells]\nB.cache_mib = -1\n')
    assert ":2: `cells.B.cache_mib`" in e.message


# -- sweeps ------------------------------------------------------------------------------


SWEEP = MINIMAL + """
[[sweep]]
cell = "B"
key = "cache_mib"
values = [32, 128.5]

[[sweep]]
cell = "A"
key = "prompt"
values = ["mmap", "a b/c"]
"""


def test_sweeps_generate_cells(tmp_path: Path) -> None:
    spec = load_campaign(write(tmp_path, SWEEP))
    assert list(spec.cells) == ["A", "B", "B.cache_mib-32", "B.cache_mib-128.5",
                                "A.prompt-mmap", "A.prompt-a_b_c"]
    c = spec.cells["B.cache_mib-128.5"]
    assert c.base == "B" and c.sweep == 0
    assert c.config is not None and c.config.cache_mib == 128.5 and c.config.n_tokens == 32
    c = spec.cells["A.prompt-a_b_c"]
    assert c.config is not None and c.config.prompt == "a b/c" and c.sweep == 1
    assert [(s.cell, s.key, s.values) for s in spec.sweeps] == [
        ("B", "cache_mib", (32, 128.5)), ("A", "prompt", ("mmap", "a b/c"))]


def test_sweep_problems(tmp_path: Path) -> None:
    e = problem(tmp_path, SWEEP.replace('key = "cache_mib"', 'key = "cache_mb"'))
    assert "`sweep[0].key`: cannot sweep \"cache_mb\"" in e.message
    assert e.tip == "did you mean `cache_mib`?"
    e = problem(tmp_path, SWEEP.replace('cell = "B"', 'cell = "C"'))
    assert "`sweep[0].cell`: no cell `C`" in e.message
    e = problem(tmp_path, SWEEP.replace("values = [32, 128.5]", "values = []"))
    assert "`sweep[0].values`: must hold at least one value" in e.message
    e = problem(tmp_path, SWEEP.replace("values = [32, 128.5]", "values = [32, true]"))
    assert "`sweep[0].values[1]`: expected a number, got a boolean" in e.message
    e = problem(tmp_path, SWEEP.replace("values = [32, 128.5]", "values = [32, -5]"))
    assert "`sweep[0].values[1]`: must be >= 0 (got -5.0) (resolving cell `B.cache_mib--5`)" \
        in e.message
    e = problem(tmp_path, SWEEP.replace('values = ["mmap", "a b/c"]',
                                        'values = ["mmap", "mmap"]'))
    assert "`sweep[1].values[1]`: generates the cell `A.prompt-mmap`, which exists already" \
        in e.message
    e = problem(tmp_path, SWEEP.replace('values = ["mmap", "a b/c"]', 'values = [[1]]'))
    assert "`sweep[1].values[0]`: expected" in e.message


# -- the resolved TOML -------------------------------------------------------------------


@pytest.mark.parametrize("text", [EXAMPLE, SWEEP, MINIMAL + '[campaign]\norder = "abba"\n',
                                  MINIMAL + "[campaign]\nsentinel_every = 1\nrepeat = 2\n"])
def test_resolved_toml_reads_back_to_the_same_plan(tmp_path: Path, text: str) -> None:
    spec = load_campaign(write(tmp_path, text))
    resolved = resolved_toml(spec)
    (tmp_path / "run").mkdir()
    again = load_campaign(write(tmp_path / "run", resolved, "campaign.toml"))
    assert plan_campaign(again).to_json() == plan_campaign(spec).to_json()
    assert {n: c.to_config() for n, c in again.cells.items()} == \
        {n: c.to_config() for n, c in spec.cells.items()}
    assert again.gate == spec.gate and again.match == spec.match
    assert again.device == spec.device and again.decisions == spec.decisions
    assert resolved_toml(again).split("\n")[2:] == resolved.split("\n")[2:]


def test_resolved_toml_keeps_a_relative_model_absolute(tmp_path: Path,
                                                       tiny_model: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(tiny_model.read_bytes())
    spec = load_campaign(write(tmp_path, '[workload]\nmodel = "m.gguf"\n[cells.A]\n'))
    (tmp_path / "run").mkdir()
    again = load_campaign(write(tmp_path / "run", resolved_toml(spec), "campaign.toml"))
    assert again.cells["A"].config == spec.cells["A"].config


@given(st.text())
def test_toml_strings_round_trip(s: str) -> None:
    assert parse(f"x = {dump_value(s)}")["x"] == s


def test_key_lines() -> None:
    text = ('a = 1\n[t]\nb = """\nc = 2\n"""\nc = 3\n[[arr]]\nk = 1\n[[arr]]\nk = 2\n'
            "[u]\nx.y = { z = 1 }\n'q r'.s = 1\n")
    lines = KeyLines(text)
    assert lines.line(("a",)) == 1 and lines.line(("t", "b")) == 3
    assert lines.line(("t", "c")) == 6  # not the line inside the multi-line string
    assert lines.line(("arr", 0, "k")) == 8 and lines.line(("arr", 1, "k")) == 10
    assert lines.line(("u", "x", "y", "z")) == 12  # inside an inline table: its key's line
    assert lines.line(("u", "q r", "s")) == 13
    assert lines.line(("nowhere",)) is None
    assert format_key(("cells", "B.v2", "cache_mib")) == 'cells."B.v2".cache_mib'
    assert format_key(("decision", 0, "baseline")) == "decision[0].baseline"


# -- fuzzing: only CampaignFileError may escape ------------------------------------------


def _exercise(folder: Path, data: bytes) -> None:
    path = folder / "fuzz.toml"
    path.write_bytes(data)
    try:
        spec = load_campaign(path)
        plan = plan_campaign(spec)
    except CampaignFileError as e:
        assert e.message.startswith(str(path)), e.message
        return
    describe_plan(plan)
    json.dumps(plan.to_json(), allow_nan=False)
    (folder / "again").mkdir(exist_ok=True)
    again = folder / "again" / "campaign.toml"
    again.write_text(resolved_toml(spec), encoding="utf-8")
    assert plan_campaign(load_campaign(again)).to_json() == plan.to_json()


_KEYS = ["name", "spacing_s", "spacng_s", "order", "warmup_tokens", "sentinel_every", "repeat",
         "transport", "sample_hz", "root", "cpu_temp_max_c", "caps_at_max", "probe_min",
         "poll_s", "timeout_s", "max_gap_s", "probe_tol", "engine", "model", "prompt", "tokens",
         "n_tokens", "cache_mib", "io_lanes", "overlap", "drop_cold_experts", "dense",
         "predict_prefetch", "predict_spec_max", "prefetch", "prompt_tokens", "seed", "temp",
         "base", "command", "output", "candidate", "baseline", "min_effect", "cell", "key",
         "values", "threads", "resident"]
_HEADERS = ["[campaign]", "[device]", "[gate]", "[match]", "[workload]", "[cells]",
            "[cells.A]", "[cells.B]", "[cells.C]", '[cells."../x"]', "[cells.A.x]",
            "[[decision]]", "[[sweep]]", "[decision]", "[[cells]]", "[cell.A]", "[sweep]"]
_SCALARS = st.one_of(
    st.sampled_from(['"A"', '"B"', '"C"', '["A", "B", "A"]', '["sh", "x"]', "0.5", "2",
                     '"abba"', '"embedded"', '"external"', '"pinned"', '"mmap"',
                     '"synthetic:tiny"', '"stdout-summary"', '"json:x"', '"local"',
                     '"sim:phone"', '"cache_mib"', '"io_lanes"', '""', "true", "false", "nan",
                     "inf", "-inf", "1979-05-27", "0", "-1", "1e400", "99999999999999999999",
                     '"../x"', '"a\\u0000b"']),
    st.integers(-3, 300).map(str),
    st.floats(-2, 1000, allow_nan=False).map(repr),
)
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=4).map(lambda v: f"[{', '.join(v)}]"),
                    st.lists(_SCALARS, max_size=2).map(
                        lambda v: "{ " + ", ".join(f"k{i} = {x}" for i, x in enumerate(v)) + " }"))
_LINES = st.one_of(st.sampled_from(_HEADERS),
                   st.tuples(st.sampled_from(_KEYS), _VALUES).map(lambda kv: f"{kv[0]} = {kv[1]}"))
_TOMLISH = st.lists(_LINES, max_size=30).map("\n".join)
_TABLE_KEYS = {
    "[campaign]": ["name", "spacing_s", "order", "warmup_tokens", "sentinel_every", "repeat"],
    "[device]": ["transport", "sample_hz", "root"],
    "[gate]": ["cpu_temp_max_c", "caps_at_max", "probe_min", "poll_s", "timeout_s"],
    "[match]": ["probe_tol", "max_gap_s", "foreign_load_tol"],
    "[workload]": ["engine", "model", "tokens", "cache_mib", "io_lanes", "overlap", "timeout_s",
                   "drop_cold_experts", "predict_prefetch", "prefetch", "seed", "temp"],
    "[cells.A]": ["base", "tokens", "cache_mib", "drop_cold_experts", "dense", "command"],
    "[cells.B]": ["base", "predict_prefetch", "predict_spec_max", "prefetch", "output"],
    "[cells.C]": ["base", "engine", "command", "output", "timeout_s", "prompt_tokens"],
    "[[decision]]": ["candidate", "baseline", "min_effect"],
    "[[sweep]]": ["cell", "key", "values"],
}


# Values that fit each key, so that drawn documents get past the type checks and reach
# resolution, ordering and planning.
_FITTING = {
    "name": ['"demo"'], "spacing_s": ["0", "1.5"], "order": ['["A", "B", "A"]', '"abba"'],
    "warmup_tokens": ["0", "4"], "sentinel_every": ["1", "2"], "repeat": ["1", "3"],
    "transport": ['"local"', '"sim:phone"'], "sample_hz": ["2"], "root": ['"/"'],
    "cpu_temp_max_c": ["45.0"], "caps_at_max": ["true"], "probe_min": ["0.97"], "poll_s": ["5"],
    "timeout_s": ["60"], "probe_tol": ["0.03"], "max_gap_s": ["900"],
    "foreign_load_tol": ["0.25", "0"],
    "engine": ['"embedded"', '"external"'], "model": ['"synthetic:tiny"'], "tokens": ["8", "64"],
    "cache_mib": ["0", "64"], "io_lanes": ["1", "4"], "overlap": ["true"],
    "drop_cold_experts": ["0.5"], "predict_prefetch": ["true"], "prefetch": ["0", "2"],
    "seed": ["3"], "temp": ["0.0"], "base": ['"A"', '"B"', '"C"'], "dense": ['"mmap"'],
    "command": ['["sh", "x"]'], "predict_spec_max": ["0", "2"], "prompt_tokens": ["[1, 2]"],
    "output": ['"stdout-summary"', '"json:x.json"'], "candidate": ['"A"', '"B"', '"C"'],
    "baseline": ['"A"', '"B"', '"C"'], "min_effect": ["0.03"], "cell": ['"A"', '"B"'],
    "key": ['"cache_mib"', '"io_lanes"', '"dense"'],
    "values": ["[1, 2]", '["mmap", "pinned"]', "[0.5]"],
}


_CELL_HEADERS = [h for h in _TABLE_KEYS if h.startswith("[cells.")]


@st.composite
def _document(draw: st.DrawFn) -> str:
    """A TOML document shaped like a campaign file: known tables, mostly their own keys,
    mostly fitting values."""
    lines = []
    headers = draw(st.lists(st.sampled_from(list(_TABLE_KEYS)), max_size=8))
    headers.insert(draw(st.integers(0, len(headers))), draw(st.sampled_from(_CELL_HEADERS)))
    rare = draw(st.integers(0, 4)) == 0  # a repeated table, a key from elsewhere
    wild = draw(st.integers(0, 2)) == 0  # values of any type
    for header in headers if rare else dict.fromkeys(headers):
        lines.append(header)
        own = st.sampled_from(_TABLE_KEYS[header])
        keys = draw(st.lists(st.one_of(own, st.sampled_from(_KEYS)) if rare else own,
                             max_size=4, unique=True))
        for k in keys:
            fitting = st.sampled_from(_FITTING.get(k, ["1"]))
            lines.append(f"{k} = {draw(st.one_of(fitting, _VALUES) if wild else fitting)}")
    return "\n".join(lines)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    lines = EXAMPLE.split("\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "swap", "value", "line", "chars", "cut"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "value" and "=" in lines[i]:
            lines[i] = lines[i].split("=", 1)[0] + "= " + draw(_VALUES)
        elif op == "line":
            lines.insert(i, draw(_LINES))
        elif op == "chars":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.text(max_size=3)) + lines[i][at + 1:]
        elif op == "cut":
            lines = lines[:i]
        if not lines:
            lines = [""]
    return "\n".join(lines)


def _fuzz_inputs() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.text(max_size=200).map(lambda s: s.encode("utf-8")),
        st.binary(max_size=64),
        _TOMLISH.map(lambda s: s.encode("utf-8")),
        _document().map(lambda s: s.encode("utf-8")),
        _mutated().map(lambda s: s.encode("utf-8")),
    )


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_fuzz_inputs())
def test_fuzz_only_campaign_file_errors_escape(fuzz_folder: Path, data: bytes) -> None:
    _exercise(fuzz_folder, data)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_fuzz_inputs())
def test_fuzz_only_campaign_file_errors_escape_slow(fuzz_folder: Path, data: bytes) -> None:
    _exercise(fuzz_folder, data)


def test_the_reference_documents_every_key() -> None:
    from dataclasses import fields

    from abbench.campaign.schema import CampaignTable, DeviceTable, GateTable, MatchTable
    from abbench.campaign.tables import CELL_HINTS, WORKLOAD_KEYS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "cells.md").read_text("utf-8")
    keys = [f.name for t in (CampaignTable, DeviceTable, GateTable, MatchTable) for f in fields(t)]
    for key in [*keys, *WORKLOAD_KEYS, *CELL_HINTS, "candidate", "baseline", "min_effect",
                "cell", "key", "values"]:
        assert f"| `{key}` |" in doc, key


def test_tokens_beyond_the_models_context_fail_at_plan_time(tmp_path: Path) -> None:
    text = edit('model = "synthetic:default"', 'model = "synthetic:tiny"')
    text = re.sub(r"\ntokens = \d+", "\ntokens = 1000000000000", text, count=1)
    e = problem(tmp_path, text)
    assert "1000000000000 tokens and a prompt do not fit the model's context (512 tokens" in \
        e.message
    assert f":{line_of(text, 'tokens = 1000000000000')}:" in e.message  # names the line
    assert e.tip == "at most 511 tokens on this model"



def test_an_unknown_synthetic_preset_fails_at_plan_time_naming_the_key(tmp_path: Path) -> None:
    text = edit('model = "synthetic:default"', 'model = "synthetic:0efault"')
    e = problem(tmp_path, text)
    assert e.message.startswith(str(tmp_path / "cells.toml")), e.message
    assert "unknown synthetic preset `0efault`" in e.message
    assert f":{line_of(text, 'synthetic:0efault')}:" in e.message


def test_an_embedded_cell_on_an_adb_device_fails_naming_the_cell(tmp_path: Path) -> None:
    # abbench (Python, numpy, gguf) is not what an Android shell has: an adb cell runs the
    # engine that is there, as an external or llama.cpp cell.
    path = tmp_path / "cells.toml"
    path.write_text('[campaign]\nname = "t"\n[device]\ntransport = "adb:SERIAL1"\n'
                    '[cells.ext]\ncommand = ["sh", "run.sh"]\noutput = "bmoe-csv:out.csv"\n'
                    '[cells.B]\ntokens = 32\n')
    with pytest.raises(CampaignFileError) as e:
        load_campaign(path)
    assert str(e.value).startswith(f"{path}:8: `cells.B`: is an embedded cell: abbench's "
                                   "engine runs on this machine or an ssh: host, not on "
                                   "`adb:SERIAL1`")


def test_an_embedded_cell_on_an_ssh_host_names_a_model_there(tmp_path: Path) -> None:
    """The model of a cell on an ssh host is a file there, not looked for here; a relative
    path has nothing to be relative to; interleaved slices run only on this machine."""
    path = tmp_path / "cells.toml"
    head = ('[campaign]\nname = "t"\n[device]\ntransport = "ssh:lab-box"\n'
            'abbench = ["python3", "-m", "abbench"]\n')
    path.write_text(head + '[cells.B]\nmodel = "/models/not-here.gguf"\ntokens = 32\n')
    spec = load_campaign(path)
    assert spec.cells["B"].config is not None
    assert spec.cells["B"].config.model == "/models/not-here.gguf"
    assert spec.device.abbench_argv == ("python3", "-m", "abbench")
    path.write_text(head + '[cells.B]\nmodel = "models/m.gguf"\n')
    with pytest.raises(CampaignFileError, match=r":7: `cells.B.model`: \"models/m.gguf\" is "
                       "not an absolute path"):
        load_campaign(path)
    path.write_text(head.replace('name = "t"', 'name = "t"\ninterleave = "slices"')
                    + '[cells.B]\nmodel = "synthetic:tiny"\n[cells.C]\nbase = "B"\n'
                    'overlap = true\n')
    with pytest.raises(CampaignFileError, match="`campaign.interleave`: \"slices\" runs two "
                       "engines on this machine"):
        load_campaign(path)


def test_decision_metric_is_checked_and_kept_in_the_plan(tmp_path: Path) -> None:
    text = edit("min_effect = 0.03              # the smallest speed-up worth shipping",
                'min_effect = 0.03\nmetric = "energy"')
    e = problem(tmp_path, text)
    assert "`decision[0].metric`: must be one of `tok_per_s`, `energy_per_token`" in e.message
    assert "energy_per_token" in (e.tip or "")
    path = tmp_path / "ok.toml"
    path.write_text(edit("min_effect = 0.03              # the smallest speed-up worth shipping",
                         'min_effect = 0.03\nmetric = "energy_per_token"'))
    (d,) = load_campaign(path).decisions
    assert d.metric == "energy_per_token" and d.to_json()["metric"] == "energy_per_token"
    assert "metric" not in dataclasses.replace(d, metric="tok_per_s").to_json()


# -- interleave = "slices" (docs/cells.md#interleaved-slices) ------------------------------

PAIRED = """\
[campaign]
interleave = "slices"
{campaign}

[workload]
model = "synthetic:tiny"
tokens = 32

[cells.B]

[cells.C]
io_lanes = 1
{cells}

[[decision]]
candidate = "C"
baseline = "B"
"""


def paired(campaign: str = "", cells: str = "") -> str:
    return PAIRED.format(campaign=campaign, cells=cells)


@pytest.mark.parametrize(("campaign", "cells", "key", "says"), [
    ('interleave = "slice"', "", "campaign.interleave",
     'must be one of `cells`, `slices` (got "slice")'),
    ("slice_tokens = 0", "", "campaign.slice_tokens", "must be between 1 and 1000000 (got 0)"),
    ("sentinel_every = 2", "", "campaign.sentinel_every",
     'cannot be combined with `interleave = "slices"`'),
    ('order = ["B", "C", "B"]', "", "campaign.order",
     'is read as pairs with interleave = "slices", but names 3 cells'),
    ('order = ["B", "C", "C", "C"]', "", "campaign.order[3]", "pairs `C` with itself"),
    ("", '[cells.E]\ncommand = ["sh", "-c", "true"]\noutput = "stdout-summary"', "campaign."
     "interleave", "but cell `E` is an external command, which has no turn protocol"),
    ("", "turn_tokens = 8", "cells.C.turn_tokens", "unknown key"),
    ("", "[cells.D]\ntokens = 24", "campaign.interleave",
     "cells `B` and `D` take turns but decode different `tokens` (32 and 24)"),
    ("", "[[decision]]\ncandidate = \"C\"\nbaseline = \"B\"\nmetric = \"energy_per_token\"",
     "decision[0].metric", "a power reading is the pair's, not one cell's"),
], ids=["value", "slice-tokens", "sentinel-every", "odd-order", "self-pair", "external",
        "set-by-the-campaign", "tokens", "energy"])
def test_interleave_mistakes_name_the_key(tmp_path: Path, campaign: str, cells: str,
                                          key: str, says: str) -> None:
    text = (paired(cells=cells).replace('interleave = "slices"', campaign)
            if campaign.startswith("interleave") else paired(campaign, cells))
    e = problem(tmp_path, text)
    assert f"`{key}`: " in e.message and says in e.message, e.message


def test_slice_tokens_needs_interleave(tmp_path: Path) -> None:
    text = paired("slice_tokens = 8").replace('interleave = "slices"\n', "")
    e = problem(tmp_path, text)
    assert '`campaign.slice_tokens`: applies only to `interleave = "slices"`' in e.message
    assert e.tip == 'add interleave = "slices", or remove it'


def test_a_llama_cpp_cell_cannot_interleave_and_the_error_says_why(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "llama-bench"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    text = paired(cells=f'[cells.L]\nengine = "llama-bench"\nllama_cpp_bin = "{folder}"')
    e = problem(tmp_path, text)
    assert f"cells.toml:{line_of(text, 'interleave = ')}: `campaign.interleave`: " in e.message
    assert ("cell `L` is a llama-bench cell: llama.cpp's command-line tools cannot pause "
            "between tokens (a llama.cpp server could, between requests: not built)"
            in e.message)
    assert e.tip is not None and 'interleave = "cells"' in e.tip
    # ... in a pair only: an explicit order without it interleaves the others
    plan = plan_campaign(load_campaign(write(tmp_path, text.replace(
        'interleave = "slices"', 'interleave = "slices"\norder = ["B", "C"]'))))
    assert [c.name for c in plan.cells] == ["B", "C"]


def test_an_interleaved_campaign_reads_back_from_its_resolved_toml(tmp_path: Path) -> None:
    spec = load_campaign(write(tmp_path, paired("slice_tokens = 8")))
    again = load_campaign(write(tmp_path, resolved_toml(spec), "again.toml"))
    assert plan_campaign(again) == plan_campaign(spec)
    assert "interleave = \"slices\"" in resolved_toml(spec)
    # a campaign that does not interleave writes nothing of it: its file is as before
    plain = load_campaign(write(tmp_path, paired().replace('interleave = "slices"\n', "")))
    assert "\ninterleave = " not in resolved_toml(plain)


@pytest.mark.parametrize(("device", "says"), [
    ('transport = "local"\nprepare = [["sync"]]',
     '`device.prepare`: applies to adb:/ssh: devices (this one is "local")'),
    ('transport = "ssh:lab"\nprepare = [[]]', "`device.prepare[0]`: is empty"),
    ('transport = "ssh:lab"\npull = ["../up.txt"]',
     '`device.pull[0]`: "../up.txt" is not a file pattern in the cell\'s folder'),
    ('transport = "ssh:lab"\npull = ["a b.log"]', '`device.pull[0]`: "a b.log" is not'),
    ('transport = "adb:X"\ncleanup = [["rm", ""], []]', "`device.cleanup[1]`: is empty"),
    ('transport = "ssh:lab"\nabbench = []', "`device.abbench`: must name a command"),
    ('transport = "ssh:lab"\nremote_dir = "tmp/x"', '`device.remote_dir`: "tmp/x" is not an '
     "absolute path"),
])
def test_the_per_cell_commands_and_pulls_of_a_device_are_checked(tmp_path: Path, device: str,
                                                                  says: str) -> None:
    path = tmp_path / "cells.toml"
    path.write_text(f'[campaign]\nname = "t"\n[device]\n{device}\n'
                    '[cells.ext]\ncommand = ["true"]\n')
    with pytest.raises(CampaignFileError) as e:
        load_campaign(path)
    assert says in str(e.value)


def test_a_devices_commands_and_pulls_reach_the_plan(tmp_path: Path) -> None:
    from abbench.campaign.plan import plan_campaign

    path = tmp_path / "cells.toml"
    path.write_text('[campaign]\nname = "t"\n[device]\ntransport = "adb:X"\n'
                    'prepare = [["am", "force-stop", "com.example"], ["sync"]]\n'
                    'pull = ["*.metrics"]\n[cells.ext]\ncommand = ["true"]\n')
    remote = plan_campaign(load_campaign(path)).remote
    assert remote is not None and remote.folder == "/data/local/tmp/abbench-cells"
    assert remote.prepare == (("am", "force-stop", "com.example"), ("sync",))
    assert remote.pull == ("*.metrics",)
