"""Each key's value on its own, with no other key but optim.lr in view: within the bounds its
schema field declares (``Allowed`` in launcher/config/schema/, read through
``launcher.config.schema.key_info``), and a number the ranks can hold in its dtype. The rule
``positive-values`` of launcher/validate/rules.py reports these; the other rules run on a
configuration whose bad values are put back at their defaults.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable
from functools import cache, lru_cache
from typing import Any

from launcher.config.schema import LLMTrainConfig, key_info
from launcher.config.schema.allowed import Allowed
from launcher.config.schema.keys import field_type

# (the keys a problem names, its message)
Problem = tuple[tuple[str, ...], str]

# What the ranks can hold (IEEE 754 binary32, the narrowest dtype a float setting is kept in: the
# optimizer's fp32 hyper-parameters and master weights; bf16 has the same exponent range), and
# torch's int64 for integers. Python's float and int hold far more, so `validate` passed values
# that then failed in the rank ("value cannot be converted to type float without overflow").
FP32_MAX = 3.4028234663852886e38  # largest finite binary32: (2 - 2**-23) * 2**127
FP32_TINY = 1.401298464324817e-45  # smallest positive binary32 (subnormal 2**-149): less is 0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@cache  # the schema's sections: a fixed few names and classes
def _section_fields(section: str, cls: type) -> tuple[tuple[str, str, object], ...]:
    """(field name, dotted key, schema default) of every field of a section's dataclass, read
    once (the defaults are only read)."""
    fresh = cls()
    return tuple(
        (f.name, f"{section}.{f.name}", getattr(fresh, f.name)) for f in dataclasses.fields(cls)
    )


def _schema_numbers(cfg: LLMTrainConfig) -> Iterable[tuple[str, object, object]]:
    """(dotted key, value, schema default) of every number the configuration holds (list items
    included, e.g. optim.betas), bools left out."""
    for section in dataclasses.fields(cfg):
        sub = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(sub) or isinstance(sub, type):
            continue
        for name, key, default in _section_fields(section.name, type(sub)):
            value = getattr(sub, name)
            items = value if isinstance(value, list | tuple) else (value,)
            for item in items:
                if isinstance(item, int | float) and not isinstance(item, bool):
                    yield key, item, default


def _representable_problem(value: int | float) -> str | None:
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return None
        return f"outside the 64-bit integer range [{INT64_MIN}, {INT64_MAX}] the ranks hold it in"
    if not math.isfinite(value):
        return None  # the key's own range rule says whether inf or nan is allowed
    if abs(value) > FP32_MAX:
        return f"larger than float32 holds (at most {FP32_MAX:.4g}), the dtype the ranks use"
    if value != 0 and abs(value) < FP32_TINY:
        return f"smaller than float32 holds (at least {FP32_TINY:.4g}): the ranks would see 0"
    return None


def representable_problems(cfg: LLMTrainConfig) -> list[Problem]:
    """Every number the ranks cannot hold in its dtype (float32 for floats, int64 for ints),
    named with a value that works (the schema default)."""
    out: list[Problem] = []
    for key, value, default in _schema_numbers(cfg):
        assert isinstance(value, int | float)
        problem = _representable_problem(value)
        if problem is None or any(key in keys for keys, _ in out):  # one message per key
            continue
        text = str(value) if isinstance(value, int) else f"{value:g}"
        if isinstance(default, int | float) and not isinstance(default, bool):
            works = f"e.g. {key}={default:g}"
        elif isinstance(default, list) and default:
            works = f"e.g. {key}=[{', '.join(f'{d:g}' for d in default)}]"
        else:
            works = f"leave {key} unset"
        out.append(((key,), f"{key}={text}: {problem}; {works}"))
    return out


def value_problems(cfg: LLMTrainConfig) -> list[Problem]:
    """Every key outside its declared bounds (in the schema's order), then every other number
    the ranks cannot hold."""
    out: list[Problem] = []
    for key, spec in key_info.ranges().items():
        value = _value(cfg, key)
        problem = bound_problem(cfg, key, value, spec)
        if problem is not None:
            shown = list(value) if isinstance(value, list | tuple) else value
            out.append(((key,), f"{key}={shown}: {problem}"))
    reported = {key for keys, _ in out for key in keys}
    return out + [p for p in representable_problems(cfg) if not set(p[0]) & reported]


@lru_cache(maxsize=1024)  # keys of the schema, which never changes
def _number_kind(key: str) -> tuple[bool, bool]:
    """(whether the key's field holds an integer, whether it may be None)."""
    kind = field_type(key)
    return int in (kind, *typing.get_args(kind)), type(None) in typing.get_args(kind)


def bound_problem(cfg: LLMTrainConfig, key: str, value: object, spec: Allowed) -> str | None:
    """What is wrong with `value` as the value of `key`, or None when it lies within `spec`."""
    integer, optional = _number_kind(key)
    if value is None:
        return None if optional else _bound_words(cfg, spec, integer=integer)
    if spec.length is not None:
        items = list(value) if isinstance(value, list | tuple) else []
        ok = len(items) == spec.length and all(_within(v, spec, None, integer=False) for v in items)
    else:
        limit = _value(cfg, spec.le_key) if spec.le_key else None
        ok = _within(value, spec, limit, integer=integer)
    if not ok:
        return _bound_words(cfg, spec, integer=integer)
    if spec.typo_above is not None and isinstance(value, int) and value > spec.typo_above:
        return f"implausibly large (limit {spec.typo_above:,}); check for a typo"
    return None


def _within(value: object, spec: Allowed, limit: object, *, integer: bool) -> bool:
    """Whether `value` is a finite number (an integer where `integer`) within the bounds; `limit`
    is the value of spec.le_key."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if (integer and not isinstance(value, int)) or not math.isfinite(value):
        return False
    if isinstance(limit, int | float) and not value <= limit:
        return False
    return (
        (spec.ge is None or value >= spec.ge)
        and (spec.gt is None or value > spec.gt)
        and (spec.le is None or value <= spec.le)
        and (spec.lt is None or value < spec.lt)
    )


# How many values a list key holds, in words ("need two values in [0, 1)").
_COUNT_WORDS = {1: "one", 2: "two", 3: "three"}


def _bound_words(cfg: LLMTrainConfig, spec: Allowed, *, integer: bool) -> str:
    """What a value of this key must be, in the words validate has always used (tests pin them):
    an integer range reads "0-3", an interval "[0, 1)", a lone bound "a number > 0"; a key with
    an example calls its number finite and shows the example."""
    low, high = spec.low, spec.high
    assert low is not None, "every range declares a lower bound"
    if spec.length is not None:
        count = _COUNT_WORDS.get(spec.length, str(spec.length))
        return f"need {count} values in {spec.interval()}, e.g. {spec.example}"
    if spec.le_key is not None:
        return f"must lie between {low[0]} and {spec.le_key}={_value(cfg, spec.le_key)}"
    if high is not None:
        if not integer:
            example = f", e.g. {spec.example}" if spec.example is not None else ""
            return f"must be in {spec.interval()}{example}"
        if spec.example is not None:
            return f"must be an integer in {spec.interval()} ({spec.why}), e.g. {spec.example}"
        return f"must be {low[0]}-{high[0]}"
    if spec.example is not None:
        return f"must be a finite number {low[1]} {low[0]}, e.g. {spec.example}"
    if integer and low == (1, ">="):
        return "must be a positive integer"
    if integer:
        return f"must be an integer {low[1]} {low[0]}"
    return f"must be a number {low[1]} {low[0]}"


def _value(cfg: LLMTrainConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node
