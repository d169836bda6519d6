"""backend.moe_comm_overlap: the expert all-to-all hidden behind another micro-batch's compute.

Megatron-Core's ``--overlap-moe-expert-parallel-comm`` (MCore 0.14, "batch-level overlapping to
hide EP-A2A communication") runs a combined 1F1B schedule: in steady state the forward of one
micro-batch and the backward of another are interleaved layer by layer, so each one's expert
dispatch and combine run on a communication stream beside the other's attention and MLP compute
(megatron/core/pipeline_parallel/combined_1f1b.py, schedules.py). To keep a backward to pair
with, the schedule runs one extra warm-up forward (schedules.py: "we schedule one extra
micro-batch forward step before the 1f1b stages"): one more micro-batch's activations in flight.

TransformerConfig.__post_init__ (megatron/core/transformer/transformer_config.py) accepts it only
with expert parallelism (expert_model_parallel_size > 1), the alltoall or flex dispatcher, no full
recomputation (recompute_granularity != "full", no recompute_method / recompute_num_layers),
a bf16 or fp16 model, at most one multi-token-prediction module, and, with pp > 1, virtual
pipeline stages. These are the refusals below.
llmtrain's torch and DeepSpeed engines run one micro-batch's forward and backward after the
other and have no such schedule: they refuse the key.

plan prices it in plan.timing (the expert all-to-all's hideable share,
plan.schedule.combined_1f1b_overlap_share) and plan.memory (plan.schedule's extra warm-up).
"""

from __future__ import annotations

from launcher.backends.common import Refusal, moe_dispatcher, precision_of
from launcher.config.layout import Layout
from launcher.config.pipeline_split import even_split_ok, suggestion
from launcher.config.schema import LLMTrainConfig

KEY = "backend.moe_comm_overlap"


def moe_overlap_on(cfg: LLMTrainConfig) -> bool:
    """Whether the combined 1F1B schedule runs (the key on, on an MoE model)."""
    return bool(cfg.backend.moe_comm_overlap and cfg.model.num_experts)


def extra_warmup_microbatches(cfg: LLMTrainConfig) -> int:
    """Micro-batch forwards run ahead of the usual schedule (the combined 1F1B's one)."""
    return 1 if moe_overlap_on(cfg) else 0


def megatron_moe_overlap(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if not cfg.backend.moe_comm_overlap:
        return None
    if not cfg.model.num_experts:
        return Refusal(
            (KEY, "model.num_experts"),
            f"{KEY}=true on a dense model: it overlaps the expert all-to-all, which a model "
            f"without experts does not have; use {KEY}=false",
        )
    if layout.ep <= 1:
        return Refusal(
            (KEY, "parallel.ep"),
            f"{KEY}=true with parallel.ep=1: Megatron-Core overlaps expert-parallel "
            "communication only, which needs expert_model_parallel_size > 1; use parallel.ep=2 "
            f"or more (dividing model.num_experts={cfg.model.num_experts}), or {KEY}=false",
        )
    dispatcher = moe_dispatcher(cfg)
    if dispatcher not in ("alltoall", "flex"):
        return Refusal(
            (KEY, "backend.moe_dispatcher"),
            f"{KEY}=true with the {dispatcher} dispatcher: Megatron-Core overlaps the alltoall "
            "and flex dispatchers only; use backend.moe_dispatcher=alltoall (or flex)",
        )
    if cfg.train.recompute == "full":
        return Refusal(
            (KEY, "train.recompute"),
            f"{KEY}=true with train.recompute=full: Megatron-Core's combined 1F1B schedule needs "
            "each layer's own backward, which full recomputation replaces; use "
            f"train.recompute=selective (or none), or {KEY}=false",
        )
    if precision_of(cfg) == "fp32":
        return Refusal(
            (KEY, "precision"),
            f"{KEY}=true with precision=fp32: Megatron-Core overlaps it for bf16 or fp16 models "
            f"only; use precision=bf16 (or fp8, whose weights are bf16), or {KEY}=false",
        )
    if cfg.model.mtp_layers > 1:
        return Refusal(
            (KEY, "model.mtp_layers"),
            f"{KEY}=true with model.mtp_layers={cfg.model.mtp_layers}: Megatron-Core overlaps "
            "with one multi-token-prediction module at most; use model.mtp_layers=1, or "
            f"{KEY}=false",
        )
    if layout.pp > 1 and layout.vpp <= 1:
        layers = cfg.model.num_layers
        even = [v for v in range(2, 9) if even_split_ok(layers, layout.pp, v)]
        use = (
            f"parallel.vpp={even[0]}"
            if even
            else f"parallel.vpp=2 with an uneven split ({suggestion(layers, layout.pp, 2)})"
        )
        return Refusal(
            (KEY, "parallel.vpp", "parallel.pp"),
            f"{KEY}=true with parallel.pp={layout.pp} and no virtual stages: Megatron-Core pairs "
            "forward and backward chunks of the interleaved schedule only; use "
            f"parallel.pp_schedule=interleaved with {use}, or parallel.pp=1",
        )
    return None


def moe_overlap_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if not cfg.backend.moe_comm_overlap:
        return None
    return Refusal(
        (KEY, "backend"),
        f"{KEY}=true: this engine runs each micro-batch's forward and backward in turn (no "
        f"combined 1F1B schedule), so nothing would overlap; use {KEY}=false, or backend=megatron",
    )
