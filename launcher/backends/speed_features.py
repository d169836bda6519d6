"""The speed features published Megatron-Core recipes switch on, with the conditions Megatron-Core
checks: backend.tp_comm_overlap, backend.cuda_graphs / cuda_graph_scope,
backend.overlap_param_gather_with_optimizer_step, backend.fp8_scaling, backend.moe_permute_fusion
and backend.moe_router_fusion. torch and DeepSpeed run none of the Megatron-only ones.

Read in NVIDIA/Megatron-LM core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6):
- megatron/training/arguments.py: --tp-comm-overlap needs --sequence-parallel ("Tensor parallel
  communication/GEMM overlap can happen only when sequence parallelism is enabled");
  --overlap-param-gather needs the distributed optimizer (or Megatron-FSDP) and
  --overlap-grad-reduce; --overlap-param-gather-with-optimizer-step needs the distributed
  optimizer, --overlap-param-gather, interleaved pipeline parallelism
  (--virtual-pipeline-model-parallel-size) and no distributed checkpoint (use_dist_ckpt, i.e.
  --ckpt-format torch: megatron/training/utils.py update_use_dist_ckpt); --cuda-graph-impl local
  with expert parallelism needs an inference-only padding flag; the full_iteration scope is
  local's, the other scopes transformer_engine's (the --cuda-graph-scope help).
- megatron/core/transformer/transformer_config.py: cuda_graph_impl none | local |
  transformer_engine; fp8_recipe tensorwise | delayed | mxfp8 | blockwise (default delayed);
  with CUDA graphs: full recompute only with the full_iteration graph, moe_router /
  moe_preprocess only for MoE models, moe_preprocess only with moe_router, mlp only where dense
  layers exist, the moe scope only with drop-and-pad MoE (which llmtrain does not run), no
  dropout inside a graphed recomputed module, and with --overlap-moe-expert-parallel-comm only
  transformer_engine without the moe / mlp scopes; moe_router_fusion needs Transformer Engine
  2.7 and moe_permute_fusion its fused permute kernels (both MoE only).
What each feature removes or adds is priced in launcher/plan/speed_features.py; the flags are
rendered by launcher/render/megatron_speed_flags.py.
"""

from __future__ import annotations

from launcher.backends.common import Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

TP_OVERLAP_KEY = "backend.tp_comm_overlap"
GRAPHS_KEY = "backend.cuda_graphs"
SCOPE_KEY = "backend.cuda_graph_scope"
PARAM_GATHER_KEY = "backend.overlap_param_gather_with_optimizer_step"
FP8_SCALING_KEY = "backend.fp8_scaling"
PERMUTE_KEY = "backend.moe_permute_fusion"
ROUTER_KEY = "backend.moe_router_fusion"

# The scopes llmtrain renders (--cuda-graph-scope); "moe" needs drop-and-pad MoE (capacity
# factor and padding), which llmtrain does not configure; "mamba" has no layer here.
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess", "full_iteration")


def graphed(cfg: LLMTrainConfig) -> bool:
    return cfg.backend.cuda_graphs != "none"


def graph_scope(cfg: LLMTrainConfig) -> tuple[str, ...]:
    """The graphed scopes; () is Megatron-Core's default, the whole transformer layer."""
    return tuple(cfg.backend.cuda_graph_scope) if graphed(cfg) else ()


def _is_moe(cfg: LLMTrainConfig) -> bool:
    return (cfg.model.num_experts or 0) > 1


def _scope_refusal(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """--cuda-graph-scope's own conditions (module docstring)."""
    scope = tuple(cfg.backend.cuda_graph_scope)
    bad = [s for s in scope if s not in CUDA_GRAPH_SCOPES]
    if bad:
        return Refusal(
            (SCOPE_KEY,),
            f"{SCOPE_KEY}: {', '.join(repr(b) for b in bad)} is not a scope llmtrain renders; "
            f"choose from {', '.join(CUDA_GRAPH_SCOPES)} ([] for the whole layer)",
        )
    if len(set(scope)) != len(scope):
        return Refusal((SCOPE_KEY,), f"{SCOPE_KEY}: a scope is listed twice ({', '.join(scope)})")
    if scope and not graphed(cfg):
        return Refusal(
            (SCOPE_KEY, GRAPHS_KEY),
            f"{SCOPE_KEY}={list(scope)} with {GRAPHS_KEY}=none: there is no graph to scope; "
            f"set {GRAPHS_KEY}=transformer_engine (or local for full_iteration), or {SCOPE_KEY}=[]",
        )
    full = "full_iteration" in scope
    impl = cfg.backend.cuda_graphs
    if full and (impl != "local" or len(scope) > 1):
        return Refusal(
            (SCOPE_KEY, GRAPHS_KEY),
            f"{SCOPE_KEY}=full_iteration is Megatron-Core's local graph of the whole iteration, "
            f"alone: use {GRAPHS_KEY}=local with {SCOPE_KEY}=[full_iteration]",
        )
    if scope and not full and impl != "transformer_engine":
        return Refusal(
            (SCOPE_KEY, GRAPHS_KEY),
            f"{SCOPE_KEY}={list(scope)}: partial scopes are Transformer Engine's graphs; use "
            f"{GRAPHS_KEY}=transformer_engine, or {SCOPE_KEY}=[] for local's whole layers",
        )
    moe_scopes = [s for s in scope if s in ("moe_router", "moe_preprocess")]
    if moe_scopes and not _is_moe(cfg):
        return Refusal(
            (SCOPE_KEY, "model.num_experts"),
            f"{SCOPE_KEY} has {', '.join(moe_scopes)} on a dense model: Megatron-Core graphs "
            "them only for MoE; drop them",
        )
    if "moe_preprocess" in scope and "moe_router" not in scope:
        return Refusal(
            (SCOPE_KEY,),
            f"{SCOPE_KEY} has moe_preprocess without moe_router: Megatron-Core captures it only "
            "together with the router; add moe_router",
        )
    if "mlp" in scope and _is_moe(cfg) and cfg.model.moe_dense_layers == 0:
        return Refusal(
            (SCOPE_KEY, "model.moe_dense_layers"),
            f"{SCOPE_KEY} has mlp, but every layer is MoE (model.moe_dense_layers=0): the mlp "
            "scope graphs dense MLPs only; drop mlp (moe_router graphs the router)",
        )
    return None


def _graph_refusal(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """CUDA graphs with the rest of the configuration (module docstring)."""
    if not graphed(cfg):
        return None
    scope = graph_scope(cfg)
    full = "full_iteration" in scope
    if cfg.train.recompute == "full" and not full:
        return Refusal(
            (GRAPHS_KEY, "train.recompute"),
            f"{GRAPHS_KEY}={cfg.backend.cuda_graphs} with train.recompute=full: Megatron-Core "
            "runs full recompute only inside a full-iteration graph; use train.recompute="
            f"selective, or {GRAPHS_KEY}=local with {SCOPE_KEY}=[full_iteration]",
        )
    if cfg.backend.cuda_graphs == "local" and layout.ep > 1:
        return Refusal(
            (GRAPHS_KEY, "parallel.ep"),
            f"{GRAPHS_KEY}=local with parallel.ep={layout.ep}: Megatron-LM asks for its "
            "inference-only expert padding there; use "
            f"{GRAPHS_KEY}=transformer_engine",
        )
    if cfg.backend.moe_comm_overlap and (
        cfg.backend.cuda_graphs != "transformer_engine" or not scope or "mlp" in scope
    ):
        return Refusal(
            (GRAPHS_KEY, "backend.moe_comm_overlap"),
            f"{GRAPHS_KEY} with backend.moe_comm_overlap: Megatron-Core graphs the combined 1F1B "
            f"schedule only with {GRAPHS_KEY}=transformer_engine and scopes without the MLP; use "
            f"{SCOPE_KEY}=[attn,moe_router,moe_preprocess]",
        )
    if cfg.train.recompute == "selective" and (not scope or full or "attn" in scope):
        from launcher.backends.activation_modules import recompute_modules

        if cfg.model.attention_dropout > 0 and "core_attn" in recompute_modules(cfg):
            return Refusal(
                (GRAPHS_KEY, "model.attention_dropout"),
                f"{GRAPHS_KEY} graphs the recomputed attention core with model.attention_dropout="
                f"{cfg.model.attention_dropout}: Megatron-Core refuses dropout inside a graphed "
                "recomputation; use model.attention_dropout=0, or drop core_attn from "
                "backend.recompute_modules",
            )
    return None


def _param_gather_refusal(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if not cfg.backend.overlap_param_gather_with_optimizer_step:
        return None
    if cfg.zero.stage != 1:
        return Refusal(
            (PARAM_GATHER_KEY, "zero.stage"),
            f"{PARAM_GATHER_KEY} with zero.stage={cfg.zero.stage}: it overlaps the distributed "
            "optimizer's parameter all-gather; use zero.stage=1",
        )
    if not cfg.backend.overlap_comm:
        return Refusal(
            (PARAM_GATHER_KEY, "backend.overlap_comm"),
            f"{PARAM_GATHER_KEY} needs --overlap-grad-reduce and --overlap-param-gather, which "
            "backend.overlap_comm=false turns off; use backend.overlap_comm=true",
        )
    if layout.vpp <= 1:
        return Refusal(
            (PARAM_GATHER_KEY, "parallel.vpp"),
            f"{PARAM_GATHER_KEY} with parallel.vpp=1: Megatron-LM supports it only with "
            "interleaved pipeline parallelism; use parallel.vpp>=2 with "
            "parallel.pp_schedule=interleaved",
        )
    return None


def _moe_fusion_refusal(cfg: LLMTrainConfig) -> Refusal | None:
    for key, on in ((PERMUTE_KEY, cfg.backend.moe_permute_fusion),
                    (ROUTER_KEY, cfg.backend.moe_router_fusion)):  # fmt: skip
        if on and not _is_moe(cfg):
            return Refusal(
                (key, "model.num_experts"),
                f"{key}=true on a dense model: there is no router or token permutation to fuse; "
                f"use {key}=false",
            )
    return None


def megatron_speed_features(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """Megatron-Core's own checks on the speed keys, as refusals naming the key."""
    if cfg.backend.tp_comm_overlap and not (layout.tp > 1 and cfg.parallel.sequence_parallel):
        return Refusal(
            (TP_OVERLAP_KEY, "parallel.sequence_parallel"),
            f"{TP_OVERLAP_KEY}=true needs tensor parallelism with sequence parallelism "
            f"(parallel.tp={layout.tp}, parallel.sequence_parallel="
            f"{str(cfg.parallel.sequence_parallel).lower()}): Megatron-LM overlaps only the "
            "sequence-parallel all-gather / reduce-scatter; use parallel.tp>=2 with "
            f"parallel.sequence_parallel=true, or {TP_OVERLAP_KEY}=false",
        )
    if cfg.backend.fp8_scaling is not None and not cfg.precision.fp8:
        return Refusal(
            (FP8_SCALING_KEY, "precision.name"),
            f"{FP8_SCALING_KEY}={cfg.backend.fp8_scaling} without fp8: it scales fp8 tensors; "
            f"use precision=fp8, or {FP8_SCALING_KEY}=null",
        )
    return (
        _scope_refusal(cfg, layout)
        or _graph_refusal(cfg, layout)
        or _param_gather_refusal(cfg, layout)
        or _moe_fusion_refusal(cfg)
    )


def speed_features_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """torch and DeepSpeed: CUDA graphs, the optimizer-step overlap, Transformer Engine's fp8
    recipes and the MoE kernel fusions are Megatron-Core's (backend.tp_comm_overlap keeps its
    meaning there: torchtitan's async TP)."""
    b = cfg.backend
    for key, on, works in (
        (GRAPHS_KEY, graphed(cfg) or bool(b.cuda_graph_scope), f"{GRAPHS_KEY}=none"),
        (PARAM_GATHER_KEY, b.overlap_param_gather_with_optimizer_step, f"{PARAM_GATHER_KEY}=false"),
        (FP8_SCALING_KEY, b.fp8_scaling is not None,
         f"{FP8_SCALING_KEY}=null (precision.fp8_recipe picks torchao's scaling)"),
        (PERMUTE_KEY, b.moe_permute_fusion, f"{PERMUTE_KEY}=false"),
        (ROUTER_KEY, b.moe_router_fusion, f"{ROUTER_KEY}=false"),
    ):  # fmt: skip
        if on:
            return Refusal(
                (key, "backend"),
                f"{key} is Megatron-Core's; backend={b.name} has no such switch; use {works}, "
                "or backend=megatron",
            )
    return None


__all__ = [
    "CUDA_GRAPH_SCOPES",
    "graph_scope",
    "graphed",
    "megatron_speed_features",
    "speed_features_not_run",
]
