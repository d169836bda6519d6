"""The rules on how the ranks split the model: world-size (dp x tp x pp x cp covers the GPUs),
expert-parallel (ep, etp and the MoE keys) and attention-heads (tp against the query and key/value
heads), declared condition by condition (launcher/validate/rule.py).

Conventions (launcher/validate/rules.py's docstring states them for users): expert groups are
carved from the ranks the backend names (``backends.expert_span_names``); tp must divide the kv
heads, or the kv heads divide tp (each then replicated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from launcher.backends import expert_span_names
from launcher.config.layout import Layout, world_size
from launcher.config.layout_rules import (
    ep_divides_experts,
    ep_fits_span,
    tp_divides_heads,
    tp_fits_kv_heads,
)
from launcher.config.schema import LLMTrainConfig
from launcher.plan.model_shape import ModelShape
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

# --- world-size ---

_WORLD_KEYS = ("parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp", "cluster.num_nodes")


def _model_parallel(v: Values) -> int:
    return int(v["tp"] * v["pp"] * v["cp"])


def _where(cfg: LLMTrainConfig) -> str:
    c = cfg.cluster
    return (
        f"cluster.num_nodes={c.num_nodes} x cluster.gpus_per_node={c.gpus_per_node} = "
        f"{world_size(cfg)}"
    )


def _given_dp_covers(cfg: LLMTrainConfig, v: Values) -> bool:
    dp = cfg.parallel.dp
    return dp is None or dp * _model_parallel(v) == world_size(cfg)


def _given_dp_message(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    dp, c, world, mp = cfg.parallel.dp, cfg.cluster, world_size(cfg), _model_parallel(v)
    assert dp is not None
    fits = world // mp if world % mp == 0 else None
    hint = f"parallel.dp={fits} (or leave dp unset to infer it)" if fits else ""
    nodes = dp * mp / c.gpus_per_node
    if nodes == int(nodes):
        hint += f"{' or ' if hint else ''}cluster.num_nodes={int(nodes)}"
    return (
        f"parallel.dp={dp} x tp={v['tp']} x pp={v['pp']} x cp={v['cp']} = "
        f"{dp * mp} GPUs, but {_where(cfg)}" + (f"; use {hint}" if hint else "")
    )


def _inferred_dp_exists(cfg: LLMTrainConfig, v: Values) -> bool:
    return cfg.parallel.dp is not None or world_size(cfg) % _model_parallel(v) == 0


def _tp_dividing_world(cfg: LLMTrainConfig, v: Values) -> Sequence[int]:
    world, others = world_size(cfg), v["pp"] * v["cp"]
    return [t for t in divisors(world) if world % (t * others) == 0]


def _inferred_dp_message(cfg: LLMTrainConfig, v: Values, valid_tp: Sequence[int]) -> str:
    c, mp = cfg.cluster, _model_parallel(v)
    nodes_ok = math.lcm(mp, c.gpus_per_node) // c.gpus_per_node
    # This rule's own list: the tp that divide the world size (other rules judge tp too; the
    # verdict's note names the values every rule accepts).
    tp_hint = (
        f"tp dividing the world size with pp={v['pp']}, cp={v['cp']}: {join(valid_tp)}; "
        if valid_tp
        else ""
    )
    if c.num_nodes == 1 and c.gpu == "cpu":
        # CPU processes on one machine: more processes on it, not nodes.
        per_node = math.lcm(mp, c.gpus_per_node)
        more = f"or cluster.gpus_per_node={per_node} (processes on this one machine)"
    elif c.num_nodes == 1:
        # A GPU node has the GPUs it has: more nodes, never more GPUs per node than it holds.
        more = f"or cluster.num_nodes={nodes_ok} ({nodes_ok * c.gpus_per_node} GPUs)"
    else:
        more = f"or use a multiple of {nodes_ok} nodes"
    return (
        f"tp={v['tp']} x pp={v['pp']} x cp={v['cp']} = {mp} does not divide the world size "
        f"{_where(cfg)}, so dp cannot be inferred; {tp_hint}{more}"
    )


WORLD_SIZE = declare(
    "world-size",
    LayoutRule("world-size", ("tp", "cp", "pp"), _WORLD_KEYS, _given_dp_covers, _given_dp_message),
    LayoutRule(
        "world-size",
        ("tp", "cp", "pp"),
        _WORLD_KEYS[1:],
        _inferred_dp_exists,
        _inferred_dp_message,
        _tp_dividing_world,
    ),
)

# --- expert-parallel ---


def _experts(cfg: LLMTrainConfig) -> int:
    return cfg.model.num_experts or 0


def _span(cfg: LLMTrainConfig, v: Values) -> int:
    """The ranks expert groups are carved from (the backend's expert span)."""
    return math.prod(v[n] for n in expert_span_names(cfg))


def _ep_without_experts(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    return (
        f"parallel.ep={v['ep']} needs a mixture-of-experts model, but model.num_experts="
        f"{cfg.model.num_experts}; use parallel.ep=1"
    )


def _ep_not_dividing(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    return (
        f"parallel.ep={v['ep']} does not divide model.num_experts={_experts(cfg)}; "
        f"valid ep: {join(works)}"
    )


def _ep_outside_span(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    names = expert_span_names(cfg)
    product = " x ".join(names)
    values = " x ".join(str(v[n]) for n in names)
    return (
        f"parallel.ep={v['ep']} does not divide {product} = {values} = {_span(cfg, v)} (backend="
        f"{cfg.backend.name} carves expert groups from the {product} ranks of a stage); "
        f"valid ep: {join(works)}"
    )


def _etp_needs(cfg: LLMTrainConfig) -> bool:
    """The etp conditions apply: an MoE model with parallel.etp set."""
    return _experts(cfg) > 1 and cfg.parallel.etp is not None


def _etp_follows_tp(cfg: LLMTrainConfig, v: Values) -> bool:
    """Engines that split experts over tp like the dense weights run etp = tp only."""
    etp = cfg.parallel.etp
    if not _etp_needs(cfg) or etp is None or etp < 1:
        return True
    return "tp" in expert_span_names(cfg) or etp == max(1, v["tp"])


def _etp_stage_ranks(v: Values) -> int:
    return int(max(1, v["tp"]) * max(1, v["cp"]) * max(1, v["dp"]))


def _etp_message(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    p = cfg.parallel
    return (
        f"parallel.etp={p.etp} with parallel.tp={v['tp']}: backend={cfg.backend.name} splits "
        f"each expert over tp like the dense weights; use parallel.etp=null (or "
        f"{max(1, v['tp'])}), or backend=megatron"
    )


def _etp_ranks_message(cfg: LLMTrainConfig, v: Values, works: Sequence[int]) -> str:
    return (
        f"parallel.etp={cfg.parallel.etp} x parallel.ep={v['ep']} does not divide the tp x cp x dp "
        f"= {_etp_stage_ranks(v)} ranks of a stage (Megatron-core folds them into expert-tensor x "
        f"expert x expert-data groups); valid etp: {join(works) or 'none with this ep'}"
    )


def _etp_ffn(cfg: LLMTrainConfig) -> int:
    return cfg.model.moe_ffn_hidden_size or cfg.model.ffn_hidden_size


def _moe_keys(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    """The MoE model keys (only with experts): routing top-k, load imbalance, dense layers."""
    m = cfg.model
    experts = _experts(cfg)
    if experts <= 1:
        return []
    out = []
    top_k = m.moe_top_k or 0
    if not 1 <= top_k <= experts:
        out.append(
            error(
                "expert-parallel",
                ("model.moe_top_k",),
                f"model.moe_top_k={m.moe_top_k}: must be between 1 and model.num_experts={experts}",
            )
        )
    imbalance = m.moe_load_imbalance
    if not isinstance(imbalance, (int, float)) or not 1.0 <= imbalance <= 16.0:
        out.append(
            error(
                "expert-parallel",
                ("model.moe_load_imbalance",),
                f"model.moe_load_imbalance={imbalance}: must be a number from 1.0 (balanced "
                "routing) to 16.0, e.g. 1.25 for a capacity factor of 1.25",
            )
        )
    if m.moe_dense_layers > m.num_layers:
        out.append(
            error(
                "expert-parallel",
                ("model.moe_dense_layers",),
                f"model.moe_dense_layers={m.moe_dense_layers} exceeds "
                f"model.num_layers={m.num_layers}",
            )
        )
    return out


# parallel.etp: Megatron-core (parallel_state.initialize_model_parallel) re-folds a stage's
# tp x cp x dp ranks into expert-tensor x expert x expert-data parallel groups, so etp x ep must
# divide them; Transformer Engine's grouped GEMMs split each expert's hidden size over etp.
EXPERT_PARALLEL = declare(
    "expert-parallel",
    LayoutRule(
        "expert-parallel",
        ("ep",),
        ("parallel.ep", "model.num_experts"),
        lambda cfg, v: _experts(cfg) > 1 or v["ep"] <= 1,
        _ep_without_experts,
    ),
    LayoutRule(
        "expert-parallel",
        ("ep",),
        ("parallel.ep", "model.num_experts"),
        lambda cfg, v: _experts(cfg) <= 1 or ep_divides_experts(_experts(cfg), v["ep"]),
        _ep_not_dividing,
        lambda cfg, v: divisors(_experts(cfg)),
    ),
    LayoutRule(
        "expert-parallel",
        ("ep", "dp", "cp", "tp"),
        lambda cfg, v: ("parallel.ep", *(f"parallel.{n}" for n in expert_span_names(cfg))),
        lambda cfg, v: (
            _experts(cfg) <= 1 or v["dp"] is None or ep_fits_span(_span(cfg, v), v["ep"])
        ),
        _ep_outside_span,
        lambda cfg, v: [d for d in divisors(_span(cfg, v)) if _experts(cfg) % d == 0],
    ),
    LayoutRule(
        "expert-parallel",
        (),
        ("parallel.etp",),
        lambda cfg, v: not _etp_needs(cfg) or (cfg.parallel.etp or 0) >= 1,
        lambda cfg, v, works: f"parallel.etp={cfg.parallel.etp}: must be 1 or more",
    ),
    LayoutRule(
        "expert-parallel",
        ("tp",),
        ("parallel.etp", "parallel.tp", "backend"),
        _etp_follows_tp,
        _etp_message,
    ),
    LayoutRule(
        "expert-parallel",
        ("tp", "cp", "dp", "ep"),
        ("parallel.etp", "parallel.ep"),
        lambda cfg, v: (
            not _etp_needs(cfg)
            or (cfg.parallel.etp or 0) < 1
            or not _etp_follows_tp(cfg, v)
            or v["dp"] is None
            or _etp_stage_ranks(v) % ((cfg.parallel.etp or 1) * max(1, v["ep"])) == 0
        ),
        _etp_ranks_message,
        lambda cfg, v: [
            e
            for e in divisors(_etp_stage_ranks(v))
            if _etp_stage_ranks(v) % (e * max(1, v["ep"])) == 0
        ],
    ),
    LayoutRule(
        "expert-parallel",
        ("tp",),
        ("parallel.etp", "model.moe_ffn_hidden_size"),
        lambda cfg, v: (
            not _etp_needs(cfg)
            or (cfg.parallel.etp or 0) < 1
            or not _etp_follows_tp(cfg, v)
            or _etp_ffn(cfg) % (cfg.parallel.etp or 1) == 0
        ),
        lambda cfg, v, works: (
            f"parallel.etp={cfg.parallel.etp} does not divide the expert hidden size "
            f"{_etp_ffn(cfg)} (each expert's weights split over etp); valid etp: {join(works)}"
        ),
        lambda cfg, v: divisors(_etp_ffn(cfg))[:8],
    ),
    _moe_keys,
)

# --- attention-heads ---


def _kv_heads_invalid(cfg: LLMTrainConfig) -> bool:
    """model.num_kv_heads does not divide the attention heads (reported on its own)."""
    heads, kv = cfg.model.num_attention_heads, ModelShape(cfg.model).kv_heads
    return kv > heads or heads % kv != 0


def _kv_replicated(cfg: LLMTrainConfig) -> bool:
    """The kv-head conditions on tp apply (valid kv heads, not multi-head latent attention)."""
    return not _kv_heads_invalid(cfg) and not ModelShape(cfg.model).is_mla


def _kv(cfg: LLMTrainConfig) -> int:
    return ModelShape(cfg.model).kv_heads


def _valid_kv_tp(cfg: LLMTrainConfig, v: Values) -> Sequence[int]:
    kv, heads = _kv(cfg), cfg.model.num_attention_heads
    return sorted(set(divisors(kv)) | {t for t in divisors(heads) if t % kv == 0})


ATTENTION_HEADS = declare(
    "attention-heads",
    LayoutRule(
        "attention-heads",
        ("tp",),
        ("parallel.tp", "model.num_attention_heads"),
        lambda cfg, v: tp_divides_heads(cfg.model.num_attention_heads, v["tp"]),
        lambda cfg, v, works: (
            f"parallel.tp={v['tp']} does not divide model.num_attention_heads="
            f"{cfg.model.num_attention_heads}; valid tp: {join(works)}"
        ),
        lambda cfg, v: divisors(cfg.model.num_attention_heads),
    ),
    LayoutRule(
        "attention-heads",
        (),
        ("model.num_kv_heads",),
        lambda cfg, v: not _kv_heads_invalid(cfg),
        lambda cfg, v, works: (
            f"model.num_kv_heads={_kv(cfg)} must divide model.num_attention_heads="
            f"{cfg.model.num_attention_heads}; valid: {join(works)}"
        ),
        lambda cfg, v: divisors(cfg.model.num_attention_heads),
    ),
    LayoutRule(
        "attention-heads",
        ("tp",),
        ("parallel.tp", "model.num_kv_heads"),
        lambda cfg, v: not _kv_replicated(cfg) or tp_fits_kv_heads(_kv(cfg), v["tp"]),
        lambda cfg, v, works: (
            f"parallel.tp={v['tp']} and model.num_kv_heads={_kv(cfg)}: tp must divide the kv "
            f"heads, or the kv heads divide tp (each then replicated); valid tp: {join(works)}"
        ),
        _valid_kv_tp,
    ),
    LayoutRule(
        "attention-heads",
        ("tp",),
        ("parallel.tp", "model.num_kv_heads"),
        lambda cfg, v: (
            not _kv_replicated(cfg)
            or not tp_fits_kv_heads(_kv(cfg), v["tp"])
            or v["tp"] <= _kv(cfg)
        ),
        lambda cfg, v, works: (
            f"parallel.tp={v['tp']} > model.num_kv_heads={_kv(cfg)}: each kv head is replicated "
            f"on {v['tp'] // _kv(cfg)} ranks (more kv memory and compute than tp={_kv(cfg)})"
        ),
        severity=WARNING,
    ),
    LayoutRule(
        "attention-heads",
        (),
        ("model.hidden_size", "model.num_attention_heads"),
        lambda cfg, v: (
            cfg.model.head_dim is not None
            or cfg.model.hidden_size % cfg.model.num_attention_heads == 0
        ),
        lambda cfg, v, works: (
            f"model.hidden_size={cfg.model.hidden_size} is not divisible by "
            f"model.num_attention_heads={cfg.model.num_attention_heads}; set model.head_dim or "
            f"use heads in {join(works)}"
        ),
        lambda cfg, v: nearest(divisors(cfg.model.hidden_size), cfg.model.num_attention_heads),
    ),
)
