"""`abbench import` on folders and destinations chosen to do harm (issue 33): links out of
the folder are not read, a destination that cannot be written is one error, and a line too
long to be real is not read whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_main

from abbench import fsutil
from abbench.errors import ForeignRunError
from abbench.records import read_journal, text
from abbench.records.text import read_text

ROWS = "step,steps,wall_ms,read_bytes\n1,2,500.0,100\n2,2,250.0,50\n"
SECRET = "# bmoe_metrics v1\n# model=SECRET-OUTSIDE\n" + ROWS  # a run the import must not see


def _folder(root: Path, files: dict[str, str]) -> Path:
    src = root / "src"
    src.mkdir()
    for name, body in files.items():
        (src / name).write_text(body)
    return src


def _import(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_main(["import", *argv, "--style", "plain"], capsys)


def _tree(root: Path) -> str:
    """Every file's text under `root`, to search for what must not be there."""
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


# --- class 2: nothing outside the folder is read --------------------------------------------


def test_links_out_of_the_folder_are_listed_not_read(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text(SECRET)
    src = _folder(tmp_path, {"a.csv": ROWS})
    (src / "b.csv").symlink_to("../outside/secret.csv")       # a file outside
    (src / "hop").symlink_to(outside / "secret.csv")
    (src / "d.csv").symlink_to("hop")                          # out through a second link
    (src / "e.csv").symlink_to(outside)                        # a folder outside
    (src / "c.csv").symlink_to("a.csv")                        # inside: may be read
    rc, _, err = _import([str(src), "--out", str(tmp_path / "run")], capsys)
    assert rc in (0, 3) and "Traceback" not in err, err
    assert [r.label for r in read_journal(tmp_path / "run")] == ["01-a", "02-c"]
    md = (tmp_path / "run" / "report.md").read_text()
    for name, kind in (("b.csv", "file"), ("d.csv", "file"), ("e.csv", "folder")):
        said = f"{name}: a link to a {kind} outside the imported folder"
        assert f"not imported: {src / said}" in err and f"- {said}\n" in md  # warned, listed
    assert "SECRET" not in _tree(tmp_path / "run")


def test_a_folder_of_links_out_is_one_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "secret.csv").write_text(SECRET)
    src = _folder(tmp_path, {})
    (src / "a.csv").symlink_to(tmp_path / "secret.csv")
    rc, _, err = _import([str(src), "--out", str(tmp_path / "run")], capsys)
    assert rc == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert "no runs here" in line and "a link to a file outside the imported folder" in line
    assert not (tmp_path / "run").exists()


# --- class 3: a destination that cannot be written ------------------------------------------


@pytest.mark.parametrize(("out", "message"), [
    ("/proc/abbench-import", "cannot write /proc/abbench-import: no such file or directory"),
    ("/proc/abbench-import/deeper", "cannot write /proc/abbench-import/deeper:"),
    ("{d}/file/run", "cannot write {d}/file/run: {d}/file is not a folder"),
    ("{d}/file/a/run", "cannot write {d}/file/a/run: {d}/file is not a folder"),
    ("{d}/file", "{d}/file is not a folder: --out names the run folder to write"),
], ids=["proc", "proc-deeper", "under-a-file", "two-under-a-file", "a-file"])
def test_an_out_that_cannot_be_a_folder_is_one_error(tmp_path: Path, out: str, message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a traceback (`FileNotFoundError` from tempfile for /proc, `FileExistsError`
    from mkdir under a file)."""
    src = _folder(tmp_path, {"a.csv": ROWS})
    (tmp_path / "file").write_text("mine\n")
    before = sorted(os.listdir(tmp_path))
    rc, _, err = _import([str(src), "--out", out.format(d=tmp_path)], capsys)
    assert rc == 2 and "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert line.startswith("ERROR: " + message.format(d=tmp_path)), line
    assert ".tmp" not in err  # the temp folder's name is not the user's
    assert sorted(os.listdir(tmp_path)) == before  # nothing partial left
    assert (tmp_path / "file").read_text() == "mine\n"
    assert not [n for n in os.listdir("/proc") if n.startswith(".abbench-import")]


def test_a_failed_write_inside_out_names_the_file_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk halfway through: one error naming the file in `--out` (not the temp
    folder), and not even the folders made above `--out` are left."""
    src = _folder(tmp_path, {"a.csv": ROWS})
    monkeypatch.setattr(fsutil, "_fault_hits", Counter())
    monkeypatch.setenv(fsutil.FAULT_ENV, "enospc:plan.json:1")
    out = tmp_path / "new" / "deeper" / "run"
    rc, _, err = _import([str(src), "--out", str(out)], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert f"ERROR: cannot write {out}/plan.json: no space left on device\n" in err
    assert "TIP: free some space on that disk, then run the import again\n" in err
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_out_through_a_link_writes_the_folder_it_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the link was renamed to `.LINK.old` (and left there) and a folder took its
    place. Now the link stays a link, as for a file written through one."""
    src = _folder(tmp_path, {"a.csv": ROWS})
    (tmp_path / "target").mkdir()
    link = tmp_path / "out"
    link.symlink_to("target")
    for force in ([], ["--force"]):  # a first import, then one replacing it
        rc, out, err = _import([str(src), "--out", str(link), *force], capsys)
        assert rc in (0, 3) and "Traceback" not in err, err
        assert f"into {link} " in out
        assert link.is_symlink() and (tmp_path / "target" / "plan.json").is_file()
        assert sorted(os.listdir(tmp_path)) == ["out", "src", "target"]


def test_the_folder_behind_a_link_is_written_into_not_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42, class 6. Before: the link was kept but the folder it names was replaced —
    a new inode, mode 755 become 700, another owner's share lost. Now the folder stays (an
    empty one, and an earlier import with --force) and its entries are replaced."""
    src = _folder(tmp_path, {"a.csv": ROWS})
    target = tmp_path / "target"
    target.mkdir()
    os.chmod(target, 0o751)  # a mode abbench would never give a folder of its own
    before = os.stat(target)
    link = tmp_path / "out"
    link.symlink_to("target")
    for force in ([], ["--force"]):
        rc, _, err = _import([str(src), "--out", str(link), *force], capsys)
        assert rc in (0, 3), err
        after = os.stat(target)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
        assert (target / "plan.json").is_file() and len(read_journal(target)) == 1
        assert sorted(os.listdir(tmp_path)) == ["out", "src", "target"]  # nothing beside


def test_what_an_import_writes_has_the_modes_of_the_users_other_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42, class 7. Before: the run folder 700 and report.* 600 (mkdtemp's and
    mkstemp's modes), whatever the umask: a report written to share could not be read."""
    src = _folder(tmp_path, {"a.csv": ROWS})
    old = os.umask(0o022)
    try:
        rc, _, err = _import([str(src), "--out", str(tmp_path / "run")], capsys)
    finally:
        os.umask(old)
    assert rc in (0, 3), err
    run = tmp_path / "run"
    modes = {p.relative_to(run).as_posix(): oct(p.stat().st_mode & 0o777)
             for p in [run, *run.rglob("*")]}
    assert modes["."] == "0o755" and modes["cells"] == "0o755"
    assert {m for name, m in modes.items() if (run / name).is_file()} == {"0o644"}, modes
    assert modes["report.md"] == modes["report.html"] == modes["report.json"] == "0o644"


# --- class 9: a line too long to be real is not read whole ----------------------------------


def test_a_line_up_to_the_limit_is_read_and_one_byte_more_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text, "MAX_LINE_BYTES", 100)
    path = tmp_path / "a.log"
    path.write_text("x" * 99 + "\n" + "y" * 100)  # 100 bytes each, the newline counted
    assert read_text(path) == "x" * 99 + "\n" + "y" * 100
    path.write_text("x\n" + "y" * 100 + "\n")
    with pytest.raises(ForeignRunError) as e:
        read_text(path)
    assert e.value.message == f"{path}:2: this line is longer than 100 bytes, the longest " \
                              "abbench reads"


def test_a_file_with_a_line_over_the_limit_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is not imported (a table missing a line would be a different run), said on
    stderr and in the report; the folder's other files are imported."""
    monkeypatch.setattr(text, "MAX_LINE_BYTES", 1000)
    src = _folder(tmp_path, {
        "a.csv": ROWS,
        "a.log": "generation: 2 tokens (9.000 tok/s)\n" + "#" * 2000 + "\n",
        "z.csv": "step," + "x" * 5000 + "\n" + ROWS,
    })
    rc, _, err = _import([str(src), "--out", str(tmp_path / "run")], capsys)
    assert rc in (0, 3) and "Traceback" not in err, err
    [run] = read_journal(tmp_path / "run")
    assert run.label == "01-a" and run.tokens_per_s == pytest.approx(2 / 0.75)  # not the log's
    md = (tmp_path / "run" / "report.md").read_text()
    for name, line in (("a.log", 2), ("z.csv", 1)):
        said = f"{name}:{line}: this line is longer than 1000 bytes, the longest abbench reads"
        assert f"not imported: {src / said}" in err and f"- {said}\n" in md


# The child's own peak RSS (VmHWM), not ru_maxrss: Linux carries the high-water mark of the
# process that forked the child (pytest, hundreds of MiB late in a session) across exec,
# and the growth measured would be zero whatever the import cost.
CHILD = textwrap.dedent("""
    import sys
    from abbench.cli import main
    def hwm():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    small, big, out = sys.argv[1:]
    rcs = [main(["import", small, "--out", out + "/run-small", "--style", "plain"])]
    warm = hwm()
    rcs.append(main(["import", big, "--out", out + "/run-big", "--style", "plain"]))
    peak = hwm()
    print(rcs, (peak - warm) * 1024, file=sys.stderr)
""")


def test_the_cli_reads_a_40_mb_line_in_bounded_memory(tmp_path: Path) -> None:
    """The real CLI, in a child process: a CSV with a 40 MB line costs little more memory
    than the same folder without it (peak RSS about 4 MiB higher: the 1 MiB read and its
    copies; before the limit, 60 to 120 MiB higher)."""
    small = _folder(tmp_path, {"a.csv": ROWS})
    big = tmp_path / "big"
    big.mkdir()
    (big / "a.csv").write_text(ROWS)
    line = 40 * 2**20
    with (big / "z.csv").open("wb") as f:
        f.write(b"step,wall_ms\n1,")  # a row whose one value is the whole line
        f.write(b"9" * line)
    child = subprocess.run([sys.executable, "-c", CHILD, str(small), str(big), str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    rcs, grown = child.stderr.strip().splitlines()[-1].rsplit(" ", 1)
    assert json.loads(rcs)[1] in (0, 3) and "Traceback" not in child.stderr, child.stderr
    assert int(grown) < line // 4, f"peak RSS grew by {int(grown) / 2**20:.0f} MiB"
    assert "z.csv:2: this line is longer than 1 MiB" in child.stderr
