"""A value read from a file, as an error message may show it: short and escaped.

Errors about files llmtrain reads (a profile, a model's config.json, a run file, an output
marker, a file name found in a folder) name the key and what is wrong; where showing the value
helps, they show ``excerpt(value)``: at most ``LIMIT`` characters, every control character (an
ANSI escape, a newline, a carriage return that would overwrite the terminal line) and every
non-ASCII character escaped as Python writes it (``\\x1b``, ``\\n``, ``\\u202e``), a longer value
cut with its length said. Nested values are shortened level by level (reprlib), never rendered
whole first. A sentence a file writes for people to read (a chat template's ``raise_exception``
message, a library's error about a file) is quoted the same way, up to ``MESSAGE_LIMIT``
characters: real templates' messages run to about 110.
"""

from __future__ import annotations

import reprlib
from typing import Any

LIMIT = 40
MESSAGE_LIMIT = 200

_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = LIMIT
_REPR.maxother = LIMIT
_REPR.maxlong = LIMIT
for _name in ("maxdict", "maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _name, 4)


def _escaped(text: str) -> str:
    """`text` with everything outside printable ASCII escaped (backslash escapes)."""
    return "".join(
        ch if " " <= ch <= "~" else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def excerpt(value: Any, limit: int = LIMIT) -> str:
    """`value` as an error message may quote it (see the module docstring)."""
    if isinstance(value, str):
        shown = _escaped(value[: limit + 1]).replace("'", "\\'")
        if len(shown) > limit:
            return f"'{shown[:limit]}'... ({len(value):,} characters)"
        return f"'{shown}'"
    try:
        text = _REPR.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"
    text = _escaped(text)
    return text if len(text) <= limit + 20 else text[: limit + 20] + "..."


def name(text: str, limit: int = 80) -> str:
    """A file or folder name found on disk, for a message: escaped, shortened, unquoted when it
    is plain."""
    shown = _escaped(text)
    if len(shown) > limit:
        shown = shown[:limit] + f"... ({len(text):,} characters)"
    return shown


def message(text: str) -> str:
    """A sentence from a file (see the module docstring): escaped, at most MESSAGE_LIMIT
    characters, quoted."""
    return excerpt(text, MESSAGE_LIMIT)
