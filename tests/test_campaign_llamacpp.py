"""llama.cpp cells through the real CLI (docs/cells.md#llamacpp-cells): `engine =
"llama-bench"` and `"llama-completion"`, their keys and errors, a failed binary, an
adb-shaped device.

Fast tests run stand-ins for llama.cpp's tools: scripts that take the same flags, reject
an unknown one as the real tools do (exit status 1, `error: invalid parameter for
argument: ...`) and print what the pinned tools print (tests/fixtures/llamacpp). The real
tools run in the slow test at the end, on the build tests/llamacpp.py makes.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from test_campaign_run import abbench, run_folder, write_campaign

from abbench.campaign.llamacpp import LlamaCell, flag
from abbench.campaign.schema import load_campaign, resolved_toml

ROOT = Path(__file__).resolve().parents[1]

FAKE_BENCH = '''#!{python}
import json, os, sys
args = sys.argv[1:]
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps(["llama-bench"] + args) + "\\n")
known = {{"-m", "-n", "-r", "-o", "-p", "-t", "-fa"}}
opts = dict(zip(args[::2], args[1::2]))
for a in args[::2]:
    if a not in known:
        print(f"error: invalid parameter for argument: {{a}}", file=sys.stderr)
        sys.exit(1)
if os.environ.get("FAKE_SILENT"):
    sys.exit(0)
threads = int(opts.get("-t", 1))
base = {{"build_commit": "0c1e570", "model_filename": os.path.basename(opts["-m"]),
        "model_size": 1126656, "model_n_params": 281664, "n_threads": threads,
        "type_k": "f16", "type_v": "f16", "n_depth": 0}}
reps = int(opts["-r"])
per_token_ns = 1_000_000 // threads
for n_prompt, n_gen in ((int(opts.get("-p", 0)), 0), (0, int(opts["-n"]))):
    if n_prompt + n_gen == 0:
        continue
    ns = [(n_prompt // 4 + n_gen) * per_token_ns + 1000 * i for i in range(reps)]
    print(json.dumps({{**base, "n_prompt": n_prompt, "n_gen": n_gen, "samples_ns": ns,
                      "samples_ts": [1e9 * (n_prompt + n_gen) / t for t in ns]}}))
'''

FAKE_COMPLETION = '''#!{python}
import sys
args = sys.argv[1:]
n = int(args[args.index("-n") + 1])
sys.stdout.write("the same text " * 3 + "\\n\\n")
sys.stderr.write(
    "0.00.011.900 I common_perf_print: prompt eval time =       2.00 ms /     8 tokens "
    "(    0.25 ms per token,  4000.00 tokens per second)\\n"
    f"0.00.011.914 I common_perf_print:        eval time =      {{n * 2:.2f}} ms / "
    f"{{n - 1:5d}} runs   (    2.00 ms per token,   500.00 tokens per second)\\n")
'''


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "llama-bin"
    folder.mkdir()
    for name, text in (("llama-bench", FAKE_BENCH), ("llama-completion", FAKE_COMPLETION)):
        exe = folder / name
        exe.write_text(text.format(python=sys.executable))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


def _report(out: Path) -> dict:
    return json.loads((run_folder(out) / "report.json").read_text())


BENCH_CELLS = """
    [cells.t1]
    engine = "llama-bench"
    llama_cpp_bin = "{bin}"
    repetitions = 4
    llama = {{ t = 1, p = 16 }}

    [cells.t2]
    base = "t1"
    llama = {{ t = 2, p = 16 }}

    [[decision]]
    candidate = "t2"
    baseline = "t1"
    """


def test_llama_bench_cells_run_with_repetitions_as_samples(tiny_model: Path, fake_bin: Path,
                                                           tmp_path: Path) -> None:
    # The probe, the other processes' load and the free memory measure this shared host
    # (other test workers beside it), whose swings are not what is tested here.
    cells = write_campaign(tmp_path, tiny_model, BENCH_CELLS.format(bin=fake_bin)
                           + "\n[match]\nprobe_tol = 1\nforeign_load_tol = 64\n"
                           "mem_available_tol_frac = 1\n",
                           head='order = ["t1", "t2", "t1", "t2"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode in (0, 1, 3), p.stdout + p.stderr
    r = _report(tmp_path / "r")
    assert [c["status"] for c in r["cells"]] == ["ok"] * 4
    t1, t2 = r["cells"][:2]
    assert t1["source"] == "per_token" and len(t1["wall_ms"]) == 4  # no warm-up cut
    assert t1["tokens_per_s"]["estimate"] == pytest.approx(6 * 4e9 / sum(
        6 * 1_000_000 + 1000 * i for i in range(4)))
    assert t2["tokens_per_s"]["estimate"] > 1.8 * t1["tokens_per_s"]["estimate"]
    assert t1["prefill_tok_s"] is not None
    # Each repetition is a stability window: the slowest over the fastest.
    assert t1["stability"] == pytest.approx(6_000_000 / (6_000_000 + 3000))
    assert any("4 repetitions of 6 tokens (llama-bench) are the samples" in n
               for n in t1["notes"])
    assert t1["fingerprint"] == t2["fingerprint"]  # same tests: the same work
    assert t1["entry"]["probe_index"] is not None  # an entry state like any cell's
    assert r["pairs"][0]["state"] == "matched", r["pairs"][0]
    assert r["drift"][0]["fingerprints"] == "equal"
    (d,) = r["decisions"]
    assert d["verdict"] in ("GO", "INCONCLUSIVE") and d["ratio"]["estimate"] > 1.8
    config = json.loads((run_folder(tmp_path / "r") / "plan.json").read_text())["cells"][0]
    assert config["config"]["engine"] == "llama-bench"
    assert config["config"]["llama"] == {"t": 1, "p": 16}


def test_an_option_the_binary_rejects_fails_its_cell_and_the_campaign_goes_on(
        tiny_model: Path, fake_bin: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, BENCH_CELLS.format(bin=fake_bin).replace(
        "llama = { t = 2, p = 16 }", "llama = { t = 2, bogus = 1 }"),
        head='order = ["t1", "t2", "t1"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 5, p.stdout + p.stderr  # no valid cell of t2, the candidate
    r = _report(tmp_path / "r")
    assert [c["status"] for c in r["cells"]] == ["ok", "failed", "ok"]
    assert r["cells"][1]["error"] == ("exited with status 1: error: invalid parameter for "
                                      "argument: --bogus")  # its stderr's own reason
    journal = [json.loads(line) for line in
               (run_folder(tmp_path / "r") / "journal.jsonl").read_text().splitlines()]
    assert "invalid parameter for argument: --bogus" in journal[1]["stderr_tail"]
    assert r["decisions"][0]["verdict"] == "OWED"


def test_a_binary_that_prints_nothing_is_a_failed_cell(tiny_model: Path, fake_bin: Path,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SILENT", "1")
    cells = write_campaign(tmp_path, tiny_model, BENCH_CELLS.format(bin=fake_bin),
                           head='order = ["t1", "t2"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 5, p.stdout + p.stderr  # no cell is a measurement
    r = _report(tmp_path / "r")
    assert [c["status"] for c in r["cells"]] == ["failed", "failed"]
    assert "no generation test" in r["cells"][0]["error"]


def test_llama_completion_cells_time_decode_and_fingerprint_the_text(
        tiny_model: Path, fake_bin: Path, tmp_path: Path) -> None:
    cells = write_campaign(tmp_path, tiny_model, f"""
        [cells.c]
        engine = "llama-completion"
        llama_cpp_bin = "{fake_bin}"
        prompt = "Once upon a time"
        llama = {{ t = 1, fa = "off" }}
        """, head='order = ["c", "c"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode in (0, 3), p.stdout + p.stderr
    r = _report(tmp_path / "r")
    a, b = r["cells"]
    assert a["status"] == b["status"] == "ok"
    assert a["tokens_per_s"]["estimate"] == pytest.approx(5 / 12e-3)  # 5 runs in 12 ms
    assert a["source"] == "summary" and a["fingerprint"] == b["fingerprint"] is not None
    assert a["prefill_tok_s"] == pytest.approx(4000.0)
    assert any("llama-completion gives no per-token times" in n for n in a["notes"])


def test_an_adb_cell_runs_the_binary_through_the_device(tiny_model: Path, fake_bin: Path,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # `adb` first on PATH runs what it is handed, as the device's shell would, and logs it.
    adb_dir = tmp_path / "adb-bin"
    adb_dir.mkdir()
    adb = adb_dir / "adb"
    adb.write_text(f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(["adb"] + args) + "\\n")
if "get-state" in args:
    print("device")
    sys.exit(0)
sys.exit(subprocess.run(["sh", "-c", args[-1]]).returncode)
""")
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{adb_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    cells = write_campaign(tmp_path, tiny_model, BENCH_CELLS.format(bin=fake_bin),
                           head='order = ["t1", "t2"]')
    text = cells.read_text().replace(
        'transport = "local"', f'transport = "adb:FAKE1"\nremote_dir = "{tmp_path / "dev"}"')
    cells.write_text(text.replace(f'model = "{tiny_model}"',
                                  'model = "/data/local/tmp/tiny.gguf"'))
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode in (0, 3), p.stdout + p.stderr
    r = _report(tmp_path / "r")
    assert [c["status"] for c in r["cells"]] == ["ok", "ok"]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    runs = [c for c in calls if c[:3] == ["adb", "-s", "FAKE1"] and "llama-bench" in c[-1]]
    assert len(runs) == 2 and runs[0][3] == "shell"
    sh, c, script = shlex.split(runs[0][4])  # in the cell's own folder there (campaign.remote)
    assert (sh, c) == ("sh", "-c")
    (line,) = [x for x in script.split("; ") if "llama-bench" in x]  # one line, `;`-joined
    argv = shlex.split(line)
    assert argv[:3] == [f"{fake_bin}/llama-bench", "-m", "/data/local/tmp/tiny.gguf"]
    assert argv[3:] == ["-n", "6", "-r", "4", "-o", "jsonl", "-t", "1", "-p", "16"]
    assert r["device"] == "adb:FAKE1"
    assert sorted(p.name for p in (tmp_path / "dev").glob("*/*")) == ["01-t1", "02-t2"]


# -- the campaign file's rules ------------------------------------------------------------


def _error(tmp: Path, model: Path, body: str, transport: str = "local") -> str:
    cells = write_campaign(tmp, model, body)
    cells.write_text(cells.read_text().replace('transport = "local"',
                                               f'transport = "{transport}"'))
    p = abbench("campaign", cells, "--out", tmp / "r", "--dry-run")
    assert p.returncode == 2, p.stdout + p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr
    assert str(cells) in errors[0]
    assert not (tmp / "r").exists()
    return errors[0]


@pytest.mark.parametrize(("body", "says"), [
    ('llama = { n = 8 }', "`cells.a.llama.n`: `-n` is set by `tokens` in a llama-bench cell"),
    ('llama = { "--output" = "md" }', "`cells.a.llama.--output`: `--output` is set by abbench"),
    ('cache_mib = 4', "`cells.a.cache_mib`: cell `a` runs llama-bench: `cache_mib` is an "
     "embedded-engine key"),
    ('repetitions = 0', "`cells.a.repetitions`: must be in 1 .. 1000"),
    ('llama_cpp_bin = "/nonexistent"', "`cells.a.llama_cpp_bin`: no `llama-bench` in "
     "/nonexistent"),
])
def test_llama_cell_mistakes_are_one_error_naming_the_key(tiny_model: Path, fake_bin: Path,
                                                          tmp_path: Path, body: str,
                                                          says: str) -> None:
    text = f'[cells.a]\nengine = "llama-bench"\nllama_cpp_bin = "{fake_bin}"\n{body}\n'
    if body.startswith("llama_cpp_bin"):
        text = f'[cells.a]\nengine = "llama-bench"\n{body}\n'
    assert says in _error(tmp_path, tiny_model, text)


def test_a_completion_cell_refuses_what_fixes_its_measure(tiny_model: Path, fake_bin: Path,
                                                          tmp_path: Path) -> None:
    text = (f'[cells.a]\nengine = "llama-completion"\nllama_cpp_bin = "{fake_bin}"\n'
            'llama = { temp = 0.8 }\n')
    assert "`--temp` is set by abbench (greedy, fixed length, one shot)" in _error(
        tmp_path, tiny_model, text)


def test_llama_keys_on_an_embedded_cell_and_synthetic_models_on_a_device(
        tiny_model: Path, fake_bin: Path, tmp_path: Path) -> None:
    assert "`cells.a.repetitions`: applies to llama.cpp cells only" in _error(
        tmp_path, tiny_model, "[cells.a]\nrepetitions = 3\n")
    (tmp_path / "2").mkdir()
    says = _error(tmp_path / "2", tiny_model,
                  '[cells.a]\nengine = "llama-bench"\nmodel = "synthetic:tiny"\n',
                  transport="ssh:lab")
    assert "`cells.a.model`" in says and "built on this machine" in says


def test_unknown_engine_lists_the_llama_tools(tiny_model: Path, tmp_path: Path) -> None:
    says = _error(tmp_path, tiny_model, '[cells.a]\nengine = "llama-benhc"\n')
    assert "`llama-bench`" in says and "llama-completion" in says


def test_resolved_campaign_reads_back_to_the_same_cells(tiny_model: Path, fake_bin: Path,
                                                        tmp_path: Path) -> None:
    extra = textwrap.dedent(f"""
        [cells.c]
        engine = "llama-completion"
        llama_cpp_bin = "{fake_bin}"
        llama = {{ fa = "on", "-nr" = true, mmap = false }}
        """)
    cells = write_campaign(tmp_path, tiny_model, BENCH_CELLS.format(bin=fake_bin) + extra,
                           head='order = ["t1", "t2", "c"]')
    spec = load_campaign(cells)
    again = tmp_path / "resolved.toml"
    again.write_text(resolved_toml(spec))
    back = load_campaign(again)
    assert {n: c.to_config() for n, c in back.cells.items()} == \
        {n: c.to_config() for n, c in spec.cells.items()}
    c = spec.cells["c"].llama
    assert c is not None and c.argv("llama-completion", "m.gguf")[-3:] == ["-fa", "on", "-nr"]


def test_option_names_map_to_llama_cpp_flags() -> None:
    assert [flag(k) for k in ("t", "fa", "ngl", "threads", "n_prompt", "-nr", "--mmap")] == \
        ["-t", "-fa", "-ngl", "--threads", "--n-prompt", "-nr", "--mmap"]
    cell = LlamaCell("llama-bench", "m.gguf", 32, "", options=(("t", 2), ("x", False)))
    assert cell.argv("/b/llama-bench", "/m.gguf") == [
        "/b/llama-bench", "-m", "/m.gguf", "-n", "32", "-r", "5", "-o", "jsonl", "-t", "2"]


# -- the real llama.cpp --------------------------------------------------------------------


@pytest.mark.slow
def test_the_shipped_llama_cpp_campaign_runs_end_to_end(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from llamacpp import Unavailable, build

    try:
        bin_dir = build()
    except Unavailable as e:
        pytest.skip(str(e))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    p = abbench("campaign", ROOT / "cells" / "llama-cpp.toml", "--out", tmp_path / "r",
                "--sentinels", tmp_path / "s", "--no-live", timeout=1800)
    assert p.returncode in (0, 1, 3), p.stdout + p.stderr
    r = _report(tmp_path / "r")
    assert all(c["status"] == "ok" for c in r["cells"]), [c["error"] for c in r["cells"]]
    for c in r["cells"]:
        assert c["source"] == "per_token" and len(c["wall_ms"]) >= 3
        assert c["prefill_tok_s"] is not None and c["entry"]["probe_index"] is not None
        assert 0 < c["stability"] <= 1  # over its five repetitions
    assert r["drift"] and r["drift"][0]["fingerprints"] == "equal"
    (d,) = r["decisions"]
    assert d["verdict"] in ("GO", "NO-GO", "INCONCLUSIVE", "OWED")
    if d["verdict"] != "OWED":
        assert any(pair["state"] == "matched" for pair in r["pairs"])
    md = (run_folder(tmp_path / "r") / "report.md").read_text()
    assert "llama-bench" in md
