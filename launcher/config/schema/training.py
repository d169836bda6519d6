"""The training groups: `precision.*`, `train.*` (steps, batch, recompute) and `optim.*`."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import a_path, bounds, one_of
from launcher.config.schema.common import AT_LEAST_0, AT_LEAST_1, MAX_SEED


@dataclass
class PrecisionConfig:
    """Number formats. Selected as a group: precision=bf16|fp16|fp32|fp8."""

    name: str = field(default="bf16", metadata=one_of("bf16", "bf16-pure", "fp16", "fp32", "fp8"))
    """The precision option's name (bf16-pure: bf16 weights, gradients and optimizer states with
    no fp32 master copy, backend=torch; conf/precision/bf16-pure.yaml)."""
    compute_dtype: str = field(default="bf16", metadata=one_of("fp32", "bf16", "fp16"))
    """Format of the working weights and activations."""
    master_weights: bool = True
    """The optimizer keeps an fp32 master copy of the weights (mixed precision). false with
    compute_dtype=bf16 (precision=bf16-pure): backend=torch stores the weights in bf16 and steps
    them there, 2 bytes a parameter instead of 4 + 2 (torchtune's full fine-tuning default);
    the other engines keep fp32 masters and refuse it."""
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
    epochs: float | None = field(default=None, metadata=bounds(gt=0, example="1 (one pass)"))
    """Length of the run in passes over the training data: steps = ceil(epochs * rows /
    global_batch_size), rows counted on the opened data by the run, read from data.path's
    index.json by plan (launcher/config/epoch_rows.py). It wins over train.steps / train.tokens,
    which then only price a plan whose data size is unknown (no prepared data.path). Given on
    the command line with either of them: refused; one of them alone there replaces it."""
    recompute: str = field(default="none", metadata=one_of("none", "selective", "full"))
    """Activation recomputation (docs/configuration.md says what each engine runs)."""
    activation_offload: bool = False
    """Saved activations go to pinned host memory after the forward and come back for the
    backward, copied on a side CUDA stream (torchtune's OffloadActivations; backend=torch,
    launcher/train/model/activation_offload.py). On the CPU it runs and trains identically, with no
    memory to save. plan prices the device memory saved and the PCIe time it cannot hide."""
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
    init_from: str | None = field(default=None, metadata=a_path())
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

    name: str = field(
        default="adamw", metadata=one_of("adamw", "adam", "sgd", "lion", "adamw8bit", "adamw4bit")
    )
    """The optimizer. adamw8bit / adamw4bit: AdamW with m and v block-quantized to 8 or 4 bits
    (torchao.optim AdamW8bit, block 256 / AdamW4bit, block 128; Dettmers et al. 2022 and Li et
    al. 2023), backend=torch; tensors under 4096 values keep fp32 states."""
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
    --exp-avg-sq-dtype), backend=megatron with zero.stage=1; bf16 on backend=torch with adam or
    adamw (torchao's Adam step over bf16 states). With pure bf16 weights (precision=bf16-pure)
    torch's Adam keeps its states in the weights' dtype, bf16, whatever this says."""
    in_backward: bool = False
    """Step each parameter in its post-accumulate-grad hook and free its gradient at once, so
    only one gradient is alive (PyTorch's tutorial "How to save memory by fusing the optimizer
    step into the backward pass"; torchtune's optimizer_in_bwd). backend=torch on one device (no
    data, tensor or pipeline parallel), with optim.grad_clip=0, one micro-batch a step
    (grad_accum=1) and train.max_nonfinite_skips=0: a step once taken cannot be withheld."""
    offload: str = field(default="none", metadata=one_of("none", "cpu"))
    """cpu: the optimizer's states (Adam's m and v, quantized or not) live in pinned host memory;
    each parameter's are copied to the device for its update and back after it, one parameter
    at a time (in its backward hook with optim.in_backward), so the device holds one tensor's
    states instead of all (bitsandbytes' paged optimizers move them on demand; this moves them
    every step; launcher/train/optim_offload.py). The update itself runs on the device, unlike
    zero.offload_optimizer's CPU step. backend=torch without tp, ep or ZeRO sharding; plan
    prices the states on the host and their PCIe copies (launcher/plan/memory/offload.py)."""
