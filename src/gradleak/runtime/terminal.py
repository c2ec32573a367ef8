"""Text gradleak does not control (private texts, reconstructions, errors, names from files
and plugins) on its way to a terminal: :func:`shown` makes it safe to print with rich, its
markup escaped and its control characters (terminal escape codes) shown as ``\\x1b`` rather
than sent to the terminal."""

from __future__ import annotations

import re

from rich.markup import escape

# C0 controls but newline and tab, DEL, C1 controls (CSI \x9b included), and the bidirectional
# overrides and isolates that reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def shown(text: object) -> str:
    """``text`` to print literally through rich: ``[unk]`` stays ``[unk]``, ``[/quote]``
    raises nothing, and ``\\x1b[31m`` reaches the terminal as those characters, not as a
    colour (newlines and tabs are kept)."""
    visible = _UNSAFE.sub(_escape_code, str(text))
    return escape(visible)


def _escape_code(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
