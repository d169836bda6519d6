"""A stage's activations at its peak: one layer's bytes (plan/memory/layer_activations.py, or
Megatron-Core's tensor by tensor: plan/memory/mcore_activations.py) times the layer-forwards in
flight for the pipeline schedule (``schedule.chunk_microbatches_in_flight``,
``pipeline_split.layers_in_flight``), what recompute rebuilds for the layer in its backward, the
transient buffers (plan/memory/transient_buffers.py) and the head: logits, loss and the
multi-token-prediction modules on their stages."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.common import recompute_mode
from launcher.backends.engine_choices import compiled_blocks
from launcher.backends.moe_overlap import extra_warmup_microbatches
from launcher.backends.speed_features import graphed
from launcher.config.layout import Layout
from launcher.config.pipeline_split import layers_in_flight, mtp_stage
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.memory import memory_savers
from launcher.plan.memory.layer_activations import (
    layer_activation_bytes,
    residual_stream,
    uses_dropout,
)
from launcher.plan.memory.mcore_activations import applies as mcore_applies
from launcher.plan.memory.mcore_activations import layer_activations as mcore_layer_activations
from launcher.plan.memory.transient_buffers import cp_ring_bytes, dispatcher_bytes, logits_bytes
from launcher.plan.model_shape import ModelShape
from launcher.plan.schedule import chunk_microbatches_in_flight
from launcher.plan.speed_features import cuda_graph_static_bytes


def stage_activations(cfg: LLMTrainConfig, layout: Layout, stage: int) -> tuple[float, int]:
    """(activation bytes, chunk-micro-batches in flight) of one GPU of `stage` at its peak."""
    parts = activation_parts(cfg, layout, stage)
    return parts.total, parts.in_flight


@dataclass(frozen=True)
class ActivationParts:
    """A stage's activations by how long they live: `kept` are stored by the layers until each
    one's backward; `transient` exists once, for the layer being computed (recompute, the cp ring,
    the MoE dispatcher); `head` is the logits and loss (and MTP modules') peak on the last stage."""

    kept: float
    transient: float
    head: float
    in_flight: int

    @property
    def total(self) -> float:
        return self.kept + self.transient + self.head


@dataclass(frozen=True)
class _StageLayers:
    """What the stage's activations depend on, read once: its layers and their kind, the layer
    forwards alive at the peak, and the per-layer pricing inputs."""

    shape: ModelShape
    moe: bool  # the stage holds MoE layers
    held: float  # layer-forwards alive at the peak (layers x micro-batches, chunk by chunk)
    in_flight: int  # chunk-micro-batches in flight
    attention: str
    dropout: bool
    compiled: bool


def _stage_layers(cfg: LLMTrainConfig, layout: Layout, stage: int) -> _StageLayers:
    """Activations: per chunk-micro-batch bytes x chunk-micro-batches in flight (schedule.py)."""
    shape = ModelShape(cfg.model)
    m = cfg.model
    chunk_layer_count = layout.chunk_layers[stage :: max(1, layout.pp)]  # chunks c % pp == stage
    layers_here = layout.stage_layers[stage]
    # Layers per chunk (an explicit pp_layers split gives per-stage counts; chunks split it evenly).
    if len(layout.chunk_layers) == layout.pp * layout.vpp:
        per_chunk = float(max(chunk_layer_count))
    else:
        per_chunk = layers_here / max(1, layout.vpp)
    first_index = sum(layout.stage_layers[:stage]) if layout.vpp == 1 else 0
    moe_here = shape.is_moe and first_index + layers_here > m.moe_dense_layers
    extra = extra_warmup_microbatches(cfg)
    in_flight = chunk_microbatches_in_flight(
        cfg.parallel.pp_schedule,
        layout.pp,
        layout.num_microbatches,
        layout.vpp,
        stage,
        extra,
    )
    held = per_chunk * in_flight
    if len(chunk_layer_count) == max(1, layout.vpp) and layout.pp > 1:
        # The layer-forwards really alive at the peak, chunk by chunk (an uneven split's chunks
        # differ: config/pipeline_split.py layers_in_flight; the same as above when equal).
        held = layers_in_flight(
            cfg.parallel.pp_schedule,
            layout.pp,
            layout.num_microbatches,
            layout.vpp,
            stage,
            tuple(chunk_layer_count),
            extra,
        )
    return _StageLayers(
        shape=shape,
        moe=moe_here,
        held=held,
        in_flight=in_flight,
        # With cp > 1 attention is ring attention whatever model.attention says: it saves q, k,
        # v, the output and the fp32 log-sum-exp, never a score matrix (Transformer Engine's CP
        # attention; launcher/train/parallel/ring_attention.py save_for_backward(q, k, v, out,
        # lse)).
        attention="flash" if layout.cp > 1 else m.attention,
        dropout=uses_dropout(cfg),
        compiled=compiled_blocks(cfg),
    )


def _per_layer(
    cfg: LLMTrainConfig, layout: Layout, here: _StageLayers, recompute: str, *, moe: bool
) -> float:
    """One layer's stored bytes for one micro-batch (layer_activation_bytes) in `recompute` mode."""
    return layer_activation_bytes(
        here.shape,
        micro_batch=layout.micro_batch_size,
        seq=cfg.model.seq_length,
        tp=layout.tp,
        cp=layout.cp,
        recompute=recompute,
        attention=here.attention,
        moe=moe,
        sequence_parallel=cfg.parallel.sequence_parallel,
        dropout=here.dropout,
        fp8=cfg.precision.fp8,
        compiled=here.compiled,
        stream=residual_stream(cfg, here.compiled),
    )


def _layers_kept_and_rebuilt(
    cfg: LLMTrainConfig, layout: Layout, here: _StageLayers
) -> tuple[float, float]:
    """(kept until each layer's backward, rebuilt once for the layer in its backward)."""
    m = cfg.model
    mode = recompute_mode(cfg, here.moe)
    if mcore_applies(cfg):
        # Megatron-Core's layer tensor by tensor, with backend.recompute_modules and
        # backend.offload_modules (plan/memory/mcore_activations.py): what is kept until the
        # backward, plus what recompute and offload bring back for the layer in its backward.
        layer = mcore_layer_activations(cfg, layout, here.moe)
        return layer.kept * here.held, layer.transient
    kept = _per_layer(cfg, layout, here, mode, moe=here.moe) * here.held
    transient = 0.0
    if finetune.is_finetune(cfg) and mode != "full":
        # The adapters' rank-r intermediates (and dropout copies), kept like the layer's own.
        tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
        act = DTYPE_BYTES[cfg.precision.compute_dtype]
        kept += here.held * finetune.adapter_activation_bytes(cfg, tokens, act)
    if mode in ("full", "op"):
        # While a layer is recomputed for its backward its full activations exist once.
        transient += _per_layer(cfg, layout, here, "none", moe=here.moe)
    elif mode == "core":
        # Only the attention core is rebuilt: what it does not keep (the log-sum-exp, or
        # eager attention's scores) exists once.
        transient += _per_layer(cfg, layout, here, "none", moe=here.moe) - _per_layer(
            cfg, layout, here, "core", moe=here.moe
        )
    return kept, transient


def _head(cfg: LLMTrainConfig, layout: Layout, here: _StageLayers, stage: int) -> float:
    """The logits and loss on the last stage, and the multi-token-prediction modules on theirs."""
    m = cfg.model
    head = 0.0
    if stage == layout.pp - 1:
        head += logits_bytes(cfg, layout)
    if stage == mtp_stage(cfg.parallel.pipeline_layout, layout.pp, m.mtp_layers):
        # Each multi-token-prediction module: one more layer's activations for every micro-batch
        # in flight in its virtual stage (the stage's chunks in flight / vpp), and its own logits
        # and loss, kept until its backward as the main head's are (Megatron's vocab-parallel
        # cross-entropy keeps its softmax).
        mtp_moe = here.shape.mtp_is_moe
        mtp_held = max(1, round(here.in_flight / max(1, layout.vpp)))
        mtp_layer = (
            mcore_layer_activations(cfg, layout, mtp_moe).kept
            if mcore_applies(cfg)
            else _per_layer(cfg, layout, here, recompute_mode(cfg, mtp_moe), moe=mtp_moe)
        )
        head += m.mtp_layers * mtp_held * mtp_layer
        head += m.mtp_layers * logits_bytes(cfg, layout)
    return head


def offloaded_bytes(cfg: LLMTrainConfig, layout: Layout, stage: int) -> float:
    """Activation bytes one micro-batch sends to host memory under train.activation_offload
    (and brings back): every layer's kept activations, those of the layers the device holds at
    a time included (they are the copies in flight; memory_savers.py), 0 without offload."""
    if not memory_savers.offloads(cfg):
        return 0.0
    here = _stage_layers(cfg, layout, stage)
    kept, _ = _layers_kept_and_rebuilt(cfg, layout, here)
    return kept / max(1, here.in_flight)


def activation_parts(cfg: LLMTrainConfig, layout: Layout, stage: int) -> ActivationParts:
    """The parts of ``stage_activations``.

    Reads the model and precision sections, the backend, parallel.sequence_parallel and
    pp_schedule, train.recompute, and the layout's micro-batch size, micro-batches, tp, cp, pp,
    vpp, ep and chunk split.
    """
    here = _stage_layers(cfg, layout, stage)
    kept, transient = _layers_kept_and_rebuilt(cfg, layout, here)
    # train.activation_offload: the layers' saved tensors to host memory (memory_savers.py).
    kept = memory_savers.device_kept(cfg, kept, here.held)
    if graphed(cfg):
        # CUDA graphs' static inputs, one per graphed layer-forward in flight (speed_features.py).
        kept += cuda_graph_static_bytes(cfg, layout, here.held)
    # One layer's transient buffers: cp's K/V ring, the MoE dispatcher's.
    transient += cp_ring_bytes(cfg, layout)
    if here.moe:
        transient += dispatcher_bytes(cfg, layout)
    return ActivationParts(kept, transient, _head(cfg, layout, here, stage), here.in_flight)
