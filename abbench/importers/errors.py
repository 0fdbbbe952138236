"""The one error the importers raise: a foreign file that cannot be read, with where."""

from __future__ import annotations

from pathlib import Path

from abbench.errors import AbbenchError


class ForeignRunError(AbbenchError):
    """A file from a run made elsewhere that cannot be imported (names the file and line)."""

    def __init__(self, source: str | Path, message: str, line: int | None = None,
                 tip: str | None = None) -> None:
        where = f"{source}:{line}" if line is not None else str(source)
        super().__init__(f"{where}: {message}", tip=tip)
        self.source = str(source)
        self.line = line


def read_text(path: Path) -> str:
    """A foreign file's text (UTF-8, a leading BOM dropped); unreadable → ForeignRunError."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ForeignRunError(path, f"cannot read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ForeignRunError(path, f"not UTF-8 text (byte {e.start})") from None
    return text.removeprefix("\ufeff")


def number(text: str, source: str | Path, line: int | None, what: str) -> float:
    """A finite number, or ForeignRunError naming `what`."""
    try:
        value = float(text)
    except ValueError:
        raise ForeignRunError(source, f"{what}: {text!r} is not a number", line) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ForeignRunError(source, f"{what}: {text!r} is not a finite number", line)
    return value
