"""The published measurements the planner is held to (../shared/reference/calibration.csv), as
configurations plus the measured value in the planner's own units.

Choices made for each source (the CSV leaves them open), with the evidence:
- N1-N5 (Narayanan et al. 2021, Table 1, A100-80GB, fp16, full recompute): the micro-batch size is
  not given; we take 1 (it only matters for N5's bubble, 1/48 of compute). Megatron 2021 did not
  overlap the data-parallel all-reduce with backward (overlap_comm=False) and reduced fp16 gradients
  (grad_dtype fp16). Eager attention (no flash attention in 2021), dropout on (GPT). Measured step
  time = 96 B s l h^2 (1 + s/6h + V/16lh) / (TFLOP/s * n_gpus) (the paper's own FLOP count).
- T1 (torchtitan Llama 3.1 8B, 8 x H100 96GB, FSDP, local batch 2, seq 8192, op-level selective AC,
  bf16): FSDP = ZeRO-3 over 8; 5762 tokens/s/GPU and 82.4 GiB peak reserved.
- P482 (Megatron-LM tools/get_training_info, Llama2-7B, 8 x H800, bf16, distributed optimizer, flash
  attention, swiglu, no recompute, no sequence parallel): the tool prints "GB" as MiB / 1024, so the
  measured values are GiB. The sequence length is not stated; we take 2048, the tool's own example:
  at 4096 the weights and optimizer alone (47 GiB) plus the activations of 2 x 4096 tokens over 32
  layers (>= 37 GiB by any count) exceed the 69.1 GiB measured. Megatron keeps fp32 main gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.config.presets import model_preset
from launcher.config.schema import (
    BackendConfig,
    ClusterConfig,
    LLMTrainConfig,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.flops import narayanan_flops_per_iteration

GIB = 1024**3


@dataclass(frozen=True)
class CalibrationPoint:
    id: str
    metric: str  # "step_s" | "tokens_per_s_per_gpu" | "allocated_bytes" | "reserved_bytes"
    measured: float
    config: LLMTrainConfig
    note: str


def _gpt(layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(
        name=f"gpt-{layers}x{hidden}",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=heads,
        vocab_size=51200,
        seq_length=2048,
        activation="gelu",
        norm="layernorm",
        position="learned",
        tie_embeddings=True,
        attention="eager",
        linear_bias=True,
    )


def _narayanan(
    rid: str, layers: int, hidden: int, heads: int, gpus: int, tp: int, pp: int, gbs: int, tf: float
) -> CalibrationPoint:
    model = _gpt(layers, hidden, heads)
    cfg = LLMTrainConfig(
        recipe=f"calibration-{rid}",
        model=model,
        parallel=ParallelConfig(tp=tp, pp=pp),
        zero=ZeroConfig(stage=0),
        precision=PrecisionConfig(
            name="fp16", compute_dtype="fp16", grad_dtype="fp16", loss_scaling="dynamic"
        ),
        train=TrainConfig(micro_batch_size=1, global_batch_size=gbs, steps=1, recompute="full"),
        cluster=ClusterConfig(
            name="a100-80gb", gpu="a100-80gb", num_nodes=gpus // 8, gpus_per_node=8
        ),
        backend=BackendConfig(name="megatron", overlap_comm=False),
    )
    flops = narayanan_flops_per_iteration(gbs, 2048, layers, hidden, 51200)
    return CalibrationPoint(
        rid, "step_s", flops / (tf * 1e12 * gpus), cfg, f"{tf:g} TFLOP/s/GPU on {gpus} A100"
    )


def _llama2_7b_megatron(tp: int, pp: int, mbs: int, gbs: int) -> LLMTrainConfig:
    model = model_preset("llama2-7b", seq_length=2048, attention="flash")
    return LLMTrainConfig(
        recipe="calibration-p482",
        model=model,
        parallel=ParallelConfig(tp=tp, pp=pp),
        zero=ZeroConfig(stage=1),
        precision=PrecisionConfig(name="bf16", compute_dtype="bf16", grad_dtype="fp32"),
        train=TrainConfig(micro_batch_size=mbs, global_batch_size=gbs, steps=1),
        cluster=ClusterConfig(name="h800", gpu="h800", num_nodes=1, gpus_per_node=8),
        backend=BackendConfig(
            name="megatron", reduce_bucket_size=40_000_000, allgather_bucket_size=40_000_000
        ),
    )


def _torchtitan_8b() -> LLMTrainConfig:
    model = model_preset("llama3-8b", attention="flash")
    return LLMTrainConfig(
        recipe="calibration-t1",
        model=model,
        parallel=ParallelConfig(),
        zero=ZeroConfig(stage=3),
        precision=PrecisionConfig(name="bf16", compute_dtype="bf16", grad_dtype="fp32"),
        train=TrainConfig(micro_batch_size=2, global_batch_size=16, steps=1, recompute="selective"),
        cluster=ClusterConfig(name="h100-96gb", gpu="h100-96gb", num_nodes=1, gpus_per_node=8),
        backend=BackendConfig(name="torch"),
    )


def points() -> list[CalibrationPoint]:
    t1 = _torchtitan_8b()
    return [
        _narayanan("N1", 24, 2304, 24, 32, 1, 1, 512, 137),
        _narayanan("N2", 30, 3072, 32, 64, 2, 1, 512, 138),
        _narayanan("N3", 36, 4096, 32, 128, 4, 1, 512, 142),
        _narayanan("N4", 40, 6144, 48, 256, 8, 1, 1024, 135),
        _narayanan("N5", 48, 8192, 64, 512, 8, 2, 1536, 138),
        CalibrationPoint("T1", "tokens_per_s_per_gpu", 5762.0, t1, "tokens/s/GPU"),
        CalibrationPoint("T1", "reserved_bytes", 82.4 * GIB, t1, "peak reserved"),
        CalibrationPoint(
            "P482", "allocated_bytes", 69.1 * GIB, _llama2_7b_megatron(1, 1, 2, 2048), "DP8 MBS2"
        ),
        CalibrationPoint(
            "P482-tp2",
            "allocated_bytes",
            55.7 * GIB,
            _llama2_7b_megatron(2, 1, 4, 512),
            "TP2 DP4 MBS4",
        ),
        CalibrationPoint(
            "P482-pp2",
            "allocated_bytes",
            49.8 * GIB,
            _llama2_7b_megatron(1, 2, 2, 2048),
            "PP2 DP4 MBS2",
        ),
        CalibrationPoint(
            "P482-tp8",
            "allocated_bytes",
            28.8 * GIB,
            _llama2_7b_megatron(8, 1, 4, 128),
            "TP8 DP1 MBS4",
        ),
    ]


def predicted(point: CalibrationPoint) -> float:
    from launcher.plan.planner import make_plan

    plan = make_plan(point.config)
    if point.metric == "step_s":
        return plan.time.step_s
    if point.metric == "tokens_per_s_per_gpu":
        return plan.time.tokens_per_s_per_gpu
    heaviest = plan.memory.heaviest
    return heaviest.allocated if point.metric == "allocated_bytes" else heaviest.reserved


__all__ = ["CalibrationPoint", "points", "predicted", "replace"]
