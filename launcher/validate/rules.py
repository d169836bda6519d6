"""The named rules that catch impossible layouts before anything is launched.

Each rule is a function ``(cfg, layout) -> list[Violation]`` registered with ``@rule(name)``. A
violation names the key(s), the rule in words, the numbers, and the nearest values that would work.
``check(cfg)`` runs every rule and returns all violations, errors and warnings together; it never
mutates the config.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, cast

from launcher.backends import expert_span, refusals
from launcher.config.layout import Layout, auto_split, derive_layout, split_keys
from launcher.config.layout_rules import (
    chunks_have_layers,
    cp_splits_sequence,
    ep_divides_experts,
    ep_fits_span,
    microbatches,
    pipeline_fills,
    sp_splits_sequence,
    split_counts_fit,
    tp_divides_heads,
    tp_fits_kv_heads,
    tp_splits,
    virtual_stages_scheduled,
)
from launcher.config.pipeline_split import SPLIT_KEYS, SplitError, megatron_split
from launcher.config.schema import LLMTrainConfig
from launcher.config.script_values import script_problems
from launcher.plan.model_shape import ModelShape
from launcher.validate.chat_rules import chat_problems
from launcher.validate.finetune_rules import finetune_problems
from launcher.validate.values import value_problems

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Violation:
    rule: str
    severity: str
    keys: tuple[str, ...]
    message: str

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR


RuleFn = Callable[[LLMTrainConfig, Layout], list[Violation]]
RULES: dict[str, RuleFn] = {}


def rule(name: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        RULES[name] = fn
        return fn

    return register


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


# --- helpers ---


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest(values: Iterable[int], target: float, count: int = 3) -> list[int]:
    """The `count` values closest to target, in ascending order."""
    return sorted(sorted(set(values), key=lambda v: (abs(v - target), v))[:count])


def _join(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)


def _dp_consistent(layout: Layout) -> bool:
    """dp x tp x pp x cp covers the world. When it does not, the world-size rule says so, and the
    rules that need dp (batch arithmetic, expert groups) stay silent rather than reason from a
    rounded-down dp."""
    return layout.dp * layout.model_parallel_size == layout.world_size


def _error(name: str, keys: tuple[str, ...], message: str) -> Violation:
    return Violation(name, ERROR, keys, message)


def _warning(name: str, keys: tuple[str, ...], message: str) -> Violation:
    return Violation(name, WARNING, keys, message)


# --- rules ---


# Each key's value on its own: the bounds its schema field declares and what the ranks can hold
# (launcher/validate/values.py).
@rule("positive-values")
def positive_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [_error("positive-values", keys, message) for keys, message in value_problems(cfg)]


@rule("world-size")
def world_size_rule(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    p, c = cfg.parallel, cfg.cluster
    world = layout.world_size
    model_parallel = p.tp * p.pp * p.cp
    where = f"cluster.num_nodes={c.num_nodes} x cluster.gpus_per_node={c.gpus_per_node} = {world}"
    if p.dp is not None:
        if p.dp * model_parallel == world:
            return []
        fits = world // model_parallel if world % model_parallel == 0 else None
        hint = f"parallel.dp={fits} (or leave dp unset to infer it)" if fits else ""
        nodes = p.dp * model_parallel / c.gpus_per_node
        if nodes == int(nodes):
            hint += f"{' or ' if hint else ''}cluster.num_nodes={int(nodes)}"
        return [
            _error(
                "world-size",
                (
                    "parallel.dp",
                    "parallel.tp",
                    "parallel.pp",
                    "parallel.cp",
                    "cluster.num_nodes",
                ),
                f"parallel.dp={p.dp} x tp={p.tp} x pp={p.pp} x cp={p.cp} = "
                f"{p.dp * model_parallel} GPUs, but {where}" + (f"; use {hint}" if hint else ""),
            )
        ]
    if world % model_parallel == 0:
        return []
    nodes_ok = math.lcm(model_parallel, c.gpus_per_node) // c.gpus_per_node
    others = p.pp * p.cp
    valid_tp = [t for t in divisors(world) if world % (t * others) == 0]
    # This rule's own list: the tp that divide the world size (other rules judge tp too; the
    # verdict's note names the values every rule accepts).
    tp_hint = (
        f"tp dividing the world size with pp={p.pp}, cp={p.cp}: {_join(valid_tp)}; "
        if valid_tp
        else ""
    )
    if c.num_nodes == 1 and c.gpu == "cpu":
        # CPU processes on one machine: more processes on it, not nodes.
        per_node = math.lcm(model_parallel, c.gpus_per_node)
        more = f"or cluster.gpus_per_node={per_node} (processes on this one machine)"
    elif c.num_nodes == 1:
        # A GPU node has the GPUs it has: more nodes, never more GPUs per node than it holds.
        more = f"or cluster.num_nodes={nodes_ok} ({nodes_ok * c.gpus_per_node} GPUs)"
    else:
        more = f"or use a multiple of {nodes_ok} nodes"
    return [
        _error(
            "world-size",
            ("parallel.tp", "parallel.pp", "parallel.cp", "cluster.num_nodes"),
            f"tp={p.tp} x pp={p.pp} x cp={p.cp} = {model_parallel} does not divide the world size "
            f"{where}, so dp cannot be inferred; {tp_hint}{more}",
        )
    ]


@rule("expert-parallel")
def expert_parallel(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    p, m = cfg.parallel, cfg.model
    experts = m.num_experts or 0
    out = []
    if experts <= 1:
        if p.ep > 1:
            out.append(
                _error(
                    "expert-parallel",
                    ("parallel.ep", "model.num_experts"),
                    f"parallel.ep={p.ep} needs a mixture-of-experts model, but model.num_experts="
                    f"{m.num_experts}; use parallel.ep=1",
                )
            )
        return out
    if not ep_divides_experts(experts, p.ep):
        out.append(
            _error(
                "expert-parallel",
                ("parallel.ep", "model.num_experts"),
                f"parallel.ep={p.ep} does not divide model.num_experts={experts}; "
                f"valid ep: {_join(divisors(experts))}",
            )
        )
    names, span = expert_span(cfg, layout)
    if _dp_consistent(layout) and not ep_fits_span(span, p.ep):
        ok = [d for d in divisors(span) if experts % d == 0]
        product = " x ".join(names)
        values = " x ".join(str(getattr(layout, n)) for n in names)
        out.append(
            _error(
                "expert-parallel",
                ("parallel.ep", *(f"parallel.{n}" for n in names)),
                f"parallel.ep={p.ep} does not divide {product} = {values} = {span} (backend="
                f"{cfg.backend.name} carves expert groups from the {product} ranks of a stage); "
                f"valid ep: {_join(ok)}",
            )
        )
    out += _expert_tensor_parallel(cfg, layout)
    top_k = m.moe_top_k or 0
    if not 1 <= top_k <= experts:
        out.append(
            _error(
                "expert-parallel",
                ("model.moe_top_k",),
                f"model.moe_top_k={m.moe_top_k}: must be between 1 and model.num_experts={experts}",
            )
        )
    imbalance = m.moe_load_imbalance
    if not isinstance(imbalance, (int, float)) or not 1.0 <= imbalance <= 16.0:
        out.append(
            _error(
                "expert-parallel",
                ("model.moe_load_imbalance",),
                f"model.moe_load_imbalance={imbalance}: must be a number from 1.0 (balanced "
                "routing) to 16.0, e.g. 1.25 for a capacity factor of 1.25",
            )
        )
    if m.moe_dense_layers > m.num_layers:
        out.append(
            _error(
                "expert-parallel",
                ("model.moe_dense_layers",),
                f"model.moe_dense_layers={m.moe_dense_layers} exceeds "
                f"model.num_layers={m.num_layers}",
            )
        )
    return out


def _expert_tensor_parallel(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    """parallel.etp. Megatron-core (parallel_state.initialize_model_parallel) re-folds a stage's
    tp x cp x dp ranks into expert-tensor x expert x expert-data parallel groups, so etp x ep must
    divide them; Transformer Engine's grouped GEMMs split each expert's hidden size over etp.
    Engines that split experts over tp like the dense weights run etp = tp only."""
    p, m = cfg.parallel, cfg.model
    etp = p.etp
    if etp is None:
        return []
    key = ("parallel.etp",)
    if etp < 1:
        return [_error("expert-parallel", key, f"parallel.etp={etp}: must be 1 or more")]
    names, _ = expert_span(cfg, layout)
    if "tp" not in names and etp != max(1, p.tp):
        return [
            _error(
                "expert-parallel",
                (*key, "parallel.tp", "backend"),
                f"parallel.etp={etp} with parallel.tp={p.tp}: backend={cfg.backend.name} splits "
                f"each expert over tp like the dense weights; use parallel.etp=null (or "
                f"{max(1, p.tp)}), or backend=megatron",
            )
        ]
    out = []
    ranks = max(1, p.tp) * max(1, p.cp) * max(1, layout.dp)
    if _dp_consistent(layout) and ranks % (etp * max(1, p.ep)):
        ok = [e for e in divisors(ranks) if ranks % (e * max(1, p.ep)) == 0]
        out.append(
            _error(
                "expert-parallel",
                (*key, "parallel.ep"),
                f"parallel.etp={etp} x parallel.ep={p.ep} does not divide the tp x cp x dp = "
                f"{ranks} ranks of a stage (Megatron-core folds them into expert-tensor x expert "
                f"x expert-data groups); valid etp: {_join(ok) or 'none with this ep'}",
            )
        )
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    if ffn % etp:
        out.append(
            _error(
                "expert-parallel",
                (*key, "model.moe_ffn_hidden_size"),
                f"parallel.etp={etp} does not divide the expert hidden size {ffn} (each expert's "
                f"weights split over etp); valid etp: {_join(divisors(ffn)[:8])}",
            )
        )
    return out


@rule("attention-heads")
def attention_heads(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    m, tp = cfg.model, cfg.parallel.tp
    shape = ModelShape(m)
    heads, kv = m.num_attention_heads, shape.kv_heads
    out = []
    if not tp_divides_heads(heads, tp):
        out.append(
            _error(
                "attention-heads",
                ("parallel.tp", "model.num_attention_heads"),
                f"parallel.tp={tp} does not divide model.num_attention_heads={heads}; "
                f"valid tp: {_join(divisors(heads))}",
            )
        )
    if kv > heads or heads % kv:
        out.append(
            _error(
                "attention-heads",
                ("model.num_kv_heads",),
                f"model.num_kv_heads={kv} must divide model.num_attention_heads={heads}; "
                f"valid: {_join(divisors(heads))}",
            )
        )
    elif not shape.is_mla and not tp_fits_kv_heads(kv, tp):
        valid = sorted(set(divisors(kv)) | {t for t in divisors(heads) if t % kv == 0})
        out.append(
            _error(
                "attention-heads",
                ("parallel.tp", "model.num_kv_heads"),
                f"parallel.tp={tp} and model.num_kv_heads={kv}: tp must divide the kv heads, or "
                f"the kv heads divide tp (each then replicated); valid tp: {_join(valid)}",
            )
        )
    elif not shape.is_mla and tp > kv:
        out.append(
            _warning(
                "attention-heads",
                ("parallel.tp", "model.num_kv_heads"),
                f"parallel.tp={tp} > model.num_kv_heads={kv}: each kv head is replicated on "
                f"{tp // kv} ranks (more kv memory and compute than tp={kv})",
            )
        )
    if m.head_dim is None and m.hidden_size % heads:
        out.append(
            _error(
                "attention-heads",
                ("model.hidden_size", "model.num_attention_heads"),
                f"model.hidden_size={m.hidden_size} is not divisible by model.num_attention_heads="
                f"{heads}; set model.head_dim or use heads in "
                f"{_join(nearest(divisors(m.hidden_size), heads))}",
            )
        )
    return out


@rule("pipeline-split")
def pipeline_split(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    p, layers = cfg.parallel, cfg.model.num_layers
    chunks = p.pp * p.vpp
    out = []
    scheduled = virtual_stages_scheduled(p.pp, p.pp_schedule, p.vpp)
    if not scheduled and p.vpp > 1:
        out.append(
            _error(
                "pipeline-split",
                ("parallel.vpp", "parallel.pp", "parallel.pp_schedule"),
                f"parallel.vpp={p.vpp} (virtual stages) needs pp > 1 and the interleaved schedule; "
                f"got pp={p.pp}, pp_schedule={p.pp_schedule}: use parallel.pp_schedule=interleaved "
                "with pp >= 2, or parallel.vpp=1",
            )
        )
    if not scheduled and p.vpp == 1:
        out.append(
            _error(
                "pipeline-split",
                ("parallel.pp_schedule", "parallel.vpp"),
                "parallel.pp_schedule=interleaved needs parallel.vpp >= 2 virtual stages per rank; "
                "set parallel.vpp=2 or use pp_schedule=1f1b",
            )
        )
    keys = split_keys(cfg)
    if keys.any:
        # Megatron-Core's split keys: exactly its conditions (launcher/config/pipeline_split.py).
        if p.pp_layers is not None:
            out.append(
                _error(
                    "pipeline-split",
                    ("parallel.pp_layers", *SPLIT_KEYS),
                    "parallel.pp_layers and Megatron-Core's split keys both place the layers: "
                    "set parallel.pp_layers=null or drop " + ", ".join(SPLIT_KEYS),
                )
            )
            return out
        try:
            megatron_split(layers, p.pp, p.vpp, keys)
        except SplitError as exc:
            out.append(_error("pipeline-split", exc.keys, exc.message))
        return out
    if p.pp_layers is not None:
        counts = list(p.pp_layers)
        if len(counts) != chunks:
            out.append(
                _error(
                    "pipeline-split",
                    ("parallel.pp_layers",),
                    f"parallel.pp_layers has {len(counts)} entries; it needs one per pipeline "
                    f"chunk, pp x vpp = {chunks}",
                )
            )
        elif not split_counts_fit(counts, chunks, layers):
            out.append(
                _error(
                    "pipeline-split",
                    ("parallel.pp_layers", "model.num_layers"),
                    f"parallel.pp_layers={counts} sums to {sum(counts)}, but model.num_layers="
                    f"{layers} (every entry >= 1); e.g. {list(auto_split(layers, chunks))}",
                )
            )
        return out
    if not chunks_have_layers(layers, chunks):
        out.append(
            _error(
                "pipeline-split",
                ("parallel.pp", "parallel.vpp", "model.num_layers"),
                f"pp x vpp = {p.pp} x {p.vpp} = {chunks} pipeline chunks, but model.num_layers="
                f"{layers}: every chunk needs a layer; use pp <= {max(1, layers // p.vpp)}",
            )
        )
    elif layers % chunks:
        split = auto_split(layers, chunks)
        even = [d for d in divisors(layers) if layers % (d * p.vpp) == 0]
        choose = (
            f"or pp in {_join(nearest(even, p.pp))} for an even split"
            if even
            else f"no pp splits {layers} layers evenly with vpp={p.vpp}"
        )
        out.append(
            _warning(
                "pipeline-split",
                ("parallel.pp", "model.num_layers"),
                f"model.num_layers={layers} does not split evenly over pp x vpp = {chunks}; "
                f"automatic split {list(split)} (first and last lighter for the embedding and "
                f"output layers); set parallel.pp_layers to choose, {choose}",
            )
        )
    return out


@rule("context-parallel")
def context_parallel(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    cp, s = cfg.parallel.cp, cfg.model.seq_length
    if cp_splits_sequence(s, cp):
        return []
    valid = [c for c in divisors(s // 2) if c > 1] if s % 2 == 0 else []
    return [
        _error(
            "context-parallel",
            ("parallel.cp", "model.seq_length"),
            f"model.seq_length={s} is not divisible by 2 x parallel.cp = {2 * cp} (load-balanced "
            f"context parallel gives each rank two chunks); valid cp: "
            f"{_join(nearest(valid, cp, 5)) if valid else 'none (odd seq_length)'}",
        )
    ]


@rule("tensor-parallel-shapes")
def tensor_parallel_shapes(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    m, p = cfg.model, cfg.parallel
    tp = p.tp
    out = []
    sizes = [("model.ffn_hidden_size", m.ffn_hidden_size)]
    if m.moe_ffn_hidden_size:
        sizes.append(("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size))
    for key, size in sizes:
        if not tp_splits(size, tp):
            out.append(
                _error(
                    "tensor-parallel-shapes",
                    ("parallel.tp", key),
                    f"parallel.tp={tp} does not divide {key}={size}; tp dividing it: "
                    f"{_join(nearest(divisors(size), tp, 5))}",
                )
            )
    if m.vocab_size % tp:
        padded = math.ceil(m.vocab_size / (128 * tp)) * 128 * tp
        out.append(
            _warning(
                "tensor-parallel-shapes",
                ("parallel.tp", "model.vocab_size"),
                f"model.vocab_size={m.vocab_size} is not divisible by parallel.tp={tp}; the "
                f"embedding is padded to {padded} (a multiple of 128 x tp, as Megatron-LM does)",
            )
        )
    if p.sequence_parallel:
        if tp == 1:
            out.append(
                _warning(
                    "tensor-parallel-shapes",
                    ("parallel.sequence_parallel",),
                    "parallel.sequence_parallel=true has no effect with parallel.tp=1",
                )
            )
        elif not sp_splits_sequence(m.seq_length, p.cp, tp):
            out.append(
                _error(
                    "tensor-parallel-shapes",
                    ("parallel.sequence_parallel", "model.seq_length"),
                    f"sequence parallel splits model.seq_length / cp = {m.seq_length // p.cp} over "
                    f"parallel.tp={tp}, which does not divide it; nearest valid tp: "
                    f"{_join(nearest(divisors(m.seq_length // p.cp), tp))}, or "
                    "parallel.sequence_parallel=false",
                )
            )
    if tp > cfg.cluster.gpus_per_node:
        out.append(
            _warning(
                "tensor-parallel-shapes",
                ("parallel.tp", "cluster.gpus_per_node"),
                f"parallel.tp={tp} > cluster.gpus_per_node={cfg.cluster.gpus_per_node}: tensor "
                "parallel crosses the node boundary and runs at network speed; keep tp <= "
                f"{cfg.cluster.gpus_per_node}",
            )
        )
    return out


@rule("batch-arithmetic")
def batch_arithmetic(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    t = cfg.train
    out = []
    if (t.steps is None) == (t.tokens is None):
        out.append(
            _error(
                "batch-arithmetic",
                ("train.steps", "train.tokens"),
                f"set exactly one of train.steps and train.tokens (got steps={t.steps}, "
                f"tokens={t.tokens}); e.g. train.tokens=null",
            )
        )
    if not _dp_consistent(layout):
        return out
    per_pass = layout.micro_batch_size * layout.dp
    if t.global_batch_size is not None and (
        microbatches(t.global_batch_size, layout.micro_batch_size, layout.dp, t.grad_accum) is None
    ):
        accum = t.grad_accum
        if accum is None:
            lower = max(per_pass, t.global_batch_size // per_pass * per_pass)
            out.append(
                _error(
                    "batch-arithmetic",
                    (
                        "train.global_batch_size",
                        "train.micro_batch_size",
                        "parallel.dp",
                    ),
                    f"train.global_batch_size={t.global_batch_size} is not a multiple of "
                    f"micro_batch_size x dp = {layout.micro_batch_size} x {layout.dp} = "
                    f"{per_pass}; "
                    f"nearest valid global batch: {lower}, {lower + per_pass}",
                )
            )
        else:
            out.append(
                _error(
                    "batch-arithmetic",
                    ("train.global_batch_size", "train.grad_accum"),
                    f"train.global_batch_size={t.global_batch_size} != micro_batch_size x dp x "
                    f"grad_accum = {layout.micro_batch_size} x {layout.dp} x {accum} = "
                    f"{per_pass * accum}; leave train.grad_accum unset to derive it",
                )
            )
    pp = cfg.parallel.pp
    m = layout.num_microbatches
    if not pipeline_fills(m, pp):
        out.append(
            _error(
                "batch-arithmetic",
                ("train.global_batch_size", "train.grad_accum", "parallel.pp"),
                f"{m} micro-batches per step < parallel.pp={pp}: the pipeline never fills; use at "
                f"least train.global_batch_size={layout.micro_batch_size * layout.dp * pp} "
                f"(grad_accum >= {pp})",
            )
        )
    elif pp > 1 and m < 4 * pp:
        bubble = (pp - 1) / (cfg.parallel.vpp * m + pp - 1)
        out.append(
            _warning(
                "batch-arithmetic",
                ("train.grad_accum", "parallel.pp"),
                f"{m} micro-batches per step < 4 x parallel.pp = {4 * pp}: the pipeline bubble is "
                f"about {bubble:.0%} of the step; raise the global batch or lower pp",
            )
        )
    if cfg.parallel.pp_schedule == "interleaved" and pp > 1 and m % pp:
        out.append(
            _warning(
                "batch-arithmetic",
                ("train.grad_accum", "parallel.pp"),
                f"interleaved schedule with {m} micro-batches, not a multiple of pp={pp}: "
                "Megatron-LM requires a multiple; the torch backend accepts it",
            )
        )
    return out


@rule("precision-hardware")
def precision_hardware(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    from launcher.plan.hardware import UnknownGPUError, get_gpu

    prec, gpu_key = cfg.precision, cfg.cluster.gpu
    try:
        gpu = get_gpu(gpu_key)
    except UnknownGPUError as exc:
        return [_error("precision-hardware", ("cluster.gpu",), str(exc))]
    out = []
    uses_bf16 = "bf16" in (prec.compute_dtype, prec.grad_dtype)
    if uses_bf16 and not gpu.supports_bf16:
        out.append(
            _error(
                "precision-hardware",
                ("precision", "cluster.gpu"),
                f"precision={prec.name} computes in bf16, which {gpu.name} ({gpu.arch}) does not "
                "support (needs Ampere or newer); use precision=fp16 or precision=fp32",
            )
        )
    if prec.fp8_emulate and not prec.fp8:
        out.append(
            _warning(
                "precision-hardware",
                ("precision.fp8_emulate",),
                f"precision.fp8_emulate=true has no effect with precision={prec.name}; use "
                "precision=fp8 with it, or drop it",
            )
        )
    # fp8 on CPU is the backend table's to refuse (launcher/backends/: emulation runs there).
    if prec.fp8 and not gpu.supports_fp8 and not prec.fp8_emulate and gpu.arch != "cpu":
        out.append(
            _error(
                "precision-hardware",
                ("precision", "cluster.gpu"),
                f"precision=fp8 needs fp8 tensor cores (compute capability 8.9+: Ada, Hopper or "
                f"newer); cluster.gpu={gpu_key} ({gpu.name}, {gpu.arch}) has none; use "
                "precision=bf16, a GPU with fp8 (e.g. cluster=h100-80gb), or "
                "precision.fp8_emulate=true (emulated fp8 matmuls: numerics only, no speedup)",
            )
        )
    if "fp16" in (prec.compute_dtype, prec.grad_dtype) and prec.loss_scaling == "none":
        out.append(
            _error(
                "precision-hardware",
                ("precision.loss_scaling",),
                "fp16 training needs loss scaling (gradients underflow otherwise); set "
                "precision.loss_scaling=dynamic",
            )
        )
    return out


# What each backend can run is declared in launcher/backends/ (one table per engine); this rule
# reports that table's refusals for the configured backend.
@rule("backend-capabilities")
def backend_capabilities(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [_error("backend-capabilities", ("backend", *r.keys), r.message) for r in refusals(cfg)]


# Values the run's scripts cannot hold (control characters, environment names, sbatch options,
# secrets kept from the job, unmountable paths): the renderers refuse the same, as an invariant.
@rule("script-values")
def script_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    run_dir = str(PurePosixPath(cfg.run.root_dir) / (cfg.run.name or "RUN"))
    return [_error("script-values", p.keys, p.message) for p in script_problems(cfg, run_dir)]


# Files are checked before launch (launcher.launch.preflight.data_problems); here only the shape.
@rule("data-sources")
def data_sources(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    d, t = cfg.data, cfg.train
    out = []
    example = "[0.7,/data/a_text_document,0.3,/data/b_text_document]"
    if d.blend and d.path is not None:
        out.append(
            _error(
                "data-sources",
                ("data.path", "data.blend"),
                f"data.path={d.path} and data.blend are both set: give one (data.path=null)",
            )
        )
    if d.blend and len(d.blend) % 2:
        out.append(
            _error(
                "data-sources",
                ("data.blend",),
                f"data.blend has {len(d.blend)} values: expected weight, path pairs, e.g. "
                f"data.blend={example}",
            )
        )
    for i in range(0, len(d.blend) - 1, 2):
        weight, path = d.blend[i], d.blend[i + 1]
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            out.append(
                _error(
                    "data-sources",
                    ("data.blend",),
                    f"data.blend[{i}]={weight!r}: a weight must be a number > 0, e.g. "
                    f"data.blend={example}",
                )
            )
        if not isinstance(path, str) or not path:
            out.append(
                _error(
                    "data-sources",
                    ("data.blend",),
                    f"data.blend[{i + 1}]={path!r}: expected a dataset path (a prepared folder "
                    "or a Megatron PREFIX)",
                )
            )
    if t.eval_every is not None and t.eval_every < 0:
        out.append(
            _error(
                "data-sources",
                ("train.eval_every",),
                f"train.eval_every={t.eval_every}: must be >= 0 (0 or null: no evaluation), "
                "e.g. train.eval_every=100",
            )
        )
    return out


def run_name_problem(name: object) -> str | None:
    """What is wrong with run.name as a run directory's folder name (None: fine). `run` and
    `validate` both use it (launcher.launch.local names the folder)."""
    if name is None:
        return None
    text = str(name)
    if "/" in text or "\0" in text or text in ("", ".", ".."):
        return (
            f"run.name={text!r}: must be a plain folder name (no '/', not '.' or '..'), e.g. exp1"
        )
    return None


@rule("run-name")
def run_name(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    problem = run_name_problem(cfg.run.name)
    return [_error("run-name", ("run.name",), problem)] if problem else []


# Adam-family rates above this diverge on any model size (published runs use 1e-4..1e-2).
HOT_LR = 1.0


@rule("optimizer-values")
def optimizer_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    """Legal but suspicious optimizer settings: warnings (the hard limits are in
    positive-values)."""
    o, out = cfg.optim, []
    if o.name in ("adam", "adamw", "lion") and math.isfinite(o.lr) and o.lr > HOT_LR:
        out.append(
            _warning(
                "optimizer-values",
                ("optim.lr",),
                f"optim.lr={o.lr:g} with {o.name}: far above the usual 1e-4..1e-2; such a run "
                "usually diverges (it then stops with exit 3 at the first non-finite step)",
            )
        )
    steps = layout.steps
    if isinstance(steps, int) and 0 < steps < o.warmup_steps:
        out.append(
            _warning(
                "optimizer-values",
                ("optim.warmup_steps",),
                f"optim.warmup_steps={o.warmup_steps} > {steps} training steps: the learning "
                f"rate never reaches optim.lr={o.lr:g}; e.g. optim.warmup_steps={steps // 10}",
            )
        )
    return out


# Fine-tuning data (data.builtin=chat and its layout): launcher/validate/chat_rules.py.
@rule("chat-data")
def chat_data(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [_error("chat-data", keys, message) for keys, message in chat_problems(cfg, layout)]


# finetune=lora|qlora: values, targets and the layouts the engines run (their own module).
@rule("finetune")
def finetune(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [Violation("finetune", s, k, m) for s, k, m in finetune_problems(cfg, layout)]


def passes(cfg: LLMTrainConfig) -> bool:
    """Whether `cfg` passes every rule (plan's fixes are offered only when they do)."""
    return not any(v.is_error for v in check(cfg))
