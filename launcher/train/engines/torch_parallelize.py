"""Model parallelization for the torch engine: the tensor-parallel plan (dense, MLA and MoE
blocks) and the data-parallel wrapping (FSDP2 or DDP), each a function of the model and the
mesh, as torchtitan's ``parallelize`` (``launcher.train.engines.torch_engine``'s docstring says
what each step does and in which order the engine applies them).

The tensor-parallel plan (tp > 1), torchtitan's: Colwise wq/wk/wv/w1/w3, Rowwise wo/w2, the token
embedding Rowwise (vocab-sharded), the head Colwise with its output gathered; everything else
(norms, learned positions) replicated as DTensors so that clipping and checkpoints see one kind
of parameter. With parallel.sequence_parallel the norms run SequenceParallel on sequence shards
(the residual stream is sharded on the sequence between blocks) and wo/w2 reduce-scatter.
MoE layers (Megatron-LM's default expert tensor parallel = tp): the router replicated, each
routed and shared expert Colwise w1/w3, Rowwise w2 (output all-reduced); the tp ranks hold
identical tokens (all-gathered under sequence parallel), so their replicated routers pick the
same top-k and every expert runs the same tokens on all tp ranks. The planner counts expert
weights / (ep x tp), as this does. Replicating the experts instead would need no collective
per expert but tp times their memory.
Multi-head latent attention: the down-projections wq_a, wkv_a and their RMSNorms replicated
(their outputs, a low-rank latent and the rope key shared by all heads, are needed whole by
every head; replicas cost kv_lora_rank + r + q_lora_rank columns, small next to h), the
per-head up-projections wq or wq_b and wkv_b Colwise (whole heads per rank), wo Rowwise. The
latent's gradient is summed over tp by wkv_b's Colwise input; the rope key bypasses it, so its
gradient is summed by ``MLAttention.shared_key_grad`` (identity forward, Partial gradient).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.model_shape import ModelShape
from launcher.train import host_malloc
from launcher.train.finetune.lora import LoRALinear
from launcher.train.model.transformer import MLP, MLAttention, MoE, Transformer, TransformerBlock


class TorchEngineError(ValueError):
    """A configuration the torch engine cannot run (the reasons say what would work instead)."""


class Replicated(ParallelStyle):
    """Keep a module whole on every tensor-parallel rank, its parameters as Replicate DTensors.

    Inputs are taken as replicated; the output is a local tensor unless use_local_output=False
    (torchtitan's NoParallel). Makes every parameter a DTensor on the tp mesh, which the global
    gradient norm and FSDP2's 2-D sharding need."""

    def __init__(self, *, use_local_output: bool = True):
        super().__init__()
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def to_dtensor(mod: nn.Module, inputs: Any, mesh: DeviceMesh) -> Any:
            return tuple(
                DTensor.from_local(t, mesh, [Replicate()], run_check=False)
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor)
                else t
                for t in inputs
            )

        def to_local(mod: nn.Module, output: Any, mesh: DeviceMesh) -> Any:
            if self.use_local_output and isinstance(output, DTensor):
                return output.to_local()
            return output

        return distribute_module(module, device_mesh, None, to_dtensor, to_local)


class ReplicatedKVHeads(ParallelStyle):
    """wk/wv when there are fewer key/value heads than tp ranks (tp a multiple of kv_heads).

    The projection stays whole (a Replicate DTensor) and each rank keeps the output of the one kv
    head its query heads use: rank r of tp takes head r // (tp // kv_heads), so each kv head is
    replicated tp // kv_heads times (Megatron-LM's scheme). The local output's gradient is declared
    Partial, so the weight gradient sums the contributions of the ranks sharing a head."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()

        def to_dtensor(mod: nn.Module, inputs: Any, mesh: DeviceMesh) -> Any:
            x = inputs[0]
            if isinstance(x, DTensor):
                return (x.redistribute(placements=[Replicate()]),)
            return (DTensor.from_local(x, mesh, [Replicate()], run_check=False),)

        def own_head(mod: nn.Module, output: Any, mesh: DeviceMesh) -> Any:
            local = output.to_local(grad_placements=[Partial()])
            kv_heads = local.shape[-1] // self.head_dim
            head = rank // (tp // kv_heads)
            return local[..., head * self.head_dim : (head + 1) * self.head_dim]

        return distribute_module(module, device_mesh, None, to_dtensor, own_head)


def mlp_plan(
    prefix: str, mlp: MLP, output: Placement, styles: tuple[type[Any], type[Any]]
) -> dict[str, ParallelStyle]:
    """An MLP under tp: w1 (and w3) column-parallel, w2 row-parallel with output `output`
    (`styles`: the (colwise, rowwise) classes, torchao's float8 ones for fp8 layers)."""
    colwise, rowwise = styles
    plan: dict[str, ParallelStyle] = {
        f"{prefix}.w1": colwise(),
        f"{prefix}.w2": rowwise(output_layouts=output),
    }
    if mlp.w3 is not None:
        plan[f"{prefix}.w3"] = colwise()
    return plan


def apply_tp(
    model: Transformer,
    tp_mesh: DeviceMesh,
    cfg: LLMTrainConfig,
    tp_styles: tuple[type[Any], type[Any]],
    first_chunk: bool,
) -> None:
    """Tensor parallel over `tp_mesh`, the torchtitan plan (see torch_engine's docstring, step 2);
    `tp_styles`: the (colwise, rowwise) classes of the block projections."""
    sp = cfg.parallel.sequence_parallel
    tied = cfg.model.tie_embeddings
    tp = tp_mesh.size()
    shape = ModelShape(cfg.model)
    kv_heads, head_dim = shape.kv_heads, shape.head_dim
    residual = Shard(1) if sp else Replicate()
    colwise, rowwise = tp_styles
    plan: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        )
    if model.pos_embeddings is not None:
        plan["pos_embeddings"] = Replicated()
    if model.norm is not None:
        # A tied head multiplies by the (vocab-sharded) embedding inside the root forward, so
        # the final norm hands it a DTensor; the engine gathers the logits for the loss.
        plan["norm"] = SequenceParallel() if sp else Replicated(use_local_output=not tied)
    if model.output is not None:
        # Logits stay split over the vocabulary: the loss is vocabulary-parallel.
        plan["output"] = ColwiseParallel(
            input_layouts=residual, output_layouts=Shard(-1), use_local_output=False
        )
    parallelize_module(model, tp_mesh, plan)
    layer_names = list(model.layers.keys())
    for name in layer_names:
        block = cast(TransformerBlock, model.layers[name])
        block_plan: dict[str, ParallelStyle] = {
            "attention_norm": SequenceParallel() if sp else Replicated(),
            "ffn_norm": SequenceParallel() if sp else Replicated(),
            "attention.wo": rowwise(output_layouts=residual),
        }
        if sp:
            block_plan["attention"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
        if isinstance(block.attention, MLAttention):
            block_plan.update(mla_plan(block.attention, tp_mesh, colwise))
        else:
            block_plan.update({f"attention.{w}": colwise() for w in ("wq", "wk", "wv")})
            if kv_heads < tp:
                kv_style = ReplicatedKVHeads(head_dim)
                block_plan["attention.wk"] = kv_style
                block_plan["attention.wv"] = kv_style
        if block.moe is not None:
            block_plan.update(moe_plan(block.moe, sp))
        else:
            assert block.feed_forward is not None
            block_plan.update(mlp_plan("feed_forward", block.feed_forward, residual, tp_styles))
            if sp:
                block_plan["feed_forward"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
        if first_chunk and sp and name == layer_names[0]:
            # The embeddings produce the whole sequence; the residual stream is sharded on it.
            parallelize_module(
                block,
                tp_mesh,
                PrepareModuleInput(
                    input_layouts=(Replicate(),),
                    desired_input_layouts=(Shard(1),),
                    use_local_output=True,
                ),
            )
        parallelize_module(block, tp_mesh, adapter_plan(block, block_plan))


def mla_plan(
    attention: MLAttention, tp_mesh: DeviceMesh, colwise: type[Any]
) -> dict[str, ParallelStyle]:
    """Multi-head latent attention under tp: the down-projections (wq_a, wkv_a) and their
    norms replicated, the per-head up-projections (wq or wq_b, wkv_b) column-parallel, so
    each rank computes its heads, and wo row-parallel (see the module docstring)."""
    plan: dict[str, ParallelStyle] = {
        "attention.wkv_a": Replicated(),
        "attention.kv_norm": Replicated(),
        "attention.wkv_b": colwise(),
    }
    if attention.wq is not None:
        plan["attention.wq"] = colwise()
    else:
        plan["attention.wq_a"] = Replicated()
        plan["attention.q_norm"] = Replicated()
        plan["attention.wq_b"] = colwise()

    def sum_grad_over_tp(t: torch.Tensor) -> torch.Tensor:
        # Identity forward; the gradient, marked Partial, is all-reduced over tp backward.
        replica = DTensor.from_local(t, tp_mesh, [Replicate()], run_check=False)
        return replica.to_local(grad_placements=[Partial()])

    attention.shared_key_grad = sum_grad_over_tp
    return plan


def moe_plan(moe: MoE, sp: bool) -> dict[str, ParallelStyle]:
    """MoE under tp (Megatron-LM's default expert tensor parallel = tp): the router
    replicated, so every tp rank picks the same top-k for the same (replicated) tokens;
    each routed and shared expert column-parallel w1/w3, row-parallel w2 with its output
    all-reduced. Under sequence parallel the layer gathers the sequence on entry and keeps
    this rank's shard of its output."""
    plan: dict[str, ParallelStyle] = {"moe.router": Replicated()}
    # torch's styles: fp8 is refused with MoE (launcher/backends/torch.py).
    styles = (ColwiseParallel, RowwiseParallel)
    for key, expert in moe.experts.items():
        plan.update(mlp_plan(f"moe.experts.{key}", cast(MLP, expert), Replicate(), styles))
    for i, shared in enumerate(moe.shared_experts):
        plan.update(mlp_plan(f"moe.shared_experts.{i}", cast(MLP, shared), Replicate(), styles))
    if sp:
        plan["moe"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_output=True,
        )
    return plan


def adapter_plan(block: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """`plan` with each LoRA-adapted projection's style moved to its frozen `base`, and its
    adapters sharded like the weight they adapt: a column-parallel W [out, in] (sharded on out)
    gets B [out, r] column-parallel and A [r, in] replicated (the rank-r intermediate whole on
    every rank, its gradient summed over tp by B's input); a row-parallel W (sharded on in) gets
    A row-parallel (its [.., r] output all-reduced: r values a token, not h) and B replicated.
    Sequence parallel and replicated kv heads are refused with LoRA (finetune_rules)."""
    out: dict[str, ParallelStyle] = {}
    for key, style in plan.items():
        module = block.get_submodule(key)
        if not isinstance(module, LoRALinear):
            out[key] = style
            continue
        out[f"{key}.base"] = style
        if isinstance(style, RowwiseParallel):
            out[f"{key}.lora_a"] = RowwiseParallel(output_layouts=Replicate())
            out[f"{key}.lora_b"] = Replicated()
        else:
            out[f"{key}.lora_a"] = Replicated()
            out[f"{key}.lora_b"] = ColwiseParallel()
    return out


def apply_dp(
    model: nn.Module,
    cfg: LLMTrainConfig,
    dp_mesh: DeviceMesh,
    device: torch.device,
    dtypes: tuple[torch.dtype, torch.dtype],
    manual_dp_sync: bool,
    frozen: bool = False,
) -> nn.Module:
    """Data parallel over `dp_mesh` (see torch_engine's docstring, step 5): FSDP2 for zero.stage
    2/3 (`dtypes`: the compute and gradient-reduction dtypes of its mixed precision), DDP for
    0/1 where dp x cp > 1, nothing where the engine all-reduces the gradients itself
    (`manual_dp_sync`) or there is one replica. `frozen` (dpo's reference copy, no gradients):
    FSDP2 reshards after every forward (no backward comes to reuse the gathered weights), no
    DDP (nothing to reduce)."""
    lay, z = derive_layout(cfg), cfg.zero
    compute_dtype, grad_dtype = dtypes
    if z.stage in (2, 3):
        mixed = compute_dtype != torch.float32
        mp = MixedPrecisionPolicy(
            param_dtype=compute_dtype if mixed else None,
            reduce_dtype=grad_dtype if mixed else None,
        )
        offload = CPUOffloadPolicy(pin_memory=False) if z.offload_params == "cpu" else None
        kwargs: dict[str, Any] = {"mesh": dp_mesh, "mp_policy": mp}
        if offload is not None:
            kwargs["offload_policy"] = offload
        reshard = z.stage == 3 or frozen
        for block in cast(Transformer, model).layers.values():
            fully_shard(block, reshard_after_forward=reshard, **kwargs)
        fully_shard(model, reshard_after_forward=reshard, **kwargs)
        return model
    if lay.dp * lay.cp > 1 and not manual_dp_sync and not frozen:
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=device_ids, process_group=dp_mesh.get_group()
        )
    return model


def map_gathered_weights(model: nn.Module, compute_dtype: torch.dtype) -> int | None:
    """FSDP2 on the CPU: glibc's mmap threshold pinned so that each weight FSDP2 gathers (in
    `compute_dtype` under mixed precision) is mapped and given back when it is freed
    (launcher.train.host_malloc); returns the threshold, None where none was pinned."""
    mixed = compute_dtype != torch.float32
    gathered = (
        p.numel()
        * (compute_dtype.itemsize if mixed and p.is_floating_point() else p.element_size())
        for p in model.parameters()
        if p.dim() >= 2
    )
    threshold = host_malloc.gathered_threshold(gathered)
    if threshold is None or not host_malloc.pin_mmap_threshold(threshold):
        return None
    return threshold
