"""Per-GPU memory of a training configuration, stage by stage; the heaviest rank decides.

Everything is in bytes. The buckets:
- weights, gradients, optimizer: bytes per parameter by precision and optimizer (ZeRO paper,
  Rajbhandari et al. 2020: mixed-precision Adam = 2 weight + 2 gradient + 12 optimizer bytes, the 12
  being the fp32 master copy and Adam's m and v), sharded by ZeRO stage over the data-parallel
  ranks;
- activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models"), generalised term by term to GQA, SwiGLU and MoE (plan/memory/layer_activations.py),
  times the micro-batches in flight for the pipeline schedule
  (``schedule.chunk_microbatches_in_flight``), plus
  the fp32 logits and loss on the last stage;
- buffers: gradient reduce / parameter all-gather buckets, ZeRO-3 gathered layers, pipeline p2p;
- liveness: the buckets are summed, except where the engine makes gradients during the backward
  as it frees the activations (plan/memory/grad_liveness.py; ``stage_not_coexisting``);
- overhead: CUDA context and NCCL, from the hardware catalog. torch does not count it: `allocated`
  and `reserved` below are what torch.cuda.max_memory_allocated / max_memory_reserved report, and
  the  GPU must hold reserved + overhead.

Conventions stated once here (and in the plan's assumptions):
- ZeRO / FSDP shards over dp * cp (Megatron's distributed optimizer and torchtitan's FSDP both shard
  over the data and context parallel ranks together); expert parameters over dp * cp / ep.
- Expert weights are split over ep and, like the dense weights, over tp (Megatron-core's expert
  tensor parallel size defaults to tp), except where llmtrain renders
  --expert-tensor-parallel-size 1 (MoE parallel folding, backends.common.expert_tensor_parallel):
  then each expert is whole on its rank and its states shard over tp x cp x dp / ep.
- Transient working sets that exist once, for the layer being computed, not per layer: context
  parallel's key/value ring buffers (``cp_ring_bytes``) and the MoE token dispatcher's buffers
  (``dispatcher_bytes``).
- Dropout is on for GPT-style models (LayerNorm; Megatron's default 0.1) and off for Llama-style
  (RMSNorm) ones; it adds 1-byte masks (Korthikanti's 34 sbh + 5 as^2 b counts them).
- CPU offload moves the optimizer states (offload_optimizer) and the sharded weights
  (offload_params) to host memory, and the gradients as each engine does (plan/memory/offload.py),
  reported per GPU and per node.

The parts live beside this module, one concern each: plan/memory/model_states.py (weights,
gradients, optimizer states), plan/memory/layer_activations.py and plan/memory/stage_activations.py
(activations), plan/memory/transient_buffers.py (cp ring, MoE dispatcher, logits),
plan/memory/comm_buffers.py (buckets, gathered layers, p2p), plan/memory/stage_liveness.py (what
never coexists). This module assembles them.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.calibration.fitted import constants
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.hardware.profile import Rates
from launcher.plan.memory.comm_buffers import stage_buffers
from launcher.plan.memory.grad_liveness import reserved_reuses_activations
from launcher.plan.memory.layer_activations import (
    ActivationTerms,
    layer_activation_bytes,
    layer_activation_terms,
    uses_dropout,
)
from launcher.plan.memory.model_states import (
    BytesPerParam,
    StageParams,
    StageStates,
    bytes_per_param,
    fp8_weight_copy_bytes,
    pipelined_fsdp_accumulates,
    stage_params,
    stage_states,
    vocab_params,
    zero_shard,
)
from launcher.plan.memory.stage_activations import (
    ActivationParts,
    activation_parts,
    stage_activations,
)
from launcher.plan.memory.stage_liveness import stage_not_coexisting
from launcher.plan.memory.transient_buffers import (
    EAGER_LOSS_BACKWARD_BYTES,
    LOSS_PARALLEL_BACKWARD_BYTES,
    cp_ring_bytes,
    dispatcher_bytes,
    logits_bytes,
)

GIB = 1024**3


# torch's caching allocator reserves more than it allocates (block rounding, fragmentation across
# differently sized tensors): reserved = allocated x fragmentation, one fitted constant per GPU
# family (plan/calibration/fitted.py, fitted on the reserved-memory rows of
# bench/data/calibration.csv). When the allocator reaches the device's capacity it frees its cache
# and retries, so what torch reports as reserved never exceeds the capacity left after the CUDA
# context (`reserved_observed`).
FRAGMENTATION = constants("hopper").fragmentation


@dataclass(frozen=True)
class HardwareView:
    """The figures of one GPU the planner uses, catalog values with cluster overrides applied."""

    key: str
    name: str
    memory_bytes: int
    overhead_bytes: int
    peak_flops: float  # dense FLOP/s of the compute dtype (tf32 for fp32): the MFU denominator
    matmul_peak_flops: float  # dense FLOP/s the linear layers run at (fp8 with precision.fp8)
    matmul_efficiency: float
    hbm_gbps: float
    intra_gbps: float
    inter_gbps: float
    gpus_per_node: int
    price_per_gpu_hour: float
    # GPU family (hardware.Arch), TDP and NVLink domain size; defaults keep old callers working.
    arch: str = "hopper"
    tdp_watts: float | None = None
    scale_up_domain: int = 0  # 0: the node (gpus_per_node)
    # Figures measured on this machine (llmtrain calibrate; launcher.plan.hardware.profile.Rates),
    # or None: every part priced from the catalog.
    profile: Rates | None = None


@dataclass(frozen=True)
class StageMemory:
    stage: int
    layers: int
    params: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    overhead: float
    in_flight: int
    host_bytes: float
    fragmentation: float = FRAGMENTATION
    capacity: float = 0.0  # device memory (0: unknown, no cap on reserved_observed)
    # What the buckets' sum counts twice because they are never live together: gradients created
    # during the backward as the activations are freed (plan/memory/grad_liveness.py; 0 elsewhere).
    not_coexisting: float = 0.0
    # The share of it the caching allocator can serve from the same cached blocks: all of it when
    # the gradients are allocated on the stream that freed the activations, none when they come
    # from another stream's pool (grad_liveness.reserved_reuses_activations).
    reused: float = 0.0

    @property
    def allocated(self) -> float:
        total = self.weights + self.gradients + self.optimizer + self.activations + self.buffers
        return total - self.not_coexisting

    @property
    def reserved(self) -> float:
        """What the caching allocator would reserve with no capacity limit (the fit verdict)."""
        return (self.allocated + self.not_coexisting - self.reused) * self.fragmentation

    @property
    def reserved_observed(self) -> float:
        """What torch.cuda.max_memory_reserved reports: reserved, capped at the capacity left
        after the CUDA context (the allocator frees its cache and retries before failing)."""
        if self.capacity <= 0:
            return self.reserved
        return min(self.reserved, max(self.allocated, self.capacity - self.overhead))

    @property
    def device_total(self) -> float:
        return self.reserved + self.overhead


@dataclass(frozen=True)
class MemoryPlan:
    stages: tuple[StageMemory, ...]
    capacity: float
    headroom: float
    # Typical |error| of the memory prediction in this regime (bands.py); 0: no band.
    band: float = 0.0

    @property
    def heaviest(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.device_total)

    @property
    def usable(self) -> float:
        return self.capacity * (1.0 - self.headroom)

    @property
    def fits(self) -> bool:
        """reserved + overhead of the heaviest GPU within capacity x (1 - headroom).

        The layout fits with the headroom to spare. `verdict` refines the other case into
        "tight" (within the physical memory) and "does_not_fit".
        """
        return self.heaviest.device_total <= self.usable

    @property
    def verdict(self) -> str:
        """fits | tight | does_not_fit: the one verdict `plan`, `plan --search` (the
        configuration as given) and the dry runs print.

        fits: as `fits`. tight: it does not fit with the headroom, but what must be resident,
        allocated + overhead on every GPU, is within the GPU's physical memory: the
        caching allocator's reserve above allocated is cache it gives back before failing
        (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, the header comment: when cudaMalloc
        fails it frees a cached block of sufficient size, then every cached block not split,
        and retries before raising out-of-memory). Split blocks it cannot free, which is why
        this is "tight", not "fits".
        does_not_fit: allocated + overhead exceeds the physical memory. The prediction's error
        band (`band`) is printed beside the figure; it never widens the verdict, so nothing
        planned above the GPU's memory is called "tight".
        """
        if self.fits:
            return "fits"
        if max(s.allocated + s.overhead for s in self.stages) <= self.capacity:
            return "tight"
        return "does_not_fit"


VERDICT_WORDS = {"fits": "fits", "tight": "tight", "does_not_fit": "does not fit"}


# stage_memory is split in three parts so that the layout search (search.py) can reuse each part
# across the layouts that share its inputs. Each part reads only what its docstring lists.


def assemble_stage(
    stage: int,
    layers: int,
    hw: HardwareView,
    states: StageStates,
    activations: tuple[float, int],
    buffers: float,
    not_coexisting: float = 0.0,
    reused: bool = True,
) -> StageMemory:
    """The StageMemory of `stage` (holding `layers` layers) from its three parts (and
    ``stage_not_coexisting``'s correction of their sum)."""
    return StageMemory(
        stage=stage,
        layers=layers,
        params=states.params,
        weights=states.weights,
        gradients=states.gradients,
        optimizer=states.optimizer,
        activations=activations[0],
        buffers=buffers,
        overhead=float(hw.overhead_bytes),
        in_flight=activations[1],
        host_bytes=states.host_bytes,
        fragmentation=constants(hw.arch).fragmentation,
        capacity=float(hw.memory_bytes),
        not_coexisting=not_coexisting,
        reused=not_coexisting if reused else 0.0,
    )


def stage_memory(
    cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, stage: int, buffers: float | None = None
) -> StageMemory:
    """One GPU of `stage`. `buffers`: ``stage_buffers``, the same on every stage, when the caller
    has them."""
    states = stage_states(cfg, layout, stage)
    if buffers is None:
        buffers = stage_buffers(cfg, layout)
    parts = activation_parts(cfg, layout, stage)
    return assemble_stage(
        stage,
        layout.stage_layers[stage],
        hw,
        states,
        (parts.total, parts.in_flight),
        buffers,
        stage_not_coexisting(cfg, layout, stage, states, buffers, parts),
        reserved_reuses_activations(cfg),
    )


def stages_memory(cfg: LLMTrainConfig, layout: Layout, hw: HardwareView) -> tuple[StageMemory, ...]:
    """Every stage's ``stage_memory``, the buffers they share computed once."""
    buffers = stage_buffers(cfg, layout)
    return tuple(stage_memory(cfg, layout, hw, s, buffers) for s in range(max(1, layout.pp)))


def estimate_memory(
    cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, headroom: float = 0.10
) -> MemoryPlan:
    from launcher.plan.calibration.bands import error_band

    stages = stages_memory(cfg, layout, hw)
    band = error_band("memory", cfg, hw.arch).worst
    return MemoryPlan(stages=stages, capacity=float(hw.memory_bytes), headroom=headroom, band=band)


# The parts, importable from here as before the split.
__all__ = [
    "DTYPE_BYTES",
    "EAGER_LOSS_BACKWARD_BYTES",
    "FRAGMENTATION",
    "GIB",
    "LOSS_PARALLEL_BACKWARD_BYTES",
    "VERDICT_WORDS",
    "ActivationParts",
    "ActivationTerms",
    "BytesPerParam",
    "HardwareView",
    "MemoryPlan",
    "StageMemory",
    "StageParams",
    "StageStates",
    "activation_parts",
    "assemble_stage",
    "bytes_per_param",
    "cp_ring_bytes",
    "dispatcher_bytes",
    "estimate_memory",
    "fp8_weight_copy_bytes",
    "layer_activation_bytes",
    "layer_activation_terms",
    "logits_bytes",
    "pipelined_fsdp_accumulates",
    "stage_activations",
    "stage_buffers",
    "stage_memory",
    "stage_not_coexisting",
    "stage_params",
    "stage_states",
    "stages_memory",
    "uses_dropout",
    "vocab_params",
    "zero_shard",
]
