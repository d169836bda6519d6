"""The rules on how the work splits: pipeline-split (layers over pp x vpp chunks, the schedule),
context-parallel (the sequence over cp), tensor-parallel-shapes (widths and the sequence over tp)
and batch-arithmetic (the global batch over micro-batches and dp), declared condition by
condition (launcher/validate/rule.py).

Conventions (launcher/validate/rules.py's docstring states them for users): context parallel is
load-balanced (each rank holds two of 2 x cp sequence chunks); sequence parallel splits
seq_length / cp over tp; a pipeline needs at least pp micro-batches to fill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from launcher.config.layout import Layout, auto_split, split_keys
from launcher.config.layout_rules import (
    chunks_have_layers,
    cp_splits_sequence,
    microbatches,
    pipeline_fills,
    sp_splits_sequence,
    split_counts_fit,
    tp_splits,
    virtual_stages_scheduled,
)
from launcher.config.pipeline_split import SPLIT_KEYS, SplitError, megatron_split
from launcher.config.schema import LLMTrainConfig
from launcher.validate.rule import (
    WARNING,
    LayoutRule,
    Values,
    Violation,
    declare,
    divisors,
    error,
    join,
    nearest,
)

# --- pipeline-split ---


def _scheduled(v: Values) -> bool:
    return virtual_stages_scheduled(v["pp"], v["pp_schedule"], v["vpp"])


def _split_error(cfg: LLMTrainConfig, v: Values, *, explain: bool = True) -> SplitError | None:
    """Megatron-Core's refusal of the configured split keys for this pp and vpp (None: accepted)."""
    try:
        megatron_split(cfg.model.num_layers, v["pp"], v["vpp"], split_keys(cfg), explain=explain)
    except SplitError as exc:
        return exc
    return None


def _split_by(cfg: LLMTrainConfig) -> str:
    """What places the layers: Megatron-Core's "keys", "both" (refused), "counts"
    (parallel.pp_layers) or "auto"."""
    keys, counts = split_keys(cfg).any, cfg.parallel.pp_layers is not None
    if keys:
        return "both" if counts else "keys"
    return "counts" if counts else "auto"


def _chunks(v: Values) -> int:
    return int(v["pp"] * v["vpp"])


def _counts(cfg: LLMTrainConfig) -> list[int]:
    return list(cfg.parallel.pp_layers or [])


def _keys_of_split_error(cfg: LLMTrainConfig, v: Values) -> tuple[str, ...]:
    exc = _split_error(cfg, v)
    return exc.keys if exc else ()


def _uneven_message(cfg: LLMTrainConfig, v: Values, even: Sequence[int]) -> str:
    layers, pp, vpp, chunks = cfg.model.num_layers, v["pp"], v["vpp"], _chunks(v)
    split = auto_split(layers, chunks)
    choose = (
        f"or pp in {join(nearest(even, pp))} for an even split"
        if even
        else f"no pp splits {layers} layers evenly with vpp={vpp}"
    )
    return (
        f"model.num_layers={layers} does not split evenly over pp x vpp = {chunks}; "
        f"automatic split {list(split)} (first and last lighter for the embedding and "
        f"output layers); set parallel.pp_layers to choose, {choose}"
    )


_SCHEDULE = ("pp", "pp_schedule", "vpp")
# Megatron-Core's split keys: exactly its conditions (launcher/config/pipeline_split.py).
PIPELINE_SPLIT = declare(
    "pipeline-split",
    LayoutRule(
        "pipeline-split",
        _SCHEDULE,
        ("parallel.vpp", "parallel.pp", "parallel.pp_schedule"),
        lambda cfg, v: _scheduled(v) or v["vpp"] <= 1,
        lambda cfg, v, works: (
            f"parallel.vpp={v['vpp']} (virtual stages) needs pp > 1 and the interleaved "
            f"schedule; got pp={v['pp']}, pp_schedule={v['pp_schedule']}: use "
            "parallel.pp_schedule=interleaved with pp >= 2, or parallel.vpp=1"
        ),
    ),
    LayoutRule(
        "pipeline-split",
        _SCHEDULE,
        ("parallel.pp_schedule", "parallel.vpp"),
        lambda cfg, v: _scheduled(v) or v["vpp"] != 1,
        lambda cfg, v, works: (
            "parallel.pp_schedule=interleaved needs parallel.vpp >= 2 virtual stages per rank; "
            "set parallel.vpp=2 or use pp_schedule=1f1b"
        ),
    ),
    LayoutRule(
        "pipeline-split",
        (),
        ("parallel.pp_layers", *SPLIT_KEYS),
        lambda cfg, v: _split_by(cfg) != "both",
        lambda cfg, v, works: (
            "parallel.pp_layers and Megatron-Core's split keys both place the layers: "
            "set parallel.pp_layers=null or drop " + ", ".join(SPLIT_KEYS)
        ),
    ),
    LayoutRule(
        "pipeline-split",
        ("pp", "vpp"),
        _keys_of_split_error,
        lambda cfg, v: _split_by(cfg) != "keys" or _split_error(cfg, v, explain=False) is None,
        lambda cfg, v, works: str(getattr(_split_error(cfg, v), "message", "")),
    ),
    LayoutRule(
        "pipeline-split",
        ("pp", "vpp"),
        ("parallel.pp_layers",),
        lambda cfg, v: _split_by(cfg) != "counts" or len(_counts(cfg)) == _chunks(v),
        lambda cfg, v, works: (
            f"parallel.pp_layers has {len(_counts(cfg))} entries; it needs one per pipeline "
            f"chunk, pp x vpp = {_chunks(v)}"
        ),
    ),
    LayoutRule(
        "pipeline-split",
        ("pp", "vpp"),
        ("parallel.pp_layers", "model.num_layers"),
        lambda cfg, v: (
            _split_by(cfg) != "counts"
            or len(_counts(cfg)) != _chunks(v)
            or split_counts_fit(_counts(cfg), _chunks(v), cfg.model.num_layers)
        ),
        lambda cfg, v, works: (
            f"parallel.pp_layers={_counts(cfg)} sums to {sum(_counts(cfg))}, but "
            f"model.num_layers={cfg.model.num_layers} (every entry >= 1); e.g. "
            f"{list(auto_split(cfg.model.num_layers, _chunks(v)))}"
        ),
    ),
    LayoutRule(
        "pipeline-split",
        ("pp", "vpp"),
        ("parallel.pp", "parallel.vpp", "model.num_layers"),
        lambda cfg, v: (
            _split_by(cfg) != "auto" or chunks_have_layers(cfg.model.num_layers, _chunks(v))
        ),
        lambda cfg, v, works: (
            f"pp x vpp = {v['pp']} x {v['vpp']} = {_chunks(v)} pipeline chunks, but "
            f"model.num_layers={cfg.model.num_layers}: every chunk needs a layer; use pp <= "
            f"{max(1, cfg.model.num_layers // v['vpp'])}"
        ),
    ),
    LayoutRule(
        "pipeline-split",
        ("pp", "vpp"),
        ("parallel.pp", "model.num_layers"),
        lambda cfg, v: (
            _split_by(cfg) != "auto"
            or not chunks_have_layers(cfg.model.num_layers, _chunks(v))
            or cfg.model.num_layers % _chunks(v) == 0
        ),
        _uneven_message,
        lambda cfg, v: [
            d for d in divisors(cfg.model.num_layers) if cfg.model.num_layers % (d * v["vpp"]) == 0
        ],
        severity=WARNING,
    ),
)

# --- context-parallel ---


def _valid_cp(cfg: LLMTrainConfig, v: Values) -> Sequence[int]:
    s = cfg.model.seq_length
    return [c for c in divisors(s // 2) if c > 1] if s % 2 == 0 else []


CONTEXT_PARALLEL = declare(
    "context-parallel",
    LayoutRule(
        "context-parallel",
        ("cp",),
        ("parallel.cp", "model.seq_length"),
        lambda cfg, v: cp_splits_sequence(cfg.model.seq_length, v["cp"]),
        lambda cfg, v, valid: (
            f"model.seq_length={cfg.model.seq_length} is not divisible by 2 x parallel.cp = "
            f"{2 * v['cp']} (load-balanced context parallel gives each rank two chunks); valid "
            f"cp: {join(nearest(valid, v['cp'], 5)) if valid else 'none (odd seq_length)'}"
        ),
        _valid_cp,
    ),
)

# --- tensor-parallel-shapes ---


def _width_rule(key: str) -> LayoutRule:
    """tp splits this MLP width (ffn_hidden_size, moe_ffn_hidden_size; unset: nothing to split)."""

    def size(cfg: LLMTrainConfig) -> int:
        return int(getattr(cfg.model, key.removeprefix("model.")) or 0)

    return LayoutRule(
        "tensor-parallel-shapes",
        ("tp",),
        ("parallel.tp", key),
        lambda cfg, v: not size(cfg) or tp_splits(size(cfg), v["tp"]),
        lambda cfg, v, works: (
            f"parallel.tp={v['tp']} does not divide {key}={size(cfg)}; tp dividing it: "
            f"{join(works)}"
        ),
        lambda cfg, v: nearest(divisors(size(cfg)), v["tp"], 5),
    )


def _padded_vocab(cfg: LLMTrainConfig, tp: int) -> int:
    """The embedding rows with vocab padding (a multiple of 128 x tp, as Megatron-LM does)."""
    return math.ceil(cfg.model.vocab_size / (128 * tp)) * 128 * tp


def _sp_split_message(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    s, cp, tp = cfg.model.seq_length, v["cp"], v["tp"]
    return (
        f"sequence parallel splits model.seq_length / cp = {s // cp} over parallel.tp={tp}, "
        f"which does not divide it; nearest valid tp: {join(works)}, or "
        "parallel.sequence_parallel=false"
    )


TENSOR_PARALLEL_SHAPES = declare(
    "tensor-parallel-shapes",
    _width_rule("model.ffn_hidden_size"),
    _width_rule("model.moe_ffn_hidden_size"),
    LayoutRule(
        "tensor-parallel-shapes",
        ("tp",),
        ("parallel.tp", "model.vocab_size"),
        lambda cfg, v: cfg.model.vocab_size % v["tp"] == 0,
        lambda cfg, v, works: (
            f"model.vocab_size={cfg.model.vocab_size} is not divisible by parallel.tp={v['tp']}; "
            f"the embedding is padded to {_padded_vocab(cfg, v['tp'])} (a multiple of 128 x tp, "
            "as Megatron-LM does)"
        ),
        severity=WARNING,
    ),
    LayoutRule(
        "tensor-parallel-shapes",
        ("sequence_parallel", "tp"),
        ("parallel.sequence_parallel",),
        lambda cfg, v: not (v["sequence_parallel"] and v["tp"] == 1),
        lambda cfg, v, works: "parallel.sequence_parallel=true has no effect with parallel.tp=1",
        severity=WARNING,
    ),
    LayoutRule(
        "tensor-parallel-shapes",
        ("sequence_parallel", "tp", "cp"),
        ("parallel.sequence_parallel", "model.seq_length"),
        lambda cfg, v: (
            not v["sequence_parallel"]
            or v["tp"] == 1
            or sp_splits_sequence(cfg.model.seq_length, v["cp"], v["tp"])
        ),
        _sp_split_message,
        lambda cfg, v: nearest(divisors(cfg.model.seq_length // v["cp"]), v["tp"]),
    ),
    LayoutRule(
        "tensor-parallel-shapes",
        ("tp",),
        ("parallel.tp", "cluster.gpus_per_node"),
        lambda cfg, v: v["tp"] <= cfg.cluster.gpus_per_node,
        lambda cfg, v, works: (
            f"parallel.tp={v['tp']} > cluster.gpus_per_node={cfg.cluster.gpus_per_node}: tensor "
            "parallel crosses the node boundary and runs at network speed; keep tp <= "
            f"{cfg.cluster.gpus_per_node}"
        ),
        severity=WARNING,
    ),
)

# --- batch-arithmetic ---


def _steps_or_tokens(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    t = cfg.train
    if (t.steps is None) != (t.tokens is None):
        return []
    return [
        error(
            "batch-arithmetic",
            ("train.steps", "train.tokens"),
            f"set exactly one of train.steps and train.tokens (got steps={t.steps}, "
            f"tokens={t.tokens}); e.g. train.tokens=null",
        )
    ]


def _batch_fits(cfg: LLMTrainConfig, v: Values, *, derived: bool) -> bool:
    """global = micro x dp x grad_accum holds (for a derived grad_accum, or a given one)."""
    t = cfg.train
    if v["dp"] is None or t.global_batch_size is None or (t.grad_accum is None) != derived:
        return True
    mbs = v["micro_batch_size"]
    return microbatches(t.global_batch_size, mbs, v["dp"], t.grad_accum) is not None


def _per_pass(v: Values) -> int:
    return int(v["micro_batch_size"] * v["dp"])


def _not_multiple(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    gbs, per_pass = cfg.train.global_batch_size or 0, _per_pass(v)
    lower = max(per_pass, gbs // per_pass * per_pass)
    return (
        f"train.global_batch_size={gbs} is not a multiple of micro_batch_size x dp = "
        f"{v['micro_batch_size']} x {v['dp']} = {per_pass}; nearest valid global batch: "
        f"{lower}, {lower + per_pass}"
    )


def _not_product(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    t = cfg.train
    accum = t.grad_accum or 0
    return (
        f"train.global_batch_size={t.global_batch_size} != micro_batch_size x dp x grad_accum = "
        f"{v['micro_batch_size']} x {v['dp']} x {accum} = {_per_pass(v) * accum}; leave "
        "train.grad_accum unset to derive it"
    )


def _fills(v: Values) -> bool:
    return v["dp"] is None or pipeline_fills(v["microbatches"], v["pp"])


_FILL = ("microbatches", "pp", "dp", "micro_batch_size")
BATCH_ARITHMETIC = declare(
    "batch-arithmetic",
    _steps_or_tokens,
    LayoutRule(
        "batch-arithmetic",
        ("micro_batch_size", "dp"),
        ("train.global_batch_size", "train.micro_batch_size", "parallel.dp"),
        lambda cfg, v: _batch_fits(cfg, v, derived=True),
        _not_multiple,
    ),
    LayoutRule(
        "batch-arithmetic",
        ("micro_batch_size", "dp"),
        ("train.global_batch_size", "train.grad_accum"),
        lambda cfg, v: _batch_fits(cfg, v, derived=False),
        _not_product,
    ),
    LayoutRule(
        "batch-arithmetic",
        _FILL,
        ("train.global_batch_size", "train.grad_accum", "parallel.pp"),
        lambda cfg, v: _fills(v),
        lambda cfg, v, works: (
            f"{v['microbatches']} micro-batches per step < parallel.pp={v['pp']}: the pipeline "
            f"never fills; use at least train.global_batch_size={_per_pass(v) * v['pp']} "
            f"(grad_accum >= {v['pp']})"
        ),
    ),
    LayoutRule(
        "batch-arithmetic",
        (*_FILL, "vpp"),
        ("train.grad_accum", "parallel.pp"),
        lambda cfg, v: not _fills(v) or v["dp"] is None or _bubble_hidden(v),
        lambda cfg, v, works: (
            f"{v['microbatches']} micro-batches per step < 4 x parallel.pp = {4 * v['pp']}: the "
            f"pipeline bubble is about {_bubble(v):.0%} of the step; raise the global batch or "
            "lower pp"
        ),
        severity=WARNING,
    ),
    LayoutRule(
        "batch-arithmetic",
        ("pp_schedule", "pp", "microbatches", "dp"),
        ("train.grad_accum", "parallel.pp"),
        lambda cfg, v: (
            v["dp"] is None
            or v["pp_schedule"] != "interleaved"
            or v["pp"] <= 1
            or v["microbatches"] % v["pp"] == 0
        ),
        lambda cfg, v, works: (
            f"interleaved schedule with {v['microbatches']} micro-batches, not a multiple of "
            f"pp={v['pp']}: Megatron-LM requires a multiple; the torch backend accepts it"
        ),
        severity=WARNING,
    ),
)


def _bubble_hidden(v: Values) -> bool:
    """No pipeline, or at least 4 x pp micro-batches per step (the bubble then stays small)."""
    return bool(v["pp"] <= 1 or v["microbatches"] >= 4 * v["pp"])


def _bubble(v: Values) -> float:
    pp, m = v["pp"], v["microbatches"]
    return float((pp - 1) / (v["vpp"] * m + pp - 1))
