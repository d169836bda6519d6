"""``backend=deepspeed``: what llmtrain's DeepSpeed engine (launcher/train/engines/
deepspeed_engine.py) runs: data parallel with ZeRO stages 0-3 and CPU offload, configured by the
generated ds_config.json (launcher/render/ds_config.py); pipeline parallel with DeepSpeed's
PipelineModule and its own 1F1B schedule (deepspeed.ai/tutorials/pipeline: one chunk per stage,
the embedding and the head on different stages, so untied); tensor parallel with DeepSpeed's
training-time AutoTP (ds_config "tensor_parallel": autotp_size and a partition_config naming the
model's projections), over (dp, tp) groups with tp innermost, with ZeRO 0-3 and offload (each
exercised on CPU with gloo by tests/integration/test_deepspeed_tensor_parallel.py).
Not run: AutoTP inside a pipeline (llmtrain builds the PipelineModule's stages and AutoTP's
(dp, tp) groups separately, so tp x pp is not wired); AutoTP splits projections evenly over tp, so
tp must divide the key/value heads (no replication); the MoE experts and the MLA projections have
no partition rules (MoE and MLA run with tp=1); no sequence parallel, context or expert parallel;
no fp8 (the engine would train in bf16; backend=torch precision=fp8 runs torchao float8); no fp16
on CPU (DeepSpeed's CPU accelerator refuses it).
"""

from __future__ import annotations

from launcher.backends.activation_modules import activation_modules_not_run
from launcher.backends.common import Backend, Refusal
from launcher.backends.engine_choices import chunked_loss_elsewhere
from launcher.backends.fp8_params import fp8_param_gather_not_run
from launcher.backends.memory_savers import savers_not_run
from launcher.backends.moe_overlap import moe_overlap_not_run
from launcher.backends.optimizer_offload import state_offload_not_run
from launcher.backends.optimizer_precision import state_dtype_not_run
from launcher.backends.packed_attention import flex_not_run
from launcher.backends.speed_features import speed_features_not_run
from launcher.config.layout import Layout, split_keys
from launcher.config.pipeline_split import SPLIT_KEYS
from launcher.config.schema import LLMTrainConfig

_NOT_HERE = (
    "llmtrain's DeepSpeed engine runs data parallel (ZeRO), pipeline parallel and AutoTP tensor "
    "parallel only"
)


def _virtual_stages_with_pipeline(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.pp <= 1 or p.vpp == 1:
        return None
    return Refusal(
        ("parallel.vpp",),
        f"parallel.vpp={p.vpp}: DeepSpeed's pipeline engine has no virtual stages; use "
        "parallel.vpp=1",
    )


def _megatron_split_keys(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    keys = split_keys(cfg)
    if not keys.any:
        return None
    return Refusal(
        SPLIT_KEYS,
        f"{keys.describe()}: DeepSpeed's PipelineModule places the layers itself "
        "(partition_method, here type:TransformerBlock); drop the split keys, or use "
        "backend=megatron or backend=torch, which follow them",
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


def _tensor_parallel_with_pipeline(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.tp <= 1 or p.pp <= 1:
        return None
    return Refusal(
        ("parallel.tp", "parallel.pp"),
        f"parallel.tp={p.tp} with parallel.pp={p.pp}: llmtrain's DeepSpeed engine runs AutoTP "
        "tensor parallel without a pipeline only (its PipelineModule topology has no tensor "
        "axis here); use parallel.pp=1 with tp, or parallel.tp=1 with pp",
    )


def _fp16_on_cpu(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if cfg.cluster.gpu != "cpu" or cfg.precision.compute_dtype != "fp16":
        return None
    return Refusal(
        ("precision", "cluster.gpu"),
        "precision=fp16 on CPU: DeepSpeed's CPU accelerator has no fp16; use precision=bf16 or "
        "precision=fp32",
    )


def _compile_requested(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if not cfg.backend.compile:
        return None
    return Refusal(
        ("backend.compile",),
        "backend.compile=true with backend=deepspeed: llmtrain's DeepSpeed engine runs the model "
        "eager (it has no compile path), so the setting would be ignored; leave backend.compile "
        "unset (null) or false, or use backend=torch to compile each block",
    )


BACKEND = Backend(
    name="deepspeed",
    adapter_methods=("lora",),
    # deepspeed/runtime/zero/stage_1_and_2.py: param_groups[i]["params"] =
    # [single_partition_of_fp32_groups[i]] (launcher/train/engines/deepspeed_engine.py).
    flat_optimizer_stages=(1, 2),
    summary=(
        "DeepSpeed: ZeRO 0-3 data parallel, CPU offload, PipelineModule 1F1B, AutoTP tensor "
        "parallel (ds_config.json)"
    ),
    launchable=True,
    not_launchable="",
    needs="",
    devices=("cpu", "cuda"),
    degrees=frozenset({"pp", "tp"}),
    degree_notes={key: _NOT_HERE for key in ("cp", "ep")},
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
    precision_notes={
        "fp8": (
            "llmtrain's DeepSpeed engine has no fp8 linear layers (DeepSpeed runs fp8 GEMMs only "
            "in Transformer Engine modules, which llmtrain's model does not use), so it would "
            "train in bf16; backend=torch precision=fp8 trains with torchao float8 on CUDA GPUs "
            "of compute capability 8.9+ (precision.fp8_emulate=true elsewhere)"
        )
    },
    combos=(
        fp8_param_gather_not_run,
        state_dtype_not_run,
        savers_not_run,
        state_offload_not_run,
        moe_overlap_not_run,
        activation_modules_not_run,
        speed_features_not_run,
        _virtual_stages_with_pipeline,
        _megatron_split_keys,
        _zero_2_or_3_with_pipeline,
        _tensor_parallel_with_pipeline,
        _fp16_on_cpu,
        _compile_requested,
        chunked_loss_elsewhere,
        flex_not_run,
    ),
    engine="launcher.train.engines.deepspeed_engine:DeepSpeedEngine",
    # No expert parallel (parallel.ep=1): every rank holds every expert and the routed copies stay
    # on their rank (launcher/train/model/experts.py); priced as alltoall, which moves nothing at ep
    # 1.
    moe_dispatchers=("alltoall",),
    moe_dispatcher_note=(
        "llmtrain's DeepSpeed engine has no expert parallelism (every expert on every rank, no "
        "token dispatch)"
    ),
    artifacts=("ds_config.json",),
    # AutoTP with llmtrain's partition_config (launcher/render/ds_config.py) splits the attention
    # and MLP projections only: the embedding and the output layer stay whole on every tp rank,
    # which computes the full logits and the eager loss (deepspeed_engine.py's docstring).
    tp_splits_vocab=False,
)
