"""Contamination tells do not depend on order information (issue 29, class 5).

`tests/fixtures/imports/tells-unordered/`: made-up runs in the seed engine's v1 CSV format,
two of which the authors flagged as contaminated — `qwen_k8_r1`, whose major faults per
token are 8x its configuration's other runs (1189 vs 149 and 155), and `qwen_k6`, whose
compute per token rose at top-k 6 while its reads fell. No file records the order. A tell
compares a run with a set of runs of its model, so it flags the same runs whether the order
is known, given in another sequence, or unknown; the property test checks that on random
folders."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abbench.analysis.campaign import analyze
from abbench.cli import main
from abbench.errors import OrderWarning
from abbench.importers import import_folder
from abbench.records import read_plan

FIXTURE = Path(__file__).parent / "fixtures" / "imports" / "tells-unordered"
CONTAMINATED = {"qwen_k8_r1", "qwen_k6"}
# what flags each: the 8x jump in major faults; compute up while top-k and reads fell
WHY = {("qwen_k8_r1", "majflt"), ("qwen_k6", "compute_up_work_down")}


def flagged_by_cli(out: Path, *args: str) -> set[tuple[str, str]]:
    """(run, tell kind) for every cell tell the import's report.json lists."""
    assert main(["import", str(FIXTURE), "--out", str(out), "--style", "plain", *args]) in (0, 3)
    doc = json.loads((out / "report.json").read_text())
    stems = {c.index: c.label.split("-", 1)[1] for c in read_plan(out).cells}
    return {(stems[t["cell"]], t["kind"]) for t in doc["tells"] if t["cell"] is not None}


def test_the_authors_two_contaminated_runs_are_flagged_without_the_order(
        tmp_path: Path) -> None:
    tells = flagged_by_cli(tmp_path / "unordered")
    assert {run for run, _ in tells} == CONTAMINATED
    assert WHY.issubset(tells)


def test_an_order_given_changes_no_tell(tmp_path: Path) -> None:
    order = "qwen_k8_r2,qwen_k8_r1,gemma_base,qwen_k6,gemma_pf,qwen_k8_r3"
    unordered = flagged_by_cli(tmp_path / "unordered")
    assert flagged_by_cli(tmp_path / "ordered", "--order", order) == unordered
    again = "qwen_k6,qwen_k8_r3,gemma_pf,qwen_k8_r1,gemma_base,qwen_k8_r2"
    assert flagged_by_cli(tmp_path / "other", "--order", again) == unordered


def test_the_tell_names_what_it_compared_with(tmp_path: Path) -> None:
    out = tmp_path / "run"
    flagged_by_cli(out)
    md = (out / "report.md").read_text()
    assert "1187.5 major faults/token vs 151.81 (the median of its configuration's other " \
        "runs: cells 5, 6)" in md


# --- the property: shuffled file names, and every order hint or none -------------------

RUN = st.fixed_dictionaries({
    "model": st.sampled_from(["qwen", "gemma"]),
    "k": st.sampled_from([6, 8]),
    "dense": st.sampled_from(["anon", "mmap"]),
    "compute": st.sampled_from([80.0, 100.0, 104.0, 130.0, 190.0]),
    "read": st.sampled_from([250.0, 300.0, 380.0]),
    "majflt": st.sampled_from([0.5, 6.0, 149.0, 160.0, 1189.0]),
})


def csv_text(r: dict, extra: str = "") -> str:
    head = (f"# bmoe_metrics v1\n# model={r['model']}.gguf n_expert_used={r['k']} threads=4"
            f"{extra}\n"
            f"# cache_mb=4000 dense_weights={r['dense']}\n"
            "step,steps,wall_ms,compute_ms,read_bytes,majflt\n")
    rows = [f"{i + 1},12,{r['compute'] * 1.8 * (1 + 0.01 * (i % 3)):.2f},"
            f"{r['compute'] * (1 + 0.01 * (i % 3)):.2f},{int(r['read'] * 2**20)},"
            f"{r['majflt']}" for i in range(12)]
    return head + "\n".join(rows) + "\n"


def flagged(runs: list[dict], names: list[str], hint: str,
            order: list[int]) -> set[tuple[int, str]]:
    """Which runs (by their index in `runs`) each cell tell flags, imported with the files
    named `names` and the order hint `hint`: none, `--order`, or a driver log."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for r, name in zip(runs, names, strict=True):
            (src / f"{name}.csv").write_text(csv_text(r))
        kw: dict = {}
        if hint == "order":
            kw["order"] = [names[i] for i in order]
        elif hint == "driver":
            (src / "driver.log").write_text("".join(
                f"ENTRY STATE: cell={names[i]} t_wall={1780000000 + 60 * k}\n"
                for k, i in enumerate(order)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderWarning)
            run = import_folder(src, Path(tmp) / "run", **kw)
        stems = {c.index: c.label.split("-", 1)[1] for c in read_plan(run).cells}
        which = {name: i for i, name in enumerate(names)}
        return {(which[stems[t.cell]], t.kind) for t in analyze(run).tells
                if t.cell is not None}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=st.lists(RUN, min_size=3, max_size=6), data=st.data())
def test_no_order_information_changes_which_runs_a_tell_flags(runs: list[dict],
                                                              data: st.DataObject) -> None:
    n = len(runs)
    base = flagged(runs, [f"run{i}" for i in range(n)], "none", [])
    # other file names, so the file-name order is another one
    perm = data.draw(st.permutations(range(n)))
    names = [f"x{perm[i]}_{r['model']}" for i, r in enumerate(runs)]
    order = data.draw(st.permutations(range(n)))
    for hint in ("none", "order", "driver"):
        assert flagged(runs, names, hint, order) == base, hint


def test_without_the_order_no_drift_is_read(tmp_path: Path) -> None:
    """Which of two runs of a configuration ran first is what a drift says: with nothing
    recording it, the difference is shown and no drift (or stability) is claimed."""
    out = tmp_path / "run"
    flagged_by_cli(out)
    drift = json.loads((out / "report.json").read_text())["drift"]
    assert drift and {d["verdict"] for d in drift} == {"unreadable"}
    assert all("the order they ran in is unknown" in d["summary"] for d in drift)
    flagged_by_cli(tmp_path / "ordered", "--order",
                   "qwen_k8_r1,qwen_k8_r2,qwen_k8_r3,qwen_k6,gemma_base,gemma_pf")
    drift = json.loads((tmp_path / "ordered" / "report.json").read_text())["drift"]
    assert "drift" in {d["verdict"] for d in drift}  # r1 slowed by its faults, order known


def test_a_configuration_that_computes_more_by_itself_is_not_a_tell(tmp_path: Path) -> None:
    """Compute rising as top-k falls is the tell; a switch that adds compute of its own (a
    predictor's gate GEMV) while reading less is a configuration's effect, not a slower CPU."""
    src = tmp_path / "src"
    src.mkdir()
    base = {"model": "qwen", "k": 8, "dense": "anon", "compute": 100.0, "read": 380.0,
            "majflt": 6.0}
    (src / "base.csv").write_text(csv_text(base))
    (src / "gate.csv").write_text(csv_text({**base, "compute": 130.0, "read": 300.0},
                                           " spec_gate=1"))
    (src / "topk6.csv").write_text(csv_text({**base, "k": 6, "compute": 130.0, "read": 300.0}))
    out = tmp_path / "run"
    assert main(["import", str(src), "--out", str(out), "--style", "plain"]) == 0
    tells = json.loads((out / "report.json").read_text())["tells"]
    stems = {c.index: c.label.split("-", 1)[1] for c in read_plan(out).cells}
    assert {(stems[t["cell"]], t["kind"]) for t in tells} == {("topk6", "compute_up_work_down")}
