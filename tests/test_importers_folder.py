"""`abbench import`: the reference folders, order sources, entry state, errors, fuzzing."""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from pathlib import Path

import pytest
from conftest import REFERENCE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abbench.cli import main
from abbench.errors import ForeignRunError, OrderWarning
from abbench.importers import (
    import_folder,
    parse_bmoe_csv,
    parse_driver_log,
    parse_engine_log,
    parse_metrics,
    parse_state,
)
from abbench.records import (
    DecisionSpec,
    read_cell_files,
    read_import_info,
    read_journal,
    read_plan,
    read_samples,
)
from abbench.records.cell_config import ImportedConfig

HEADERLESS = REFERENCE / "headerless-2026-07-12"
DESKTOP = REFERENCE / "v1-desktop-2026-07-24"
ROUTE = REFERENCE / "route-trace-2026-07-15"

needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason="no shared/reference")


def _import(src: Path, dest: Path, **kw) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderWarning)
        return import_folder(src, dest, **kw)


def _own_summaries(folder: Path) -> dict[str, str]:
    """Each run's tok/s as its own files print it, read independently of the importer."""
    out = {}
    for f in folder.iterdir():
        text = f.read_text(encoding="utf-8-sig")
        stem = f.name.split(".")[0]
        m = re.search(r"^# summary .*?\btok/s=([0-9.]+)", text, re.M)
        if m is None and f.suffix == ".log":
            m = re.search(r"\(([0-9.]+) tok/s\)", text)
        if m:
            out[stem] = m[1]
    return out


# -- the reference folders ------------------------------------------------------------


@needs_reference
@pytest.mark.parametrize("src", [HEADERLESS, DESKTOP, ROUTE], ids=lambda p: p.name)
def test_reference_tokens_per_s_equal_own_summary(src: Path, tmp_path: Path) -> None:
    run = _import(src, tmp_path / "run")
    plan, journal = read_plan(run), read_journal(run)
    own = _own_summaries(src)
    assert len(journal) == len(plan.cells) == len(own) > 0
    for rec in journal:
        printed = own[rec.name]
        decimals = len(printed.split(".")[1])
        assert f"{rec.tokens_per_s:.{decimals}f}" == printed, rec.name
        doc = json.loads((run / "cells" / rec.label / "summary.json").read_text())
        assert doc["summary"]["tok/s"] == rec.tokens_per_s
        # the per-token times: the run's tokens.csv, read as a cell's
        cols = read_cell_files(run / "cells" / rec.label).columns
        assert len(cols["wall_ms"]) == int(doc["summary"]["tokens"])
        assert rec.fingerprint and rec.fingerprint.startswith("sha256:")
        assert isinstance(plan.cells[rec.index].config, ImportedConfig)


@needs_reference
def test_headerless_entry_state_from_metrics(tmp_path: Path) -> None:
    journal = read_journal(_import(HEADERLESS, tmp_path / "run"))
    first = journal[0].entry
    assert journal[0].name == "qwen_c2000_l4"
    assert first.cpu_temp_c == pytest.approx(44.8)
    assert first.battery_temp_c == pytest.approx(38.1)
    assert first.mem_available_mib == pytest.approx(5761708 / 1024)
    assert first.caps_khz == {} and first.thermal_status is None  # not recorded: empty
    assert journal[0].summary.tok_per_s == 2.366  # from the .log: the CSV has no summary
    assert journal[2].entry.cpu_temp_c == pytest.approx(46.7)


@needs_reference
def test_desktop_order_by_name_warns_and_records_unknown(tmp_path: Path) -> None:
    with pytest.warns(OrderWarning, match="order of 4 runs is unknown"):
        run = import_folder(DESKTOP, tmp_path / "run")
    plan = read_plan(run)
    assert [c.name.split("-")[1] for c in plan.cells] == ["E", "F", "H", "I"]
    assert not plan.order_known and read_import_info(run).order.kind == "unknown"
    assert plan.cells[0].config.resolved["io_threads"] == "4"  # the preamble is the configuration
    entry = read_journal(run)[0].entry
    assert (entry.cpu_temp_c, entry.battery_temp_c, entry.mem_available_mib) == (None,) * 3


@needs_reference
def test_desktop_explicit_order_and_decision(tmp_path: Path) -> None:
    run = import_folder(DESKTOP, tmp_path / "run", order=["I", "H", "F", "E"],
                        decisions=[("H", "E", 0.03)])
    plan = read_plan(run)
    assert [c.label for c in plan.cells] == [
        "01-pc-I-c5000-overlap", "02-pc-H-c5000-combo", "03-pc-F-c5000-io8t4",
        "04-pc-E-c5000-io4t4"]
    assert plan.order_known and read_import_info(run).order.source.startswith("--order")
    # the combination differs from E in three keys, and a decision by run names names none:
    # each is a confound of the others (docs/import.md#configuration-identity-arms)
    assert plan.decisions == (DecisionSpec("pc-H-c5000-combo", "pc-E-c5000-io4t4", 0.03,
                                           confounds=("drop_cold_frac", "io_threads",
                                                      "threads")),)


@needs_reference
def test_route_trace_state_gives_entry_and_samples(tmp_path: Path) -> None:
    run = _import(ROUTE, tmp_path / "run")
    (rec,) = read_journal(run)
    e = rec.entry
    assert rec.name == "qwen" and rec.tokens_per_s == 5.657
    assert e.caps_khz == {"policy0": 2188800, "policy6": 1651200}
    assert e.hw_max_khz == {"policy0": 3321600, "policy6": 3801600}
    assert e.capped() == ["policy0", "policy6"]
    assert e.thermal_status == 1 and e.cpu_temp_c == 99.6
    assert e.mem_available_mib == pytest.approx(6151240 / 1024)
    assert e.battery_temp_c is None  # `battery_temp_dC:` was empty
    assert rec.t_end_wall - rec.t_start_wall == 59.0  # 09:05:49 → 09:06:48
    samples = read_samples(run)
    assert [s.values["android.thermal_status"] for s in samples] == [1, 2]
    assert samples[1].values["cpu.policy0.cap_khz"] == 1900800


@needs_reference
def test_cli_import_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    # The import prints the report and exits as a campaign does: I and E are not adjacent,
    # so the decision is OWED (3).
    assert main(["import", str(DESKTOP), "--out", str(out), "--order", "E,F,H,I",
                 "--decision", "I:E:0.02"]) == 3
    text = capsys.readouterr().out
    assert "imported 4 runs (4 arms)" in text and "(order measured: --order" in text
    assert "01-pc-E-c5000-io4t4       4.718 tok/s  no entry state recorded" in text
    assert "OWED" in text and "pc-I-c5000-overl" in text
    assert main(["import", str(DESKTOP), "--out", str(out)]) == 2  # exists: refused
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["import", str(DESKTOP), "--out", str(out), "--force"]) in (0, 1, 3)


# -- order sources and entry state from a driver log ----------------------------------

ROWS = "step,steps,wall_ms,read_bytes\n1,2,500.0,100\n2,2,250.0,50\n"


def _folder(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name, text in files.items():
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        (src / name).write_bytes(data)
    return src


def test_driver_log_gives_order_and_entry_state(tmp_path: Path) -> None:
    log = ("09:00 start\n"
           "09:01 ENTRY STATE: cell=b t_wall=1780000000 cpu_temp_c=41.5 battery_temp_c=33.0 "
           "mem_available_mib=5000 thermal_status=0 caps=policy0:2188800/3321600\n"
           "09:05 ENTRY STATE: cell=a cpu_temp_c=47.0\n")
    src = _folder(tmp_path, {"a.csv": ROWS, "b.csv": ROWS,
                             "a.metrics": "cpu_temp_before_mC=50000\n",
                             "driver.log": log})
    run = import_folder(src, tmp_path / "run")
    plan, journal = read_plan(run), read_journal(run)
    assert [c.name for c in plan.cells] == ["b", "a"]
    assert read_import_info(run).order.source.startswith("the runs in sequence in driver.log")
    b, a = journal
    assert b.entry.t_wall == 1780000000 and b.entry.capped() == ["policy0"]
    assert (b.entry.battery_temp_c, b.entry.mem_available_mib) == (33.0, 5000)
    assert a.entry.cpu_temp_c == 47.0  # the driver's entry state wins over .metrics
    assert a.tokens_per_s == pytest.approx(2 / 0.75)  # no summary, no .log: from the rows
    assert a.summary.tokens == 2


def test_timestamps_in_file_names_order(tmp_path: Path) -> None:
    src = _folder(tmp_path, {"z-20260712-101500.csv": ROWS, "a-20260712-113000.csv": ROWS,
                             "m-2026-07-12_09-00-00.csv": ROWS})
    with warnings.catch_warnings():
        warnings.simplefilter("error", OrderWarning)
        plan = read_plan(import_folder(src, tmp_path / "run"))
    assert [c.name[0] for c in plan.cells] == ["m", "z", "a"]
    assert read_import_info(tmp_path / "run").order.source == "timestamps in the file names"


# -- bad input: one ERROR line naming file and line, exit 2 ---------------------------


@pytest.mark.parametrize(("files", "message"), [
    ({}, "no runs here"),
    ({"a.csv": ""}, "a.csv: no header row"),
    ({"a.csv": "step,wall_ms\n1,abc\n"}, "a.csv:2: column `wall_ms`: 'abc' is not a number"),
    ({"a.csv": "step,wall_ms\n1,2,3\n"}, "a.csv:2: 3 fields, the header has 2"),
    ({"a.csv": "step,wall_ms\n1,nan\n"}, "a.csv:2: column `wall_ms`: 'nan' is not a finite"),
    ({"a.csv": "step,step\n"}, "a.csv:1: header: column `step` appears twice"),
    ({"a.csv": "step,wall_ms\n# summary tok/s=fast\n"}, "a.csv:2: `# summary` tok/s"),
    # `step` is left out (its line said in a warning), and nothing gives the run a speed
    ({"a.csv": b"step\n\xff\xfe\n"}, "a.csv: no tokens/s"),
])
def test_a_folder_that_leaves_nothing_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str | bytes],
        message: str) -> None:
    src = _folder(tmp_path, files)
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing half-written


@pytest.mark.parametrize(("files", "note"), [
    ({"a.metrics": "cpu_temp_before_mC=hot\n"}, "a.metrics:1:"),
    ({"a.state": "policy0: scaling_max=1\n"}, "a.state:1: text before"),
    ({"d.log": "ENTRY STATE: cell=../../etc\n"}, "d.log:1: `ENTRY STATE:` names no run"),
    ({"b.csv": ROWS, "d.log": "ENTRY STATE: cell=a\n"}, "d.log leaves out b"),
    ({"b.csv": "step,wall_ms\n1,x\n"}, "b.csv:2: column `wall_ms`: 'x' is not a number"),
    ({"session.log": "generation: 3 tokens, 0.5 s/token (2.000 tok/s)\n" * 2},
     "session.log: a log of no run here"),
    # sections of something else (the authors' memory benchmark log, 2026-07-21)
    ({"membench.log": "=== 1. First run ===\n$ bmoe-membench --mib 512\n"
                      "=== 2. Pinned ===\nanon 45410.4\n"},
     "membench.log: a log of no run here: its sections (`1. First run`, `2. Pinned`) name no "
     "run"),
])
def test_one_odd_file_never_aborts_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            files: dict[str, str | bytes], note: str) -> None:
    src = _folder(tmp_path, {"a.csv": ROWS, **files})
    rc = main(["import", str(src), "--out", str(tmp_path / "run"), "--style", "plain"])
    captured = capsys.readouterr()
    assert rc in (0, 3) and "Traceback" not in captured.err, captured.err
    assert note in captured.err  # warned ...
    md = (tmp_path / "run" / "report.md").read_text()
    assert note in md  # ... and in the report, not only on stderr
    assert "01-a" in {r.label for r in read_journal(tmp_path / "run")}


def test_bad_order_and_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _folder(tmp_path, {"run-a.csv": ROWS, "run-b.csv": ROWS})
    out = str(tmp_path / "run")
    assert main(["import", str(src), "--out", out, "--order", "run-a,run-c"]) == 2
    assert "no run `run-c`" in capsys.readouterr().err
    assert main(["import", str(src), "--out", out, "--order", "../x,run-a"]) == 2
    assert "no run `../x`" in capsys.readouterr().err
    assert main(["import", str(src), "--out", out, "--decision", "a"]) == 2
    assert "CANDIDATE:BASELINE" in capsys.readouterr().err
    assert main(["import", str(src), "--out", out, "--order", "a,b", "--decision", "a:b:x"]) == 2
    assert "MIN_EFFECT" in capsys.readouterr().err
    assert main(["import", str(src), "--out", out, "--decision", "run-*:run-a"]) == 2
    assert "names several arms" in capsys.readouterr().err


# -- parsers ----------------------------------------------------------------------------


def test_csv_columns_optional_and_preamble() -> None:
    run = parse_bmoe_csv("# bmoe_metrics v2\n# threads=4 cache_mb=500\nwall_ms,extra\n"
                         "10.5,\n# summary tokens=1 tok/s=95.2 note=x\n")
    assert run.version == "v2" and run.preamble == {"threads": "4", "cache_mb": "500"}
    assert run.columns == {"wall_ms": [10.5], "extra": [None]}
    assert run.summary == {"tokens": 1.0, "tok/s": 95.2, "note": "x"}


def test_state_and_metrics_and_logs_parse() -> None:
    state = parse_state("--- BEFORE ---\ndate: Wed Jul 15 09:05:49 XYZT 2026\n"
                        "battery_temp_dC: 381\n")
    assert state.before is not None and state.before.t_wall is None  # unknown zone: unknown
    assert state.before.battery_temp_c == pytest.approx(38.1)
    assert parse_metrics("a=1\na=2\nb=\n# c\n") == {"a": 1.0, "b": None}
    (e,) = parse_driver_log("x ENTRY STATE: cell=A caps=policy0:1000,policy4:2000/3000")
    assert e.caps_khz == {"policy0": 1000, "policy4": 2000} and e.hw_max_khz == {"policy4": 3000}
    log = parse_engine_log("generation: 3 tokens, 0.5 s/token (2.000 tok/s)")
    assert log is not None and log.tok_per_s == 2.0
    assert parse_engine_log("nothing") is None


@pytest.mark.parametrize("line", [
    "generation: 256 tokens, 0.423 s/token (999999999999999999999999992.366 tok/s)",
    "compute: 80% CPU occupancy (0.2 cpu-s/token over 9999999999999999999999 threads), "
    "0 major faults/token",
])
def test_an_engine_log_number_past_what_a_record_holds_names_its_line(line: str) -> None:
    """Found by the slow fuzz: a finite number past records' LIMIT reached the summary's
    check, whose message names no file."""
    text = "generation: 3 tokens, 0.5 s/token (2.000 tok/s)\n" + line
    with pytest.raises(ForeignRunError, match=r"^a\.log:2: .*out of range"):
        parse_engine_log(text, "a.log")


PARSERS = [parse_bmoe_csv, parse_metrics, parse_state, parse_driver_log, parse_engine_log]
ALPHABET = st.sampled_from(list("0123456789.,=:-/# \n\teE+abcdstepwall_msTemperature{}")
                           + ["step,wall_ms\n", "# summary ", "tok/s=", "--- BEFORE ---\n",
                              "policy0: ", "scaling_max=", "hw_max=", "meminfo: ", "kB",
                              "MemAvailable:", "Thermal Status: ", "mValue=", "mName=",
                              "ENTRY STATE: ", "cell=", "caps=", "nan", "inf", "\ufeff"])
TEXTS = st.one_of(st.text(max_size=300), st.lists(ALPHABET, max_size=80).map("".join))


def _only_our_error(text: str) -> None:
    for parse in PARSERS:
        with contextlib.suppress(ForeignRunError):
            parse(text, "fuzz")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
def test_fuzz_parsers_raise_only_foreign_run_error(text: str) -> None:
    _only_our_error(text)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
def test_fuzz_parsers_slow(text: str) -> None:
    _only_our_error(text)


@pytest.mark.parametrize(("written", "read"), [("8", 8), ("8.0", 8), ("8.5", None),
                                               ("inf", None), ("1e400", None), ("0", None),
                                               ("eight", None)])
def test_a_preamble_thread_count_in_any_spelling_imports(tmp_path: Path, written: str,
                                                         read: int | None) -> None:
    # A real file in an odd shape is read, not refused: `threads=8.0` is 8 threads, and a
    # count that is no whole number is left out rather than crashing the import.
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.csv").write_text(f"# bmoe_metrics v1\n# model=x threads={written}\n"
                               "step,steps,wall_ms,read_bytes\n1,1,5,1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderWarning)
        run = import_folder(src, tmp_path / "run")
    doc = json.loads(next((run / "cells").glob("*/summary.json")).read_text())
    assert doc["resolved"] == ({"threads": read} if read is not None else {})
