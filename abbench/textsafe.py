"""Text abbench did not write, made safe to show on a terminal.

A model's `general.name`, a cell name in a run folder made elsewhere, a transport string,
what an external cell wrote: any of them can hold control characters. Printed raw, an
escape sequence recolours or clears the terminal, a right-to-left override reverses what
follows it, a newline splits one message into two that look like abbench's own. `shown`
writes each such character as a visible escape (`\\x1b`, `\\u202e`, `\\n`) and leaves every
other character as it is.

It is applied where foreign text meets a line abbench prints, not to the stream: abbench
prints its own colours (rich) and its own newlines, and on a stream neither can be told
from a foreign one. abbench's own words hold no control character, so a whole composed
line (an `ERROR:` message, a progress line) can go through `shown` as it is.
"""

from __future__ import annotations

# What a terminal or a text viewer acts on instead of showing: C0 but the tab (a tab only
# moves the cursor right), DEL and C1 (ESC and CSI start escape sequences; CR rewrites a
# line), the bidirectional embeddings, overrides, isolates and marks (they reorder what
# follows them), and the Unicode line and paragraph separators (a line break to some
# viewers).
_CONTROLS = (
    [c for c in range(0x20) if c != 0x09] + list(range(0x7F, 0xA0))
    + [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
    + [0x2028, 0x2029]
)
_NAMED = {0x0A: "\\n", 0x0D: "\\r"}


def _escape(code: int) -> str:
    return _NAMED.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


_TABLE = {code: _escape(code) for code in _CONTROLS}


def shown(text: object) -> str:
    """`text` with every control character written as a visible escape: one line, in the
    order it was written, unable to restyle or move the cursor."""
    return str(text).translate(_TABLE)
