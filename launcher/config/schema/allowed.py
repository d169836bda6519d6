"""What values a key of the schema allows, declared on its field (``field(metadata=...)``).

A schema field carries an ``Allowed`` in its metadata: a fixed set of words (``one_of``), or
bounds on a number (``bounds``). One declaration serves composition's choice check
(``compose.choice_problems``), validate's value ranges (``launcher.validate.values``), shell
completion of values (``cli_hints``) and docs/configuration.md (``config.reference_doc``);
``config.key_info`` reads them by dotted key. Pure data: imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The key of a field's metadata mapping that holds its Allowed.
METADATA_KEY = "llmtrain.allowed"


@dataclass(frozen=True)
class Allowed:
    """Choices or bounds of one key. Bounds follow pydantic's names: ge (>=), gt (>), le (<=),
    lt (<). A list key's bounds hold for each element, and ``length`` says how many it has."""

    choices: tuple[str, ...] = ()
    ge: int | float | None = None
    gt: int | float | None = None
    le: int | float | None = None
    lt: int | float | None = None
    # The upper bound is another key's value (optim.min_lr <= optim.lr).
    le_key: str | None = None
    length: int | None = None
    # Values above this pass the bounds but are typos, not plans.
    typo_above: int | None = None
    # A value that works, shown in the error message, and why the range is what it is.
    example: str | None = None
    why: str | None = None

    @property
    def low(self) -> tuple[int | float, str] | None:
        """The lower bound and its operator, or None."""
        if self.gt is not None:
            return self.gt, ">"
        return (self.ge, ">=") if self.ge is not None else None

    @property
    def high(self) -> tuple[int | float | str, str] | None:
        """The upper bound (a number, or a key's name) and its operator, or None."""
        if self.lt is not None:
            return self.lt, "<"
        if self.le is not None:
            return self.le, "<="
        return (self.le_key, "<=") if self.le_key is not None else None

    def interval(self) -> str:
        """Both bounds as an interval: [0, 1), [0, 3]."""
        low, high = self.low, self.high
        assert low is not None and high is not None
        return f"{'(' if low[1] == '>' else '['}{low[0]}, {high[0]}{')' if high[1] == '<' else ']'}"

    def describe(self) -> str:
        """The allowed values in words, for the reference page."""
        if self.choices:
            return ", ".join(f"`{c}`" for c in self.choices)
        low, high = self.low, self.high
        if low and high:
            text = self.interval()
        elif low:
            text = f"{low[1]} {low[0]}"
        elif high:
            text = f"{high[1]} {high[0]}"
        else:
            text = ""
        if self.length is not None:
            text = f"{self.length} values, each in {text}"
        if self.typo_above is not None:
            text += f"; above {self.typo_above:,} is refused as a typo"
        if self.why:
            text += f" ({self.why})"
        return text


def one_of(*choices: str) -> dict[str, Any]:
    """Field metadata: the value is one of these words."""
    return {METADATA_KEY: Allowed(choices=tuple(choices))}


def bounds(**limits: Any) -> dict[str, Any]:
    """Field metadata: the value lies within these bounds (Allowed's fields)."""
    return {METADATA_KEY: Allowed(**limits)}
