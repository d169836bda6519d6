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
import math
from collections.abc import Iterable
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

# What the ranks can hold (IEEE 754 binary32, the narrowest dtype a float setting is kept in: the
# optimizer's fp32 hyper-parameters and master weights; bf16 has the same exponent range), and
# torch's int64 for integers. Python's float and int hold far more, so `validate` passed values
# that then failed in the rank ("value cannot be converted to type float without overflow").
FP32_MAX = 3.4028234663852886e38  # largest finite binary32: (2 - 2**-23) * 2**127
FP32_TINY = 1.401298464324817e-45  # smallest positive binary32 (subnormal 2**-149): less is 0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _schema_numbers(cfg: LLMTrainConfig) -> Iterable[tuple[str, object, object]]:
    """(dotted key, value, schema default) of every number the configuration holds (list items
    included, e.g. optim.betas), bools left out."""
    for section in dataclasses.fields(cfg):
        sub = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(sub) or isinstance(sub, type):
            continue
        fresh = type(sub)()
        for f in dataclasses.fields(sub):
            value, default = getattr(sub, f.name), getattr(fresh, f.name)
            key = f"{section.name}.{f.name}"
            items = value if isinstance(value, list | tuple) else [value]
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


def representable_values(cfg: LLMTrainConfig) -> list[Violation]:
    """Every number the ranks cannot hold in its dtype (float32 for floats, int64 for ints),
    named with a value that works (the schema default)."""
    out: list[Violation] = []
    for key, value, default in _schema_numbers(cfg):
        assert isinstance(value, int | float)
        problem = _representable_problem(value)
        if problem is None or any(key in v.keys for v in out):  # one message per key
            continue
        text = str(value) if isinstance(value, int) else f"{value:g}"
        if isinstance(default, int | float) and not isinstance(default, bool):
            works = f"e.g. {key}={default:g}"
        elif isinstance(default, list) and default:
            works = f"e.g. {key}=[{', '.join(f'{d:g}' for d in default)}]"
        else:
            works = f"leave {key} unset"
        out.append(_error("positive-values", (key,), f"{key}={text}: {problem}; {works}"))
    return out


_POSITIVE = (
    "model.num_layers",
    "model.hidden_size",
    "model.ffn_hidden_size",
    "model.num_attention_heads",
    "model.vocab_size",
    "model.seq_length",
    "parallel.tp",
    "parallel.pp",
    "parallel.vpp",
    "parallel.cp",
    "parallel.ep",
    "train.micro_batch_size",
    "cluster.num_nodes",
    "cluster.gpus_per_node",
    "train.log_every",
    "train.eval_steps",
    "checkpoint.keep_last",
    "data.bpe_vocab_size",
    "backend.reduce_bucket_size",
    "backend.allgather_bucket_size",
    "train.loss_spike_window",
)
_POSITIVE_OPTIONAL = (
    "model.num_kv_heads",
    "model.head_dim",
    "parallel.dp",
    "train.global_batch_size",
    "train.grad_accum",
    "train.steps",
    "train.tokens",
    "model.num_experts",
    "model.moe_top_k",
    "model.moe_ffn_hidden_size",
    "model.q_lora_rank",
    "model.kv_lora_rank",
    "model.qk_rope_head_dim",
    "model.v_head_dim",
    "checkpoint.every_steps",
    "slurm.cpus_per_task",
)
# Counts that may be zero.
_NON_NEGATIVE = (
    "model.moe_shared_experts",
    "model.moe_dense_layers",
    "model.mtp_layers",
    "data.num_workers",
    "slurm.chain",
    "slurm.signal_grace_s",
    "train.max_nonfinite_skips",
)
# Rates and durations (None: the catalog's figure or off): a finite number > 0, or >= 0 where 0
# means free or disabled. NaN fails both.
_POSITIVE_NUMBER = (
    "cluster.storage_write_gbps",
    "cluster.intra_node_bandwidth_gbps",
    "cluster.inter_node_bandwidth_gbps",
    "checkpoint.every_minutes",
    "model.rope_theta",
    "model.norm_eps",
)
_NON_NEGATIVE_NUMBER = (
    "cluster.price_per_gpu_hour",
    "train.hang_timeout_s",
    "train.loss_spike_zscore",
)
# numpy seeds (Generator, legacy RandomState in Megatron-LM) and torch.manual_seed all take this.
MAX_SEED = 2**32 - 1
# Values past these are typos, not plans (the largest published runs are far below them).
_ABSURD = {
    "cluster.num_nodes": 1_000_000,
    "cluster.gpus_per_node": 1024,
    "model.num_layers": 10_000,
    "model.hidden_size": 1_000_000,
    "model.seq_length": 100_000_000,
}


def _value(cfg: LLMTrainConfig, key: str) -> object:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


@rule("positive-values")
def positive_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    out = []
    for key in _POSITIVE + _POSITIVE_OPTIONAL:
        value = _value(cfg, key)
        if value is None and key in _POSITIVE_OPTIONAL:
            continue
        if not isinstance(value, int) or value < 1:
            out.append(
                _error(
                    "positive-values",
                    (key,),
                    f"{key}={value}: must be a positive integer",
                )
            )
        elif value > _ABSURD.get(key, math.inf):
            out.append(
                _error(
                    "positive-values",
                    (key,),
                    f"{key}={value}: implausibly large (limit {_ABSURD[key]:,}); check for a typo",
                )
            )
    for key in _NON_NEGATIVE:
        value = _value(cfg, key)
        if not isinstance(value, int) or value < 0:
            out.append(_error("positive-values", (key,), f"{key}={value}: must be an integer >= 0"))
    for key in _POSITIVE_NUMBER + _NON_NEGATIVE_NUMBER:
        value = _value(cfg, key)
        if value is None:
            continue
        low_ok = value > 0 if key in _POSITIVE_NUMBER else value >= 0  # type: ignore[operator]
        if not (low_ok and math.isfinite(value)):  # type: ignore[arg-type]
            bound = "> 0" if key in _POSITIVE_NUMBER else ">= 0"
            out.append(
                _error("positive-values", (key,), f"{key}={value}: must be a number {bound}")
            )
    if not 0 <= cfg.zero.stage <= 3:
        out.append(
            _error(
                "positive-values",
                ("zero.stage",),
                f"zero.stage={cfg.zero.stage}: must be 0-3",
            )
        )
    seed = cfg.train.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        out.append(
            _error(
                "positive-values",
                ("train.seed",),
                f"train.seed={seed}: must be an integer in [0, {MAX_SEED}] (numpy's and "
                "Megatron-LM's seed range), e.g. 1234",
            )
        )
    o = cfg.optim
    # Finite numbers only: inf passes `> 0` and would train NaN from the first step.
    if not (o.lr > 0 and math.isfinite(o.lr)):
        out.append(
            _error(
                "positive-values",
                ("optim.lr",),
                f"optim.lr={o.lr}: must be a finite number > 0, e.g. 3e-4",
            )
        )
    if not 0 <= o.min_lr <= o.lr:
        out.append(
            _error(
                "positive-values",
                ("optim.min_lr",),
                f"optim.min_lr={o.min_lr}: must lie between 0 and optim.lr={o.lr}",
            )
        )
    if len(o.betas) != 2 or not all(
        isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in o.betas
    ):
        out.append(
            _error(
                "positive-values",
                ("optim.betas",),
                f"optim.betas={list(o.betas)}: need two values in [0, 1), e.g. [0.9, 0.95]",
            )
        )
    for key, value, works in (
        ("optim.weight_decay", o.weight_decay, "0.1 (0: no decay)"),
        ("optim.warmup_steps", o.warmup_steps, "10 (0: no warmup)"),
        ("optim.grad_clip", o.grad_clip, "1.0 (0: no clipping)"),
    ):
        if not (value >= 0 and math.isfinite(value)):  # also NaN
            out.append(
                _error(
                    "positive-values",
                    (key,),
                    f"{key}={value}: must be a finite number >= 0, e.g. {works}",
                )
            )
    if not (o.eps > 0 and math.isfinite(o.eps)):  # Adam divides by sqrt(v) + eps
        out.append(
            _error(
                "positive-values",
                ("optim.eps",),
                f"optim.eps={o.eps}: must be a finite number > 0, e.g. 1e-8",
            )
        )
    reported = {key for v in out for key in v.keys}
    out += [v for v in representable_values(cfg) if not set(v.keys) & reported]
    # Fractions: a dropout probability of 1 would zero every activation.
    for key, value, high_ok in (
        ("model.attention_dropout", cfg.model.attention_dropout, False),
        ("model.hidden_dropout", cfg.model.hidden_dropout, False),
        ("optim.wsd_decay_fraction", o.wsd_decay_fraction, True),
    ):
        if not (0 <= value < 1 or (high_ok and value == 1)):
            bound = "in [0, 1]" if high_ok else "in [0, 1)"
            out.append(_error("positive-values", (key,), f"{key}={value}: must be {bound}"))
    return out


def passes(cfg: LLMTrainConfig) -> bool:
    """Whether `cfg` passes every rule (plan's fixes are offered only when they do)."""
    return not any(v.is_error for v in check(cfg))
