"""The plan's assumptions (plan.json's "assumptions", `plan --detail`): the model behind every
figure, one sentence each, then what this configuration adds (engine, MoE dispatcher, fp8,
inferred dp, offload, uneven pipeline split)."""

from __future__ import annotations

from launcher.backends.common import moe_dispatcher
from launcher.backends.engine_choices import engine_choices
from launcher.backends.moe_overlap import moe_overlap_on
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.memory.estimate import FRAGMENTATION, fp8_weight_copy_bytes, uses_dropout
from launcher.plan.memory.offload import offload_assumption
from launcher.plan.timing.estimate import HOST_GBPS
from launcher.plan.totals import FAILURES_PER_GPU_HOUR

# What the expert-parallel communication is priced as, by dispatcher (plan.comm, plan.timing).
_DISPATCHER_ASSUMPTION = {
    "allgather": "MoE dispatcher allgather (Megatron-core's default): each rank all-gathers the "
    "tokens of its tp x ep group and reduce-scatters the expert outputs, whatever the routing",
    "alltoall": "MoE dispatcher alltoall: every routed copy is sent, so across nodes a token "
    "moves top_k x (n-k)/n copies over the NIC (n ranks in the ep group, k per node)",
    "flex": "MoE dispatcher flex (DeepEP): a token crosses the NIC once per remote node it is "
    "routed to, N-1 nodes x (1 - (1 - 1/N)^top_k) on average, and is forwarded over NVLink there",
}


def _dispatcher_source(cfg: LLMTrainConfig) -> str:
    if cfg.backend.moe_dispatcher is None:
        return f" (backend={cfg.backend.name}'s default; set backend.moe_dispatcher to change)."
    return f" (backend.moe_dispatcher={cfg.backend.moe_dispatcher})."


def assumptions(cfg: LLMTrainConfig, plan_layout: Layout) -> tuple[str, ...]:
    """What the plan assumes, one sentence each: the fixed model behind every figure, then what
    this configuration adds (engine, MoE dispatcher, fp8, inferred dp, offload, uneven split)."""
    out = [
        *_memory_assumptions(cfg),
        *_compute_assumptions(),
        *_communication_assumptions(cfg),
        *_totals_assumptions(cfg),
    ]
    out += [f"Engine: {line}." for line in engine_choices(cfg).lines()]
    out += _moe_assumptions(cfg, plan_layout)
    out += _fp8_assumptions(cfg)
    if plan_layout.dp_inferred:
        out.append(f"dp inferred as world_size / (tp*pp*cp) = {plan_layout.dp}.")
    if cfg.zero.offload_optimizer == "cpu" or cfg.zero.offload_params == "cpu":
        out.append(offload_assumption(cfg))
    if len(set(plan_layout.stage_layers)) > 1:
        out.append(
            "Pipeline split: transformer layers per stage "
            f"{list(plan_layout.stage_layers)}; embedding on stage 0, loss on the last; "
            "bubble scaled by (sum - max) / ((pp - 1) max) of the stage layers."
        )
    return tuple(out)


def _memory_assumptions(cfg: LLMTrainConfig) -> list[str]:
    """Units, torch's allocated/reserved, the fit test, model states, activations, logits."""
    return [
        "Memory in bytes; GiB = 2^30 bytes, GB = 1e9 bytes.",
        "allocated/reserved are what torch.cuda.max_memory_allocated/max_memory_reserved report; "
        f"reserved = allocated x {FRAGMENTATION} (caching-allocator fragmentation, fitted on the "
        "reserved-memory rows of calibration.csv); CUDA context + NCCL (overhead) come on top.",
        "Fits when reserved + overhead <= capacity x (1 - headroom).",
        "Model states: ZeRO paper bytes per parameter (weights in the compute dtype, gradients in "
        "precision.grad_dtype, fp32 master + optimizer moments), sharded over dp*cp by zero.stage; "
        "expert parameters split over ep*tp and sharded over dp*cp/ep.",
        "Activations: Korthikanti et al. 2022 per layer, generalised to GQA/SwiGLU/MoE; "
        + (
            "dropout masks counted (GPT-style model)."
            if uses_dropout(cfg)
            else "no dropout (Llama-style model)."
        ),
        "Flash attention stores no s^2 scores; eager stores softmax (+ dropout) per score.",
        "Selective recompute: with eager attention recompute the attention core (Korthikanti); "
        "with flash, PyTorch op-level SAC (every other matmul output saved).",
        "Full recompute keeps each layer's input plus one layer's activations while recomputing.",
        "Published-figure pricing describes the engine releases of calibration.csv up to 2025 "
        "(newest: NeMo 25.02's Megatron-Core for compute); Megatron's activations as "
        "Megatron-Core core_v0.16.1's layer keeps them (plan/memory/mcore_activations.py).",
        (
            "Loss chunked (train.chunked_loss): one chunk of tokens' logits at a time (10 bytes "
            "per logit in bf16) plus the gradients it keeps for backward (input [tokens, h], "
            "head weight [V, h] fp32)."
            if engine_choices(cfg).chunked_loss
            else "Last stage holds the logits for one micro-batch: compute dtype + fp32 copy + "
            "fp32 softmax (10 bytes per logit in bf16), split over tp."
        ),
        "1F1B: stage i holds min(m, pp - i) micro-batches; gpipe all m; interleaved per Megatron.",
    ]


def _compute_assumptions() -> list[str]:
    """Model and hardware FLOPs, the per-operator compute model, the error bands."""
    return [
        "Model FLOPs: 6 x matmul params (active experts, output head, no embedding lookup) + "
        "12 l h s attention (PaLM appendix B; full s x s, not halved for the causal mask).",
        "Hardware FLOPs add recompute; time uses executed FLOPs (causal attention halved with "
        "flash attention).",
        "Compute per operator class (kernels.py): linear GEMMs on a smooth roofline at "
        "MAMF x d/(d + gemm_half_dim) of peak (d the smaller output dimension), flash attention "
        "at the kernel's published rate x one fitted factor, norms/activations/rotary/casts/"
        "routing as bytes over HBM; constants fitted on calibration.csv (fitted.py).",
        "Error bands: leave-one-source-out cross-validation on calibration.csv, by regime; "
        "'tight' = over the headroom but allocated + CUDA context within the GPU's memory (the "
        "allocator frees its cache before failing); above it, 'does not fit', whatever the band.",
    ]


def _communication_assumptions(cfg: LLMTrainConfig) -> list[str]:
    """Rank placement, collectives and their overlap, MFU's peak, the bubble, the optimizer."""
    return [
        "Rank placement, innermost first: tp, cp, dp (ep carved from dp), pp; a group spanning "
        "nodes with k members per node gets min(intra, k x inter) bus bandwidth.",
        "Ring collectives, bandwidth term only: all-reduce 2(n-1)/n, reduce-scatter/all-gather "
        "(n-1)/n of the message per GPU.",
        "TP collectives hide behind the linear GEMMs with backend.tp_comm_overlap (Megatron "
        "tp-comm-overlap, torchtitan async TP); PP p2p hides with Megatron's interleaved schedule "
        "(overlap_p2p_comm); EP all-to-all is exposed; CP K/V exchange hides behind attention; "
        "DP/ZeRO collectives overlap backward/forward when backend.overlap_comm; hidden "
        "communication still costs overlap_cost of its time. Groups inside one NVLink domain "
        "(scale_up_domain, e.g. 72 on GB200 NVL72) get NVLink bandwidth.",
        "MFU and HFU divide by the dense peak of precision.compute_dtype "
        f"({cfg.precision.compute_dtype}), with fp8 matmuls too.",
        "Bubble (p-1)/(v m) of the per-micro-batch time (Narayanan et al. 2021).",
        f"Optimizer step memory-bound over HBM; CPU offload at {HOST_GBPS:g} GB/s host memory.",
    ]


def _totals_assumptions(cfg: LLMTrainConfig) -> list[str]:
    """Failures, the checkpoint interval and size, what train time and cost count."""
    return [
        f"Failure rate {FAILURES_PER_GPU_HOUR:.3g} per GPU-hour (Llama 3: 419 interruptions in "
        "54 days on 16,384 GPUs); checkpoint interval sqrt(2 C MTBF) (Young 1974 / Daly 2006).",
        "Checkpoint = weights in the compute dtype + optimizer states (master + moments), "
        f"written synchronously at cluster.storage_write_gbps={cfg.cluster.storage_write_gbps:g} "
        "GB/s for the whole job; time lost = C/interval + interval/(2 MTBF).",
        "Train time, GPU-hours and cost count training steps only; 'expected wall time' adds "
        "checkpoint writes and work redone after failures (train time / (1 - time lost)).",
    ]


def _moe_assumptions(cfg: LLMTrainConfig, plan_layout: Layout) -> list[str]:
    """How the expert all-to-all is priced (by dispatcher) and overlapped, with ep > 1."""
    if not ((cfg.model.num_experts or 0) > 1 and plan_layout.ep > 1):
        return []
    out = [_DISPATCHER_ASSUMPTION[moe_dispatcher(cfg)] + _dispatcher_source(cfg)]
    if moe_overlap_on(cfg):
        out.append(
            "backend.moe_comm_overlap: Megatron-Core's combined 1F1B pairs one micro-batch's "
            "forward with another's backward, so the paired share of the expert all-to-all "
            "(not the warm-up forwards nor the cool-down backwards) runs beside the "
            "partner's compute, costing overlap_cost of its time; one more micro-batch's "
            "activations are held (its extra warm-up forward)."
        )
    return out


def _fp8_assumptions(cfg: LLMTrainConfig) -> list[str]:
    """What fp8 (real or emulated) changes in the pricing."""
    if cfg.precision.fp8 and cfg.precision.fp8_emulate:
        return [
            "fp8 emulated (precision.fp8_emulate): GEMMs at the compute dtype's peak; the fp8 "
            "casts' traffic is not counted."
        ]
    if cfg.precision.fp8:
        return [
            "fp8: linear-layer GEMMs at the fp8 dense peak; attention, non-GEMM work and "
            "communication as in the compute dtype; "
            + (
                "weights keep an fp8 copy and its transpose (Transformer Engine)."
                if fp8_weight_copy_bytes(cfg)
                else "weights cast to fp8 on the fly, no copy kept (torchao float8)."
            )
        ]
    return []
