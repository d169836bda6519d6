"""``backend=deepspeed``: what llmtrain's DeepSpeed engine (launcher/train/engines/
deepspeed_engine.py) runs: data parallel with ZeRO stages 0-3 and CPU offload, configured by the
generated ds_config.json (launcher/render/ds_config.py), and pipeline parallel with DeepSpeed's
PipelineModule and its own 1F1B schedule (deepspeed.ai/tutorials/pipeline: one chunk per stage,
the embedding and the head on different stages, so untied). No tensor parallel (DeepSpeed's AutoTP
is wired for inference-style module replacement, not llmtrain's model), no context or expert
parallel; no fp8 (the engine would train in bf16); no fp16 on CPU (DeepSpeed's CPU accelerator
refuses it)."""

from __future__ import annotations

from launcher.backends.common import Backend, Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

_NOT_HERE = "llmtrain's DeepSpeed engine runs data parallel (ZeRO) and pipeline parallel only"


def _virtual_stages_with_pipeline(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.pp <= 1 or p.vpp == 1:
        return None
    return Refusal(
        ("parallel.vpp",),
        f"parallel.vpp={p.vpp}: DeepSpeed's pipeline engine has no virtual stages; use "
        "parallel.vpp=1",
    )


def _zero_2_or_3_with_pipeline(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    # DeepSpeed's PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
    # parallelism".
    if cfg.parallel.pp <= 1 or cfg.zero.stage < 2:
        return None
    return Refusal(
        ("zero.stage", "parallel.pp"),
        f"zero.stage={cfg.zero.stage} with parallel.pp={cfg.parallel.pp}: DeepSpeed's pipeline "
        "engine runs ZeRO stage 0 or 1 only; use zero.stage=1",
    )


def _fp16_on_cpu(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if cfg.cluster.gpu != "cpu" or cfg.precision.compute_dtype != "fp16":
        return None
    return Refusal(
        ("precision", "cluster.gpu"),
        "precision=fp16 on CPU: DeepSpeed's CPU accelerator has no fp16; use precision=bf16 or "
        "precision=fp32",
    )


BACKEND = Backend(
    name="deepspeed",
    summary="DeepSpeed: ZeRO 0-3 data parallel, CPU offload, PipelineModule 1F1B (ds_config.json)",
    launchable=True,
    not_launchable="",
    needs="",
    devices=("cpu", "cuda"),
    degrees=frozenset({"pp"}),
    degree_notes={key: _NOT_HERE for key in ("tp", "cp", "ep")},
    zero_stages=(0, 1, 2, 3),
    zero_notes={
        0: "plain data parallel",
        1: "optimizer states sharded",
        2: "optimizer states and gradients sharded",
        3: "everything sharded",
    },
    precisions=("bf16", "fp16", "fp32"),
    optimizers=("adamw", "adam", "sgd", "lion"),
    # DeepSpeed docs: ZeRO-Offload of optimizer states with stage 1-3, parameters with stage 3.
    offload_optimizer_stages=(1, 2, 3),
    offload_params_stages=(3,),
    schedules=("1f1b",),
    features=frozenset({"moe", "mla"}),
    combos=(_virtual_stages_with_pipeline, _zero_2_or_3_with_pipeline, _fp16_on_cpu),
)
