"""`abbench import` tells the truth (docs/import.md): constructed folders in the field's real
variants — unit-suffixed, banner-named entry lines, several driver logs, bytes that are not
UTF-8, stray logs, no order, unknown gaps, caps without a hardware maximum, arms from the
preamble, several models — and what the report may and may not say of them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from abbench.analysis.campaign import analyze
from abbench.cli import main
from abbench.errors import OrderWarning
from abbench.importers import import_folder
from abbench.records import read_import_info, read_journal, read_plan
from abbench.report import write_reports


def rows(ms: float, n: int = 40, read: int = 100, majflt: float | None = None,
         hit: float | None = None) -> str:
    cols = ["step", "steps", "wall_ms", "read_bytes"]
    if majflt is not None:
        cols.append("majflt")
    if hit is not None:
        cols.append("cache_hit_pct")
    out = [",".join(cols)]
    for i in range(n):
        wobble = ms * (1 + 0.01 * ((i * 7) % 5 - 2))
        vals = [str(i + 1), str(n), f"{wobble:.3f}", str(read)]
        if majflt is not None:
            vals.append(f"{majflt:.1f}")
        if hit is not None:
            vals.append(f"{hit * (i + 1) / n:.2f}")  # cumulative, as the seed engine writes it
        out.append(",".join(vals))
    return "\n".join(out) + "\n"


def folder(tmp: Path, files: dict[str, str | bytes]) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name, text in files.items():
        (src / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return src


def imported(tmp: Path, files: dict[str, str | bytes], **kw) -> tuple[Path, str]:
    src = folder(tmp, files)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderWarning)
        run = import_folder(src, tmp / "run", **kw)
    write_reports(run)
    return run, (run / "report.md").read_text()


def test_unit_suffixed_banner_named_entry_lines(tmp_path: Path) -> None:
    log = ("=============== qwen_base ===============\n"
           "ENTRY STATE: batt=420 dC, memavail=6837980 kB, freq=1555200, waited=0s\n"
           "=============== qwen_sg ===============\n"
           "ENTRY STATE: batt=43.1 C, cpu=47100 mC, memavail=6.1 GB, freq=1.9 GHz, waited=12s\n")
    run, md = imported(tmp_path, {"qwen_base.csv": rows(200), "qwen_sg.csv": rows(400),
                                  "driver.log": log})
    base, sg = read_journal(run)
    assert (base.name, sg.name) == ("qwen_base", "qwen_sg")  # named by the banners
    assert base.entry.battery_temp_c == pytest.approx(42.0)
    assert base.entry.mem_available_mib == pytest.approx(6837980 / 1024)
    assert base.entry.caps_khz == {"cpu": 1555200} and base.entry.hw_max_khz == {}
    assert sg.entry.cpu_temp_c == pytest.approx(47.1)
    assert sg.entry.mem_available_mib == pytest.approx(6.1 * 1024)
    assert sg.entry.caps_khz == {"cpu": 1900000} and sg.gate.waited_s == 12.0
    # a cap without a hardware maximum is never "at max"
    assert "at max" not in md
    assert "cpu cap 1.56 GHz (hardware max unknown)" in md
    assert "cpu cap 1.56 GHz first seen at cell 1, hardware max unknown" in md
    info = read_import_info(run)
    assert info.cells[0].facts["entry"].source == "driver.log:2 (named by banner line 1)"


def test_two_driver_logs_merge_in_time_order(tmp_path: Path) -> None:
    first = ("ENTRY STATE: cell=a t_wall=1780000000 cpu_temp_c=40\n"
             "ENTRY STATE: cell=c t_wall=1780000600 cpu_temp_c=42\n")
    second = "ENTRY STATE: cell=b t_wall=1780000300 cpu_temp_c=41\n"
    run, md = imported(tmp_path, {"a.csv": rows(100), "b.csv": rows(100), "c.csv": rows(100),
                                  "morning.log": first, "noon.log": second})
    assert [c.name for c in read_plan(run).cells] == ["a", "b", "c"]
    info = read_import_info(run)
    assert info.order.kind == "measured" and "morning.log, noon.log (start times)" in \
        info.order.source
    assert [c.facts["entry"].source.split(" ")[0] for c in info.cells] == [
        "morning.log:1", "noon.log:1", "morning.log:2"]
    assert "Execution order: **measured**" in md


def test_bytes_that_are_not_utf8_are_read_with_replacement(tmp_path: Path) -> None:
    log = (b"llama_model_loader: loaded meta data with 35 key-value pairs and 579 tensors from "
           b"/sdcard/Download/Qwen3-30B-A3B-Q4_K_M.gguf (version GGUF V3 (latest))\n"
           b"prompt tokens: [151644, 872, '\xe4\xb8'] (cut mid-character)\n"
           b"generation: 40 tokens, 0.200 s/token (5.000 tok/s)\n")
    run, md = imported(tmp_path, {"qwen.csv": rows(200), "qwen.log": log})
    (rec,) = read_journal(run)
    assert rec.tokens_per_s == 5.0  # the rest of the log was used
    notes = read_import_info(run).notes
    assert len([n for n in notes if "not UTF-8" in n]) == 1 and "qwen.log" in notes[0]
    assert read_plan(run).cells[0].config.model == "Qwen3-30B-A3B-Q4_K_M.gguf"
    assert "not UTF-8" in md


def test_a_table_with_bytes_that_are_not_utf8_is_read_as_its_reader_refuses_it(
        tmp_path: Path) -> None:
    # `read_bmoe_csv` alone refuses such a file; the folder import reads it and says so.
    table = b"# device=Pixel \xe4\xb8 (cut mid-character)\n" + rows(200).encode()
    run, md = imported(tmp_path, {"qwen.csv": table})
    (rec,) = read_journal(run)
    assert rec.status == "ok" and rec.tokens_per_s is not None
    (note,) = [n for n in read_import_info(run).notes if "not UTF-8" in n]
    assert note.startswith("qwen.csv:") and "the rest of the file is used" in note
    assert "not UTF-8" in md


def test_a_stray_log_is_reported_not_made_a_run(tmp_path: Path) -> None:
    stray = "session notes\ngeneration: 4 tokens, 1 s/token (1.000 tok/s)\n" * 3
    run, md = imported(tmp_path, {"a.csv": rows(100), "b.csv": rows(100), "all.log": stray})
    assert sorted(c.name for c in read_plan(run).cells) == ["a", "b"]
    assert "all.log: a log of no run here" in md


def test_no_order_information_no_pair_and_no_invented_gap(tmp_path: Path) -> None:
    run, md = imported(tmp_path, {"x.csv": rows(100), "y.csv": rows(80)},
                       decisions=[("y", "x", 0.0)])
    a = analyze(run)
    assert not a.plan.order_known
    assert all(m.state == "unmatched" for m in a.pairs) and not a.unverified_ratios
    assert a.decisions[0].verdict == "OWED"
    assert "✓ gap" not in md and "0 s between the cells" not in md
    assert "EXECUTION ORDER UNKNOWN" in md
    assert "Execution order: **unknown**" in md


def test_a_pair_with_an_unknown_gap_is_never_matched(tmp_path: Path) -> None:
    metrics = "cpu_temp_before_mC=40000\nbatt_temp_before_dC=300\nmem_avail_before_kb=4000000\n"
    run, md = imported(tmp_path, {"x.csv": rows(100), "y.csv": rows(80), "x.metrics": metrics,
                                  "y.metrics": metrics},
                       order=["x", "y"], decisions=[("y", "x", 0.0)])
    a = analyze(run)
    (pair,) = a.pairs
    assert pair.state == "unverified" and "gap between the cells is unknown" in (pair.note or "")
    assert a.decisions[0].verdict == "UNVERIFIED"
    assert "✓ gap" not in md


def test_a_negative_gap_fails(tmp_path: Path) -> None:
    log = ("ENTRY STATE: cell=x t_wall=1780000000 cpu_temp_c=40\n"
           "ENTRY STATE: cell=y t_wall=1780000001 cpu_temp_c=40\n")  # x runs for 4 s
    run, _ = imported(tmp_path, {"x.csv": rows(100), "y.csv": rows(100), "d.log": log})
    (pair,) = analyze(run).pairs
    assert pair.state == "unmatched"
    assert any("started 3 s before cell 1 ended" in r for r in pair.reasons)


def preamble(**kw: object) -> str:
    keys = {"model": "q.gguf", "n_expert_used": 8, "threads": 4, "cache_mb": 4000,
            "io_threads": 4, "overlap": 1, "dense_weights": "anon", **kw}
    return "# bmoe_metrics v2\n# " + " ".join(f"{k}={v}" for k, v in keys.items()) + "\n"


def test_abab_arms_from_the_preamble_pool_and_drift(tmp_path: Path) -> None:
    files = {}
    speeds = {"r1-A": 200, "r2-B": 180, "r3-A": 205, "r4-B": 182, "r5-A": 250}
    for name, ms in speeds.items():
        pre = preamble(dense_weights="ahwb" if name.endswith("B") else "anon")
        files[f"{name}.csv"] = pre + rows(ms, majflt=2)
        files[f"{name}.metrics"] = ("cpu_temp_before_mC=40000\nbatt_temp_before_dC=300\n"
                                    "mem_avail_before_kb=4000000\n")
    log = "".join(f"ENTRY STATE: cell={n} t_wall={1780000000 + 60 * k} cpu_temp_c=40 "
                  f"battery_temp_c=30 mem_available_mib=3900\n" for k, n in enumerate(speeds))
    files["driver.log"] = log
    run, md = imported(tmp_path, files,
                       decisions=[("dense_weights=ahwb", "dense_weights=anon", 0.03)])
    plan = read_plan(run)
    assert [c.name for c in plan.cells] == ["r1-A", "r2-B", "r1-A", "r2-B", "r1-A"]
    assert [c.sentinel_of for c in plan.cells] == [None, None, 0, 1, 0]
    a = analyze(run)
    (d,) = a.decisions
    assert (d.candidate, d.baseline) == ("r2-B", "r1-A")
    assert len(d.pairs) == 4 and d.ratio is not None  # the rounds pool
    assert a.noise.source == "this campaign" and a.noise.df >= 2
    assert any(x.verdict == "drift" and x.sentinel == 4 for x in a.drift)  # 205 -> 250 ms
    assert "dense_weights=ahwb" in md and "dense_weights=anon" in md  # the keys that differ


def test_tells_never_compare_across_models(tmp_path: Path) -> None:
    log = "".join(f"ENTRY STATE: cell={n} t_wall={1780000000 + 100 * k} cpu_temp_c=40\n"
                  for k, n in enumerate(["gemma_base", "qwen_base", "qwen_small"]))
    run, md = imported(tmp_path, {
        "gemma_base.csv": preamble(model="gemma.gguf") + rows(300, read=400, majflt=1000),
        "qwen_base.csv": preamble(model="qwen.gguf") + rows(150, read=200, majflt=149),
        "qwen_small.csv": preamble(model="qwen.gguf", n_expert_used=6)
        + rows(180, read=150, majflt=1189),
        "driver.log": log})
    tells = analyze(run).tells
    for t in tells:  # a Qwen cell is never held against the Gemma cell
        assert "cell 1 (gemma_base)" not in t.detail, t
    kinds = {(t.cell, t.kind) for t in tells}
    # the authors' canonical majflt case, 149 -> 1189 per token (8x), against the Qwen cell
    assert (2, "majflt") in kinds
    # compute per token up while work per token falls (top-k 8 -> 6): the other tell
    assert (2, "compute_up_work_down") in kinds or any(t.kind == "majflt" for t in tells)


def test_hit_rate_is_the_last_cumulative_value_or_the_summary(tmp_path: Path) -> None:
    run, _ = imported(tmp_path, {"a.csv": rows(100, hit=77.1),
                                 "b.csv": rows(100, hit=80.0) + "# summary tok/s=10 "
                                 "cache_hit_pct=79.5\n",
                                 "c.csv": rows(100, hit=-1.0)}, order=["a", "b", "c"])
    cells = {c.name: c for c in analyze(run).cells}
    assert cells["a"].work.hit_pct == pytest.approx(77.1)  # not the mean of the running value
    assert cells["b"].work.hit_pct == pytest.approx(79.5)
    assert cells["c"].work.hit_pct is None  # -1: the cache was off


def test_cpu_and_battery_disagree_the_cpu_decides(tmp_path: Path) -> None:
    log = ("ENTRY STATE: cell=a t_wall=1780000000 cpu_temp_c=60 battery_temp_c=35\n"
           "ENTRY STATE: cell=b t_wall=1780000100 cpu_temp_c=68.5 battery_temp_c=32.3\n")
    run, md = imported(tmp_path, {"a.csv": rows(100), "b.csv": rows(100), "d.log": log})
    (pair,) = analyze(run).pairs
    assert "the battery says cell 1 (by 2.7 °C), the CPU says cell 2 (by 8.5 °C); the CPU " \
        "sensor decides" in (pair.note or "")


def test_entry_degrading_on_the_free_ram_floor_and_major_faults(tmp_path: Path) -> None:
    files = {"driver.log": ""}
    for k, (floor, majflt) in enumerate([(1650000, 149), (1100000, 600), (650000, 1894)]):
        files[f"r{k}.csv"] = rows(200, majflt=majflt)
        files[f"r{k}.metrics"] = f"mem_avail_floor_kb={floor}\ncpu_temp_before_mC=45000\n"
        files["driver.log"] += f"ENTRY STATE: cell=r{k} t_wall={1780000000 + 60 * k}\n"
    run, _ = imported(tmp_path, files)
    details = [t.detail for t in analyze(run).tells if t.kind == "entry_degrading"]
    assert any(d.startswith("free-RAM floor during the cell worsened at every cell") for d in
               details), details
    assert any(d.startswith("major faults per token worsened") for d in details), details


def test_cli_renders_the_report_and_force_replaces_only_an_import(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = folder(tmp_path, {"a.csv": rows(100), "b.csv": rows(50)})
    out = tmp_path / "run"
    assert main(["import", str(src), "--out", str(out), "--order", "a,b", "--decision",
                 "b:a", "--warmup", "4", "--style", "plain"]) == 3
    text = capsys.readouterr().out
    assert "verdicts (matched pairs only)" in text and (out / "report.html").is_file()
    assert read_plan(out).warmup_tokens == 4
    assert main(["import", str(src), "--out", str(out)]) == 2
    assert "--force replaces an earlier import" in capsys.readouterr().err
    assert main(["import", str(src), "--out", str(out), "--force", "--order", "b,a"]) == 0
    assert [c.name for c in read_plan(out).cells] == ["b", "a"]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["import", str(src), "--out", str(other), "--force"]) == 2
    assert "is not an import" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "keep me"


def test_import_json_is_whole_and_names_every_source(tmp_path: Path) -> None:
    run, _ = imported(tmp_path, {"a.csv": rows(100), "a.metrics": "cpu_temp_before_mC=40000\n"})
    doc = json.loads((run / "import.json").read_text())
    (cell,) = doc["cells"]
    assert cell["facts"]["entry.cpu_temp_c"] == {"kind": "measured",
                                                 "source": "a.metrics `cpu_temp_before_mC`"}
    assert cell["facts"]["t_start"]["kind"] == "unknown"
    assert cell["facts"]["config.model"]["kind"] == "derived"


def test_a_driver_log_number_out_of_range_is_left_out_with_a_note() -> None:
    from abbench.importers.driverlog import parse_driver_log

    notes: list[str] = []
    big = "9" * 400  # a float of this is infinite
    (entry,) = parse_driver_log(
        f"ENTRY STATE: cell=a cpu_temp_c={big} battery_temp_c=38.1 memavail=1e308 GB "
        f"caps=policy0:{big}/3321600,policy6:1651200/3801600\n", "driver.log", notes)
    assert entry.cpu_temp_c is None and entry.battery_temp_c == 38.1
    assert entry.mem_available_mib is None
    assert entry.caps_khz == {"policy6": 1651200}
    assert any("cpu_temp_c" in n and "finite" in n for n in notes), notes
    assert any("memavail" in n and "out of range" in n for n in notes), notes
    assert any("policy0" in n for n in notes), notes


def test_a_driver_log_number_past_what_a_record_holds_is_left_out_with_a_note() -> None:
    from abbench.importers.driverlog import parse_driver_log

    notes: list[str] = []
    (entry,) = parse_driver_log(  # finite, but past records' LIMIT (1e18)
        "ENTRY STATE: cell=a cpu_temp_c=1e27 battery_temp_c=38.1 "
        "caps=policy0:1e27/3321600,policy6:1651200/3801600\n", "driver.log", notes)
    assert entry.cpu_temp_c is None and entry.battery_temp_c == 38.1
    assert entry.caps_khz == {"policy6": 1651200}
    assert any("cpu_temp_c" in n and "out of range" in n for n in notes), notes
    assert any("policy0" in n for n in notes), notes
