"""Campaigns that can measure nothing (issue 33, classes 4, 7 and 9's sweep): what the
model refuses is found before the first cell, a sweep past the cell cap before any cell is
built, a model of NaN weights is no measurement, and a campaign left with no valid cell
exits 5 (`EXIT_NO_MEASUREMENT`), never 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main
from runs_helper import cell, make_run

from abbench.campaign.schema import load_campaign
from abbench.campaign.tables import MAX_CELLS
from abbench.engine import synth
from abbench.engine.gguf import model_file as gguf_file
from abbench.engine.gguf.model_file import ModelFile
from abbench.errors import EXIT_NO_MEASUREMENT, CampaignFileError
from abbench.records import read_journal
from abbench.report import write_reports


def one_error(err: str, progress: bool = False) -> str:
    """The one `ERROR:` line (only `WARNING:` lines before it, or a campaign's progress
    lines where `progress`; at most a `TIP:` after)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("ERROR:")]
    assert len(at) == 1, err
    before = ("WARNING:", "[") if progress else ("WARNING:",)
    assert all(line.startswith(before) for line in lines[:at[0]]), err
    assert all(line.startswith("TIP: ") for line in lines[at[0] + 1:]) and \
        len(lines) - at[0] <= 2, err
    return lines[at[0]]


def campaign_file(folder: Path, model: Path | str, body: str, head: str = "") -> Path:
    path = folder / "cells.toml"
    path.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "h"
        spacing_s = 0
        warmup_tokens = 1
        {head}

        [workload]
        model = "{model}"
        tokens = 4
        cache_mib = 0.2
        timeout_s = 120
        """) + textwrap.dedent(body))
    return path


def poisoned(source: Path, to: Path, tensor: str, values: int | None = None) -> Path:
    """A copy of an F32 model with the first `values` (all) floats of `tensor` NaN."""
    info = ModelFile(source).tensors[tensor]
    data = bytearray(source.read_bytes())
    n = info.nbytes // 4 if values is None else values
    data[info.offset:info.offset + 4 * n] = np.full(n, np.nan, np.float32).tobytes()
    to.write_bytes(bytes(data))
    return to


# -- class 4: what the model refuses, found before the first cell ---------------------------


REFUSED = {
    # name: (cell body, what the one ERROR line says after `cells.toml:LINE: `)
    "prompt-id": ("[cells.A]\nprompt_tokens = [1, 999999999]\n",
                  "`cells.A.prompt_tokens`: ids [999999999] outside the model's vocabulary "
                  "(0..258: "),
    "context": ("[cells.A]\nn_ctx = 4000000000\n",
                "`cells.A.n_ctx`: 4000000000 is more than the model's context (512 tokens: "),
    "context-short": ("[cells.A]\nprompt_tokens = [1, 2, 3]\nn_ctx = 5\n",
                      "`cells.A.n_ctx`: 5 does not hold `tokens` (4) and the prompt's 3 tokens"),
    "top-k": ("[cells.A]\nn_expert_used = 99\n",
              "`cells.A.n_expert_used`: 99 is more than the model's 8 experts ("),
    "top-k-in-a-sweep": ("[cells.A]\n[[sweep]]\ncell = \"A\"\nkey = \"n_expert_used\"\n"
                         "values = [2, 64]\n",
                         "`sweep[0].values[1]`: 64 is more than the model's 8 experts ("),
    "unreadable-model": ("[cells.A]\n[cells.B]\nmodel = \"{d}/truncated.gguf\"\n",
                         "`cells.B.model`: {d}/truncated.gguf: "),
}


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("body,expect", REFUSED.values(), ids=REFUSED.keys())
def test_what_the_model_refuses_fails_the_campaign_file_before_any_cell(
        body: str, expect: str, dry: bool, tmp_path: Path, tiny_model: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "truncated.gguf").write_bytes(tiny_model.read_bytes()[:5000])
    path = campaign_file(tmp_path, tiny_model, body.format(d=tmp_path))
    rc, _, err = run_main(["campaign", str(path), *(["--dry-run"] if dry else []),
                           "--out", str(tmp_path / "out"),
                           "--sentinels", str(tmp_path / "sentinels")], capsys)
    line = one_error(err)
    assert rc == 2, err
    assert line.startswith(f"ERROR: {path}:"), line
    assert expect.format(d=tmp_path) in line, line
    assert not (tmp_path / "out").exists()  # no run folder: nothing ran


def test_a_workload_value_the_model_refuses_names_the_key_and_the_cell(
        tmp_path: Path, tiny_model: Path) -> None:
    path = campaign_file(tmp_path, tiny_model, "[cells.A]\n").read_text()
    path = path.replace("tokens = 4\n", "tokens = 4\nn_expert_used = 9\n")
    (tmp_path / "cells.toml").write_text(path)
    with pytest.raises(CampaignFileError) as e:
        load_campaign(tmp_path / "cells.toml")
    assert ":10: `workload.n_expert_used`: 9 is more than the model's 8 experts" in \
        e.value.message
    assert e.value.message.endswith("(resolving cell `A`)")


def test_a_context_no_memory_holds_fails_the_campaign_file(tmp_path: Path) -> None:
    model = tmp_path / "long.gguf"  # a header that claims 2^31 positions of context
    synth.write_model(replace(synth.preset("tiny"), context_length=2**31), model)
    path = campaign_file(tmp_path, model, "[cells.A]\nn_ctx = 2000000000\n")
    with pytest.raises(CampaignFileError) as e:
        load_campaign(path)
    assert ":13: `cells.A.n_ctx`: " in e.value.message  # 2e9 positions: about 2 TiB
    assert "GiB" in e.value.message and "memory" in e.value.message


# -- class 9: a sweep's size, and one header read per model ---------------------------------


@pytest.mark.parametrize("declared,values,repeat", [(1, MAX_CELLS, 1), (2, 5001, 2)],
                         ids=["values", "repeat"])
def test_a_sweep_past_the_cell_cap_fails_naming_it_before_any_cell_is_built(
        declared: int, values: int, repeat: int, tmp_path: Path) -> None:
    cells = "".join(f"[cells.C{i}]\n" for i in range(declared))
    sweep = (f'[[sweep]]\ncell = "C0"\nkey = "cache_mib"\n'
             f"values = [{', '.join(map(str, range(values)))}]\n")
    path = campaign_file(tmp_path, "synthetic:tiny", cells + sweep, head=f"repeat = {repeat}")
    with pytest.raises(CampaignFileError) as e:
        load_campaign(path)
    total = declared + values
    times = f", run {repeat} times (`repeat`)" if repeat > 1 else ""
    assert e.value.message.endswith(
        f"`sweep[0].values`: {values} values make the campaign {total} cells{times}: more "
        f"than the {MAX_CELLS} a campaign may run"), e.value.message


@pytest.mark.parametrize("repeat", [None, 2])
def test_too_many_cells_names_the_key_the_file_has(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repeat: int | None) -> None:
    """Issue 42, class 5. Before: a file of 10,001 cells and no `repeat` key was told
    "`campaign.repeat`: the plan would run 10001 cells ... lower `repeat`"."""
    declared = MAX_CELLS + 1 if repeat is None else MAX_CELLS // 2 + 1
    cells = "".join(f"[cells.C{i}]\n" for i in range(declared))
    head = "" if repeat is None else f"repeat = {repeat}"
    path = campaign_file(tmp_path, "synthetic:tiny", cells, head=head)
    rc, _, err = run_main(["campaign", str(path), "--dry-run"], capsys)
    line = one_error(err)
    assert rc == 2
    if repeat is None:
        assert f"`cells`: the file declares {declared} cells: more than the {MAX_CELLS}" in line
        assert "repeat" not in err and "split the campaign" in err
        first_past = path.read_text().splitlines().index(f"[cells.C{MAX_CELLS}]") + 1
        assert f"cells.toml:{first_past}: " in line  # the line of the first cell past it
    else:
        assert f"`campaign.repeat`: is 2: the file's {declared} cells, run 2 times, are " \
            f"{2 * declared}" in line and "lower `repeat`" in err


def test_each_model_header_is_read_once_per_campaign_file(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = gguf_file.ModelFile.__init__

    def counting(self: ModelFile, path: str | Path) -> None:
        opened.append(str(path))
        real(self, path)

    monkeypatch.setattr(gguf_file.ModelFile, "__init__", counting)
    path = campaign_file(tmp_path, tiny_model, '[cells.A]\n[[sweep]]\ncell = "A"\n'
                         'key = "cache_mib"\nvalues = [' + ", ".join(map(str, range(1, 41)))
                         + "]\n")
    spec = load_campaign(path)
    assert len(spec.cells) == 41
    assert opened == [str(tiny_model)]


# -- class 7: NaN weights are no measurement -----------------------------------------------


@pytest.mark.parametrize("tensor,expect", [
    ("blk.1.ffn_down_exps.weight", "non-finite logits (NaN or inf) at decode step 1"),
    ("output_norm.weight", "tensor `output_norm.weight` holds NaN or inf"),
], ids=["expert", "norm"])
def test_nan_weights_fail_the_engine_run_with_one_error(
        tensor: str, expect: str, tmp_path: Path, tiny_model: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = poisoned(tiny_model, tmp_path / "nan.gguf", tensor)
    rc, _, err = run_main(["engine", "run", "-m", str(model), "-n", "4", "--json",
                           str(tmp_path / "out.json"), "--csv", str(tmp_path / "out.csv")],
                          capsys)
    line = one_error(err)
    assert rc == 2, err
    assert line.startswith(f"ERROR: {model}: ") and expect in line, line
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.csv").exists()


def test_a_nan_cell_is_failed_with_its_reason_and_the_campaign_exits_5(
        tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = poisoned(tiny_model, tmp_path / "nan.gguf", "blk.1.ffn_down_exps.weight", 4)
    path = campaign_file(tmp_path, tiny_model, f"""
        [cells.A]

        [cells.B]
        model = "{bad}"

        [[decision]]
        candidate = "B"
        baseline = "A"
        """, head='order = ["A", "B"]')
    p = subprocess.run([sys.executable, "-m", "abbench", "campaign", str(path), "--out",
                        str(tmp_path / "r"), "--sentinels", str(tmp_path / "s"), "--no-live"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == EXIT_NO_MEASUREMENT == 5, p.stdout + p.stderr
    line = one_error(p.stderr, progress=True)
    assert line.startswith("ERROR: no cell of `B` produced a valid measurement (1 failed; "
                           "cell 2 (B): exited with status 2: "), line
    assert "non-finite logits" in line, line
    (run,) = (tmp_path / "r").iterdir()
    a, b = read_journal(run)
    assert a.status == "ok" and b.status == "failed"
    assert b.error is not None and "non-finite logits (NaN or inf)" in b.error
    report = json.loads((run / "report.json").read_text())
    assert report["exit_status"] == 5
    assert report["cells"][1]["tokens_per_s"] is None  # its figures are not in the analysis
    assert report["decisions"][0]["verdict"] == "OWED"
    assert f"cell 2 (B): cell failed: {b.error}" in (run / "report.md").read_text()
    rc, _, _ = run_main(["report", str(run), "--style", "plain"], capsys)
    assert rc == 5  # the campaign and its re-rendered report alike


# -- the exit status of a run that measured nothing -----------------------------------------


DECIDE = [{"candidate": "C", "baseline": "B", "min_effect": 0.03}]


@pytest.mark.parametrize("cells,decisions,status", [
    ([cell("B", 40, status="failed"), cell("C", 44, status="failed")], [], 5),
    ([cell("B", 40), cell("C", 44, status="failed")], DECIDE, 5),
    ([cell("B", 40, status="failed"), cell("C", 44)], DECIDE, 5),
    # a NO-GO elsewhere is a definite answer: it wins, as it wins over an open question
    ([cell("B", 40), cell("C", 30), cell("D", 44, status="failed")],
     [DECIDE[0], {"candidate": "D", "baseline": "B", "min_effect": 0.03}], 1),
    # one failed cell among valid ones, no decision: something was measured
    ([cell("B", 40), cell("C", 44, status="failed")], [], 0),
], ids=["every-cell-no-decision", "candidate", "baseline", "no-go-wins", "some-valid"])
def test_a_run_with_no_valid_cell_for_what_it_asks_exits_5(
        cells: list[dict[str, object]], decisions: list[dict[str, object]], status: int,
        tmp_path: Path) -> None:
    run = make_run(tmp_path, cells, decisions, floor=0.01)
    assert write_reports(run)[1] == status


# -- issue 42, class 4: plans checked against the model's sizes --------------------------------


@pytest.mark.parametrize("kernels,one", [("numpy", "24 KiB"), ("ggml", "6 KiB")])
def test_a_cache_that_holds_no_expert_is_named_at_dry_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kernels: str, one: str) -> None:
    """Before: `cache_mib = 1` on experts of 144 MiB ran (every expert read from disk, as
    with no cache) and `--dry-run` said nothing. The tiny preset's experts: 24 KiB in F32,
    6.4 KiB as Q8_0 (34 bytes per 32 weights), held so by ggml's kernels."""
    model = tmp_path / "q8.gguf"
    synth.write_model(replace(synth.preset("tiny"), expert_type="Q8_0"), model)
    path = campaign_file(tmp_path, model,
                         f'[cells.A]\ncache_mib = 0.005\nkernels = "{kernels}"\n[cells.B]\n')
    rc, _, err = run_main(["campaign", str(path), "--dry-run"], capsys)
    line = one_error(err)
    assert rc == 2
    assert f"`cells.A.cache_mib`: 0.005 MiB holds no expert of {model}: one takes {one}" in line
    assert "TIP: at least 1 MiB holds one; 0 streams every expert with no cache" in err


def test_a_cell_no_memory_here_holds_is_named_at_dry_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget no cell fits: the cell's load and cache against what this machine has."""
    from abbench.engine.streaming import memory

    model = tmp_path / "small.gguf"
    synth.write_model(synth.preset("small"), model)
    monkeypatch.setattr(memory, "rooms", lambda root=None: [
        memory.Room("the memory cgroup /t's limit 20 MiB less 0 MiB in use", 20 * 2**20)])
    path = campaign_file(tmp_path, model, "[cells.A]\nresident = true\n[cells.B]\n")
    rc, _, err = run_main(["campaign", str(path), "--dry-run"], capsys)
    line = one_error(err)
    assert rc == 2 and "`cells.A.resident`: " in line
    assert "every expert resident, in F32, as the file holds them 48 MiB" in line
    assert "more than the 20 MiB this process may have now (the memory cgroup /t's" in line
    assert "TIP: it fits with cache_mib = " in err and "resident = false" in err
