"""The memory savers fine-tuners rely on, and which engine runs them (backend=torch alone):

- optim.in_backward: each parameter stepped in its post-accumulate-grad hook
  (launcher/train/optim_in_backward.py). The other parameters are already updated when the
  last gradient exists, so nothing that needs every gradient first can hold: clipping the global
  norm, accumulating micro-batches, loss scaling's skipped steps, withholding a non-finite step,
  and data / tensor / pipeline parallel reductions (DDP and FSDP reduce after the hook).
- train.activation_offload: saved activations to pinned host memory
  (launcher/train/model/activation_offload.py), in the engine's own forward (not the pipeline
  schedules').
- precision=bf16-pure (precision.master_weights=false, compute bf16): bf16 weights with no fp32
  master; DeepSpeed's bf16 optimizer and Megatron-Core's always keep fp32 masters.
- optim.state_dtype=bf16 on backend=torch: torchao's Adam over bf16 moments (adam, adamw);
  adamw8bit / adamw4bit quantize their states already.
The engines' tables list these refusals (docs/backends.md); the plan prices each saver
(launcher/plan/memory/memory_savers.py).
"""

from __future__ import annotations

from launcher.backends.common import Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig


def pure_bf16(cfg: LLMTrainConfig) -> bool:
    """bf16 weights with no fp32 master copy (precision=bf16-pure), for full training: with
    finetune=lora|qlora the adapters are the master and stay fp32."""
    p = cfg.precision
    return p.compute_dtype == "bf16" and not p.master_weights and cfg.finetune.name == "full"


def in_backward_problem(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """What optim.in_backward cannot run with, on the engine that runs it."""
    if not cfg.optim.in_backward:
        return None
    o, t = cfg.optim, cfg.train
    fix = "or optim.in_backward=false"
    if o.grad_clip > 0:
        return Refusal(
            ("optim.in_backward", "optim.grad_clip"),
            f"optim.in_backward=true with optim.grad_clip={o.grad_clip:g}: each parameter is "
            f"stepped before the global norm exists; set optim.grad_clip=0 {fix}",
        )
    if layout.grad_accum > 1:
        return Refusal(
            ("optim.in_backward", "train.grad_accum"),
            f"optim.in_backward=true with {layout.grad_accum} micro-batches a step: the first "
            "micro-batch's gradients would be stepped alone; set train.global_batch_size to "
            f"micro_batch_size x dp (grad_accum=1) {fix}",
        )
    if layout.world_size > 1:
        return Refusal(
            ("optim.in_backward", "cluster.gpus_per_node"),
            f"optim.in_backward=true on {layout.world_size} ranks: the gradients are reduced "
            "across ranks after the hook steps them; run it on one GPU (cluster.num_nodes=1 "
            f"cluster.gpus_per_node=1) {fix}",
        )
    if cfg.zero.stage >= 2:
        return Refusal(
            ("optim.in_backward", "zero.stage"),
            f"optim.in_backward=true with zero.stage={cfg.zero.stage}: FSDP2 sets the sharded "
            f"gradients itself, past the hooks; use zero.stage=0 on one GPU {fix}",
        )
    if cfg.precision.loss_scaling == "dynamic":
        return Refusal(
            ("optim.in_backward", "precision"),
            "optim.in_backward=true with dynamic loss scaling: a step the scaler would skip is "
            f"taken already; use precision=bf16 or bf16-pure {fix}",
        )
    if t.max_nonfinite_skips > 0:
        return Refusal(
            ("optim.in_backward", "train.max_nonfinite_skips"),
            f"optim.in_backward=true with train.max_nonfinite_skips={t.max_nonfinite_skips}: a "
            f"non-finite step is applied before it is seen; set train.max_nonfinite_skips=0 {fix}",
        )
    return None


def torch_savers(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """backend=torch: the savers' own conditions."""
    problem = in_backward_problem(cfg, layout)
    if problem is not None:
        return problem
    if cfg.train.activation_offload and layout.pp > 1:
        return Refusal(
            ("train.activation_offload", "parallel.pp"),
            f"train.activation_offload=true with parallel.pp={layout.pp}: the pipeline "
            "schedules run their own forwards; use parallel.pp=1 or "
            "train.activation_offload=false",
        )
    dtype, name = cfg.optim.state_dtype, cfg.optim.name
    if dtype == "fp32":
        return None
    if dtype != "bf16" or name not in ("adam", "adamw"):
        return Refusal(
            ("optim.state_dtype", "optim.name"),
            f"optim.state_dtype={dtype} with optim.name={name}: the torch engine keeps Adam's "
            "moments in bf16 (adam, adamw) or quantized (adamw8bit, adamw4bit); use "
            "optim.state_dtype=bf16 with optim.name=adamw, or optim.state_dtype=fp32",
        )
    return None


def savers_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """Engines other than torch: none of the savers."""
    if cfg.optim.in_backward:
        return Refusal(
            ("optim.in_backward", "backend"),
            "optim.in_backward=true: only backend=torch steps parameters in the backward; use "
            "backend=torch or optim.in_backward=false",
        )
    if cfg.train.activation_offload:
        return Refusal(
            ("train.activation_offload", "backend"),
            "train.activation_offload=true: only backend=torch offloads saved activations this "
            "way (backend=megatron: backend.offload_modules); use backend=torch or "
            "train.activation_offload=false",
        )
    p = cfg.precision
    if not p.master_weights and p.compute_dtype in ("bf16", "fp16"):
        return Refusal(
            ("precision", "precision.master_weights"),
            f"precision={p.name} without fp32 master weights: this engine keeps fp32 masters; "
            "use precision=bf16, or backend=torch for precision=bf16-pure",
        )
    return None
