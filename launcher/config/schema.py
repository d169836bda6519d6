"""The typed schema of an llmtrain configuration.

Every key a user can type lives here, as a field of a dataclass registered in Hydra's
ConfigStore (see ``compose.py``), with a docstring below it (docs/configuration.md's reference
is generated from them: ``python -m launcher.config.reference_doc``) and, where its values are
limited, an ``Allowed`` in its metadata (``launcher/config/allowed.py``): the words it takes
(``one_of``) or its bounds (``bounds``). Keys whose value is one of a fixed set of words are
plain ``str`` fields: OmegaConf matches enums by member name, which cannot spell ``1f1b``, so the
choice check is ours (``compose.py`` applies it after composition; validate checks the bounds).

Derived quantities (dp inferred from the world size, gradient accumulation, ...) are not stored
here: ``launcher.config.layout`` computes them from these values, one source of truth.
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from launcher.config.allowed import bounds, one_of

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


# Bounds shared by many keys: counts of at least 1, counts that may be 0, rates above 0.
_AT_LEAST_1 = bounds(ge=1)
_AT_LEAST_0 = bounds(ge=0)
_ABOVE_0 = bounds(gt=0)
# Values past these are typos, not plans (the largest published runs are far below them).
_LAYERS_TYPO = 10_000
_HIDDEN_TYPO = 1_000_000
_SEQUENCE_TYPO = 100_000_000
_NODES_TYPO = 1_000_000
_GPUS_PER_NODE_TYPO = 1024
# numpy seeds (Generator, legacy RandomState in Megatron-LM) and torch.manual_seed all take this.
MAX_SEED = 2**32 - 1


@dataclass
class ModelConfig:
    """Shape of a decoder-only transformer."""

    name: str = "tiny"
    """The model's name (the conf/model option it came from)."""
    num_layers: int = field(default=4, metadata=bounds(ge=1, typo_above=_LAYERS_TYPO))
    """Transformer layers."""
    hidden_size: int = field(default=128, metadata=bounds(ge=1, typo_above=_HIDDEN_TYPO))
    """Width of the residual stream."""
    ffn_hidden_size: int = field(default=512, metadata=_AT_LEAST_1)
    """Width of the dense MLP's inner layer."""
    num_attention_heads: int = field(default=4, metadata=_AT_LEAST_1)
    """Query heads."""
    num_kv_heads: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Key/value heads (grouped-query attention); None: multi-head attention (as many key/value
    heads as query heads)."""
    head_dim: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Width of one attention head; None: hidden_size // num_attention_heads."""
    qk_norm: bool = False
    """RMSNorm over each query and key head before RoPE (Qwen3's q_norm/k_norm). plan and
    validate price it (2 x head_dim weights a layer); the training model has none, so run/submit
    refuse it."""
    vocab_size: int = field(default=256, metadata=_AT_LEAST_1)
    """Tokens of the vocabulary (embedding and output head rows)."""
    seq_length: int = field(default=256, metadata=bounds(ge=1, typo_above=_SEQUENCE_TYPO))
    """Tokens per training sequence."""
    activation: str = field(default="gelu", metadata=one_of("gelu", "swiglu"))
    """The MLP's activation (swiglu: a gated MLP with three projections)."""
    norm: str = field(default="layernorm", metadata=one_of("layernorm", "rmsnorm"))
    """The normalization layers' kind."""
    position: str = field(default="learned", metadata=one_of("learned", "rope"))
    """Position encoding: learned absolute embeddings or rotary (RoPE)."""
    tie_embeddings: bool = True
    """The output head shares the input embedding's weights."""
    attention: str = field(default="flash", metadata=one_of("flash", "eager"))
    """Attention implementation: a fused flash kernel or the eager softmax(QK^T)V."""
    linear_bias: bool = False
    """Bias terms on the linear layers (GPT-2/3 style) and on the norms (LayerNorm has one)."""
    num_experts: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Mixture of experts: routed experts per MoE layer; None: a dense model."""
    moe_top_k: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Routed experts active per token."""
    moe_ffn_hidden_size: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Inner width of each expert's MLP."""
    moe_shared_experts: int = field(default=0, metadata=_AT_LEAST_0)
    """Always-on experts of moe_ffn_hidden_size beside the routed ones (DeepSeek-V3 style)."""
    moe_dense_layers: int = field(default=0, metadata=_AT_LEAST_0)
    """The first layers use a dense MLP of ffn_hidden_size instead of experts (DeepSeek-V3
    style)."""
    moe_load_imbalance: float = 1.0
    """Planning only: tokens on the busiest expert-parallel rank over the mean (1.0 to 16.0). The
    busiest rank sets the pace of the experts' GEMMs and of the all-to-all. 1.0: balanced routing;
    with a capacity factor c and token dropping (GShard, Lepikhin et al. 2020; Switch Transformer,
    Fedus et al. 2022; Megatron-Core --moe-expert-capacity-factor) the busiest expert gets c."""
    mtp_layers: int = field(default=0, metadata=_AT_LEAST_0)
    """Multi-token prediction depth (DeepSeek-V3 section 2.2; Megatron-Core --mtp-num-layers):
    each module adds one transformer layer of the model's last kind, a 2h -> h projection and
    three norms, and one more output head and loss over the shared vocabulary, after the last
    layer (an "m" in parallel.pipeline_layout). backend=megatron only."""
    q_lora_rank: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Multi-head latent attention (DeepSeek-V2/V3): rank of the query's low-rank projection;
    None: a full-rank query projection."""
    kv_lora_rank: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Multi-head latent attention (DeepSeek-V2/V3): rank of the compressed key/value latent;
    set it to enable MLA."""
    qk_rope_head_dim: int | None = field(default=None, metadata=_AT_LEAST_1)
    """MLA: width of the rotary part of each query/key head."""
    v_head_dim: int | None = field(default=None, metadata=_AT_LEAST_1)
    """MLA: width of each value head."""
    rope_theta: float = field(default=10000.0, metadata=_ABOVE_0)
    """Rotary base frequency (theta). 10000 is RoFormer's and Llama 1/2's; Llama 3 uses 500000
    (Meta's Llama 3 model card / params.json "rope_theta")."""
    norm_eps: float | None = field(default=None, metadata=_ABOVE_0)
    """Epsilon of every normalization layer; None: the norm's usual default (LayerNorm 1e-5,
    RMSNorm 1e-6). Llama 2 and 3 use 1e-5 (their params.json "norm_eps")."""
    attention_dropout: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    """Dropout on attention probabilities (0 for modern pre-training; Megatron-LM defaults it to
    0.1, so rendered jobs pass it explicitly)."""
    hidden_dropout: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    """Dropout on the residual branches (0 for modern pre-training; Megatron-LM defaults it to
    0.1, so rendered jobs pass it explicitly)."""


@dataclass
class ParallelConfig:
    """Parallel degrees. Rank placement order, innermost first: tp, cp, ep-within-dp, dp, pp."""

    tp: int = field(default=1, metadata=_AT_LEAST_1)
    """Tensor parallel degree."""
    pp: int = field(default=1, metadata=_AT_LEAST_1)
    """Pipeline parallel degree (stages)."""
    vpp: int = field(default=1, metadata=_AT_LEAST_1)
    """Virtual pipeline stages (model chunks) per pipeline rank, for the interleaved schedule."""
    cp: int = field(default=1, metadata=_AT_LEAST_1)
    """Context parallel degree (load-balanced: seq_length must divide by 2 x cp)."""
    ep: int = field(default=1, metadata=_AT_LEAST_1)
    """Expert parallel degree."""
    etp: int | None = None
    """Expert tensor parallel: how many ranks split each expert's weights (Megatron-core's
    --expert-tensor-parallel-size). None: tp, or 1 where ep does not divide dp x cp
    (launcher/backends/common.py expert_tensor_parallel); other values on backend=megatron
    only."""
    dp: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Data parallel degree; None: inferred as world_size // (tp * pp * cp)."""
    sequence_parallel: bool = False
    """Shard the norms' and dropouts' activations over the tensor-parallel ranks along the
    sequence (Megatron-LM's sequence parallelism)."""
    pp_schedule: str = field(default="1f1b", metadata=one_of("gpipe", "1f1b", "interleaved"))
    """Pipeline schedule."""
    pp_layers: list[int] | None = None
    """Layer count per pipeline stage (length pp); None: automatic split."""
    account_for_embedding_in_pipeline_split: bool = False
    """Megatron-Core's uneven split: the embedding counted as a layer of the first stage
    (launcher/config/pipeline_split.py has the conditions)."""
    account_for_loss_in_pipeline_split: bool = False
    """Megatron-Core's uneven split: the loss counted as a layer of the last stage."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Megatron-Core's uneven split: the first stage's own layer count."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Megatron-Core's uneven split: the last stage's own layer count."""
    pipeline_layout: str | None = None
    """Megatron-Core's explicit layout string ("Et|(tt|)*30L": E embedding, t layer, L loss,
    | between stages)."""


@dataclass
class ZeroConfig:
    """ZeRO / FSDP sharding of model states over data parallel ranks."""

    stage: int = field(default=0, metadata=bounds(ge=0, le=3))
    """ZeRO stage: 0 none, 1 optimizer states, 2 and gradients, 3 and parameters sharded."""
    offload_optimizer: str = field(default="none", metadata=one_of("none", "cpu"))
    """Keep the optimizer states (and step) in host memory."""
    offload_params: str = field(default="none", metadata=one_of("none", "cpu"))
    """Keep the parameters in host memory (ZeRO-3)."""


@dataclass
class PrecisionConfig:
    """Number formats. Selected as a group: precision=bf16|fp16|fp32|fp8."""

    name: str = field(default="bf16", metadata=one_of("bf16", "fp16", "fp32", "fp8"))
    """The precision option's name."""
    compute_dtype: str = field(default="bf16", metadata=one_of("fp32", "bf16", "fp16"))
    """Format of the working weights and activations."""
    master_weights: bool = True
    """The optimizer keeps an fp32 master copy of the weights (mixed precision)."""
    grad_dtype: str = field(default="fp32", metadata=one_of("fp32", "bf16", "fp16"))
    """Format gradients are accumulated and reduced in."""
    loss_scaling: str = field(default="none", metadata=one_of("none", "dynamic"))
    """Loss scaling (dynamic: for fp16, scaled to keep gradients from underflowing)."""
    fp8: bool = False
    """fp8 matmuls (Transformer Engine style): keep an fp8 copy of each weight and its
    transpose."""
    fp8_emulate: bool = False
    """With fp8: emulate the fp8 matmuls in higher precision (torchao's Float8LinearConfig(
    emulate=True)): the fp8 casts and scaling numerics on any device (CPU included), no
    speedup."""
    fp8_recipe: str = field(default="tensorwise", metadata=one_of("tensorwise", "rowwise"))
    """torchao float8 scaling: tensorwise (one scale per tensor; fastest) or rowwise (one scale
    per row; more accurate, slower casts; no fp8 all-gather under FSDP2)."""
    fp8_param_gather: bool = False
    """With fp8 (backend=megatron, --fp8-param-gather): the compute weights kept in fp8 only (no
    bf16 copy) and all-gathered in fp8 (launcher/backends/fp8_params.py)."""


@dataclass
class TrainConfig:
    """Batch sizes, the run's length, recomputation, evaluation and training health."""

    micro_batch_size: int = field(default=1, metadata=_AT_LEAST_1)
    """Sequences per rank per forward/backward pass."""
    global_batch_size: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Sequences per optimizer step; None: micro_batch_size * dp * grad_accum."""
    grad_accum: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Micro-batches per optimizer step; None: global_batch_size // (micro_batch_size * dp), or 1
    when global_batch_size is None too."""
    steps: int | None = field(default=100, metadata=_AT_LEAST_1)
    """Length of the run in optimizer steps; set this or tokens, not both."""
    tokens: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Length of the run in tokens (converted to steps); set this or steps, not both."""
    recompute: str = field(default="none", metadata=one_of("none", "selective", "full"))
    """Activation recomputation (docs/configuration.md says what each engine runs)."""
    chunked_loss: bool | None = None
    """The loss over chunks of tokens, never the full fp32 logits (backend=torch with tp=1, pp=1;
    launcher/train/chunked_loss.py). null: wherever it applies; false: full logits."""
    seed: int = field(
        default=1234,
        metadata=bounds(
            ge=0, le=MAX_SEED, example="1234", why="numpy's and Megatron-LM's seed range"
        ),
    )
    """Random seed of the weights' initialization and the data order."""
    log_every: int = field(default=1, metadata=_AT_LEAST_1)
    """Log the loss every N optimizer steps."""
    hang_timeout_s: float = field(default=1800.0, metadata=_AT_LEAST_0)
    """A rank that makes no progress (a step or checkpoint) for this many seconds is declared hung
    and the whole run is stopped with a message instead of waiting forever; 0 disables the
    watchdog."""
    eval_every: int | None = None
    """Validation loss every N optimizer steps (and after the last), over eval_steps global
    batches of the validation data (launcher.train.evaluation); None or 0: no evaluation."""
    eval_steps: int = field(default=10, metadata=_AT_LEAST_1)
    """Global batches of validation data per evaluation."""
    init_from: str | None = None
    """Start from these weights (step 0, fresh optimizer): a Hugging Face folder (llmtrain
    export), a run directory or a checkpoint folder. A run with checkpoints of its own resumes
    instead."""
    max_nonfinite_skips: int = field(default=0, metadata=_AT_LEAST_0)
    """Training health (launcher.health): a step whose loss or gradient norm is NaN or infinite
    stops the run (exit 3, nothing checkpointed after the last good step), unless up to this many
    such steps may be skipped first (their update withheld, counted in metrics.jsonl)."""
    loss_spike_window: int = field(default=100, metadata=_AT_LEAST_1)
    """Loss spikes: the number of previous losses a step's loss is compared with."""
    loss_spike_zscore: float = field(default=6.0, metadata=_AT_LEAST_0)
    """Loss spikes: a step whose loss lies more than this many robust standard deviations (median
    / MAD) above the previous loss_spike_window losses is warned about and marked in
    metrics.jsonl; 0 disables the warning."""


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule."""

    name: str = field(default="adamw", metadata=one_of("adamw", "adam", "sgd", "lion"))
    """The optimizer."""
    lr: float = field(default=3.0e-4, metadata=bounds(gt=0, example="3e-4"))
    """Peak learning rate (reached after warmup)."""
    weight_decay: float = field(default=0.1, metadata=bounds(ge=0, example="0.1 (0: no decay)"))
    """Decoupled weight decay (AdamW); 0: no decay."""
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.95],
        metadata=bounds(ge=0, lt=1, length=2, example="[0.9, 0.95]"),
    )
    """adam/adamw/lion: (beta1, beta2); sgd: betas[0] is the momentum (Lion paper: 0.9, 0.99)."""
    eps: float = field(default=1.0e-8, metadata=bounds(gt=0, example="1e-8"))
    """Adam's epsilon (it divides by sqrt(v) + eps)."""
    warmup_steps: int = field(default=10, metadata=bounds(ge=0, example="10 (0: no warmup)"))
    """Steps of linear warmup from 0 to lr."""
    schedule: str = field(default="cosine", metadata=one_of("cosine", "linear", "constant", "wsd"))
    """Learning-rate schedule after warmup, down to min_lr."""
    wsd_decay_fraction: float = field(default=0.2, metadata=bounds(ge=0, le=1))
    """Warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024): after warmup the rate
    stays at lr, then decays to min_lr over this last fraction of the steps."""
    wsd_decay_style: str = field(
        default="minus_sqrt", metadata=one_of("linear", "cosine", "minus_sqrt")
    )
    """Shape of the warmup-stable-decay schedule's decay (minus_sqrt from Hägele et al. 2024)."""
    min_lr: float = field(default=3.0e-5, metadata=bounds(ge=0, le_key="optim.lr"))
    """Learning rate at the end of the schedule."""
    grad_clip: float = field(default=1.0, metadata=bounds(ge=0, example="1.0 (0: no clipping)"))
    """Clip the gradients' global norm to this; 0: no clipping."""
    state_dtype: str = field(default="fp32", metadata=one_of("fp32", "bf16", "fp16"))
    """Format Adam's moments (m and v) are stored in; the update computes in fp32. Not fp32:
    Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer --exp-avg-dtype
    --exp-avg-sq-dtype), backend=megatron with zero.stage=1 only."""


@dataclass
class DataConfig:
    """Training and validation data, tokenizer and chat-data handling."""

    path: str | None = None
    """None: the built-in offline corpus (prepared on first use, never downloaded). Else a folder
    `llmtrain data prepare` wrote, or a Megatron-LM PREFIX of PREFIX.bin/PREFIX.idx."""
    blend: list[Any] = field(default_factory=list)
    """Several datasets with weights, Megatron-LM's --data-path convention:
    [0.7, /data/web_text_document, 0.3, /data/code] (weights normalised); instead of path."""
    valid_path: str | None = None
    """Validation data: a prepared folder (its valid split, else all of it) or a Megatron prefix.
    None: the valid splits of the training datasets (with the blend's weights)."""
    tokenizer: str = field(default="byte", metadata=one_of("byte", "bpe"))
    """Tokenizer of the built-in corpus: bytes, or a BPE trained on it."""
    bpe_vocab_size: int = field(default=4096, metadata=_AT_LEAST_1)
    """Vocabulary of the BPE tokenizer (data.tokenizer=bpe)."""
    num_workers: int = field(default=0, metadata=_AT_LEAST_0)
    """Data loader worker processes per rank; 0: load in the training process."""
    builtin: str = field(default="corpus", metadata=one_of("corpus", "chat"))
    """Without data.path / data.blend: corpus (the built-in text corpus, pre-training) or chat
    (the built-in chat dataset, a few hundred generated conversations with a byte-level ChatML
    tokenizer, for fine-tuning; launcher/data/builtin_chat.py)."""
    train_on: str = field(default="assistant", metadata=one_of("assistant", "completion", "all"))
    """Chat data (`llmtrain data prepare --input-format chat|instruct`, docs/finetuning.md):
    which tokens carry loss: assistant (every assistant turn), completion (the last assistant
    turn only) or all (every token of the conversation)."""
    packing: bool = True
    """Several examples per row of model.seq_length + 1 tokens, attention kept within each
    (true), or one example a row, padded (false)."""
    overlong: str = field(default="truncate", metadata=one_of("truncate", "drop"))
    """An example longer than a row: truncate (keep its first seq_length + 1 tokens) or drop."""


@dataclass
class ClusterConfig:
    """Hardware: which accelerator, how many, and figures that override the catalog's defaults."""

    name: str = "cpu"
    """The cluster's name (the conf/cluster option it came from)."""
    gpu: str = "cpu"
    """The accelerator, a name of the GPU catalog (launcher.plan.hardware)."""
    num_nodes: int = field(default=1, metadata=bounds(ge=1, typo_above=_NODES_TYPO))
    """Nodes of the job."""
    gpus_per_node: int = field(default=1, metadata=bounds(ge=1, typo_above=_GPUS_PER_NODE_TYPO))
    """Accelerators per node."""
    intra_node_bandwidth_gbps: float | None = field(default=None, metadata=_ABOVE_0)
    """Bandwidth between the GPUs of a node, GB/s; None: the GPU catalog's figure."""
    inter_node_bandwidth_gbps: float | None = field(default=None, metadata=_ABOVE_0)
    """Bandwidth between nodes per GPU, GB/s; None: the GPU catalog's figure."""
    price_per_gpu_hour: float | None = field(default=None, metadata=_AT_LEAST_0)
    """Price of one GPU hour; None: the GPU catalog's figure."""
    storage_write_gbps: float = field(default=10.0, metadata=_ABOVE_0)
    """Aggregate write bandwidth of the checkpoint storage, GB/s."""
    power_limit_w: float | None = None
    """GPU board power cap in watts (nvidia-smi -pl); None: the catalog's TDP. The planner slows
    compute by the clock a lower cap leaves (launcher.plan.kernels.clock_factor)."""
    gpu_request: str = field(default="gpus-per-node", metadata=one_of("gpus-per-node", "gres"))
    """How the SLURM job asks for GPUs: --gpus-per-node or --gres."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the ranks (a name saying KEY, TOKEN, SECRET, ... is a secret)."""
    profile: str | None = None
    """Operator profile `llmtrain calibrate` wrote (a JSON file) for `plan` to price from; None:
    the cached profile of cluster.gpu when there is one (~/.cache/llmtrain/profiles/GPU.json),
    "none": published figures only."""


@dataclass
class BackendConfig:
    """The engine that runs the training and its settings."""

    name: str = field(default="torch", metadata=one_of(*backend_names()))
    """The training engine (the modules of launcher/backends/)."""
    reduce_bucket_size: int = field(default=25_000_000, metadata=_AT_LEAST_1)
    """Gradient reduce bucket size, in elements (DeepSpeed naming)."""
    allgather_bucket_size: int = field(default=25_000_000, metadata=_AT_LEAST_1)
    """Parameter all-gather bucket size, in elements (DeepSpeed naming)."""
    overlap_comm: bool = True
    """Overlap the gradient reduction with the backward pass."""
    compile: bool | None = None
    """torch.compile each transformer block (backend=torch). null: the backend's default (on for
    precision=fp8 on a GPU, off otherwise; launcher/backends/engine_choices.py); true / false: as
    set."""
    tp_comm_overlap: bool = False
    """Overlap tensor-parallel collectives with the linear layers' GEMMs: Megatron-core's
    --tp-comm-overlap (Transformer Engine userbuffers) or torchtitan's async TP."""
    attention_kernel: str | None = None
    """Flash-attention kernel family: te (Transformer Engine / cuDNN fused attention,
    Hopper-native) or sdpa (PyTorch scaled_dot_product_attention's flash kernel,
    FlashAttention-2 class). None: te for megatron, sdpa for torch and deepspeed."""
    moe_dispatcher: str | None = field(
        default=None, metadata=one_of("allgather", "alltoall", "flex")
    )
    """MoE token dispatcher (launcher/backends/common.py says what each runs and prices):
    allgather (Megatron-core's gathered tokens), alltoall (every routed copy sent: torch
    all_to_all_single, Megatron's alltoall) or flex (node-deduplicated, DeepEP: Megatron's flex).
    None: the backend's default (alltoall for torch and deepspeed, allgather for megatron); the
    others are refused where the backend does not run them."""
    moe_comm_overlap: bool = False
    """Hide the expert dispatch/combine behind another micro-batch's compute: Megatron-Core's
    --overlap-moe-expert-parallel-comm (its combined 1F1B schedule pairs one micro-batch's
    forward with another's backward, layer by layer; one extra micro-batch in flight). Only
    backend=megatron runs it (launcher/backends/moe_overlap.py has its conditions)."""
    # --- Megatron-Core activation memory (launcher/backends/activation_modules.py; priced by
    # launcher/plan/mcore_activations.py). backend=megatron only.
    recompute_modules: list[str] | None = None
    """Megatron-Core's --recompute-modules with train.recompute=selective: core_attn, moe_act,
    layernorm, mla_up_proj, mlp, moe, shared_experts. None: Megatron's default [core_attn]."""
    offload_modules: list[str] = field(default_factory=list)
    """Megatron-Core's fine-grained activation offloading (--fine-grained-activation-offloading
    --offload-modules): the inputs of these modules go to host memory after the forward:
    attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act."""
    swiglu_fusion: bool = True
    """Megatron-LM's fused SwiGLU (bias_swiglu_fusion, on by default since 2024-01; false renders
    --no-bias-swiglu-fusion): the fused kernel keeps only its input; unfused, PyTorch's SiLU and
    product keep their own outputs too (launcher/plan/mcore_activations.py)."""
    cross_entropy_fusion: bool = False
    """Megatron-Core's fused cross-entropy, Transformer Engine's kernel
    (--cross-entropy-loss-fusion --cross-entropy-fusion-impl te): the fp32 gradient computed in
    the forward, no fp32 copies of the logits (launcher/plan/memory.py logits_bytes)."""
    megatron_path: str | None = None
    """backend=megatron: the Megatron-LM checkout holding pretrain_gpt.py that `run`/`submit`
    launch; None: $MEGATRON_LM_PATH."""
    megatron_extra_args: list[str] = field(default_factory=list)
    """backend=megatron: arguments appended to the rendered ones (your data and tokenizer:
    --data-path, --tokenizer-type ...; without data arguments, --mock-data)."""
    cuda_graphs: str = field(default="none", metadata=one_of("none", "local", "transformer_engine"))
    """CUDA graphs, backend=megatron only (Megatron-Core's --cuda-graph-impl): none, local or
    transformer_engine. Checked by launcher/backends/speed_features.py, priced by
    launcher/plan/speed_features.py, rendered by launcher/render/megatron_speed_flags.py."""
    cuda_graph_scope: list[str] = field(default_factory=list)
    """What a CUDA graph captures (--cuda-graph-scope): attn, mlp, moe_router, moe_preprocess;
    [] for the whole layer."""
    overlap_param_gather_with_optimizer_step: bool = False
    """--overlap-param-gather-with-optimizer-step (with --overlap-grad-reduce
    --overlap-param-gather): the first model chunk's all-gather runs beside the optimizer step.
    backend=megatron only."""
    fp8_scaling: str | None = field(
        default=None, metadata=one_of("delayed", "tensorwise", "mxfp8", "blockwise")
    )
    """fp8 scaling, backend=megatron (--fp8-recipe): delayed, tensorwise (current), mxfp8 or
    blockwise. None: Megatron-Core's default, delayed (precision.fp8_recipe is torchao's, for
    backend=torch)."""
    moe_permute_fusion: bool = False
    """--moe-permute-fusion: token permute and unpermute in one kernel each (backend=megatron)."""
    moe_router_fusion: bool = False
    """--moe-router-fusion: top-k with its score function, and the aux-loss scores, in one kernel
    each (backend=megatron)."""


@dataclass
class SlurmConfig:
    """The SLURM job `llmtrain submit` writes (launcher=slurm)."""

    job_name: str | None = None
    """None: the run's name (its directory's name), so jobs of different runs tell apart in
    squeue."""
    partition: str | None = None
    """sbatch --partition; None: the cluster's default."""
    account: str | None = None
    """sbatch --account; None: your default account."""
    qos: str | None = None
    """sbatch --qos; None: the default quality of service."""
    time: str = "01:00:00"
    """Wall-time limit of each job (sbatch --time)."""
    cpus_per_task: int | None = field(default=None, metadata=_AT_LEAST_1)
    """sbatch --cpus-per-task; None: SLURM's default."""
    signal_grace_s: int = field(default=120, metadata=_AT_LEAST_0)
    """Seconds before the time limit at which SLURM sends USR1 (checkpoint and requeue)."""
    requeue: bool = True
    """Requeue the job when it is preempted or reaches its time limit."""
    chain: int = field(default=0, metadata=_AT_LEAST_0)
    """Continuation jobs chained with --dependency=afterany to train past the wall-time limit."""
    extra_sbatch_args: list[str] = field(default_factory=list)
    """Further sbatch options, as written on sbatch's command line."""
    extra_srun_args: list[str] = field(default_factory=list)
    """Further srun options of the training step."""
    container_image: str | None = None
    """pyxis/enroot container for the training step. The job then runs the image's own Python
    (container_python, which must have llmtrain installed), mounts the run directory, the data
    and the working directory at the same paths, and starts in the working directory."""
    container_mounts: str | None = None
    """Further pyxis --container-mounts (SRC:DST[,...])."""
    container_python: str = "python3"
    """The container's Python interpreter."""


@dataclass
class LauncherConfig:
    """Where the run starts."""

    name: str = field(default="local", metadata=one_of("local", "slurm"))
    """local (this machine, torchrun) or slurm (sbatch)."""


@dataclass
class CheckpointConfig:
    """When the trainer writes checkpoints (atomically, with a checksummed manifest)."""

    every_steps: int | None = field(default=None, metadata=_AT_LEAST_1)
    """Every N optimizer steps. With neither this nor every_minutes set: every Young/Daly
    interval that `plan` computes (plan.json checkpoint.interval_s). Always at the end and on
    preemption."""
    every_minutes: float | None = field(default=None, metadata=_ABOVE_0)
    """Also every N minutes of wall time."""
    keep_last: int = field(default=3, metadata=_AT_LEAST_1)
    """Checkpoints kept; older ones are deleted."""
    resume: bool = True
    """Continue from the latest valid checkpoint in the run directory when there is one; false
    over a run that holds checkpoints is refused (start the new run with --fresh)."""


@dataclass
class RunConfig:
    """The run directory and what the ranks get from the environment."""

    name: str | None = None
    """The run directory's name; None: <recipe>-<hash of the config>, so the same command resumes
    the same run. A plain folder name of UTF-8 text, at most 239 bytes (--fresh adds 16)."""
    root_dir: str = "runs"
    """The folder holding the run directories."""
    secret_env: list[str] = field(default_factory=list)
    """Names of environment variables the ranks need but that are never written down (API keys):
    values come from the launching environment; see launcher.config.secrets."""


@dataclass
class LoggingConfig:
    """Experiment trackers beside metrics.jsonl and TensorBoard: off by default, rank 0 only,
    optional extras (pip install 'llmtrain[wandb]' / 'llmtrain[mlflow]'). Credentials only from
    the environment (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...; see run.secret_env)."""

    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_project: str = "llmtrain"
    """The W&B project."""
    wandb_entity: str | None = None
    """The W&B entity (team or user); None: your default."""
    wandb_mode: str = field(default="online", metadata=one_of("online", "offline", "disabled"))
    """W&B's mode."""
    mlflow: bool = False
    """Log to MLflow."""
    mlflow_tracking_uri: str | None = None
    """None: MLFLOW_TRACKING_URI from the environment, else mlflow's default (./mlruns)."""
    mlflow_experiment: str = "llmtrain"
    """The MLflow experiment."""


@dataclass
class FinetuneConfig:
    """How the model trains (conf/finetune/; docs/finetuning.md): full (every weight), lora
    (frozen base weights, a trainable low-rank update B @ A on each target projection, Hu et al.
    2021, arXiv:2106.09685) or qlora (lora over base weights stored in NF4, Dettmers et al. 2023,
    arXiv:2305.14314; launcher/train/lora.py)."""

    name: str = field(default="full", metadata=one_of("full", "lora", "qlora"))
    """The fine-tuning method."""
    rank: int = 16
    """The adapter's rank r: A is [r, in], B is [out, r]; 1 <= r <= min(in, out) of every
    target."""
    alpha: float = 32.0
    """The update is scaled by alpha / r (alpha > 0)."""
    dropout: float = 0.0
    """Dropout on the adapter branch's input, in [0, 1)."""
    targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "o"])
    """Projections to adapt: q k v o (attention), gate up down (MLP; gate only with swiglu), or
    all-linear (every one of them the model has)."""


@dataclass
class LLMTrainConfig:
    """The whole configuration: what `llmtrain show` prints."""

    recipe: str = "none"
    """The recipe (recipes/NAME.yaml, or a path) the configuration starts from."""
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
