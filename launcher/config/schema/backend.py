"""The backend group (`backend.*`): the engine and its speed features."""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from launcher.config.schema.allowed import one_of
from launcher.config.schema.common import AT_LEAST_1

# How a module of launcher/backends/ declares its backend (its other modules are helpers).
_DECLARATION = "\nBACKEND = Backend("


@cache
def backend_names() -> tuple[str, ...]:
    """The choices of ``backend.name``: the modules of launcher/backends/ that declare a
    ``BACKEND = Backend(...)``, found by reading them, not importing them
    (launcher.backends.all_backends imports them and checks each BACKEND's name is its module's)."""
    folder = Path(__file__).resolve().parents[2] / "backends"
    found = [i.name for i in pkgutil.iter_modules([str(folder)])]
    return tuple(
        sorted(n for n in found if _DECLARATION in (folder / f"{n}.py").read_text("utf-8"))
    )


@dataclass
class BackendConfig:
    """The engine that runs the training and its settings."""

    name: str = field(default="torch", metadata=one_of(*backend_names()))
    """The training engine (the modules of launcher/backends/)."""
    reduce_bucket_size: int = field(default=25_000_000, metadata=AT_LEAST_1)
    """Gradient reduce bucket size, in elements (DeepSpeed naming)."""
    allgather_bucket_size: int = field(default=25_000_000, metadata=AT_LEAST_1)
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
    # launcher/plan/memory/mcore_activations.py). backend=megatron only.
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
    product keep their own outputs too (launcher/plan/memory/mcore_activations.py)."""
    cross_entropy_fusion: bool = False
    """Megatron-Core's fused cross-entropy, Transformer Engine's kernel
    (--cross-entropy-loss-fusion --cross-entropy-fusion-impl te): the fp32 gradient computed in
    the forward, no fp32 copies of the logits (launcher/plan/memory/estimate.py logits_bytes)."""
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
