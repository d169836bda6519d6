"""``backend=torch``: what llmtrain's PyTorch-native engine (launcher/train/engines/torch_engine.py)
runs: DDP (zero.stage=0), DDP + ZeroRedundancyOptimizer (1, data parallel only), FSDP2
``fully_shard`` (2: reshard_after_forward=False, 3: full shard, with CPUOffloadPolicy for parameter
offload), DTensor tensor and sequence parallel, ``torch.distributed.pipelining`` (GPipe, 1F1B,
interleaved 1F1B), context parallel by ring attention (with data parallel only), expert parallel by
all-to-all dispatch (with plain data parallel, and tp), MoE and multi-head latent attention under
tp (experts and heads tensor-parallel), fp16 with dynamic loss scaling (not with pipelining), on
one DeviceMesh. Every accepted combination is exercised on CPU with gloo by
tests/integration/test_torch_engine.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launcher.backends.activation_modules import activation_modules_not_run
from launcher.backends.common import Backend, Refusal, device_of, precision_of
from launcher.backends.engine_choices import (
    FP8_EAGER_NOTE,
    chunked_loss_elsewhere,
    compile_in_force,
)
from launcher.backends.fp8_params import fp8_param_gather_not_run
from launcher.backends.memory_savers import torch_savers
from launcher.backends.moe_overlap import moe_overlap_not_run
from launcher.backends.optimizer_offload import torch_state_offload
from launcher.backends.packed_attention import flex_not_run
from launcher.backends.speed_features import speed_features_not_run
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig, ModelConfig


def _optimizer_offload_alone(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    z = cfg.zero
    if z.offload_optimizer == "cpu" and z.offload_params != "cpu" and z.stage == 3:
        return Refusal(
            ("zero.offload_optimizer", "zero.offload_params"),
            "zero.offload_optimizer=cpu alone is not available with FSDP2 (its CPUOffloadPolicy "
            "offloads parameters, gradients and optimizer states together); set "
            "zero.offload_params=cpu as well",
        )
    return None


def _empty_pipeline_stage(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """The engine builds one torch.distributed.pipelining stage per virtual stage from
    layout.chunk_layers (any uneven split, Megatron-Core's keys included); a virtual stage without
    a transformer layer is not built."""
    if cfg.parallel.pp <= 1 or min(layout.chunk_layers, default=1) >= 1:
        return None
    return Refusal(
        ("parallel.pipeline_layout", "parallel.account_for_embedding_in_pipeline_split"),
        f"virtual stages {list(layout.chunk_layers)}: llmtrain's torch engine needs a transformer "
        "layer in every pipeline stage; give each stage a t, or leave the split keys unset (the "
        "automatic split)",
    )


def _interleaved_rounds(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.pp <= 1 or p.pp_schedule != "interleaved":
        return None
    # ScheduleInterleaved1F1B runs the micro-batches in rounds of grad_accum // pp.
    rounds = max(1, layout.grad_accum // p.pp)
    if layout.grad_accum % rounds == 0:
        return None
    return Refusal(
        ("train.grad_accum", "parallel.pp"),
        f"parallel.pp_schedule=interleaved runs grad_accum={layout.grad_accum} micro-batches in "
        f"{rounds} rounds, which must divide it; use a multiple of pp={p.pp} (or fewer than "
        f"{2 * p.pp})",
    )


def _zero1_with_tp_or_pp(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if cfg.zero.stage != 1 or (p.tp == 1 and p.pp == 1):
        return None
    return Refusal(
        ("zero.stage", "parallel.tp", "parallel.pp"),
        f"zero.stage=1 (DDP + ZeroRedundancyOptimizer) with parallel.tp={p.tp}, "
        f"parallel.pp={p.pp}: the torch backend shards optimizer states over plain data parallel "
        "only; use zero.stage=0, 2 or 3 with tp/pp, or parallel.tp=1 and parallel.pp=1",
    )


def _cp_with_pp_mla_or_compile(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.cp <= 1:
        return None
    if p.pp > 1:
        return Refusal(
            ("parallel.cp", "parallel.pp"),
            f"parallel.cp={p.cp} with parallel.pp={p.pp}: the torch backend's ring attention "
            "runs with data and tensor parallel only; use parallel.pp=1 with cp, or "
            "parallel.cp=1",
        )
    if cfg.model.kv_lora_rank is not None:
        return Refusal(
            ("parallel.cp", "model.kv_lora_rank"),
            f"parallel.cp={p.cp} with multi-head latent attention: the torch backend's ring "
            "attention covers standard attention only; use parallel.cp=1",
        )
    compile_on, why = compile_in_force(cfg)
    if compile_on:
        fix = (
            "set backend.compile=false"
            if cfg.backend.compile
            else "use precision=bf16 (fp8 runs compiled; eager fp8 is slower than bf16)"
        )
        return Refusal(
            ("parallel.cp", "backend.compile"),
            f"parallel.cp={p.cp} with blocks compiled ({why}): ring attention is not compiled "
            f"by the torch backend; {fix}, or parallel.cp=1",
        )
    return None


def _ep_with_pp_cp_or_sharding(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p, z = cfg.parallel, cfg.zero
    if p.ep <= 1:
        return None
    experts = cfg.model.num_experts or 0
    if experts < 2 or experts % p.ep:
        return Refusal(
            ("parallel.ep", "model.num_experts"),
            f"parallel.ep={p.ep} needs a mixture-of-experts model whose model.num_experts "
            f"({cfg.model.num_experts}) divides by ep; use parallel.ep=1",
        )
    if p.pp > 1 or p.cp > 1 or z.stage != 0:
        return Refusal(
            ("parallel.ep", "zero.stage"),
            f"parallel.ep={p.ep} with parallel.pp={p.pp}, cp={p.cp}, zero.stage={z.stage}: the "
            "torch backend's expert parallel runs over plain data parallel (zero.stage=0), with "
            "or without tp; use parallel.pp=1, cp=1 and zero.stage=0 with ep, or parallel.ep=1 "
            "(experts then sharded by FSDP or replicated by DDP over dp)",
        )
    return None


def _loss_scaling_with_pipeline(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p, prec = cfg.parallel, cfg.precision
    if p.pp <= 1 or not (prec.compute_dtype == "fp16" or prec.loss_scaling == "dynamic"):
        return None
    return Refusal(
        ("precision", "parallel.pp"),
        f"precision={prec.name} (loss_scaling={prec.loss_scaling}) with parallel.pp={p.pp}: the "
        "torch backend does not scale the loss inside the pipeline schedules; use parallel.pp=1, "
        "or precision=bf16",
    )


# torchao float8 GEMMs need both dimensions of every converted linear divisible by 16 (the
# alignment of torch._scaled_mm; torchao's float8 README). Under tp, each rank's share of a
# column- or row-parallel dimension must be.
FP8_DIM_MULTIPLE = 16


def _fp8_gemm_dims(m: ModelConfig, tp: int) -> list[tuple[int, int]]:
    """(dimension, what it must divide by) for every block projection llmtrain converts."""
    one, split = FP8_DIM_MULTIPLE, FP8_DIM_MULTIPLE * tp
    n = m.num_attention_heads
    d = m.head_dim or m.hidden_size // max(1, n)
    dims = [(m.hidden_size, one), (m.ffn_hidden_size, split)]
    if m.kv_lora_rank is None:
        dims += [(n * d, split), ((m.num_kv_heads or n) * d, one)]
    else:  # multi-head latent attention (launcher/train/model/transformer.py MLAttention)
        r, v = m.qk_rope_head_dim or 0, m.v_head_dim or d
        dims += [(m.kv_lora_rank + r, one), (m.kv_lora_rank, one)]
        dims += [(n * (d + r), split), (n * (d + v), split), (n * v, split)]
        if m.q_lora_rank is not None:
            dims.append((m.q_lora_rank, one))
    return dims


def _fp8_misfit(cfg: LLMTrainConfig) -> tuple[str, int, int | None] | None:
    """The first model key whose value leaves a converted GEMM dimension not divisible by 16
    (per tp rank), its value, and the nearest larger value that works (None: none found)."""
    m = cfg.model
    keys = ["hidden_size", "ffn_hidden_size", "head_dim", "kv_lora_rank", "qk_rope_head_dim"]
    keys += ["v_head_dim", "q_lora_rank"]

    def fits(model: ModelConfig) -> bool:
        return all(dim % mult == 0 for dim, mult in _fp8_gemm_dims(model, cfg.parallel.tp))

    if fits(m):
        return None
    for key in keys:
        value = getattr(m, key)
        if key == "head_dim" and value is None and m.kv_lora_rank is None:
            value = m.hidden_size // max(1, m.num_attention_heads)
        if value is None:
            continue
        for candidate in range(value + 1, value + 16 * FP8_DIM_MULTIPLE * cfg.parallel.tp + 1):
            changed: dict[str, Any] = {key: candidate}
            if fits(replace(m, **changed)):
                return f"model.{key}", value, candidate
    return "model.hidden_size", m.hidden_size, None


def _fp8(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """precision=fp8 (torchao float8, launcher/train/model/fp8.py): real fp8 matmuls need CUDA with
    compute capability 8.9+; precision.fp8_emulate=true runs the same numerics anywhere."""
    prec = cfg.precision
    if precision_of(cfg) != "fp8":
        return None
    if device_of(cfg) == "cpu" and not prec.fp8_emulate:
        return Refusal(
            ("precision", "cluster.gpu"),
            "precision=fp8 on CPU: real fp8 matmuls need a CUDA GPU with compute capability 8.9 "
            "or newer (L40S, H100, H200, B200); run on a GPU cluster (e.g. cluster=h100-80gb), "
            "use precision=bf16 on CPU, or set precision.fp8_emulate=true (fp8 casts and scales "
            "with emulated matmuls: numerics only, no speedup)",
        )
    if (cfg.model.num_experts or 0) > 1:
        # The routed experts run as grouped GEMMs on stacked weights
        # (launcher/train/model/experts.py), which torchao's float8 linear conversion does not
        # reach; converting only the attention would leave the larger share of the FLOPs in bf16
        # under an "fp8" label.
        return Refusal(
            ("model.num_experts", "precision"),
            "precision=fp8 with a mixture-of-experts model: the experts run as grouped GEMMs in "
            "bf16, which torchao's float8 linear layers do not cover (and per-expert float8 "
            "layers cannot scale an expert's empty token batch, which dropless routing "
            "produces); use precision=bf16 for MoE models, or a dense model "
            "(model.num_experts=null) with fp8",
        )
    if cfg.backend.compile is False and not prec.fp8_emulate:
        return Refusal(
            ("backend.compile", "precision"),
            "precision=fp8 with backend.compile=false: eager fp8 is slower than bf16 "
            f"({FP8_EAGER_NOTE}); leave backend.compile unset (null: fp8 compiles each block) "
            "or set it to true, or use precision=bf16 for an eager run",
        )
    if device_of(cfg) == "cpu" and cfg.parallel.sequence_parallel and cfg.parallel.tp > 1:
        # Measured: Float8RowwiseParallel's backward all-gathers e5m2 gradients over the
        # sequence shards; gloo has no fp8 types ("Invalid scalar type"). NCCL moves them.
        return Refusal(
            ("parallel.sequence_parallel", "precision"),
            "precision=fp8 with parallel.sequence_parallel=true on CPU: the backward all-gathers "
            "fp8 gradients over the sequence shards, which gloo cannot carry (no fp8 types); set "
            "parallel.sequence_parallel=false (fp8 with tp alone runs on CPU), or run on CUDA "
            "GPUs (NCCL)",
        )
    misfit = _fp8_misfit(cfg)
    if misfit is not None:
        key, value, works = misfit
        per_rank = f" (per rank of parallel.tp={cfg.parallel.tp})" if cfg.parallel.tp > 1 else ""
        return Refusal(
            (key, "precision"),
            f"precision=fp8 with {key}={value}: torchao float8 GEMMs need every dimension of the "
            f"block projections divisible by 16{per_rank}, and this one is not; use "
            + (f"{key}={works}, or " if works is not None else "")
            + "precision=bf16",
        )
    return None


BACKEND = Backend(
    name="torch",
    adapter_methods=("lora", "qlora"),
    adapters_with_model_parallel=True,
    bucket_needs_replicas=True,
    summary="PyTorch-native: DDP, FSDP2, DTensor TP/SP, torch.distributed.pipelining",
    launchable=True,
    not_launchable="",
    needs="",
    devices=("cpu", "cuda"),
    degrees=frozenset({"tp", "pp", "cp", "ep"}),
    degree_notes={},
    zero_stages=(0, 1, 2, 3),
    zero_notes={
        0: "DDP",
        1: "DDP + ZeroRedundancyOptimizer (data parallel only)",
        2: "FSDP2, parameters kept after forward",
        3: "FSDP2 full shard",
    },
    precisions=("bf16", "fp16", "fp32", "fp8"),
    optimizers=("adamw", "adam", "sgd", "lion", "adamw8bit", "adamw4bit"),
    offload_optimizer_stages=(3,),
    offload_params_stages=(3,),
    schedules=("1f1b", "gpipe", "interleaved"),
    features=frozenset({"moe", "moe+tp", "mla", "mla+tp", "kv-replication", "sequence-parallel"}),
    combos=(
        fp8_param_gather_not_run,
        torch_savers,
        torch_state_offload,
        moe_overlap_not_run,
        activation_modules_not_run,
        speed_features_not_run,
        _optimizer_offload_alone,
        _empty_pipeline_stage,
        _interleaved_rounds,
        _zero1_with_tp_or_pp,
        _cp_with_pp_mla_or_compile,
        _ep_with_pp_cp_or_sharding,
        _loss_scaling_with_pipeline,
        _fp8,
        chunked_loss_elsewhere,
        flex_not_run,
    ),
    engine="launcher.train.engines.torch_engine:TorchEngine",
    # launcher/train/parallel/expert_parallel.py dispatch_combine: one all_to_all_single of every
    # routed copy each way, no node deduplication and no gathered tokens.
    moe_dispatchers=("alltoall",),
    moe_dispatcher_note=(
        "llmtrain's torch engine sends every routed copy with all_to_all_single "
        "(launcher/train/parallel/expert_parallel.py), with no DeepEP or all-gather dispatcher"
    ),
    fp8_package="torchao",
    # FSDP2 with a MixedPrecisionPolicy stores the sharded parameters in fp32 (they are the
    # master copy) and casts to the compute dtype when it all-gathers them.
    fp32_sharded_params_from_stage=3,
    # FSDP2 under torch.distributed.pipelining: gradients accumulate unsharded over the step's
    # micro-batches and are reduce-scattered once, after the last backward.
    pipelined_unsharded_grads_from_stage=2,
)
