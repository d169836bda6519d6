"""The training groups: `precision.*`, `train.*` (steps, batch, recompute) and `optim.*`."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import bounds, one_of
from launcher.config.schema.common import AT_LEAST_0, AT_LEAST_1, MAX_SEED


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

    micro_batch_size: int = field(default=1, metadata=AT_LEAST_1)
    """Sequences per rank per forward/backward pass."""
    global_batch_size: int | None = field(default=None, metadata=AT_LEAST_1)
    """Sequences per optimizer step; None: micro_batch_size * dp * grad_accum."""
    grad_accum: int | None = field(default=None, metadata=AT_LEAST_1)
    """Micro-batches per optimizer step; None: global_batch_size // (micro_batch_size * dp), or 1
    when global_batch_size is None too."""
    steps: int | None = field(default=100, metadata=AT_LEAST_1)
    """Length of the run in optimizer steps; set this or tokens, not both."""
    tokens: int | None = field(default=None, metadata=AT_LEAST_1)
    """Length of the run in tokens (converted to steps); set this or steps, not both."""
    recompute: str = field(default="none", metadata=one_of("none", "selective", "full"))
    """Activation recomputation (docs/configuration.md says what each engine runs)."""
    chunked_loss: bool | None = None
    """The loss over chunks of tokens, never the full fp32 logits (backend=torch with tp=1, pp=1;
    launcher/train/model/chunked_loss.py). null: wherever it applies; false: full logits."""
    seed: int = field(
        default=1234,
        metadata=bounds(
            ge=0, le=MAX_SEED, example="1234", why="numpy's and Megatron-LM's seed range"
        ),
    )
    """Random seed of the weights' initialization and the data order."""
    log_every: int = field(default=1, metadata=AT_LEAST_1)
    """Log the loss every N optimizer steps."""
    hang_timeout_s: float = field(default=1800.0, metadata=AT_LEAST_0)
    """A rank that makes no progress (a step or checkpoint) for this many seconds is declared hung
    and the whole run is stopped with a message instead of waiting forever; 0 disables the
    watchdog."""
    eval_every: int | None = None
    """Validation loss every N optimizer steps (and after the last), over eval_steps global
    batches of the validation data (launcher.train.evaluation); None or 0: no evaluation."""
    eval_steps: int = field(default=10, metadata=AT_LEAST_1)
    """Global batches of validation data per evaluation."""
    init_from: str | None = None
    """Start from these weights (step 0, fresh optimizer): a Hugging Face folder (llmtrain
    export), a run directory or a checkpoint folder. A run with checkpoints of its own resumes
    instead."""
    max_nonfinite_skips: int = field(default=0, metadata=AT_LEAST_0)
    """Training health (launcher.health): a step whose loss or gradient norm is NaN or infinite
    stops the run (exit 3, nothing checkpointed after the last good step), unless up to this many
    such steps may be skipped first (their update withheld, counted in metrics.jsonl)."""
    loss_spike_window: int = field(default=100, metadata=AT_LEAST_1)
    """Loss spikes: the number of previous losses a step's loss is compared with."""
    loss_spike_zscore: float = field(default=6.0, metadata=AT_LEAST_0)
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
