"""What a validation rule is, and the one registry of them.

A rule is a function ``(cfg, layout) -> list[Violation]`` registered under its name (``RULES``).
The rules about the layout are declared instead (``declare``): an ordered list of conditions
(``LayoutRule``), each with the layout values it reads, its check, the keys it names, its message
and the values that work; plain functions stand in for what is not a condition on the layout.
``check()`` (launcher/validate/rules.py) words every violation from these objects, and the layout
search (launcher/search/space.py) prunes a partial layout with every error condition
(``layout_conditions``) at the level where the values it reads are fixed: one copy of each rule.

The values a condition reads (``LAYOUT_VALUES``) are those the search varies or derives; everything
else it reads from the configuration, which the search never varies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

ERROR = "error"
WARNING = "warning"

# The layout values a LayoutRule may read, in the order the layout search fixes them (dp is
# derived from the world size once tp, cp and pp are; microbatches from the batch sizes once the
# micro-batch size is). In `validate`, dp is None when dp x tp x pp x cp does not cover the world:
# the world-size rule says so, and the conditions reading dp stay silent. The recomputation is not
# one (no rule reads it): a condition on it would need a level of its own in the search.
LAYOUT_VALUES = (
    "tp",
    "cp",
    "pp",
    "dp",
    "ep",
    "micro_batch_size",
    "microbatches",
    "pp_schedule",
    "vpp",
    "sequence_parallel",
    "zero_stage",
    "offload_optimizer",
)

# A condition's view of the layout: LAYOUT_VALUES -> value (in the search, only those fixed).
Values = Mapping[str, Any]


@dataclass(frozen=True)
class Violation:
    rule: str
    severity: str
    keys: tuple[str, ...]
    message: str

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR


def error(name: str, keys: tuple[str, ...], message: str) -> Violation:
    return Violation(name, ERROR, keys, message)


def warning(name: str, keys: tuple[str, ...], message: str) -> Violation:
    return Violation(name, WARNING, keys, message)


def no_values(cfg: LLMTrainConfig, v: Values) -> Sequence[int]:
    """For a condition whose message names no list of values that work."""
    return ()


@dataclass(frozen=True)
class LayoutRule:
    """One condition of a rule on the layout.

    name: the rule it belongs to (what `validate` prints and the search counts rejections under).
    reads: the LAYOUT_VALUES its check, keys and message read.
    keys: the configuration keys a violation names (or a function of the values giving them).
    holds: whether the condition holds for these values.
    message: the violation's text, given the values that work.
    works: the values that work (nearest valid degrees), handed to `message`.
    """

    name: str
    reads: tuple[str, ...]
    keys: tuple[str, ...] | Callable[[LLMTrainConfig, Values], tuple[str, ...]]
    holds: Callable[[LLMTrainConfig, Values], bool]
    message: Callable[[LLMTrainConfig, Values, Sequence[int]], str]
    works: Callable[[LLMTrainConfig, Values], Sequence[int]] = no_values
    severity: str = ERROR

    def __post_init__(self) -> None:
        unknown = set(self.reads) - set(LAYOUT_VALUES)
        if unknown:
            raise ValueError(f"rule {self.name} reads {sorted(unknown)}, not layout values")

    def violation(self, cfg: LLMTrainConfig, values: Values) -> Violation | None:
        """The violation of this condition (None when it holds)."""
        if self.holds(cfg, values):
            return None
        keys = self.keys(cfg, values) if callable(self.keys) else self.keys
        text = self.message(cfg, values, self.works(cfg, values))
        return Violation(self.name, self.severity, keys, text)


RuleFn = Callable[[LLMTrainConfig, Layout], list[Violation]]
Part = LayoutRule | RuleFn


@dataclass(frozen=True)
class DeclaredRule:
    """A rule made of declared parts, run in order: conditions on the layout, and plain functions
    for the rest (values of other keys, warnings that need the whole layout)."""

    name: str
    parts: tuple[Part, ...]

    def __call__(self, cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
        values = layout_values(cfg, layout)
        out: list[Violation] = []
        for part in self.parts:
            if isinstance(part, LayoutRule):
                found = part.violation(cfg, values)
                out += [found] if found else []
            else:
                out += part(cfg, layout)
        return out


RULES: dict[str, RuleFn] = {}


def rule(name: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        RULES[name] = fn
        return fn

    return register


def declare(name: str, *parts: Part) -> DeclaredRule:
    """A rule made of these parts (a condition named after another rule is refused). It counts
    once it is in RULES (launcher/validate/rules.py registers the built-in ones in order)."""
    for part in parts:
        if isinstance(part, LayoutRule) and part.name != name:
            raise ValueError(f"condition of rule {part.name} declared under {name}")
    return DeclaredRule(name, parts)


def layout_conditions() -> list[LayoutRule]:
    """Every declared condition of every registered rule, in the order `check()` runs them."""
    return [
        part
        for fn in RULES.values()
        if isinstance(fn, DeclaredRule)
        for part in fn.parts
        if isinstance(part, LayoutRule)
    ]


def dp_consistent(layout: Layout) -> bool:
    """dp x tp x pp x cp covers the world. When it does not, the world-size rule says so, and the
    rules that need dp (batch arithmetic, expert groups) stay silent rather than reason from a
    rounded-down dp."""
    return layout.dp * layout.model_parallel_size == layout.world_size


def layout_values(cfg: LLMTrainConfig, layout: Layout) -> dict[str, Any]:
    """The LAYOUT_VALUES of a configuration, as `validate` hands them to the conditions."""
    p = cfg.parallel
    return {
        "tp": p.tp,
        "cp": p.cp,
        "pp": p.pp,
        "dp": layout.dp if dp_consistent(layout) else None,
        "ep": p.ep,
        "micro_batch_size": layout.micro_batch_size,
        "microbatches": layout.num_microbatches,
        "pp_schedule": p.pp_schedule,
        "vpp": p.vpp,
        "sequence_parallel": p.sequence_parallel,
        "zero_stage": cfg.zero.stage,
        "offload_optimizer": cfg.zero.offload_optimizer,
    }


# --- what the messages say ---


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest(values: Iterable[int], target: float, count: int = 3) -> list[int]:
    """The `count` values closest to target, in ascending order."""
    return sorted(sorted(set(values), key=lambda v: (abs(v - target), v))[:count])


def join(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)
