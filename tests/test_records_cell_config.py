"""records/cell_config.py: a planned cell's configuration as the kind of cell it is, read
from plan.json as written (old run folders included) and written back to the same bytes,
its identity (`key`) what sentinel histories hold, each problem a ConfigError naming its
key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from abbench.campaign.run_folder import write_plan
from abbench.errors import ConfigError, RecordError
from abbench.records import read_plan
from abbench.records.cell_config import (
    EmbeddedConfig,
    ExternalConfig,
    ImportedConfig,
    LlamaConfig,
    cell_config,
    config_key,
)

RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
KINDS = {"embedded-sim": EmbeddedConfig, "external": ExternalConfig,
         "imported-headerless": ImportedConfig, "imported-pr23": ImportedConfig,
         "synthetic": EmbeddedConfig}  # a plan tests write: no `engine`, read as embedded

# A llama-bench cell as plans before the kinds held it (`CellSpec.to_config`'s order).
LLAMA = {"engine": "llama-bench", "model": "/m/q.gguf", "tokens": 16, "prompt": "hi",
         "seed": 0, "repetitions": 3, "llama_cpp_bin": None, "llama": {"t": 1, "fa": True},
         "timeout_s": 600.0}


@pytest.mark.parametrize("run", sorted(KINDS))
def test_every_fixture_plan_reads_as_its_kind_and_writes_its_cells_back(run: str) -> None:
    text = (RUNS / run / "plan.json").read_text(encoding="utf-8")
    plan = read_plan(RUNS / run)
    old = json.loads(text)["cells"]
    assert {type(c.config) for c in plan.cells} == {KINDS[run]}
    assert json.dumps([c.to_json() for c in plan.cells]) == json.dumps(old)
    # The identity sentinel histories hold is what it was.
    assert [c.config.key for c in plan.cells] == [config_key(c["config"]) for c in old]


@pytest.mark.parametrize("run", ["embedded-sim", "external"])
def test_a_plan_from_before_the_kinds_is_rewritten_byte_for_byte(run: str,
                                                                  tmp_path: Path) -> None:
    before = (RUNS / run / "plan.json").read_bytes()
    write_plan(tmp_path, read_plan(RUNS / run))
    assert (tmp_path / "plan.json").read_bytes() == before


def test_each_kind_reads_what_the_code_uses() -> None:
    plan = read_plan(RUNS / "embedded-sim")
    embedded = plan.cells[0].config
    assert isinstance(embedded, EmbeddedConfig)
    assert (embedded.engine, embedded.model, embedded.prompt, embedded.n_tokens,
            embedded.prompt_tokens, embedded.timeout_s) == (
        "embedded", "/tmp/tmp64v_e5jl/tiny.gguf", "hello", 24, None, 900.0)
    external = read_plan(RUNS / "external").cells[1].config
    assert isinstance(external, ExternalConfig) and external.output == "stdout-summary"
    assert external.command[1:2] == ("-c",)
    llama = cell_config(LLAMA)
    assert isinstance(llama, LlamaConfig)
    assert (llama.tool, llama.model, llama.tokens, llama.repetitions, llama.bin_dir,
            llama.options, llama.timeout_s) == (
        "llama-bench", "/m/q.gguf", 16, 3, None, (("t", 1), ("fa", True)), 600.0)
    assert llama.to_json() == LLAMA and list(llama.to_json()) == list(LLAMA)
    imported = read_plan(RUNS / "imported-pr23").cells[0].config
    assert isinstance(imported, ImportedConfig) and imported.model == "gemma"
    assert cell_config({}).model is None  # a plan tests write may name no model


def test_a_kind_is_frozen_and_its_json_a_copy() -> None:
    llama = cell_config(LLAMA)
    with pytest.raises(dataclasses.FrozenInstanceError):
        llama.tokens = 3  # type: ignore[misc]
    llama.to_json()["llama"]["t"] = 99
    assert llama.resolved["llama"]["t"] == 1


@pytest.mark.parametrize(("config", "field", "problem"), [
    ({"engine": "warp"}, "engine", 'is "warp", expected one of embedded, llama-bench'),
    ({"engine": 3}, "engine", "is 3, expected one of"),
    ({"model": 3}, "model", "expected a string, got an integer (3)"),
    ({"prompt_tokens": ["a"]}, "prompt_tokens[0]", "expected an integer"),
    ({"timeout_s": 0}, "timeout_s", "must be > 0 (got 0.0)"),
    ({**LLAMA, "tokens": "16"}, "tokens", "expected an integer, got a string"),
    ({**LLAMA, "llama": {"t": [1]}}, "llama.t", "expected a string or an integer"),
    ({k: v for k, v in LLAMA.items() if k != "seed"}, "seed", "is missing"),
    ({"engine": "external", "command": [], "output": "stdout-summary"}, "command",
     "must be a non-empty array of strings"),
    ({"engine": "external", "command": ["sh"], "output": "csv:x"}, "output",
     '"csv:x" is not an output'),
    ({"engine": "imported", "model": ["m"]}, "model", "expected a string, got an array"),
])
def test_a_configuration_that_is_not_its_kind_is_a_config_error(
        config: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        cell_config(config)
    assert e.value.field == field and e.value.problem[0].startswith(problem)
    assert e.value.message.startswith(f"cell configuration `{field}`: {problem}")


def test_a_kind_refuses_another_kinds_engine() -> None:
    with pytest.raises(ConfigError, match="`engine`: is \"external\", not one of embedded"):
        EmbeddedConfig({"engine": "external"})
    with pytest.raises(ConfigError, match="`engine`: is missing"):
        LlamaConfig({k: v for k, v in LLAMA.items() if k != "engine"})


def test_a_plan_with_a_bad_configuration_names_the_key(tmp_path: Path) -> None:
    doc = json.loads((RUNS / "external" / "plan.json").read_text(encoding="utf-8"))
    doc["cells"][1]["config"]["command"] = ["", "x"]
    (tmp_path / "plan.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(RecordError) as e:
        read_plan(tmp_path)
    assert "malformed plan: `cells[1].config.command`: must be a non-empty array" \
        in str(e.value)
