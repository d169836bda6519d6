"""Megatron-LM ``pretrain_gpt.py`` arguments equivalent to an llmtrain config.

For users who train with their own Megatron-LM checkout. Flag names follow Megatron-LM's
``megatron/training/arguments.py``. What Megatron-LM cannot express is refused with a reason
(``MegatronUnsupported``), never approximated; what Megatron-LM runs is declared once, in
launcher/backends/megatron.py (zero.stage=1 is ``--use-distributed-optimizer``, zero.stage=3 is
Megatron-FSDP; no ZeRO-2, no parameter offload, no Lion, no GPipe schedule, no kv-head
replication, pipeline splits where only the first and last stage differ).
Data, tokenizer, checkpoints and evaluation come from the config (``_data_args``): data.path /
data.blend as --data-path (Megatron-LM's weight, prefix order) or, when there is validation data,
--train-data-path / --valid-data-path; the tokenizer.json folder of a prepared dataset as
HuggingFaceTokenizer, else NullTokenizer with model.vocab_size; --save/--load in the run
directory, with --exit-signal-handler (checkpoint and exit on SIGTERM, the signal job.sbatch sends
on a preemption notice); train.eval_every/eval_steps as --eval-interval/--eval-iters.
"""

from __future__ import annotations

import shlex

from launcher.backends import raw_refusals
from launcher.backends.common import expert_tensor_parallel
from launcher.config.layout import derive_layout, split_keys
from launcher.config.norms import norm_epsilon
from launcher.config.schema import LLMTrainConfig
from launcher.data.sources import MegatronData
from launcher.render.megatron_speed_flags import megatron_speed_flags


class MegatronUnsupported(ValueError):
    """The config uses something Megatron-LM's pretrain_gpt.py cannot express."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("; ".join(reasons))


def _split_args(cfg: LLMTrainConfig) -> list[str]:
    """Uneven splits and virtual stages (what Megatron-LM cannot split is refused by
    launcher/backends/megatron.py before this runs). Megatron-Core's split keys become its flags
    (megatron/training/arguments.py); virtual stages are given as
    --num-virtual-stages-per-pipeline-rank, which arguments.py requires with uneven first/last
    stages, and not at all with --pipeline-model-parallel-layout (the layout sets them)."""
    layout = derive_layout(cfg)
    p = cfg.parallel
    keys = split_keys(cfg)
    args: list[str] = []
    if keys.layout is not None:
        return ["--pipeline-model-parallel-layout", keys.layout]
    stages = list(layout.stage_layers)
    if keys.first is not None:
        args += ["--decoder-first-pipeline-num-layers", str(keys.first)]
    if keys.last is not None:
        args += ["--decoder-last-pipeline-num-layers", str(keys.last)]
    if keys.embedding:
        args.append("--account-for-embedding-in-pipeline-split")
    if keys.loss:
        args.append("--account-for-loss-in-pipeline-split")
    uneven = p.pp > 1 and p.vpp == 1 and len(set(stages)) > 1
    if uneven and not keys.any:
        # parallel.pp_layers, or the automatic split, with equal inner stages.
        args += [
            "--decoder-first-pipeline-num-layers",
            str(stages[0]),
            "--decoder-last-pipeline-num-layers",
            str(stages[-1]),
        ]
    if p.vpp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(p.vpp)]
    return args


def _schedule_args(cfg: LLMTrainConfig, steps: int) -> list[str]:
    """--lr-decay-style and, for warmup-stable-decay, Megatron-LM's WSD flags."""
    o = cfg.optim
    if o.schedule != "wsd":
        return ["--lr-decay-style", o.schedule]
    decay_iters = max(1, round(o.wsd_decay_fraction * steps))
    # llmtrain's decay style names are Megatron-LM's (--lr-wsd-decay-style).
    return [
        "--lr-decay-style", "WSD",
        "--lr-wsd-decay-style", o.wsd_decay_style,
        "--lr-wsd-decay-iters", str(decay_iters),
    ]  # fmt: skip


def _weighted(pairs: tuple[tuple[float, str], ...]) -> list[str]:
    """One prefix alone; several as weight, prefix pairs (Megatron-LM's --data-path order)."""
    if len(pairs) == 1:
        return [pairs[0][1]]
    return [word for weight, prefix in pairs for word in (f"{weight:.6g}", prefix)]


def _data_args(cfg: LLMTrainConfig, data: MegatronData | None, run_dir: str | None) -> list[str]:
    """Tokenizer, data paths (or mock data), checkpoints in the run directory, evaluation."""
    data = data or MegatronData((), (), None, ())
    t = cfg.train
    args: list[str] = []
    if data.tokenizer_dir is not None:
        args += [
            "--tokenizer-type",
            "HuggingFaceTokenizer",
            "--tokenizer-model",
            data.tokenizer_dir,
        ]
    else:
        args += ["--tokenizer-type", "NullTokenizer"]
    if not data.train:
        # The built-in corpus is llmtrain's own byte shards: Megatron-LM gets its synthetic data.
        args.append("--mock-data")
    elif data.valid:
        args += ["--train-data-path", *_weighted(data.train)]
        args += ["--valid-data-path", *_weighted(data.valid)]
    else:
        # No held-out documents: all for training, or 1% for validation when evaluating.
        split = "99,1,0" if t.eval_every else "100,0,0"
        args += ["--data-path", *_weighted(data.train), "--split", split]
    if run_dir is not None:
        checkpoints = f"{run_dir.rstrip('/')}/checkpoints"
        args += ["--save", checkpoints, "--load", checkpoints]
        # On SIGTERM, save a checkpoint at the next iteration and exit (Megatron-LM's
        # --exit-signal-handler, SIGTERM by default): job.sbatch turns SLURM's preemption notice
        # (USR1) into SIGTERM for the ranks, and the requeued job resumes through --load.
        args.append("--exit-signal-handler")
    if t.eval_every:
        args += ["--eval-interval", str(t.eval_every), "--eval-iters", str(t.eval_steps)]
    else:
        # No evaluation. Megatron-Core 0.16's get_train_valid_test_num_samples divides
        # train_iters by eval_interval (default None: a TypeError before the first step), so an
        # interval is given too; with --eval-iters 0 it never evaluates (measured on one H200,
        # core_v0.16.1's pretrain_gpt.py).
        args += ["--eval-iters", "0", "--eval-interval", str(derive_layout(cfg).steps)]
    return args


def _model_shape_args(cfg: LLMTrainConfig) -> list[str]:
    """Layers, widths and heads; grouped-query or multi-latent attention."""
    m = cfg.model
    args = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
    ]  # fmt: skip
    if m.head_dim is not None and m.kv_lora_rank is None:
        args += ["--kv-channels", str(m.head_dim)]
    if m.num_kv_heads is not None and m.num_kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if m.kv_lora_rank is not None:
        args += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank)]
        if m.q_lora_rank is not None:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
        head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
        args += ["--qk-head-dim", str(head_dim)]
        args += ["--qk-pos-emb-head-dim", str(m.qk_rope_head_dim or 0)]
        args += ["--v-head-dim", str(m.v_head_dim or head_dim)]
    return args


def _sequence_args(cfg: LLMTrainConfig) -> list[str]:
    """Sequence length (also the position embeddings' reach) and vocabulary size."""
    m = cfg.model
    return [
        "--seq-length", str(m.seq_length),
        "--max-position-embeddings", str(m.seq_length),
        "--vocab-size", str(m.vocab_size),
    ]  # fmt: skip


def _layer_args(cfg: LLMTrainConfig) -> list[str]:
    """Activation, normalization, position embedding, dropout, tied embeddings, biases."""
    m = cfg.model
    args: list[str] = []
    if m.activation == "swiglu":
        args.append("--swiglu")
        if not cfg.backend.swiglu_fusion:
            args.append("--no-bias-swiglu-fusion")
    args += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    args += ["--position-embedding-type", "rope" if m.position == "rope" else "learned_absolute"]
    if m.position == "rope":
        args += ["--rotary-base", f"{m.rope_theta:g}"]
    # Megatron-LM's own defaults are 0.1 dropout and 1e-5 epsilon: always say what llmtrain means.
    args += [
        "--norm-epsilon", repr(norm_epsilon(m.norm, m.norm_eps)),
        "--attention-dropout", repr(m.attention_dropout),
        "--hidden-dropout", repr(m.hidden_dropout),
    ]  # fmt: skip
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    return args


def _moe_args(cfg: LLMTrainConfig) -> list[str]:
    """Experts, their widths and placement, the token dispatcher and its overlap; none for a
    dense model."""
    m = cfg.model
    if not m.num_experts:
        return []
    args = ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_top_k or 1)]
    # The experts as grouped GEMMs (TEGroupedMLP), as plan prices them and as
    # recompute_modules' moe_act needs (transformer_config.py: "moe_act in recompute_modules
    # is only supported with moe_grouped_gemm"); without it Megatron-Core runs them one by one.
    args.append("--moe-grouped-gemm")
    if m.moe_ffn_hidden_size:
        args += ["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
    if m.moe_shared_experts:
        shared = m.moe_shared_experts * (m.moe_ffn_hidden_size or m.ffn_hidden_size)
        args += ["--moe-shared-expert-intermediate-size", str(shared)]
    if m.moe_dense_layers:
        dense, moe = m.moe_dense_layers, m.num_layers - m.moe_dense_layers
        args += ["--moe-layer-freq", f"([0]*{dense}+[1]*{moe})"]
    # backend.moe_dispatcher (null: Megatron-core's own default, allgather, no flag).
    # megatron/core/transformer/transformer_config.py: moe_token_dispatcher_type
    # allgather | alltoall | flex; flex with moe_flex_dispatcher_backend "deepep" (its
    # default; moe_enable_deepep, the older switch, is deprecated in its favour), rendered
    # explicitly so that the DeepEP that plan prices is what runs (Megatron-core MoE README's
    # "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep").
    dispatcher = cfg.backend.moe_dispatcher
    if dispatcher is not None:
        args += ["--moe-token-dispatcher-type", dispatcher]
        if dispatcher == "flex":
            args += ["--moe-flex-dispatcher-backend", "deepep"]
    # backend.moe_comm_overlap: Megatron-Core's combined 1F1B schedule (its conditions:
    # launcher/backends/moe_overlap.py, checked before anything is rendered).
    if cfg.backend.moe_comm_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    return args


def _mtp_args(cfg: LLMTrainConfig) -> list[str]:
    """Multi-token prediction (Megatron-Core --mtp-num-layers; placed by an "m" in
    --pipeline-model-parallel-layout, else on the last pipeline stage)."""
    m = cfg.model
    return ["--mtp-num-layers", str(m.mtp_layers)] if m.mtp_layers else []


def _parallel_args(cfg: LLMTrainConfig) -> list[str]:
    """Tensor, pipeline (with its split), context and expert parallel sizes; sequence parallel;
    ZeRO as the distributed optimizer (with its CPU offload) or Megatron-FSDP."""
    p, z = cfg.parallel, cfg.zero
    args = [
        "--tensor-model-parallel-size", str(p.tp),
        "--pipeline-model-parallel-size", str(p.pp),
        *_split_args(cfg),
        "--context-parallel-size", str(p.cp),
    ]  # fmt: skip
    if p.ep > 1:
        args += ["--expert-model-parallel-size", str(p.ep)]
        etp = expert_tensor_parallel(cfg, derive_layout(cfg))
        if etp != max(1, p.tp):
            # MoE parallel folding: the expert groups span tensor-parallel ranks too.
            args += ["--expert-tensor-parallel-size", str(etp)]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if z.stage == 3:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    if z.stage == 1:
        args.append("--use-distributed-optimizer")
        if z.offload_optimizer == "cpu":
            args += [
                "--optimizer-cpu-offload",
                "--use-precision-aware-optimizer",
                "--optimizer-offload-fraction", "1.0",
            ]  # fmt: skip
        dtype = cfg.optim.state_dtype
        if dtype != "fp32":
            if z.offload_optimizer != "cpu":
                args.append("--use-precision-aware-optimizer")
            args += ["--exp-avg-dtype", dtype, "--exp-avg-sq-dtype", dtype]
    return args


def _training_args(cfg: LLMTrainConfig) -> list[str]:
    """Batch sizes, steps, the optimizer with its schedule and hyperparameters, the seed."""
    o, t = cfg.optim, cfg.train
    layout = derive_layout(cfg)
    args = [
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(layout.global_batch_size),
        "--train-iters", str(layout.steps),
        "--optimizer", "sgd" if o.name == "sgd" else "adam",
        "--lr", repr(o.lr),
        "--min-lr", repr(o.min_lr),
        "--lr-warmup-iters", str(o.warmup_steps),
        *_schedule_args(cfg, layout.steps),
        "--weight-decay", repr(o.weight_decay),
        "--clip-grad", repr(o.grad_clip),
        "--seed", str(t.seed),
    ]  # fmt: skip
    if o.name == "sgd":
        args += ["--sgd-momentum", repr(o.betas[0])]
    else:
        args += [
            "--adam-beta1", repr(o.betas[0]),
            "--adam-beta2", repr(o.betas[1]),
            "--adam-eps", repr(o.eps),
        ]  # fmt: skip
    return args


def _precision_args(cfg: LLMTrainConfig) -> list[str]:
    """bf16 or fp16 (with a fixed loss scale when precision.loss_scaling=none), fp8."""
    prec = cfg.precision
    args: list[str] = []
    if prec.compute_dtype == "bf16":
        args.append("--bf16")
    elif prec.compute_dtype == "fp16":
        args.append("--fp16")
        if prec.loss_scaling == "none":
            args += ["--loss-scale", "1"]
    if prec.fp8:
        args += ["--fp8-format", "hybrid"]
        if prec.fp8_param_gather:
            args.append("--fp8-param-gather")
    return args


def _recompute_args(cfg: LLMTrainConfig) -> list[str]:
    """train.recompute as Megatron-LM's recompute granularity (and modules, method, layers)."""
    t = cfg.train
    if t.recompute == "selective":
        args = ["--recompute-granularity", "selective"]
        if cfg.backend.recompute_modules is not None:
            # Megatron-Core's per-module recompute (launcher/backends/activation_modules.py;
            # without the flag Megatron recomputes its default, core_attn).
            args += ["--recompute-modules", *cfg.backend.recompute_modules]
        return args
    if t.recompute == "full":
        return [
            "--recompute-granularity", "full",
            "--recompute-method", "uniform",
            "--recompute-num-layers", "1",
        ]  # fmt: skip
    return []


def _loss_fusion_and_offload_args(cfg: LLMTrainConfig) -> list[str]:
    """backend.cross_entropy_fusion and backend.offload_modules."""
    args: list[str] = []
    if cfg.backend.cross_entropy_fusion:
        # Megatron-Core's fused cross-entropy with Transformer Engine's kernel
        # (language_module.py compute_language_model_loss).
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    if cfg.backend.offload_modules:
        # Fine-grained activation offloading (Megatron-Core's docs,
        # fine_grained_activation_offloading.md): the listed modules' inputs go to the host.
        args += [
            "--fine-grained-activation-offloading",
            "--offload-modules", *cfg.backend.offload_modules,
        ]  # fmt: skip
    args += megatron_speed_flags(cfg)  # launcher/render/megatron_speed_flags.py
    return args


def megatron_args(
    cfg: LLMTrainConfig, data: MegatronData | None = None, run_dir: str | None = None
) -> list[str]:
    """The argument list (unquoted words). Raises MegatronUnsupported with every reason.

    `data`: the resolved datasets (``launcher.data.sources.megatron_data``); `run_dir`: where
    --save/--load point. Each part of the configuration has its step below, in the order the
    flags are written: a new group of flags is one more line here."""
    problems = [r.message for r in raw_refusals("megatron", cfg, device=False)]
    if problems:
        raise MegatronUnsupported(problems)
    return [
        *_model_shape_args(cfg),
        *_sequence_args(cfg),
        *_data_args(cfg, data, run_dir),
        *_layer_args(cfg),
        *_moe_args(cfg),
        *_mtp_args(cfg),
        *_parallel_args(cfg),
        *_training_args(cfg),
        *_precision_args(cfg),
        *_recompute_args(cfg),
        *_loss_fusion_and_offload_args(cfg),
    ]


def render_megatron_args(
    cfg: LLMTrainConfig, data: MegatronData | None = None, run_dir: str | None = None
) -> str:
    """megatron_args.txt: one argument (with its value) per line, shell-quoted, or a note saying
    why there is none."""
    try:
        args = megatron_args(cfg, data, run_dir)
    except MegatronUnsupported as exc:
        return "# Megatron-LM cannot express this configuration:\n" + "".join(
            f"#   - {reason}\n" for reason in exc.reasons
        )
    lines = [
        "# Megatron-LM pretrain_gpt.py arguments equivalent to this llmtrain config. In bash:",
        "#   eval \"args=($(grep -v '^#' megatron_args.txt))\"; torchrun ... pretrain_gpt.py "
        '"${args[@]}"',
        *(f"# NOTE: {note}" for note in (data.notes if data else ())),
    ]
    i = 0
    while i < len(args):
        # A flag with its values (several for weighted data paths) on one line.
        words = [args[i]]
        while i + 1 < len(args) and not args[i + 1].startswith("--"):
            words.append(args[i + 1])
            i += 1
        lines.append(shlex.join(words))
        i += 1
    return "\n".join(lines) + "\n"
