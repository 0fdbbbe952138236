"""`EngineConfig`: validated on construction, every error naming the flag; and the command
line reports the same errors as `ERROR:` lines with exit status 2."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_main

from abbench.cli import build_parser
from abbench.engine.config import EngineConfig, default_threads
from abbench.errors import ConfigError

# (field overrides, the flag the message must name)
BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"n_tokens": 0}, "--n-tokens"),
    ({"n_tokens": -5}, "--n-tokens"),
    ({"cache_mib": -1}, "--cache-mib"),
    ({"cache_mib": math.nan}, "--cache-mib"),
    ({"io_lanes": 0}, "--io-lanes"),
    ({"io_lanes": 65}, "--io-lanes"),
    ({"dense": "foo"}, "--dense"),
    ({"temp": -1.0}, "--temp"),
    ({"repeat_penalty": 0.0}, "--repeat-penalty"),
    ({"repeat_penalty": math.nan}, "--repeat-penalty"),
    ({"repeat_last_n": -1}, "--repeat-last-n"),
    ({"threads": -1}, "--threads"),
    ({"threads": 257}, "--threads"),
    ({"n_ctx": 1}, "--n-ctx"),
    ({"n_expert_used": 0}, "--n-expert-used"),
    ({"prompt_tokens": ()}, "--prompt-tokens"),
    ({"prompt": ""}, "--prompt"),
]


@pytest.mark.parametrize(("overrides", "flag"), BAD_VALUES,
                         ids=[f"{k}={v}" for o, _ in BAD_VALUES for k, v in o.items()])
def test_out_of_range_value_names_the_flag(overrides: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError) as e:
        EngineConfig(model="m.gguf", **overrides)
    assert f"`{flag}`" in e.value.message
    value = next(iter(overrides.values()))
    if value not in ("", ()):
        assert str(value) in e.value.message  # and says what it got
    assert e.value.exit_status == 2


@pytest.mark.parametrize("edge", [
    {"n_tokens": 1}, {"cache_mib": 0}, {"io_lanes": 1}, {"io_lanes": 64}, {"temp": 0.0},
    {"repeat_penalty": 1.0}, {"repeat_penalty": 100.0}, {"repeat_last_n": 0},
    {"threads": 0}, {"threads": 256}, {"n_ctx": 2}, {"dense": "mmap"},
    {"prompt": "", "prompt_tokens": (1,)},
])
def test_edge_values_are_accepted(edge: dict[str, Any]) -> None:
    cfg = EngineConfig(model="m.gguf", **edge)
    for k, v in edge.items():
        assert getattr(cfg, k) == v


def test_config_is_frozen() -> None:
    cfg = EngineConfig(model="m.gguf")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_tokens = 5  # type: ignore[misc]


def test_to_dict_is_json_and_resolves_threads() -> None:
    d = EngineConfig(model="m.gguf", prompt_tokens=(1, 2, 3)).to_dict()
    assert d["prompt_tokens"] == [1, 2, 3]
    assert d["threads"] == default_threads() >= 1
    assert json.loads(json.dumps(d)) == d
    assert EngineConfig(model="m.gguf", threads=3).to_dict()["threads"] == 3


def test_every_config_field_is_an_engine_run_flag() -> None:
    """Field names are the flags' names: campaigns and error messages rely on it."""
    args = build_parser().parse_args(["engine", "run", "-m", "m.gguf"])
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert fields <= set(vars(args)), fields - set(vars(args))
    from abbench.commands.engine import config_from_args

    assert config_from_args(args) == EngineConfig(model="m.gguf")  # the same defaults


# -- through the command line ----------------------------------------------------------

CLI_BAD: list[tuple[list[str], str]] = [
    (["-n", "0"], "--n-tokens"),
    (["--cache-mib", "-1"], "--cache-mib"),
    (["--io-lanes", "0"], "--io-lanes"),
    (["--temp", "-1"], "--temp"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--repeat-last-n", "-3"], "--repeat-last-n"),
    (["--dense", "foo"], "--dense"),  # argparse's choices
    (["--threads", "300"], "--threads"),
    (["-n", "two"], "--n-tokens"),  # argparse's type
]


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("flags", "flag"), CLI_BAD, ids=[" ".join(f) for f, _ in CLI_BAD])
def test_cli_bad_value_exits_2_naming_the_flag(
    flags: list[str], flag: str, tiny_model: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run_main(["engine", "run", "-m", str(tiny_model), *flags], capsys)
    assert rc == 2
    assert out == ""
    assert "Traceback" not in err
    assert flag in error_line(err)


def test_cli_bad_value_in_a_real_process(tiny_model: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "abbench", "engine", "run", "-m", str(tiny_model), "-n", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stdout + p.stderr
    assert p.stderr.splitlines() == [error_line(p.stderr)]
    assert "`--n-tokens`" in p.stderr


@pytest.mark.parametrize(("flags", "needle"), [
    (["--n-expert-used", "9"], "--n-expert-used"),  # tiny has 8 experts
    (["--prompt-tokens", "1,259"], "--prompt-tokens"),  # tiny's vocabulary is 0..258
    (["-n", "600"], "context"),  # tiny's context is 512
    (["--n-ctx", "10"], "context"),  # the prompt alone is longer
])
def test_cli_value_invalid_for_the_model(
    flags: list[str], needle: str, tiny_model: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run_main(["engine", "run", "-m", str(tiny_model), "-q", *flags], capsys)
    assert rc == 2, err
    assert needle in error_line(err)


@pytest.mark.parametrize("values", [
    {"model": "m.gguf"},
    {"model": "m.gguf", "n_tokens": 7, "temp": 0.0, "seed": 3, "prompt": "-starts with a dash",
     "dense": "mmap", "cache_mib": 12.5, "overlap": True, "o_direct": False, "threads": 2},
    {"model": "m.gguf", "drop_cold_experts": 0.75, "drop_in_prefill": True,
     "drop_no_renorm": True, "prompt_tokens": (1, 2, 3), "predict_prefetch": True,
     "predict_spec_max": 0, "prefetch_sync": True, "predict_log": True, "ignore_eos": True},
    {"model": "m.gguf", "prefetch": 2, "repeat_penalty": 1.3, "repeat_last_n": 8,
     "n_expert_used": 1, "n_ctx": 99, "io_lanes": 2, "resident": True},
])
def test_the_one_declaration_round_trips_through_the_command_line(values: dict[str, Any]
                                                                  ) -> None:
    """to_argv and the parser are both made from EngineConfig's fields: what a campaign
    passes its cell is the configuration the cell's engine runs."""
    import argparse

    from abbench.engine.config import EngineConfig, add_options, from_args, to_argv

    parser = argparse.ArgumentParser()
    add_options(parser)
    assert from_args(parser.parse_args(to_argv(values))) == EngineConfig(**values)


def test_every_option_has_help_and_a_group() -> None:
    from abbench.engine.config import EngineConfig

    for f in dataclasses.fields(EngineConfig):
        assert f.metadata["help"] and f.metadata["group"], f.name


def test_a_config_error_carries_its_setting_as_data() -> None:
    """A front end names settings its own way from the error's data, never by parsing the
    command line's message (a campaign file says `cache_mib`, the engine `--cache-mib`)."""
    from abbench.errors import Setting, render

    with pytest.raises(ConfigError) as e:
        EngineConfig(model="synthetic:tiny", cache_mib=0, drop_cold_experts=0.5)
    assert e.value.field == "drop_cold_experts"
    assert e.value.message == "`--drop-cold-experts` needs the expert cache (`--cache-mib` > 0)"
    assert e.value.problem == ("needs the expert cache (", Setting("cache_mib"), " > 0)")
    assert render(e.value.problem, str.upper) == "needs the expert cache (CACHE_MIB > 0)"
