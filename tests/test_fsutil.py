"""fsutil.atomic_write_text on paths that are not plain files (issue 33, class 1 and 2):
devices and fifos are written through, never renamed over; links stay links.

The device nodes are made in a temporary folder (`mknod`, as root), copies of /dev/null
and /dev/full: the machine's own are never at risk from a regression here.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_main

from abbench import fsutil
from abbench.fsutil import append_line, atomic_write_text, check_own_file, cut_torn_tail


def device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device of the memory driver (1, minor): 3 null, 7 full."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


def is_char_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


def test_a_device_is_written_through_not_replaced(tmp_path: Path) -> None:
    null = device(tmp_path, "null", 3)
    atomic_write_text(null, "discarded\n")
    assert is_char_device(null)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temp file left


def test_a_full_device_fails_naming_it_and_stays_a_device(tmp_path: Path) -> None:
    full = device(tmp_path, "full", 7)
    with pytest.raises(OSError) as e:
        atomic_write_text(full, "x" * 100)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(full)
    assert is_char_device(full)


def test_a_fifo_nobody_reads_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as e:
        atomic_write_text(fifo, "x\n")
    assert e.value.errno == errno.ENXIO and e.value.filename == str(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_link_stays_a_link_and_its_file_gets_the_text(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "made.json")
    atomic_write_text(dangling, "made\n")
    assert dangling.is_symlink() and (tmp_path / "made.json").read_text() == "made\n"


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        atomic_write_text(tmp_path, "x")


def test_engine_outputs_onto_a_device_keep_the_device(tiny_model: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """`abbench engine run --csv DEV --json DEV` through the real CLI: the run succeeds and
    the nodes are still devices; onto a full device, one ERROR line naming it, exit 2."""
    null = device(tmp_path, "null", 3)
    rc, _, err = run_main(["engine", "run", "-m", str(tiny_model), "-n", "2", "-q",
                           "--csv", str(null), "--json", str(null)], capsys)
    assert rc == 0, err
    assert is_char_device(null)
    full = device(tmp_path, "full", 7)
    rc, _, err = run_main(["engine", "run", "-m", str(tiny_model), "-n", "2", "-q",
                           "--json", str(full)], capsys)
    assert rc == 2 and err.count("ERROR:") == 1 and str(full) in err
    assert "Traceback" not in err and is_char_device(full)
    out = tmp_path / "run.json"
    link = tmp_path / "run-link.json"
    link.symlink_to(out)
    rc, _, err = run_main(["engine", "run", "-m", str(tiny_model), "-n", "2", "-q",
                           "--json", str(link)], capsys)
    assert rc == 0 and link.is_symlink() and json.loads(out.read_text())["format"]
    assert sys.platform != "win32"  # the nodes above exist only where mknod does


def test_model_synth_into_a_folder_that_takes_no_files_is_one_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Class 3: /proc exists but takes no new files: one ERROR naming the file asked for,
    exit 2, no traceback (before: `FileNotFoundError` from the temp file beside it)."""
    rc, _, err = run_main(["model", "synth", "-o", "/proc/abbench-x.gguf"], capsys)
    assert rc == 2
    assert err.count("ERROR:") == 1 and "/proc/abbench-x.gguf:" in err
    assert "Traceback" not in err and ".part" not in err


def test_whole_files_built_beside_their_path_never_replace_a_device_or_a_link(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model (`model synth -o`) and a route trace (`engine run --route-trace`) are built
    in a temp file and renamed into place: onto a device that rename replaced the device
    (as root, /dev/null itself). Now a device or fifo is one ERROR before anything is
    written, and a link stays a link while its file gets the model."""
    null = device(tmp_path, "null", 3)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["model", "synth", "-o", str(null)],
                 ["engine", "run", "-m", str(tiny_model), "-n", "2", "-q",
                  "--route-trace", str(fifo)]):
        rc, _, err = run_main(argv, capsys)
        assert rc == 2 and err.count("ERROR:") == 1 and "not a regular file" in err, err
    assert is_char_device(null) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    model, link = tmp_path / "m.gguf", tmp_path / "link.gguf"
    link.symlink_to(model)
    rc, _, err = run_main(["model", "synth", "-o", str(link)], capsys)
    assert rc == 0, err
    assert link.is_symlink() and model.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.gguf", "m.gguf",
                                                          "null"]


# --- files abbench appends to or owns: never through a link, never onto a device ---------

# a line appended the two ways abbench appends: opened per line, or the file held open
APPENDERS = {"per-line": append_line,
             "held": lambda path, line: fsutil.LineAppender(path).append(line)}


@pytest.mark.parametrize("append", APPENDERS.values(), ids=APPENDERS.keys())
def test_appending_through_a_link_is_refused_and_its_file_untouched(
        tmp_path: Path, append: Callable[[Path, str], None]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    link = tmp_path / "history.jsonl"
    link.symlink_to(notes)
    with pytest.raises(OSError) as e:
        append(link, '{"kind": "repeat"}\n')
    assert e.value.filename == str(link) and "symbolic link" in e.value.strerror
    with pytest.raises(OSError):
        cut_torn_tail(link)  # it truncates: the worst thing to do through a link
    assert notes.read_text() == "my notes\n" and link.is_symlink()


def test_appending_onto_a_device_or_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "journal.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as e:
        append_line(fifo, "{}\n")
    assert e.value.filename == str(fifo) and "not a regular file" in e.value.strerror
    with pytest.raises(OSError):
        check_own_file(fifo)
    check_own_file(tmp_path / "missing.jsonl")  # abbench creates it: fine


def test_a_device_history_that_is_a_link_stops_the_campaign_before_its_first_cell(
        tiny_model: Path, tmp_path: Path) -> None:
    import socket

    from test_campaign_run import abbench, write_campaign

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    history = tmp_path / "s" / f"{socket.gethostname()}.jsonl"
    history.parent.mkdir()
    history.symlink_to(notes)
    cells = write_campaign(tmp_path, tiny_model, """
        [cells.B]
        overlap = true
        """, head='order = ["B", "B"]')
    p = abbench("campaign", cells, "--out", tmp_path / "r", "--sentinels", tmp_path / "s",
                "--no-live")
    assert p.returncode == 2, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("ERROR:")]
    assert errors == [f"ERROR: cannot write {history}: is a symbolic link; abbench appends "
                      "only to a file of its own there (remove the link)"], p.stderr
    assert "Traceback" not in p.stderr
    assert notes.read_text() == "my notes\n"
    assert not list((tmp_path / "r").iterdir())  # no run folder: nothing ran


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path: Path, mask: int) -> None:
    """Issue 42, class 7: mkstemp's 0600 was every report's mode; now the umask's, as the
    shell's `>` gives, and a file written over keeps its own mode."""
    old = os.umask(mask)
    try:
        assert fsutil.umask() == mask
        fsutil.atomic_write_text(tmp_path / "new.md", "x")
        fsutil.append_line(tmp_path / "log.jsonl", "{}\n")
        assert fsutil.folder_mode() == 0o777 & ~mask
    finally:
        os.umask(old)
    assert (tmp_path / "new.md").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (tmp_path / "log.jsonl").stat().st_mode & 0o777 == 0o666 & ~mask
    os.chmod(tmp_path / "new.md", 0o640)
    fsutil.atomic_write_text(tmp_path / "new.md", "y")
    assert (tmp_path / "new.md").stat().st_mode & 0o777 == 0o640


# --- a file held open for many lines (the sampler's samples.jsonl) ---------------------

def test_a_held_file_gets_whole_lines_after_cutting_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text('{"t": 1}\n{"t": 2, "va')  # a crash mid-line
    out = fsutil.LineAppender(path)
    with pytest.warns(UserWarning, match="torn last line"):
        out.append('{"t": 3}\n')
    out.append('{"t": 4}\n')
    out.close()
    out.close()  # twice: nothing
    assert path.read_text() == '{"t": 1}\n{"t": 3}\n{"t": 4}\n'


def test_a_held_file_undoes_a_line_the_disk_refused_and_names_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "samples.jsonl"
    out = fsutil.LineAppender(path)
    out.append('{"t": 1}\n')
    monkeypatch.setattr(fsutil, "_fault_hits", Counter())
    monkeypatch.setenv(fsutil.FAULT_ENV, "enospc:samples.jsonl:1")  # half the line, then full
    with pytest.raises(OSError) as e:
        out.append('{"t": 2, "long": "' + "x" * 100 + '"}\n')
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    monkeypatch.delenv(fsutil.FAULT_ENV)
    out.append('{"t": 3}\n')  # the file is whole lines again, and still held
    out.close()
    assert path.read_text() == '{"t": 1}\n{"t": 3}\n'
