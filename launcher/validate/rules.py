"""The named rules that catch impossible layouts before anything is launched.

Each rule is registered by name in ``RULES`` (launcher/validate/rule.py says what a rule is). A
violation names the key(s), the rule in words, the numbers, and the nearest values that would work.
``check(cfg)`` runs every rule and returns all violations, errors and warnings together; it never
mutates the config. The rules live by concern: the value ranges here; how the ranks split the
model (launcher/validate/parallel_rules.py); how the work splits (split_rules.py); the rest of the
configuration (config_rules.py).

Conventions stated once:
- Rank placement, innermost first: tp, cp, dp, pp (Megatron-LM's order). Expert parallel groups are
  carved out of the ranks of one pipeline stage the backend names (``backends.expert_span``):
  dp x cp, or tp x cp x dp with Megatron-core's MoE parallel folding; ep must divide that product.
- Grouped-query attention under tensor parallel: tp must divide num_kv_heads, or num_kv_heads must
  divide tp, in which case each kv head is replicated tp / num_kv_heads times (Megatron-LM requires
  the first; the torch backend also runs the second).
- Context parallel is load-balanced (each rank holds two of 2*cp sequence chunks), so
  seq_length must divide by 2 * cp.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.validate.config_rules import CONFIG_RULES, run_name_problem
from launcher.validate.parallel_rules import ATTENTION_HEADS, EXPERT_PARALLEL, WORLD_SIZE
from launcher.validate.rule import (
    ERROR,
    RULES,
    WARNING,
    LayoutRule,
    Violation,
    divisors,
    layout_conditions,
    nearest,
    rule,
)
from launcher.validate.rule import error as _error
from launcher.validate.split_rules import (
    BATCH_ARITHMETIC,
    CONTEXT_PARALLEL,
    PIPELINE_SPLIT,
    TENSOR_PARALLEL_SHAPES,
)
from launcher.validate.values import value_problems

__all__ = [
    "ERROR",
    "RULES",
    "WARNING",
    "LayoutRule",
    "Violation",
    "check",
    "divisors",
    "layout_conditions",
    "nearest",
    "passes",
    "run_name_problem",
    "value_range_problems",
]

# The registry, in the order `check()` reports (positive-values, below, runs first).
for _declared in (
    WORLD_SIZE,
    EXPERT_PARALLEL,
    ATTENTION_HEADS,
    PIPELINE_SPLIT,
    CONTEXT_PARALLEL,
    TENSOR_PARALLEL_SHAPES,
    BATCH_ARITHMETIC,
):
    RULES[_declared.name] = _declared
RULES.update(CONFIG_RULES)


def check(cfg: LLMTrainConfig) -> list[Violation]:
    """Every violation of every rule, errors first."""
    layout = derive_layout(cfg)
    found: list[Violation] = []
    positive = RULES["positive-values"](cfg, layout)
    found += positive
    bad = {key for v in positive if v.is_error for key in v.keys}
    if bad:
        # The other rules divide by these values: they run on the configuration with the bad
        # values at their schema defaults, and report only what does not involve those keys.
        repaired = _with_defaults(cfg, bad)
        if repaired is None:
            return found
        cfg, layout = repaired
    for name, fn in RULES.items():
        if name != "positive-values":
            found += [v for v in fn(cfg, layout) if not set(v.keys) & bad]
    return sorted(found, key=lambda v: v.severity != ERROR)


def value_range_problems(cfg: LLMTrainConfig) -> list[Violation]:
    """The value-range rule alone (zero.stage=9, parallel.tp=0, ...): what can be said of keys
    without the rest of the configuration."""
    return RULES["positive-values"](cfg, derive_layout(cfg))


def _with_defaults(cfg: LLMTrainConfig, keys: set[str]) -> tuple[LLMTrainConfig, Layout] | None:
    """`cfg` with these dotted keys at their schema defaults (None if that is still unusable)."""
    sections: dict[str, object] = {}
    for key in keys:
        section, _, name = key.partition(".")
        current = sections.get(section, getattr(cfg, section, None))
        if current is None or not dataclasses.is_dataclass(current) or not name:
            return None
        fresh: Any = cast(Any, type(current))()
        sections[section] = dataclasses.replace(current, **{name: getattr(fresh, name)})  # type: ignore[type-var]
    repaired = dataclasses.replace(cfg, **sections)  # type: ignore[arg-type]
    if RULES["positive-values"](repaired, derive_layout(repaired)):
        return None
    return repaired, derive_layout(repaired)


# --- rules ---


# Each key's value on its own: the bounds its schema field declares and what the ranks can hold
# (launcher/validate/values.py).
@rule("positive-values")
def positive_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [_error("positive-values", keys, message) for keys, message in value_problems(cfg)]


def passes(cfg: LLMTrainConfig) -> bool:
    """Whether `cfg` passes every rule (plan's fixes are offered only when they do)."""
    return not any(v.is_error for v in check(cfg))
