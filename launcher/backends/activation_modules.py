"""backend.recompute_modules and backend.offload_modules: Megatron-Core's per-module activation
recomputation and fine-grained activation offloading, with the conditions Megatron-Core checks.

Read in NVIDIA/Megatron-LM core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6):
- megatron/core/transformer/transformer_config.py: ``recompute_modules`` (default
  ``["core_attn"]``, used with ``recompute_granularity="selective"``; allowed core_attn, moe_act,
  layernorm, mla_up_proj, mlp, moe, shared_experts; moe_act needs moe_grouped_gemm, mla_up_proj
  needs multi-latent attention, moe_act and layernorm with fp8 are refused under delayed scaling);
  ``offload_modules`` (with ``fine_grained_activation_offloading``; allowed attn_norm, qkv_linear,
  core_attn, attn_proj, mlp_norm, expert_fc1, moe_act; attn_proj only together with core_attn,
  "because the input of attn_proj is the output of core_attn").
- docs/user-guide/features/fine_grained_activation_offloading.md: the flags
  ``--fine-grained-activation-offloading --offload-modules ...``.
What each module frees and costs is priced in launcher/plan/memory/mcore_activations.py.
"""

from __future__ import annotations

from launcher.backends.common import Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

RECOMPUTE_KEY = "backend.recompute_modules"
OFFLOAD_KEY = "backend.offload_modules"
SWIGLU_KEY = "backend.swiglu_fusion"
CE_KEY = "backend.cross_entropy_fusion"

RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)
# Megatron-Core's default when --recompute-modules is not given.
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
OFFLOAD_MODULES = (
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "expert_fc1",
    "moe_act",
)


def recompute_modules(cfg: LLMTrainConfig) -> tuple[str, ...]:
    """The modules Megatron-Core recomputes: none unless train.recompute=selective, then
    backend.recompute_modules or Megatron's default (core_attn)."""
    if cfg.train.recompute != "selective":
        return ()
    chosen = cfg.backend.recompute_modules
    return tuple(chosen) if chosen is not None else DEFAULT_RECOMPUTE_MODULES


def offload_modules(cfg: LLMTrainConfig) -> tuple[str, ...]:
    return tuple(cfg.backend.offload_modules)


def _unknown(key: str, values: tuple[str, ...], allowed: tuple[str, ...]) -> Refusal | None:
    bad = [v for v in values if v not in allowed]
    if bad:
        return Refusal(
            (key,),
            f"{key}: {', '.join(repr(b) for b in bad)} is not a Megatron-Core module; "
            f"choose from {', '.join(allowed)}",
        )
    if len(set(values)) != len(values):
        return Refusal((key,), f"{key}: a module is listed twice ({', '.join(values)})")
    return None


def megatron_activation_modules(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """Megatron-Core's own checks on the two lists (module docstring), as refusals naming
    the key."""
    chosen = cfg.backend.recompute_modules
    if chosen is not None:
        rec = tuple(chosen)
        refusal = _unknown(RECOMPUTE_KEY, rec, RECOMPUTE_MODULES)
        if refusal:
            return refusal
        if cfg.train.recompute != "selective":
            return Refusal(
                (RECOMPUTE_KEY, "train.recompute"),
                f"{RECOMPUTE_KEY} with train.recompute={cfg.train.recompute}: Megatron-Core "
                "recomputes modules only with --recompute-granularity selective; use "
                f"train.recompute=selective, or {RECOMPUTE_KEY}=null",
            )
        m = cfg.model
        if "mla_up_proj" in rec and m.kv_lora_rank is None:
            return Refusal(
                (RECOMPUTE_KEY, "model.kv_lora_rank"),
                f"{RECOMPUTE_KEY} has mla_up_proj on a model without multi-latent attention "
                "(model.kv_lora_rank is null): Megatron-Core refuses it; drop mla_up_proj",
            )
        moe_only = [x for x in ("moe_act", "moe", "shared_experts") if x in rec]
        if moe_only and not (m.num_experts or 0) > 1:
            return Refusal(
                (RECOMPUTE_KEY, "model.num_experts"),
                f"{RECOMPUTE_KEY} has {', '.join(moe_only)} on a dense model: there is no MoE "
                "layer to recompute; drop it",
            )
        if "shared_experts" in rec and not m.moe_shared_experts:
            return Refusal(
                (RECOMPUTE_KEY, "model.moe_shared_experts"),
                f"{RECOMPUTE_KEY} has shared_experts on a model without shared experts "
                "(model.moe_shared_experts=0); drop it",
            )
    off = offload_modules(cfg)
    if off:
        refusal = _unknown(OFFLOAD_KEY, off, OFFLOAD_MODULES)
        if refusal:
            return refusal
        if "attn_proj" in off and "core_attn" not in off:
            return Refusal(
                (OFFLOAD_KEY,),
                f"{OFFLOAD_KEY} has attn_proj without core_attn: Megatron-Core refuses it (the "
                "input of attn_proj is the output of core_attn, which core_attn's backward "
                "needs); add core_attn",
            )
        moe_inputs = [x for x in ("expert_fc1", "moe_act") if x in off]
        if moe_inputs and not (cfg.model.num_experts or 0) > 1:
            return Refusal(
                (OFFLOAD_KEY, "model.num_experts"),
                f"{OFFLOAD_KEY} has {', '.join(moe_inputs)} on a dense model: there are no "
                "experts whose inputs could be offloaded; drop it",
            )
        if cfg.train.recompute == "full":
            return Refusal(
                (OFFLOAD_KEY, "train.recompute"),
                f"{OFFLOAD_KEY} with train.recompute=full: a fully recomputed layer keeps only "
                "its input, so there is nothing of the modules' to offload; use "
                f"train.recompute=selective (or none), or {OFFLOAD_KEY}=[]",
            )
    return None


def activation_modules_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """torch and DeepSpeed: none of the keys exists there (their recompute is train.recompute's
    op-level or full checkpointing; they offload no activations; their SwiGLU is eager or
    compiled, backend.compile)."""
    if cfg.backend.recompute_modules is not None:
        return Refusal(
            (RECOMPUTE_KEY, "backend"),
            f"{RECOMPUTE_KEY}: per-module recomputation is Megatron-Core's; this engine runs "
            f"train.recompute=selective|full as a whole; use {RECOMPUTE_KEY}=null, or "
            "backend=megatron",
        )
    if not cfg.backend.swiglu_fusion:
        return Refusal(
            (SWIGLU_KEY, "backend"),
            f"{SWIGLU_KEY}=false is Megatron-LM's --no-bias-swiglu-fusion; this engine has no "
            f"such switch; use {SWIGLU_KEY}=true, or backend=megatron",
        )
    if cfg.backend.cross_entropy_fusion:
        return Refusal(
            (CE_KEY, "backend"),
            f"{CE_KEY}=true is Megatron-Core's fused cross-entropy; this engine's loss without "
            f"full logits is train.chunked_loss; use {CE_KEY}=false, or backend=megatron",
        )
    if cfg.backend.offload_modules:
        return Refusal(
            (OFFLOAD_KEY, "backend"),
            f"{OFFLOAD_KEY}: fine-grained activation offloading is Megatron-Core's; this engine "
            f"keeps activations on the GPU; use {OFFLOAD_KEY}=[], or backend=megatron",
        )
    return None


__all__ = [
    "DEFAULT_RECOMPUTE_MODULES",
    "OFFLOAD_MODULES",
    "RECOMPUTE_MODULES",
    "activation_modules_not_run",
    "megatron_activation_modules",
    "offload_modules",
    "recompute_modules",
]
