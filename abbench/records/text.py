"""Text from files abbench did not write (archived runs, an external cell's output):
decoding, numbers, and names quoted safely in messages. Errors are `ForeignRunError`s
naming the file and line."""

from __future__ import annotations

from pathlib import Path

from abbench.errors import ForeignRunError
from abbench.records.schema import LIMIT


def quote(text: str, n: int = 40) -> str:
    """`repr(text)` for a message, shortened to about `n` characters: a hostile file's
    line can be a megabyte long, and the message must stay one readable line."""
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def ascii_clip(text: str, n: int = 40) -> str:
    """A name from a binary file (a GGUF key, a route trace's model) for one message line:
    everything but printable ASCII escaped (`\\x1b`, `\\u202e`), shortened to `n`
    characters."""
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= n else shown[: n - 3] + "..."


def clip(text: str, n: int = 40) -> str:
    """A name from a file for a backticked message: control characters escaped, shortened
    to `n` characters."""
    shown = repr(text)[1:-1]
    return shown if len(shown) <= n else shown[: n - 3] + "..."


# The longest line a foreign file may hold. Real lines are short (the reference folders'
# longest is 453 bytes); a longer one is a broken or hostile file, and reading it whole
# would cost memory in proportion to it (a 200 MB one-line CSV took 1.9 GiB to parse).
MAX_LINE_BYTES = 1 << 20


def _read_bounded(path: Path) -> bytearray:
    """A foreign file's bytes, read line by line so that no line costs more than
    `MAX_LINE_BYTES` (its newline counted): a longer line stops the read there, a
    ForeignRunError naming the file and the line. Unreadable → ForeignRunError."""
    data = bytearray()  # grown in place: no second copy of the file
    try:
        with path.open("rb") as f:
            number = 0
            while line := f.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES:
                    raise ForeignRunError(path, f"this line is longer than "
                                          f"{_size(MAX_LINE_BYTES)}, the longest abbench "
                                          "reads", number)
                data += line
    except OSError as e:
        raise ForeignRunError(path, f"cannot read ({e.strerror or e})") from None
    return data


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n} bytes"


def read_text(path: Path) -> str:
    """A foreign file's text (UTF-8, a leading BOM dropped); unreadable, or a line over
    `MAX_LINE_BYTES` → ForeignRunError."""
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ForeignRunError(path, f"not UTF-8 text (byte {e.start})") from None
    return text.removeprefix("\ufeff")


def read_text_lossy(path: Path) -> tuple[str, str | None]:
    """A foreign file's text and, when it is not UTF-8, what was done about it: the bytes
    that do not decode become U+FFFD and the rest of the file is read (an engine log that
    printed a token cut mid-character is still a log). An unreadable file, or one with a
    line over `MAX_LINE_BYTES`, is an error."""
    data = _read_bounded(path)
    try:
        return data.decode("utf-8").removeprefix("\ufeff"), None
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
        bad = text.count("\ufffd")
        return text, (f"not UTF-8 from byte {e.start} ({bad} undecodable sequence"
                      f"{'s' if bad != 1 else ''} read as U+FFFD; the rest of the file is "
                      "used)")


def number(text: str, source: str | Path, line: int | None, what: str) -> float:
    """A finite number within records' `LIMIT`, or ForeignRunError naming `what`."""
    try:
        value = float(text)
    except ValueError:
        raise ForeignRunError(source, f"{what}: {quote(text)} is not a number", line) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ForeignRunError(source, f"{what}: {quote(text)} is not a finite number", line)
    if abs(value) > LIMIT:  # a record refuses it later, without the file's name
        raise ForeignRunError(source, f"{what}: {quote(text)} is out of range (at most "
                              f"{LIMIT:g})", line)
    return value
