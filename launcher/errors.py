"""User-facing errors: printed without a traceback, exit code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class UserError(Exception):
    """A mistake in what the user asked for: the message names the key, the rule, what works."""

    exit_code = 2


class ConfigError(UserError):
    """One or more problems with a composed configuration."""

    def __init__(self, problems: list[str], unparsed: Sequence[str] = ()):
        self.problems = problems
        # Overrides that are not key=value at all (a bare word): no key names them, so the
        # problem says which override it is about here (launcher.verdict sets them aside).
        self.unparsed = tuple(unparsed)
        super().__init__("\n".join(problems))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest candidate, or '' when none is close. Candidates that
    start with the word come first ('h100' -> 'h100-80gb', 'h100-pcie' rather than 'h800')."""
    options = list(candidates)
    starting = [c for c in options if word and c.startswith(word) and c != word]
    if starting:
        shown = " or ".join(repr(c) for c in sorted(starting)[:3])
        return f" (did you mean {shown}?)"
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
