"""Each run's configuration identity, the arms it groups the runs into, and the decisions
between arms that `--decision` names.

A run's configuration is every option its files record (the CSV preamble; the engine
log's command line, banner lines and loader lines, `enginelog`, where a logged override
beats the model's default; the model, at worst, from the file name's first word, marked
derived). Runs with equal configurations are one arm, named after the first of them, and
two runs that differ in any recorded option are two arms whatever their names. Where a
file gives only part of a configuration (no preamble, no command line), the run is its own
arm, so that two runs are never taken for repeats on too little evidence. A decision whose
arms differ in more than the keys it names carries those keys as its `confounds`.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable
from typing import Any

from abbench.errors import UsageError
from abbench.importers.discover import Run
from abbench.importers.order import resolve_run, run_names
from abbench.records import DecisionSpec, Fact
from abbench.records.bmoe_csv import CACHE_BUDGET as CACHE_MB
from abbench.records.provenance import FACT_CONFIG, FROM_FILE_NAME
from abbench.records.text import clip

# Preamble keys that say how a run was measured, not what it ran: not identity.
NOT_IDENTITY = frozenset({"n_ctx", "turn", "seed"})
# Keys the seed engine's writer zeroes unless the feature that owns them is on (the RunInfo
# it fills, core/src/engine/session.cpp): each with its feature and the feature's values
# that keep it. They say nothing of a run whose feature is off, so they leave its
# configuration, and between arms that differ in the feature they are not a second
# difference.
STREAMING = ("moe_stream", frozenset({"1"}))
DEPENDENT: dict[str, tuple[str, frozenset[str]]] = {
    "spec_draft_max": ("spec", frozenset({"mtp", "ngram"})),
    "mtp_p_min": ("spec", frozenset({"mtp"})),
    "ngram_min_match": ("spec", frozenset({"ngram"})),
    **{key: STREAMING for key in (
        "io_threads", "predict_spec_max", "prefetch", "route_ahead", "drop_cold_frac",
        "load_all", "o_direct", "overlap", "io_two_wave", "predict_prefetch", "predict_log",
        "prefetch_sync", "cache_mb")},
}
# `cache_auto=1`: the engine sized the cache itself, and `cache_mb` is what it settled on
# — a number no flag asked for, which moves with the free memory it found.
AUTO = "auto"
SELECTOR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# The key that makes a partial configuration its own arm: the run's name, not an option.
OWN_ARM = "run"

# A run's configuration, where each key came from, and whether it is the whole of it.
Identity = tuple[dict[str, Any], dict[str, Fact], bool]


def configuration(run: Run) -> Identity:
    """The run's configuration as its files give it, where each key came from, and
    whether that is the whole configuration (a preamble or a command line)."""
    config: dict[str, Any] = {}
    facts: dict[str, Fact] = {}
    pre = run.table.preamble if run.table is not None else {}
    tf = run.table_file.name if run.table_file else ""
    for k, v in pre.items():
        if k not in NOT_IDENTITY:
            config[k] = v
            facts[f"config.{k}"] = Fact("measured", f"{tf} preamble")
    overrides = []
    for k, v in run.log_config.items():
        if k not in config and k not in NOT_IDENTITY:
            config[k] = str(v)
            where = run.log_lines.get(k, "")
            if k in run.log_defaults:  # measured beats default: the run's value, not the model's
                default, line = run.log_defaults[k]
                where += f", overriding the model's default {k}={default} ({line})"
                overrides.append(f"{k}={v} ({where})")
            facts[f"config.{k}"] = Fact("measured", where)
    _normalized(config, facts)
    if "model" in config:
        config["model"] = str(config["model"]).replace("\\", "/").rsplit("/", 1)[-1]
    else:
        word = re.match(r"[A-Za-z]+", run.name)
        config["model"] = word[0].lower() if word else run.name
        facts["config.model"] = Fact("derived", f"{FROM_FILE_NAME}'s first word (no file "
                                     "names the model)")
    told = run.script or (f"{run.log_file.name} command line" if run.log_file else "")
    whole = [w for w, given in ((f"{tf} preamble", pre), (told, run.log_command)) if given]
    facts[FACT_CONFIG] = _whole(whole, overrides)
    return config, facts, bool(whole)


def _normalized(config: dict[str, Any], facts: dict[str, Fact]) -> None:
    """The configuration as it identifies what ran: a feature's zeroed keys out where it
    is not on (`DEPENDENT`), an auto-sized cache as `cache_mb=auto`."""
    for key, (feature, keeps) in DEPENDENT.items():
        if key in config and feature in config and str(config[feature]) not in keeps:
            del config[key]
            facts.pop(f"config.{key}", None)
    if str(config.get("cache_auto")) == "1" and config.get(CACHE_MB) not in (None, AUTO):
        sized = config[CACHE_MB]
        config[CACHE_MB] = AUTO
        facts[f"config.{CACHE_MB}"] = Fact("derived", f"cache_auto=1: the engine sized the "
                                          f"cache itself (to {sized} MiB), and runs group "
                                          "by that setting, not the budget it found")


def _whole(whole: list[str], overrides: list[str]) -> Fact:
    """Where the configuration as a whole comes from, and the model parameters the run
    overrode (shown, so that the model's value is never read as what ran)."""
    over = "; " + "; ".join(overrides) if overrides else ""
    if whole:
        return Fact("measured", f"whole: {' and '.join(whole)}{over}")
    return Fact("derived", f"partial (no preamble, no command line): its own arm{over}")


def group_arms(names: list[str], identities: dict[str, Identity]
               ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Each run's arm, and each arm's configuration: runs with equal whole configurations
    share the arm of the first of them (in `names`' order); a partial one is its own."""
    arm_of: dict[str, str] = {}
    arms: dict[str, dict[str, Any]] = {}
    first: dict[str, str] = {}  # a configuration's canonical text -> its arm
    for n in names:
        cfg, _, complete = identities[n]
        key = cfg if complete else {**cfg, OWN_ARM: n}
        arm = first.setdefault(json.dumps(key, sort_keys=True, default=str), n)
        if arm == n:
            arms[arm] = key
        arm_of[n] = arm
    return arm_of, arms


def decision_specs(decisions: Iterable[tuple[str, str, float]],
                   arms: dict[str, dict[str, Any]], arm_of: dict[str, str]
                   ) -> list[DecisionSpec]:
    """`--decision CANDIDATE:BASELINE:MIN_EFFECT`s as the plan's decisions, each side
    resolved to an arm (`find_arm`)."""
    specs = []
    for cand, base, effect in decisions:
        c = find_arm(cand, arms, arm_of, "--decision")
        b = find_arm(base, arms, arm_of, "--decision")
        if c == b:
            raise UsageError(f"--decision: `{clip(c)}` against itself")
        if not effect >= 0:
            raise UsageError(f"--decision: min_effect {effect} is not >= 0")
        named = {k for side in (cand, base) for k in selected_keys(side)}
        specs.append(DecisionSpec(c, b, effect, confounds=confounds(arms[c], arms[b], named)))
    return specs


def selected_keys(item: str) -> list[str]:
    """The configuration keys a `--decision` side names (`key=value[,key=value]`); none
    for an arm named by its name, a run's or a glob."""
    if not SELECTOR.match(item):
        return []
    return [kv.split("=", 1)[0] for kv in item.split(",") if "=" in kv]


def confounds(cand: dict[str, Any], base: dict[str, Any], named: set[str]
              ) -> tuple[str, ...]:
    """The keys that set two arms apart besides those a decision names: with keys named,
    every other key that differs; with none named, every key that differs where more than
    one does (one key apart is what the decision asks about). A key one arm's files do not
    record differs from any value."""
    differ = [k for k in sorted(set(cand) | set(base))
              if k != OWN_ARM and (k in cand, str(cand.get(k))) != (k in base, str(base.get(k)))]
    implied = {k for k, (f, _) in DEPENDENT.items() if f in differ}  # set by the feature
    differ = [k for k in differ if k not in implied]
    if not named and len(differ) <= 1:
        return ()
    return tuple(k for k in differ if k not in named)


def find_arm(item: str, arms: dict[str, dict[str, Any]], stems: dict[str, str],
             what: str) -> str:
    """An arm named by its name, a run's file stem (or a unique word of one), a glob over
    file stems, or `key=value[,key=value]` over the arms' configurations."""
    if item in arms:
        return item
    if SELECTOR.match(item):
        want = dict(kv.split("=", 1) for kv in item.split(",") if "=" in kv)
        hits = [a for a, cfg in arms.items()
                if all(_selects(cfg, k, v) for k, v in want.items())]
    elif any(c in item for c in "*?["):
        hits = sorted({stems[s] for s in stems if fnmatch.fnmatchcase(s, item)})
    else:
        try:
            hits = [stems[resolve_run(item, sorted(stems), what)]]
        except UsageError:
            hits = []
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UsageError(f"{what}: `{clip(item)}` names no arm (arms: "
                         f"{run_names(list(arms))})",
                         tip="an arm's name, a run's file name, a glob (`qwen_*`) or "
                         "key=value of its configuration")
    raise UsageError(f"{what}: `{clip(item)}` names several arms: {run_names(hits)}",
                     tip="add a key=value, or name the arm")


def _selects(cfg: dict[str, Any], key: str, value: str) -> bool:
    """Whether `key=value` names this configuration; `key=0` also names a whole one that
    does not record `key`: a switch its command line did not give is off."""
    if key in cfg:
        return str(cfg[key]) == value
    return value == "0" and OWN_ARM not in cfg


__all__ = ["Identity", "configuration", "confounds", "decision_specs", "find_arm", "group_arms"]
