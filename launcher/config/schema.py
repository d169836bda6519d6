"""The typed schema of an llmtrain configuration.

Every key a user can type lives here, as a field of a dataclass registered in Hydra's
ConfigStore (see ``compose.py``). Keys whose value is one of a fixed set of words are plain
``str`` fields listed in ``CHOICES``: OmegaConf matches enums by member name, which cannot spell
``1f1b``, so the choice check is ours (``compose.py`` applies it after composition).

Derived quantities (dp inferred from the world size, gradient accumulation, ...) are not stored
here: ``launcher.config.layout`` computes them from these values, one source of truth.
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

# How a module of launcher/backends/ declares its backend (its other modules are helpers).
_DECLARATION = "\nBACKEND = Backend("


@cache
def backend_names() -> tuple[str, ...]:
    """The choices of ``backend.name``: the modules of launcher/backends/ that declare a
    ``BACKEND = Backend(...)``, found by reading them, not importing them
    (launcher.backends.all_backends imports them and checks each BACKEND's name is its module's)."""
    folder = Path(__file__).resolve().parent.parent / "backends"
    found = [i.name for i in pkgutil.iter_modules([str(folder)])]
    return tuple(
        sorted(n for n in found if _DECLARATION in (folder / f"{n}.py").read_text("utf-8"))
    )


@dataclass
class ModelConfig:
    """Shape of a decoder-only transformer."""

    name: str = "tiny"
    num_layers: int = 4
    hidden_size: int = 128
    ffn_hidden_size: int = 512
    num_attention_heads: int = 4
    # None means multi-head attention (as many key/value heads as query heads).
    num_kv_heads: int | None = None
    # None means hidden_size // num_attention_heads.
    head_dim: int | None = None
    # RMSNorm over each query and key head before RoPE (Qwen3's q_norm/k_norm). plan and validate
    # price it (2 x head_dim weights a layer); the training model has none, so run/submit refuse it.
    qk_norm: bool = False
    vocab_size: int = 256
    seq_length: int = 256
    activation: str = "gelu"  # gelu | swiglu
    norm: str = "layernorm"  # layernorm | rmsnorm
    position: str = "learned"  # learned | rope
    tie_embeddings: bool = True
    attention: str = "flash"  # flash | eager
    # Bias terms on the linear layers (GPT-2/3 style) and on the norms (LayerNorm has one).
    linear_bias: bool = False
    # Mixture of experts: num_experts routed experts, moe_top_k of them active per token, each with
    # moe_ffn_hidden_size; moe_shared_experts always-on experts of the same size; the first
    # moe_dense_layers layers use a dense MLP of ffn_hidden_size instead (DeepSeek-V3 style).
    num_experts: int | None = None
    moe_top_k: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_experts: int = 0
    moe_dense_layers: int = 0
    # Planning only: tokens on the busiest expert-parallel rank over the mean (>= 1). The busiest
    # rank sets the pace of the experts' GEMMs and of the all-to-all. 1.0: balanced routing; with
    # a capacity factor c and token dropping (GShard, Lepikhin et al. 2020; Switch Transformer,
    # Fedus et al. 2022; Megatron-Core --moe-expert-capacity-factor) the busiest expert gets c.
    moe_load_imbalance: float = 1.0
    # Multi-token prediction depth (DeepSeek-V3 section 2.2; Megatron-Core --mtp-num-layers):
    # each module adds one transformer layer of the model's last kind, a 2h -> h projection and
    # three norms, and one more output head and loss over the shared vocabulary, after the last
    # layer (an "m" in parallel.pipeline_layout). backend=megatron only.
    mtp_layers: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3): set kv_lora_rank to enable it.
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Rotary base frequency (theta). 10000 is RoFormer's and Llama 1/2's; Llama 3 uses 500000
    # (Meta's Llama 3 model card / params.json "rope_theta").
    rope_theta: float = 10000.0
    # Epsilon of every normalization layer; None: the norm's usual default (LayerNorm 1e-5,
    # RMSNorm 1e-6). Llama 2 and 3 use 1e-5 (their params.json "norm_eps").
    norm_eps: float | None = None
    # Dropout on attention probabilities and on the residual branches (0 for modern pre-training;
    # Megatron-LM defaults both to 0.1, so rendered jobs pass them explicitly).
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0


@dataclass
class ParallelConfig:
    """Parallel degrees. Rank placement order, innermost first: tp, cp, ep-within-dp, dp, pp."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    # Expert tensor parallel: how many ranks split each expert's weights (Megatron-core's
    # --expert-tensor-parallel-size). None: tp, or 1 where ep does not divide dp x cp
    # (launcher/backends/common.py expert_tensor_parallel); other values on backend=megatron only.
    etp: int | None = None
    # None: inferred as world_size // (tp * pp * cp).
    dp: int | None = None
    sequence_parallel: bool = False
    pp_schedule: str = "1f1b"  # gpipe | 1f1b | interleaved
    # Layer count per pipeline stage (length pp); None: automatic split.
    pp_layers: list[int] | None = None
    # Megatron-Core's uneven splits (launcher/config/pipeline_split.py has the conditions): the
    # embedding / loss counted as a layer, the first / last stage's own layer count, or an
    # explicit layout string ("Et|(tt|)*30L": E embedding, t layer, L loss, | between stages).
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    pipeline_layout: str | None = None


@dataclass
class ZeroConfig:
    """ZeRO / FSDP sharding of model states over data parallel ranks."""

    stage: int = 0
    offload_optimizer: str = "none"  # none | cpu
    offload_params: str = "none"  # none | cpu


@dataclass
class PrecisionConfig:
    """Number formats. Selected as a group: precision=bf16|fp16|fp32|fp8."""

    name: str = "bf16"  # bf16 | fp16 | fp32 | fp8
    # Format of the working weights and activations.
    compute_dtype: str = "bf16"  # fp32 | bf16 | fp16
    # The optimizer keeps an fp32 master copy of the weights (mixed precision).
    master_weights: bool = True
    # Format gradients are accumulated and reduced in.
    grad_dtype: str = "fp32"  # fp32 | bf16 | fp16
    loss_scaling: str = "none"  # none | dynamic
    # fp8 matmuls (Transformer Engine style): keep an fp8 copy of each weight and its transpose.
    fp8: bool = False
    # With fp8: emulate the fp8 matmuls in higher precision (torchao's Float8LinearConfig(emulate=
    # True)): the fp8 casts and scaling numerics on any device (CPU included), no speedup.
    fp8_emulate: bool = False
    # torchao float8 scaling: tensorwise (one scale per tensor; fastest) | rowwise (one scale per
    # row; more accurate, slower casts; no fp8 all-gather under FSDP2).
    fp8_recipe: str = "tensorwise"
    # With fp8 (backend=megatron, --fp8-param-gather): the compute weights kept in fp8 only (no
    # bf16 copy) and all-gathered in fp8 (launcher/backends/fp8_params.py).
    fp8_param_gather: bool = False


@dataclass
class TrainConfig:
    micro_batch_size: int = 1
    # Sequences per optimizer step; None: micro_batch_size * dp * grad_accum.
    global_batch_size: int | None = None
    # None: global_batch_size // (micro_batch_size * dp), or 1 when global_batch_size is None too.
    grad_accum: int | None = None
    # Length of the run: steps, or tokens (converted to steps); one of the two.
    steps: int | None = 100
    tokens: int | None = None
    recompute: str = "none"  # none | selective | full
    # The loss over chunks of tokens, never the full fp32 logits (backend=torch with tp=1, pp=1;
    # launcher/train/chunked_loss.py). null: wherever it applies; false: full logits.
    chunked_loss: bool | None = None
    seed: int = 1234
    log_every: int = 1
    # A rank that makes no progress (a step or checkpoint) for this long is declared hung and the
    # whole run is stopped with a message instead of waiting forever; 0 disables the watchdog.
    hang_timeout_s: float = 1800.0
    # Validation loss every N optimizer steps (and after the last), over eval_steps global batches
    # of the validation data (launcher.train.evaluation); None or 0: no evaluation.
    eval_every: int | None = None
    eval_steps: int = 10
    # Start from these weights (step 0, fresh optimizer): a Hugging Face folder (llmtrain export),
    # a run directory or a checkpoint folder. A run with checkpoints of its own resumes instead.
    init_from: str | None = None
    # Training health (launcher.health): a step whose loss or gradient norm is NaN or infinite
    # stops the run (exit 3, nothing checkpointed after the last good step), unless up to this
    # many such steps may be skipped first (their update withheld, counted in metrics.jsonl).
    max_nonfinite_skips: int = 0
    # Loss spikes: a step whose loss lies more than loss_spike_zscore robust standard deviations
    # (median / MAD) above the previous loss_spike_window losses is warned about and marked in
    # metrics.jsonl; 0 disables the warning.
    loss_spike_window: int = 100
    loss_spike_zscore: float = 6.0


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | adam | sgd | lion
    lr: float = 3.0e-4
    weight_decay: float = 0.1
    # adam/adamw/lion: (beta1, beta2); sgd: betas[0] is the momentum (Lion paper: 0.9, 0.99).
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1.0e-8
    warmup_steps: int = 10
    schedule: str = "cosine"  # cosine | linear | constant | wsd
    # Warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024): after warmup the rate stays
    # at lr, then decays to min_lr over the last wsd_decay_fraction of the steps, in the shape
    # wsd_decay_style (linear | cosine | minus_sqrt, the last from Hägele et al.).
    wsd_decay_fraction: float = 0.2
    wsd_decay_style: str = "minus_sqrt"
    min_lr: float = 3.0e-5
    grad_clip: float = 1.0


@dataclass
class DataConfig:
    # None: the built-in offline corpus (prepared on first use, never downloaded). Else a folder
    # `llmtrain data prepare` wrote, or a Megatron-LM PREFIX of PREFIX.bin/PREFIX.idx.
    path: str | None = None
    # Several datasets with weights, Megatron-LM's --data-path convention:
    # [0.7, /data/web_text_document, 0.3, /data/code] (weights normalised); instead of path.
    blend: list[Any] = field(default_factory=list)
    # Validation data: a prepared folder (its valid split, else all of it) or a Megatron prefix.
    # None: the valid splits of the training datasets (with the blend's weights).
    valid_path: str | None = None
    tokenizer: str = "byte"  # byte | bpe
    bpe_vocab_size: int = 4096
    num_workers: int = 0
    # Without data.path / data.blend: corpus (the built-in text corpus, pre-training) | chat (the
    # built-in chat dataset, a few hundred generated conversations with a byte-level ChatML
    # tokenizer, for fine-tuning; launcher/data/builtin_chat.py).
    builtin: str = "corpus"
    # Chat data (`llmtrain data prepare --input-format chat|instruct`, docs/finetuning.md):
    # which tokens carry loss: assistant (every assistant turn) | completion (the last assistant
    # turn only) | all (every token of the conversation).
    train_on: str = "assistant"
    # Several examples per row of model.seq_length + 1 tokens, attention kept within each (true),
    # or one example a row, padded (false).
    packing: bool = True
    # An example longer than a row: truncate (keep its first seq_length + 1 tokens) | drop.
    overlong: str = "truncate"


@dataclass
class ClusterConfig:
    """Hardware: which accelerator, how many, and figures that override the catalog's defaults."""

    name: str = "cpu"
    gpu: str = "cpu"
    num_nodes: int = 1
    gpus_per_node: int = 1
    # None: take the value from the GPU catalog (launcher.plan.hardware).
    intra_node_bandwidth_gbps: float | None = None
    inter_node_bandwidth_gbps: float | None = None
    price_per_gpu_hour: float | None = None
    # Aggregate write bandwidth of the checkpoint storage, GB/s.
    storage_write_gbps: float = 10.0
    # GPU board power cap in watts (nvidia-smi -pl); None: the catalog's TDP. The planner slows
    # compute by the clock a lower cap leaves (launcher.plan.kernels.clock_factor).
    power_limit_w: float | None = None
    # SLURM GPU request style: gpus-per-node | gres.
    gpu_request: str = "gpus-per-node"
    env: dict[str, str] = field(default_factory=dict)
    # Operator profile `llmtrain calibrate` wrote (a JSON file) for `plan` to price from; None: the
    # cached profile of cluster.gpu when there is one (~/.cache/llmtrain/profiles/GPU.json),
    # "none": published figures only.
    profile: str | None = None


@dataclass
class BackendConfig:
    name: str = "torch"  # deepspeed | torch | megatron
    # Gradient reduce bucket and parameter all-gather bucket sizes, in elements (DeepSpeed naming).
    reduce_bucket_size: int = 25_000_000
    allgather_bucket_size: int = 25_000_000
    overlap_comm: bool = True
    # torch.compile each transformer block (backend=torch). null: the backend's default (on for
    # precision=fp8 on a GPU, off otherwise; launcher/backends/engine_choices.py); true / false:
    # as set.
    compile: bool | None = None
    # Overlap tensor-parallel collectives with the linear layers' GEMMs: Megatron-core's
    # --tp-comm-overlap (Transformer Engine userbuffers) or torchtitan's async TP.
    tp_comm_overlap: bool = False
    # Flash-attention kernel family: te (Transformer Engine / cuDNN fused attention, Hopper-native)
    # | sdpa (PyTorch scaled_dot_product_attention's flash kernel, FlashAttention-2 class).
    # None: te for megatron, sdpa for torch and deepspeed.
    attention_kernel: str | None = None
    # MoE token dispatcher (launcher/backends/common.py MOE_DISPATCHERS): allgather (Megatron-core's
    # gathered tokens) | alltoall (every routed copy sent: torch all_to_all_single, Megatron's
    # alltoall) | flex (node-deduplicated, DeepEP: Megatron's flex). None: the backend's default
    # (alltoall for torch and deepspeed, allgather for megatron); the others are refused where the
    # backend does not run them.
    moe_dispatcher: str | None = None
    # Hide the expert dispatch/combine behind another micro-batch's compute: Megatron-Core's
    # --overlap-moe-expert-parallel-comm (its combined 1F1B schedule pairs one micro-batch's
    # forward with another's backward, layer by layer; one extra micro-batch in flight). Only
    # backend=megatron runs it (launcher/backends/moe_overlap.py has its conditions).
    moe_comm_overlap: bool = False
    # --- Megatron-Core activation memory (launcher/backends/activation_modules.py; priced by
    # launcher/plan/mcore_activations.py). backend=megatron only.
    # Megatron-Core's --recompute-modules with train.recompute=selective: core_attn | moe_act |
    # layernorm | mla_up_proj | mlp | moe | shared_experts. None: Megatron's default [core_attn].
    recompute_modules: list[str] | None = None
    # Megatron-Core's fine-grained activation offloading (--fine-grained-activation-offloading
    # --offload-modules): the inputs of these modules go to host memory after the forward:
    # attn_norm | qkv_linear | core_attn | attn_proj | mlp_norm | expert_fc1 | moe_act.
    offload_modules: list[str] = field(default_factory=list)
    # Megatron-LM's fused SwiGLU (bias_swiglu_fusion, on by default since 2024-01; false renders
    # --no-bias-swiglu-fusion): the fused kernel keeps only its input; unfused, PyTorch's SiLU
    # and product keep their own outputs too (launcher/plan/mcore_activations.py).
    swiglu_fusion: bool = True
    # Megatron-Core's fused cross-entropy, Transformer Engine's kernel (--cross-entropy-loss-fusion
    # --cross-entropy-fusion-impl te): the fp32 gradient computed in the forward, no fp32 copies
    # of the logits (launcher/plan/memory.py logits_bytes).
    cross_entropy_fusion: bool = False
    # backend=megatron: the Megatron-LM checkout holding pretrain_gpt.py that `run`/`submit`
    # launch (None: $MEGATRON_LM_PATH), and arguments appended to the rendered ones (your data
    # and tokenizer: --data-path, --tokenizer-type ...; without data arguments, --mock-data).
    megatron_path: str | None = None
    megatron_extra_args: list[str] = field(default_factory=list)
    # --- Megatron-Core speed features, backend=megatron only (checked by launcher/backends/
    # speed_features.py, priced by launcher/plan/speed_features.py, rendered by
    # launcher/render/megatron_speed_flags.py). CUDA graphs (--cuda-graph-impl): none | local |
    # transformer_engine; their scope (--cuda-graph-scope): attn | mlp | moe_router |
    # moe_preprocess, [] for the whole layer.
    cuda_graphs: str = "none"
    cuda_graph_scope: list[str] = field(default_factory=list)
    # --overlap-param-gather-with-optimizer-step (with --overlap-grad-reduce
    # --overlap-param-gather): the first model chunk's all-gather runs beside the optimizer step.
    overlap_param_gather_with_optimizer_step: bool = False
    # fp8 scaling (--fp8-recipe): delayed | tensorwise (current) | mxfp8 | blockwise; None:
    # Megatron-Core's default, delayed (precision.fp8_recipe is torchao's, for backend=torch).
    fp8_scaling: str | None = None
    # --moe-permute-fusion (token permute / unpermute in one kernel each) and --moe-router-fusion
    # (top-k with its score function, and the aux-loss scores, in one kernel each).
    moe_permute_fusion: bool = False
    moe_router_fusion: bool = False


@dataclass
class SlurmConfig:
    # None: the run's name (its directory's name), so jobs of different runs tell apart in squeue.
    job_name: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    cpus_per_task: int | None = None
    # Seconds before the time limit at which SLURM sends USR1 (checkpoint and requeue).
    signal_grace_s: int = 120
    requeue: bool = True
    # Continuation jobs chained with --dependency=afterany to train past the wall-time limit.
    chain: int = 0
    extra_sbatch_args: list[str] = field(default_factory=list)
    extra_srun_args: list[str] = field(default_factory=list)
    # pyxis/enroot container for the training step. The job then runs the image's own Python
    # (container_python, which must have llmtrain installed), mounts the run directory, the data
    # and the working directory at the same paths, and starts in the working directory.
    container_image: str | None = None
    container_mounts: str | None = None
    container_python: str = "python3"


@dataclass
class LauncherConfig:
    name: str = "local"  # local | slurm


@dataclass
class CheckpointConfig:
    """When the trainer writes checkpoints (atomically, with a checksummed manifest)."""

    # Every N optimizer steps. With neither this nor every_minutes set: every Young/Daly interval
    # that `plan` computes (plan.json checkpoint.interval_s). Always at the end and on preemption.
    every_steps: int | None = None
    # Also every N minutes of wall time.
    every_minutes: float | None = None
    keep_last: int = 3
    # Continue from the latest valid checkpoint in the run directory when there is one.
    resume: bool = True


@dataclass
class RunConfig:
    # None: <recipe>-<hash of the config>, so the same command resumes the same run.
    name: str | None = None
    root_dir: str = "runs"
    # Names of environment variables the ranks need but that are never written down (API keys):
    # values come from the launching environment; see launcher.config.secrets.
    secret_env: list[str] = field(default_factory=list)


@dataclass
class LoggingConfig:
    """Experiment trackers beside metrics.jsonl and TensorBoard: off by default, rank 0 only,
    optional extras (pip install 'llmtrain[wandb]' / 'llmtrain[mlflow]'). Credentials only from
    the environment (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...; see run.secret_env)."""

    wandb: bool = False
    wandb_project: str = "llmtrain"
    wandb_entity: str | None = None
    wandb_mode: str = "online"  # online | offline | disabled
    mlflow: bool = False
    # None: MLFLOW_TRACKING_URI from the environment, else mlflow's default (./mlruns).
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "llmtrain"


@dataclass
class FinetuneConfig:
    """How the model trains (conf/finetune/; docs/finetuning.md): full (every weight), lora
    (frozen base weights, a trainable low-rank update B @ A on each target projection, Hu et al.
    2021, arXiv:2106.09685) or qlora (lora over base weights stored in NF4, Dettmers et al. 2023,
    arXiv:2305.14314; launcher/train/lora.py)."""

    name: str = "full"  # full | lora | qlora
    # The adapter's rank r: A is [r, in], B is [out, r]; 1 <= r <= min(in, out) of every target.
    rank: int = 16
    # The update is scaled by alpha / r (alpha > 0).
    alpha: float = 32.0
    # Dropout on the adapter branch's input, in [0, 1).
    dropout: float = 0.0
    # Projections to adapt: q k v o (attention), gate up down (MLP; gate only with swiglu), or
    # all-linear (every one of them the model has).
    targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "o"])


@dataclass
class LLMTrainConfig:
    """The whole configuration: what `llmtrain show` prints."""

    recipe: str = "none"
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


# backend.moe_dispatcher's words (launcher/backends/common.py says what each runs and prices).
MOE_DISPATCHERS = ("allgather", "alltoall", "flex")

# Keys whose value must be one of a fixed set of words.
CHOICES: dict[str, tuple[str, ...]] = {
    "model.activation": ("gelu", "swiglu"),
    "model.norm": ("layernorm", "rmsnorm"),
    "model.position": ("learned", "rope"),
    "model.attention": ("flash", "eager"),
    "logging.wandb_mode": ("online", "offline", "disabled"),
    "parallel.pp_schedule": ("gpipe", "1f1b", "interleaved"),
    "zero.offload_optimizer": ("none", "cpu"),
    "zero.offload_params": ("none", "cpu"),
    "precision.name": ("bf16", "fp16", "fp32", "fp8"),
    "precision.fp8_recipe": ("tensorwise", "rowwise"),
    "precision.compute_dtype": ("fp32", "bf16", "fp16"),
    "precision.grad_dtype": ("fp32", "bf16", "fp16"),
    "precision.loss_scaling": ("none", "dynamic"),
    "train.recompute": ("none", "selective", "full"),
    "optim.name": ("adamw", "adam", "sgd", "lion"),
    "optim.schedule": ("cosine", "linear", "constant", "wsd"),
    "optim.wsd_decay_style": ("linear", "cosine", "minus_sqrt"),
    "data.tokenizer": ("byte", "bpe"),
    "data.builtin": ("corpus", "chat"),
    "data.train_on": ("assistant", "completion", "all"),
    "data.overlong": ("truncate", "drop"),
    "cluster.gpu_request": ("gpus-per-node", "gres"),
    "backend.name": backend_names(),
    "backend.moe_dispatcher": MOE_DISPATCHERS,
    "backend.cuda_graphs": ("none", "local", "transformer_engine"),
    "backend.fp8_scaling": ("delayed", "tensorwise", "mxfp8", "blockwise"),
    "launcher.name": ("local", "slurm"),
    "finetune.name": ("full", "lora", "qlora"),
}


def get_path(node: Any, dotted: str) -> Any:
    """Value at a dotted key of a nested dataclass (or mapping)."""
    value = node
    for part in dotted.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value
