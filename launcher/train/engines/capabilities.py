"""What the PyTorch-native engine can run, decided from the config alone (no torch import).

``torch_capabilities(cfg)`` lists, in words, why ``backend=torch`` cannot run a configuration, each
reason followed by what would work instead. An empty list means the engine accepts the config (the
validation rules in ``launcher.validate`` still check the layout arithmetic itself). Only what
really fails is refused; every combination that is accepted is exercised by
``tests/integration/test_torch_engine.py`` on CPU with gloo.
"""

from __future__ import annotations

from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig

SUPPORTED_OPTIMIZERS = ("adamw", "adam")


def torch_capabilities(cfg: LLMTrainConfig) -> list[str]:
    """Reasons the torch backend cannot run `cfg`, each with what would work; [] if it can."""
    layout = derive_layout(cfg)
    p, z, m, prec = cfg.parallel, cfg.zero, cfg.model, cfg.precision
    on_cpu = cfg.cluster.gpu == "cpu"
    out: list[str] = []

    if z.stage == 1 and (p.tp > 1 or p.pp > 1):
        out.append(
            f"zero.stage=1 (DDP + ZeroRedundancyOptimizer) with parallel.tp={p.tp}, "
            f"parallel.pp={p.pp}: the torch backend shards optimizer states over plain data "
            "parallel only; use zero.stage=0, 2 or 3 with tp/pp, parallel.tp=1 and "
            "parallel.pp=1, or backend=deepspeed"
        )
    elif z.stage not in (0, 1, 2, 3):
        out.append(f"zero.stage={z.stage} is not a ZeRO stage; use 0, 1, 2 or 3")
    if z.offload_params == "cpu" and z.stage != 3:
        out.append(
            "zero.offload_params=cpu is FSDP2's CPUOffloadPolicy, which the torch backend applies "
            "with full sharding only; use zero.stage=3, or backend=deepspeed"
        )
    if z.offload_optimizer == "cpu" and z.offload_params != "cpu":
        out.append(
            "zero.offload_optimizer=cpu alone is not available with FSDP2 (its CPUOffloadPolicy "
            "offloads parameters, gradients and optimizer states together); set "
            "zero.offload_params=cpu with zero.stage=3 as well, or use backend=deepspeed"
        )
    if p.cp > 1:
        if p.tp > 1 or p.pp > 1:
            out.append(
                f"parallel.cp={p.cp} with parallel.tp={p.tp}, parallel.pp={p.pp}: the torch "
                "backend's ring attention runs with data parallel only; use parallel.tp=1 and "
                "parallel.pp=1 with cp, parallel.cp=1, or backend=megatron"
            )
        if m.kv_lora_rank is not None:
            out.append(
                f"parallel.cp={p.cp} with multi-head latent attention (model.kv_lora_rank set): "
                "the torch backend's ring attention covers standard attention only; use "
                "parallel.cp=1, or backend=megatron"
            )
        if cfg.backend.compile:
            out.append(
                f"parallel.cp={p.cp} with backend.compile=true: ring attention is not compiled "
                "by the torch backend; set backend.compile=false, or parallel.cp=1"
            )
    if p.ep > 1:
        experts = m.num_experts or 0
        if experts < 2 or experts % p.ep:
            out.append(
                f"parallel.ep={p.ep} needs a mixture-of-experts model whose model.num_experts "
                f"({m.num_experts}) divides by ep; use parallel.ep=1 or a multiple-of-ep "
                "num_experts"
            )
        if p.tp > 1 or p.pp > 1 or p.cp > 1 or z.stage != 0:
            out.append(
                f"parallel.ep={p.ep} with parallel.tp={p.tp}, pp={p.pp}, cp={p.cp}, "
                f"zero.stage={z.stage}: the torch backend's expert parallel runs over plain "
                "data parallel (zero.stage=0) only; use parallel.tp=1, pp=1, cp=1 and "
                "zero.stage=0 with ep, parallel.ep=1 (experts then sharded by FSDP or replicated "
                "by DDP over dp), or backend=megatron"
            )
    if (m.num_experts or 0) > 1 and p.tp > 1:
        out.append(
            f"a mixture-of-experts model with parallel.tp={p.tp}: the torch backend does not "
            "shard experts by tensor parallel; use parallel.tp=1 with zero.stage=2 or 3, "
            "or backend=megatron"
        )
    if m.kv_lora_rank is not None and p.tp > 1:
        out.append(
            f"multi-head latent attention (model.kv_lora_rank set) with parallel.tp={p.tp}: the "
            "torch backend's tensor-parallel plan covers standard attention only; use "
            "parallel.tp=1, or backend=megatron"
        )
    kv = m.num_kv_heads or m.num_attention_heads
    if p.tp > 1 and m.kv_lora_rank is None and kv % p.tp and p.tp % kv:
        fits = [
            t
            for t in range(1, m.num_attention_heads + 1)
            if m.num_attention_heads % t == 0 and (kv % t == 0 or t % kv == 0)
        ]
        out.append(
            f"parallel.tp={p.tp} neither divides model.num_kv_heads={kv} nor is a multiple of "
            "it: the torch backend shards whole key/value heads, or replicates each one "
            f"tp // kv_heads times; use parallel.tp in {{{', '.join(str(t) for t in fits)}}}"
        )
    if m.tie_embeddings and p.pp > 1:
        out.append(
            f"model.tie_embeddings=true with parallel.pp={p.pp}: the input embedding (first stage) "
            "and the output layer (last stage) cannot share one weight across pipeline stages; "
            "set model.tie_embeddings=false, or parallel.pp=1"
        )
    if p.pp > 1:
        schedule = p.pp_schedule
        if p.vpp > 1 and schedule != "interleaved":
            out.append(
                f"parallel.vpp={p.vpp} needs the interleaved schedule, but parallel.pp_schedule="
                f"{schedule}; set parallel.pp_schedule=interleaved, or parallel.vpp=1"
            )
        if schedule == "1f1b" and layout.grad_accum < p.pp:
            out.append(
                f"parallel.pp_schedule=1f1b needs at least pp={p.pp} micro-batches per step, "
                f"but grad_accum={layout.grad_accum}; raise train.grad_accum (or "
                f"train.global_batch_size) to >= {p.pp}, or use parallel.pp_schedule=gpipe"
            )
        if schedule == "interleaved":
            # ScheduleInterleaved1F1B runs the micro-batches in rounds of grad_accum // pp.
            rounds = max(1, layout.grad_accum // p.pp)
            if layout.grad_accum % rounds:
                out.append(
                    f"parallel.pp_schedule=interleaved runs grad_accum={layout.grad_accum} "
                    f"micro-batches in {rounds} rounds, which must divide it; use a multiple "
                    f"of pp={p.pp} (or fewer than {2 * p.pp})"
                )
    if prec.fp8 or prec.name == "fp8":
        # No "or backend=megatron": that backend is render-only in llmtrain (advice that loops).
        out.append(
            "precision=fp8 needs fp8 tensor cores (Hopper or newer GPUs); on CPU use "
            "precision=bf16 or precision=fp32"
            if on_cpu
            else "precision=fp8 is not implemented by the torch backend (torchao float8 "
            "training is not wired in); use precision=bf16"
        )
    elif (prec.compute_dtype == "fp16" or prec.loss_scaling == "dynamic") and p.pp > 1:
        out.append(
            f"precision={prec.name} (loss_scaling={prec.loss_scaling}) with parallel.pp={p.pp}: "
            "the torch backend does not scale the loss inside the pipeline schedules; use "
            "parallel.pp=1, or precision=bf16" + ("" if on_cpu else ", or backend=deepspeed")
        )
    if cfg.optim.name not in SUPPORTED_OPTIMIZERS:
        out.append(
            f"optim.name={cfg.optim.name} is not available in the torch backend; use "
            f"optim.name={' or '.join(SUPPORTED_OPTIMIZERS)}"
        )
    return out
