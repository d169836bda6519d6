"""``backend=megatron``: what Megatron-LM runs, for the arguments llmtrain renders
(launcher/render/megatron_args.py, megatron_args.txt). `run` and `submit` launch the user's own
Megatron-LM checkout's pretrain_gpt.py with them under torchrun / srun
(launcher/render/megatron_launch.py); without a checkout they refuse, saying how to get one.

Facts from Megatron-LM's ``megatron/training/arguments.py`` and the Megatron-core docs:
- ``--use-distributed-optimizer`` shards optimizer states over data parallel (zero.stage=1);
  Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params``)
  shards parameters, gradients and optimizer states (zero.stage=3); there is no gradients-only
  stage 2. CPU offload (``--optimizer-cpu-offload``) is of the distributed optimizer only.
- Grouped-query attention needs tp to divide ``--num-query-groups`` (no kv-head replication).
- MoE parallel folding (Megatron-core MoE docs): the expert layers re-fold the tp x cp x dp ranks
  of a pipeline stage into expert-tensor x expert x expert-data parallel groups, so ep must divide
  tp x cp x dp (with ``--expert-tensor-parallel-size 1`` when ep does not divide dp x cp).
- Pipeline schedules: 1F1B, interleaved with virtual stages. Uneven splits through Megatron-Core's
  own keys (parallel.account_for_embedding/loss_in_pipeline_split,
  parallel.num_layers_in_first/last_pipeline_stage, parallel.pipeline_layout; conditions in
  launcher/config/pipeline_split.py); with parallel.pp_layers only the first and last stage may
  differ, without virtual stages.
"""

from __future__ import annotations

from launcher.backends.activation_modules import megatron_activation_modules
from launcher.backends.common import Backend, Refusal
from launcher.backends.fp8_params import megatron_fp8_param_gather
from launcher.backends.memory_savers import savers_not_run
from launcher.backends.moe_overlap import megatron_moe_overlap
from launcher.backends.optimizer_offload import state_offload_not_run
from launcher.backends.optimizer_precision import megatron_state_dtype
from launcher.backends.speed_features import megatron_speed_features
from launcher.config.layout import Layout
from launcher.config.pipeline_split import even_split_ok, suggestion
from launcher.config.schema import LLMTrainConfig


def _pipeline_split(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.pp <= 1 or p.pp_layers is None:
        return None
    stages = list(layout.stage_layers)
    if len(set(stages[1:-1])) > 1:
        return Refusal(
            ("parallel.pp_layers",),
            f"parallel.pp_layers={stages}: Megatron-LM splits the inner stages evenly (only the "
            "first and last may differ); make the inner stages equal",
        )
    if p.vpp > 1 and len(set(stages)) > 1:
        return Refusal(
            ("parallel.pp_layers", "parallel.vpp"),
            f"parallel.pp_layers={stages} with parallel.vpp={p.vpp}: uneven stages with "
            "interleaving are not expressible in Megatron-LM; use equal stages",
        )
    return None


def _virtual_stages(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """An uneven layer count with none of Megatron-Core's split keys: Megatron-LM refuses it
    (megatron/training/arguments.py, transformer_block.py), except with one chunk per stage where
    only the first and last stage differ (rendered as --decoder-first/last-pipeline-num-layers).
    The refusal names the split keys that work (launcher/config/pipeline_split.py)."""
    p, layers = cfg.parallel, cfg.model.num_layers
    if p.pp <= 1 or layout.explicit_split or even_split_ok(layers, p.pp, p.vpp):
        return None
    stages = layout.stage_layers
    if p.vpp == 1 and len(set(stages[1:-1])) <= 1:
        return None
    return Refusal(
        ("parallel.pp", "parallel.vpp", "model.num_layers"),
        f"model.num_layers={layers} does not split evenly over pp x vpp = {p.pp} x {p.vpp}: "
        "Megatron-Core needs an uneven split said explicitly; " + suggestion(layers, p.pp, p.vpp),
    )


BACKEND = Backend(
    name="megatron",
    summary="Megatron-LM: TP/PP/CP/EP, distributed optimizer or Megatron-FSDP (pretrain_gpt.py)",
    launchable=True,
    not_launchable="",
    needs="a Megatron-LM checkout: `backend.megatron_path` or `MEGATRON_LM_PATH`",
    devices=("cuda",),
    degrees=frozenset({"tp", "pp", "cp", "ep"}),
    degree_notes={},
    zero_stages=(0, 1, 3),
    zero_notes={
        0: "plain data parallel",
        1: "distributed optimizer (--use-distributed-optimizer)",
        2: "Megatron-LM has no gradients-and-optimizer-only sharding (the distributed optimizer "
        "is zero.stage=1, Megatron-FSDP is zero.stage=3)",
        3: "Megatron-FSDP (--use-megatron-fsdp, optim_grads_params)",
    },
    precisions=("bf16", "fp16", "fp8", "fp32"),
    optimizers=("adamw", "adam", "sgd"),
    offload_optimizer_stages=(1,),
    offload_params_stages=(),
    schedules=("1f1b", "interleaved"),
    features=frozenset(
        {"moe", "moe+tp", "mla", "mla+tp", "tied-embeddings+pp", "sequence-parallel", "mtp"}
    ),
    expert_span=("tp", "cp", "dp"),
    combos=(
        _pipeline_split,
        _virtual_stages,
        megatron_fp8_param_gather,
        megatron_state_dtype,
        savers_not_run,
        state_offload_not_run,
        megatron_moe_overlap,
        megatron_activation_modules,
        megatron_speed_features,
    ),
    # Each rank runs Megatron-LM's own training script with the rendered arguments
    # (launcher/render/megatron_launch.py).
    entry="pretrain_gpt.py",
    checkpoint_tracker="latest_checkpointed_iteration.txt",
    # Megatron-LM does not answer SIGUSR1; --exit-signal-handler checkpoints on SIGTERM.
    answers_usr1=False,
    # Megatron-LM's docs: with tensor parallel, orders the communication kernels before the GEMMs
    # they overlap with.
    tp_env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    artifacts=("megatron_args.txt",),
    # Transformer Engine keeps an fp8 copy of each weight and of its transpose (1 + 1 bytes).
    fp8_weight_copy_bytes=2.0,
    attention_kernel="te",
    # Megatron's hand-fused element-wise kernels count as compiled.
    fused_elementwise=True,
    # overlap_p2p_comm, on by default with virtual pipeline stages.
    overlaps_interleaved_p2p=True,
    # zero.stage=3 is Megatron-FSDP (plan/memory/megatron_fsdp.py prices its buffers).
    megatron_fsdp=True,
    # Vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py): in-place backward.
    eager_loss=False,
    # Transformer Engine's AttnFuncWithCPAndKVP2P: received K/V, received dK/dV, own dK/dV.
    cp_ring_kv_buffers=3.0,
    cp_ring_kv_fp32_buffers=0.0,
    cp_ring_q_fp32_buffers=0.0,
    # Megatron-core's TransformerConfig.moe_token_dispatcher_type ('allgather' | 'alltoall' |
    # 'flex', default 'allgather'; megatron/core/transformer/transformer_config.py, whose fields
    # megatron/training/arguments.py turns into --moe-token-dispatcher-type): llmtrain renders
    # the flag only when backend.moe_dispatcher is set (launcher/render/megatron_args.py).
    moe_dispatchers=("allgather", "alltoall", "flex"),
    # --recompute-granularity selective with Megatron-Core's default --recompute-modules
    # (["core_attn"], transformer_config.py): the attention core only, on every layer.
    selective_recompute=("core", "core"),
)
