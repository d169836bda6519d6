"""Communication and gathering buffers of one GPU, the same on every stage: the gradient reduce
and parameter all-gather buckets, ZeRO-3 / FSDP's gathered layers (and gloo's staging copy of
the layer being gathered on the CPU), pipeline p2p."""

from __future__ import annotations

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.memory.megatron_fsdp import megatron_fsdp_buffers
from launcher.plan.memory.model_states import bytes_per_param, zero_shard
from launcher.plan.model_shape import ModelShape


def gloo_staging_layers(cfg: LLMTrainConfig, layout: Layout) -> int:
    """Extra copies of one gathered layer a ZeRO-3 / FSDP all-gather holds while it runs: 1 over
    gloo (cluster.gpu=cpu, the process group engines.dist starts there) when the layer is sharded
    over more than one rank, else 0.

    gloo does not write into the output it is given: ProcessGroupGloo's all-gather
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, AsyncAllgatherWork, v2.13.0; the flat
    all_gather_into_tensor that FSDP2 calls chunks its output and goes through it) gathers into
    a flat tensor of its own (``newLikeFlat``), then copies each rank's part into the output, so
    the gathered layer exists twice until the collective ends. Measured with torch.profiler
    (torch 2.13.0, CPU): an all-gather into a 4 MiB output allocates a 4 MiB tensor of its own;
    bench/build_peak.py's model cut to 4 layers (4 ranks, lora, ZeRO-3): the step's allocated
    peak is the layer being computed, the next one's all-gather output and this copy, at FSDP2's
    backward prefetch (3 gathered layers where 2 were priced). NCCL writes into the output (no
    copy on a GPU); with one shard FSDP2 copies the local shard without a collective."""
    return 1 if cfg.cluster.gpu == "cpu" and zero_shard(layout) > 1 else 0


def stage_buffers(cfg: LLMTrainConfig, layout: Layout) -> float:
    """Communication and gathering buffers, the same on every stage.

    Reads the model, precision and backend sections, zero.stage, parallel.sequence_parallel, and
    the layout's micro-batch size, tp, cp and pp.
    """
    shape = ModelShape(cfg.model)
    m = cfg.model
    z = cfg.zero
    bpp = bytes_per_param(cfg)
    tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
    act_dtype = DTYPE_BYTES[cfg.precision.compute_dtype]
    # A bucket never holds more than the parameters of one model-parallel rank (a small model's
    # gradients fill less than one 500M-element DeepSpeed bucket).
    rank_params = shape.total_params() / max(1, layout.tp * layout.pp)
    if finetune.is_finetune(cfg):
        # Only the adapters' gradients are reduced; ZeRO-3 gathers the frozen layer and the
        # layer's adapters (the two layers in flight, plus gloo's staging copy on the CPU) and
        # holds one layer's adapter gradients.
        adapters = finetune.adapter_params_per_layer(cfg, max(1, layout.tp))
        rank_adapters = adapters * m.num_layers / max(1, layout.pp)
        buffers = min(cfg.backend.reduce_bucket_size, rank_adapters) * finetune.ADAPTER_GRAD_BYTES
        if z.stage >= 3:
            layer = shape.dense_layer_params() / max(1, layout.tp)
            frozen = finetune.frozen_weight_bytes(cfg, layer, 1, max(1, layout.tp))
            copies = 2 + gloo_staging_layers(cfg, layout)
            buffers += copies * (frozen + adapters * finetune.ADAPTER_WEIGHT_BYTES) + adapters * 4.0
        if layout.pp > 1:
            sp = layout.tp if cfg.parallel.sequence_parallel else 1
            buffers += 4.0 * tokens * m.hidden_size * act_dtype / sp
        return buffers
    buffers = min(cfg.backend.reduce_bucket_size, rank_params) * bpp.gradients
    if backend_of(cfg).bucket_needs_replicas and layout.dp * layout.cp == 1:
        # One replica: the torch engine wraps nothing in DDP, so no gradient bucket exists
        # (torch_parallelize.apply_dp; measured by bench/lora_memory.py on the CPU).
        buffers = 0.0
    if z.stage in (1, 2):
        allgather = min(cfg.backend.allgather_bucket_size, rank_params)
        gathered = 1 if cfg.precision.fp8 and cfg.precision.fp8_param_gather else None
        buffers += allgather * (gathered or DTYPE_BYTES[cfg.precision.compute_dtype])
    if z.stage >= 3:
        # ZeRO-3 / FSDP: the layer being computed and the prefetched next one, unsharded (plus
        # gloo's staging copy of the one being gathered on the CPU), plus one layer's unsharded
        # gradients before its reduce-scatter.
        # Expert weights are gathered only within their expert-parallel shard (1/ep of them).
        # A layer's count depends on its index only through i >= moe_dense_layers, which is
        # monotone in i: the first and the last layer take every value the layers take.
        routed = shape.expert_params() * (m.num_experts or 0) if shape.is_moe else 0
        ends = (0, m.num_layers - 1) if m.num_layers > 0 else ()
        layer = max(
            shape.layer_params(i)
            - (
                routed * (1.0 - 1.0 / max(1, layout.ep))
                if shape.is_moe and i >= m.moe_dense_layers
                else 0.0
            )
            for i in ends
        ) / max(1, layout.tp)
        if backend_of(cfg).megatron_fsdp:
            # Megatron-FSDP: its own unsharded weight and gradient buckets, gathered further
            # ahead and freed later (plan/memory/megatron_fsdp.py), and no separate DDP bucket.
            buffers = megatron_fsdp_buffers(
                layer,
                max(layout.stage_layers),
                weight_bytes=bpp.weights,
                grad_bytes=bpp.gradients,
            )
        else:
            copies = 2 + gloo_staging_layers(cfg, layout)
            buffers += layer * (copies * bpp.weights + bpp.gradients)
    if layout.pp > 1:
        # Send and receive buffers for activations (forward) and their gradients (backward).
        sp = layout.tp if cfg.parallel.sequence_parallel else 1
        buffers += 4.0 * tokens * m.hidden_size * act_dtype / sp
    return buffers
