"""Model states of one GPU of a stage: weights, gradients and optimizer states, by precision and
optimizer (ZeRO paper, Rajbhandari et al. 2020: mixed-precision Adam = 2 weight + 2 gradient + 12
optimizer bytes, the 12 being the fp32 master copy and Adam's m and v), sharded by ZeRO stage over
the data-parallel ranks (dp * cp; expert parameters over the expert-data-parallel ranks), and
what CPU offload moves to the host (plan/memory/offload.py). plan/memory/estimate.py assembles
them."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.common import backend_of, expert_data_parallel, expert_tensor_parallel
from launcher.config.layout import Layout
from launcher.config.pipeline_split import mtp_stage
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.memory import memory_savers
from launcher.plan.memory.offload import gradient_placement, state_placement
from launcher.plan.model_shape import ModelShape

# Optimizer states in fp32 per parameter, besides the master copy: Adam keeps m and v (Kingma & Ba
# 2015), Lion one momentum (Chen et al. 2023), SGD with momentum one buffer.
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "lion": 4, "sgd": 4}


@dataclass(frozen=True)
class BytesPerParam:
    weights: float
    gradients: float
    optimizer: float


def fp8_weight_copy_bytes(cfg: LLMTrainConfig) -> float:
    """Bytes per parameter of the fp8 weight copies kept across a step's micro-batches.

    Transformer Engine (backend=megatron) keeps an fp8 copy of each weight and of its transpose
    (1 + 1 bytes); torchao's float8 training (backend=torch) casts each weight on the fly in
    every forward and backward and keeps no copy (torchao float8_linear.py saves the
    high-precision weight for the backward)."""
    return backend_of(cfg).fp8_copy_bytes(cfg)


def bytes_per_param(cfg: LLMTrainConfig) -> BytesPerParam:
    """Unsharded bytes per parameter of each model-state bucket (ZeRO paper, section 3)."""
    p = cfg.precision
    weights = float(DTYPE_BYTES[p.compute_dtype]) + fp8_weight_copy_bytes(cfg)
    if p.fp8 and p.fp8_param_gather:
        # --fp8-param-gather: the fp8 weight and its transpose are the only compute copy.
        weights = 2.0
    gradients = float(DTYPE_BYTES[p.grad_dtype])
    gradients = memory_savers.pure_bf16_gradient_bytes(cfg) or gradients
    master = 4.0 if p.master_weights and p.compute_dtype != "fp32" else 0.0
    if master and backend_of(cfg).fp32_sharded_params(cfg):
        # torch FSDP2 with a MixedPrecisionPolicy stores the sharded parameters in fp32 (they are
        # the master copy) and casts to the compute dtype when it all-gathers them: 4 bytes of
        # weights and no separate master (the unsharded compute copy is a transient buffer); the
        # sharded gradients take the fp32 parameters' dtype (grad_dtype is the reduce dtype).
        # Still 16 bytes per parameter in all, as the ZeRO paper counts.
        weights += master - DTYPE_BYTES[p.compute_dtype]
        gradients = master
        master = 0.0
    if master and stores_master_remainders(cfg):
        master = 2.0
    return BytesPerParam(weights, gradients, master + moment_bytes(cfg))


def moment_bytes(cfg: LLMTrainConfig) -> float:
    """Optimizer-state bytes per parameter besides the master copy: block-quantized for
    adamw8bit / adamw4bit, else in the states' dtype (plan/memory_savers.py state_dtype: fp32
    unless Megatron's precision-aware optimizer or torch's bf16 states store Adam's m and v in
    16 bits; backends/optimizer_precision.py and memory_savers.py refuse the other optimizers)."""
    quantized = memory_savers.quantized_state_bytes(cfg)
    if quantized is not None:
        return quantized
    fp32 = OPTIMIZER_STATE_BYTES[cfg.optim.name]
    return fp32 * DTYPE_BYTES[memory_savers.state_dtype(cfg)] / DTYPE_BYTES["fp32"]


def stores_master_remainders(cfg: LLMTrainConfig) -> bool:
    """Megatron's precision-aware optimizer on bf16 weights keeps only the low 16 bits of each
    fp32 master weight (the high 16 are the bf16 weight itself): 2 bytes, not 4.

    Megatron-Core core_v0.16.1 optimizer/__init__.py passes OptimizerConfig.store_param_remainders
    (default True) to Transformer Engine's FusedAdam when use_precision_aware_optimizer_no_fp8_or_
    ds_fp8 holds (optimizer_config.py: fp32 main params and no fp8 recipe or the delayed one), and
    FusedAdam applies it when the parameters are bf16 and the master fp32 (so not with
    --fp8-param-gather's fp8 parameters). The CPU-offloaded optimizer (HybridDeviceOptimizer) is
    another class and keeps full fp32 masters."""
    p, b = cfg.precision, cfg.backend
    return (
        b.name == "megatron"
        and cfg.optim.state_dtype != "fp32"
        and cfg.zero.offload_optimizer == "none"
        and p.compute_dtype == "bf16"
        and not p.fp8_param_gather
        and (not p.fp8 or b.fp8_scaling in (None, "delayed"))
    )


def pipelined_fsdp_accumulates(cfg: LLMTrainConfig, layout: Layout) -> bool:
    """torch FSDP2 (zero.stage 2/3) under pipelining: gradients accumulate unsharded over the
    step's micro-batches and are reduce-scattered once, after the last backward. Without pp the
    torch engine reduce-scatters every micro-batch, as DeepSpeed's ZeRO-2/3 do."""
    return backend_of(cfg).pipelined_unsharded_grads(cfg, layout.pp)


def vocab_params(cfg: LLMTrainConfig, layout: Layout, stage: int) -> float:
    """Embedding and output-layer parameters one GPU of `stage` holds (as stage_params counts
    them)."""
    shape = ModelShape(cfg.model)
    m = cfg.model
    vocab_tp = backend_of(cfg).vocab_split(max(1, layout.tp))
    n = 0.0
    if stage == 0:
        n += shape.embedding_params() / vocab_tp
    if stage == layout.pp - 1:
        n += shape.output_params() / vocab_tp
        if m.tie_embeddings and layout.pp > 1:
            n += m.vocab_size * m.hidden_size / vocab_tp
    return n


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds before ZeRO sharding (after tp / ep splits)."""

    dense: float
    expert: float

    @property
    def total(self) -> float:
        return self.dense + self.expert


def stage_params(cfg: LLMTrainConfig, layout: Layout, stage: int) -> StageParams:
    shape = ModelShape(cfg.model)
    m = cfg.model
    tp, ep = max(1, layout.tp), max(1, layout.ep)
    etp = expert_tensor_parallel(cfg, layout)
    first_layer = sum(layout.stage_layers[:stage]) if layout.vpp == 1 else None
    dense = 0.0
    expert = 0.0
    # Which layers live on this stage: contiguous with vpp == 1, else chunks i % pp == stage.
    indices: list[int] = []
    if first_layer is not None:
        indices = list(range(first_layer, first_layer + layout.stage_layers[stage]))
    else:
        start = 0
        for c, n in enumerate(layout.chunk_layers):
            if c % layout.pp == stage:
                indices.extend(range(start, start + n))
            start += n
    routed = shape.expert_params() * (m.num_experts or 0)
    # Every dense layer has the same count, and so does every MoE layer (shape.layer_params):
    # each kind's shares are computed once and added layer by layer.
    is_moe = shape.is_moe
    dense_share = shape.dense_layer_params() / tp
    expert_share = routed / (ep * etp) if is_moe else 0.0
    moe_dense_share = (shape.moe_layer_params() - routed) / tp if is_moe else 0.0
    for i in indices:
        if is_moe and i >= m.moe_dense_layers:
            expert += expert_share
            dense += moe_dense_share
        else:
            dense += dense_share
    if stage == mtp_stage(cfg.parallel.pipeline_layout, layout.pp, m.mtp_layers):
        # The multi-token-prediction modules (ModelShape.mtp_module_params): their layer's
        # experts split like the others', the rest like a dense layer's.
        mtp_routed = routed if shape.mtp_is_moe else 0
        expert += m.mtp_layers * mtp_routed / (ep * etp)
        dense += m.mtp_layers * (shape.mtp_module_params() - mtp_routed) / tp
    vocab_tp = backend_of(cfg).vocab_split(tp)
    if stage == 0:
        dense += shape.embedding_params() / vocab_tp
    if stage == layout.pp - 1:
        dense += shape.output_params() / vocab_tp
        if m.tie_embeddings and layout.pp > 1:
            # The last stage keeps its own copy of the tied embedding for the output projection.
            dense += m.vocab_size * m.hidden_size / vocab_tp
    return StageParams(dense, expert)


def zero_shard(layout: Layout) -> int:
    return max(1, layout.dp * layout.cp)


@dataclass(frozen=True)
class StageStates:
    """Model states one GPU of a stage holds (after ZeRO sharding and CPU offload), in bytes."""

    params: float
    weights: float
    gradients: float
    optimizer: float
    host_bytes: float


def stage_states(
    cfg: LLMTrainConfig, layout: Layout, stage: int, params: StageParams | None = None
) -> StageStates:
    """Weights, gradients, optimizer states (and host bytes) of one GPU of `stage`.

    Reads the model, precision, optimizer and zero sections, and the layout's tp, pp, vpp, ep, dp,
    cp and chunk split. `params`: this stage's ``stage_params``, when the caller has them.
    """
    z = cfg.zero
    bpp = bytes_per_param(cfg)
    if params is None:
        params = stage_params(cfg, layout, stage)
    shard = zero_shard(layout)
    # Expert states shard over the expert-data-parallel ranks (MoE parallel folding).
    expert_shard = expert_data_parallel(cfg, layout)

    def sharded(per_param: float, on: bool) -> float:
        if not on:
            return per_param * params.total
        return per_param * (params.dense / shard + params.expert / expert_shard)

    if finetune.is_finetune(cfg):
        return _finetune_states(cfg, layout, stage, params)
    weights = sharded(bpp.weights, z.stage >= 3)
    copy = fp8_weight_copy_bytes(cfg)
    if copy and not cfg.precision.fp8_param_gather:
        # Transformer Engine keeps fp8 copies of its own linear layers' weights only: the
        # embedding (VocabParallelEmbedding) and the output layer (tensor_parallel's
        # ColumnParallelLinear) run in bf16 outside it (Megatron-Core gpt_model.py).
        weights -= copy * vocab_params(cfg, layout, stage) / (shard if z.stage >= 3 else 1)
    gradients = sharded(bpp.gradients, z.stage >= 2)
    if cfg.optim.in_backward:  # one tensor's gradient at a time (plan/memory_savers.py)
        gradients = memory_savers.in_backward_gradients(cfg, layout, bpp.gradients)
    # Offloading engines keep (part of) the gradients on the host (plan/memory/offload.py).
    gradients, host = gradient_placement(cfg, gradients, sharded(4.0, True))
    if z.stage >= 2 and pipelined_fsdp_accumulates(cfg, layout):
        # torch FSDP2 under torch.distributed.pipelining: every backward but the schedule's last
        # runs with gradient sync and reshard-after-backward off (PipelineStage.
        # backward_maybe_with_nosync), so each stage keeps its parameters unsharded in the
        # compute dtype (ZeRO-3; ZeRO-2 keeps them anyway) and accumulates unsharded gradients
        # in the reduce dtype (FSDPParam.to_accumulated_grad_if_needed: grad_dtype with mixed
        # precision, fp32 without) until the one reduce-scatter (perform_reduce_grad).
        compute = cfg.precision.compute_dtype
        if z.stage >= 3:
            weights += DTYPE_BYTES[compute] * params.total
        reduce = cfg.precision.grad_dtype if compute != "fp32" else "fp32"
        gradients += DTYPE_BYTES[reduce] * params.total
    optimizer = sharded(bpp.optimizer, z.stage >= 1)
    # optim.offload=cpu: Adam's moments on the host, one tensor's on the GPU (offload.py).
    optimizer, paged = state_placement(cfg, layout, optimizer, params.total, moment_bytes(cfg))
    host += paged
    if z.offload_optimizer == "cpu":
        host += optimizer
        optimizer = 0.0
    if z.offload_params == "cpu":
        host += weights
        weights = 0.0
    return StageStates(params.total, weights, gradients, optimizer, host)


def _finetune_states(
    cfg: LLMTrainConfig, layout: Layout, stage: int, params: StageParams
) -> StageStates:
    """finetune=lora|qlora (launcher/plan/finetune.py): the frozen base at its dtype (NF4 for
    qlora's targets), sharded by ZeRO-3 / FSDP like any weight, with no gradient or optimizer
    state; the adapters with fp32 weights, gradients and optimizer states, sharded by stage."""
    z = cfg.zero
    shard = zero_shard(layout)
    tp = max(1, layout.tp)
    layers = layout.stage_layers[stage]
    adapters = layers * finetune.adapter_params_per_layer(cfg, tp)
    frozen = finetune.frozen_weight_bytes(cfg, params.total, layers, tp)
    weights = frozen / (shard if z.stage >= 3 else 1)
    weights += finetune.ADAPTER_WEIGHT_BYTES * adapters / (shard if z.stage >= 3 else 1)
    gradients = finetune.ADAPTER_GRAD_BYTES * adapters / (shard if z.stage >= 2 else 1)
    if cfg.optim.in_backward:  # one adapter's gradient at a time (plan/memory_savers.py)
        gradients = memory_savers.in_backward_gradients(cfg, layout, finetune.ADAPTER_GRAD_BYTES)
    optimizer = moment_bytes(cfg) * adapters / (shard if z.stage >= 1 else 1)
    optimizer, host = state_placement(cfg, layout, optimizer, adapters, moment_bytes(cfg))
    if z.offload_optimizer == "cpu":
        host, optimizer = host + optimizer, 0.0
    return StageStates(params.total + adapters, weights, gradients, optimizer, host)
