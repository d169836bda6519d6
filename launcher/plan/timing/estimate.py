"""Step time: compute + exposed communication + pipeline bubble + optimizer step.

- Compute per operator class (kernels.py): GEMMs on a shape-dependent roofline, flash attention at
  its kernel's rate, element-wise work as bytes over HBM; fitted constants in fitted.py.
- Tensor parallel: per layer and micro-batch 2 all-reduces forward and 2 backward (or the same bytes
  as all-gather + reduce-scatter with sequence parallelism; +2 with full recompute), b*s*h
  activations each (Shoeybi et al. 2019); exposed, or hidden behind the linear GEMMs with
  backend.tp_comm_overlap (Megatron-core --tp-comm-overlap, torchtitan async TP).
- Pipeline: p2p of b*s*h activations (and their gradients) per micro-batch and chunk; exposed,
  except Megatron's interleaved schedule (overlap_p2p_comm, its default with virtual stages).
- Groups inside one NVLink domain (catalog scale_up_domain: a node, or 72 GPUs of a GB200 NVL72
  rack) get the NVLink bandwidth. Hidden communication still costs fitted.overlap_cost of its time.
- Context parallel: ring exchange of K and V, (cp-1) steps forward, K,V and their gradients
  backward; hidden behind the attention core's compute, the excess exposed.
- Expert parallel, by the dispatcher (backends.common.moe_dispatcher): alltoall and flex, 4
  all-to-alls per MoE layer and micro-batch (dispatch and combine, forward and backward) of
  top_k * tokens * h; exposed. A group spanning nodes is bound by each GPU's NIC: every copy
  that leaves the node (alltoall) or one copy per remote node a token reaches (flex)
  (comm.expert_alltoall_bus_gbps). allgather (Megatron-core's default): the rank's tokens
  all-gathered over the tp x ep group before the experts and reduce-scattered after them
  (all-gather + reduce-scatter forward, the reverse backward), tp x ep x tokens / tp x h each;
  exposed.
- Data parallel / ZeRO (Rajbhandari et al. 2020): stage 0 all-reduces gradients once per step;
  stage 1 reduce-scatters gradients and all-gathers parameters once per step; stage 2
  reduce-scatters per micro-batch; stage 3 all-gathers parameters forward and backward and
  reduce-scatters gradients per micro-batch. With backend.overlap_comm, once-per-step collectives
  overlap the last micro-batch's backward (gradients) or the first one's forward (parameters),
  per-micro-batch ones overlap that micro-batch's compute; only the excess is exposed. Without it
  all of it is exposed.
- Bubble: (p-1)/(v*m) of the per-micro-batch pipeline time (schedule.py).
- Optimizer step: memory-bound, (2 * optimizer + gradients + weights) bytes over HBM bandwidth; with
  CPU offload over HOST_GBPS, plus gradients down and weights up over PCIE_GBPS; with
  optim.offload=cpu on the GPU, plus the states down and up over PCIE_GBPS
  (plan/memory/offload.py paged_states_s).
- Activation offload (train.activation_offload): the PCIe copies beyond what the compute hides
  (plan/memory_savers.py offload_exposed_s).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from launcher.backends.common import moe_dispatcher
from launcher.config.layout import Layout
from launcher.config.pipeline_split import bubble_scale, mtp_stage
from launcher.config.schema import LLMTrainConfig
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.flops import FlopsPerToken, attention_core_flops_fwd
from launcher.plan.memory.estimate import HardwareView, StageMemory
from launcher.plan.memory.memory_savers import offload_exposed_s
from launcher.plan.memory.model_states import bytes_per_param
from launcher.plan.memory.offload import paged_states_s, pages_states
from launcher.plan.memory.stage_activations import offloaded_bytes
from launcher.plan.model_shape import ModelShape
from launcher.plan.schedule import bubble_overhead
from launcher.plan.timing.comm import Collective
from launcher.plan.timing.kernels import ComputeParts, stage_parts
from launcher.plan.timing.measured import overhead_row
from launcher.plan.timing.measured import stage_parts as measured_parts
from launcher.plan.timing.step_collectives import (
    MicrobatchWindows,
    add_collective,
    allgather_dispatcher_rows,
    alltoall_row,
    context_parallel_row,
    data_parallel_rows,
    pipeline_row,
    tensor_parallel_row,
)


@dataclass(frozen=True)
class TimePlan:
    step_s: float
    compute_s: float  # compute of all micro-batches on the heaviest stage, no bubble
    bubble_s: float
    exposed_comm_s: float
    optimizer_s: float
    microbatch_s: float
    bubble_fraction: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float  # model FLOPs achieved per GPU, TFLOP/s
    hardware_tflops_per_gpu: float
    mfu: float  # model FLOPs / peak (PaLM appendix B)
    hfu: float  # hardware FLOPs (with recompute) / peak (Korthikanti et al. 2022)
    collectives: tuple[Collective, ...]
    compute_stage: int


def stage_compute_parts(
    cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, stage: int, exact: bool = True
) -> ComputeParts:
    """Compute of one micro-batch on one GPU of `stage`, per operator class (kernels.py)."""
    m = cfg.model
    shape = ModelShape(m)
    layers = layout.stage_layers[stage]
    if shape.is_moe:
        if layout.vpp == 1:
            first = sum(layout.stage_layers[:stage])
            dense = max(0, min(layers, m.moe_dense_layers - first))
        else:
            dense = round(m.moe_dense_layers * layers / max(1, m.num_layers))
    else:
        dense = layers
    moe = layers - dense
    # The multi-token-prediction modules on their stage: one more layer each (of the model's
    # last kind) and one more pass of the output head and loss (priced as a head-only part).
    mtp = (
        m.mtp_layers
        if stage == mtp_stage(cfg.parallel.pipeline_layout, layout.pp, m.mtp_layers)
        else 0
    )
    if mtp and shape.mtp_is_moe:
        moe += mtp
    elif mtp:
        dense += mtp
    head = stage == layout.pp - 1

    def priced(n_dense: int, n_moe: int, with_head: bool) -> ComputeParts:
        catalog = stage_parts(
            cfg,
            layout,
            hw.arch,
            hw.peak_flops,
            hw.matmul_peak_flops,
            hw.matmul_efficiency,
            hw.hbm_gbps,
            hw.tdp_watts,
            dense_layers=n_dense,
            moe_layers=n_moe,
            head=with_head,
            m_limit=not exact,
        )
        if hw.profile is None:
            return catalog
        # Measured on this machine (llmtrain calibrate): launcher/plan/timing/measured.py. Not exact
        # (the search's bound): every measured class at its fastest measured rate
        # (Rates.optimistic), the others from the catalog with unbounded token dimensions.
        rates = hw.profile if exact else hw.profile.optimistic()
        return measured_parts(
            cfg, layout, rates, n_dense, n_moe, with_head, catalog, hw.arch, hw.hbm_gbps
        )

    parts = priced(dense, moe, head)
    if mtp:
        extra = priced(0, 0, True)
        parts = ComputeParts(
            parts.linear_s + mtp * extra.linear_s,
            parts.other_gemm_s + mtp * extra.other_gemm_s,
            parts.attention_s + mtp * extra.attention_s,
            parts.bytes_s + mtp * extra.bytes_s,
            parts.launch_removed_s + mtp * extra.launch_removed_s,
        )
    return parts


def _heaviest_stage(
    cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, exact: bool = True
) -> tuple[ComputeParts, int]:
    best: tuple[ComputeParts | None, int] = (None, 0)
    seen: dict[tuple[int, bool, bool, bool], ComputeParts] = {}
    stage_layers = layout.stage_layers
    holds_mtp = mtp_stage(cfg.parallel.pipeline_layout, layout.pp, cfg.model.mtp_layers)
    for s in range(layout.pp):
        kind = (stage_layers[s], s == layout.pp - 1, s == 0, s == holds_mtp)
        if kind not in seen:
            seen[kind] = stage_compute_parts(cfg, layout, hw, s, exact)
        parts = seen[kind]
        if best[0] is None or parts.total_s > best[0].total_s:
            best = (parts, s)
    assert best[0] is not None
    return best[0], best[1]


def microbatch_compute_s(
    cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, flops: FlopsPerToken
) -> tuple[float, int, float]:
    """(seconds, stage, attention share) of one micro-batch's compute on the heaviest stage.

    A lower bound of the step: step_s >= this x micro-batches x (1 + bubble overhead), which
    the layout search (``search.py``) uses to skip layouts that cannot make its top k; per token
    it also bounds every larger micro-batch (kernels.stage_parts' m_limit: token dimensions priced
    as unbounded). The operator-class model is in kernels.py; `flops` is kept for callers'
    compatibility.
    """
    parts, stage = _heaviest_stage(cfg, layout, hw, exact=False)
    return parts.total_s, stage, parts.attention_s / max(1e-30, parts.total_s)


@dataclass(frozen=True)
class MicrobatchTime:
    """One micro-batch on the heaviest compute stage: compute and exposed per-micro-batch comm."""

    compute_s: float
    exposed_s: float
    stage: int
    attn_share: float
    collectives: tuple[Collective, ...]  # per step (all micro-batches)


def microbatch_time(
    cfg: LLMTrainConfig,
    layout: Layout,
    hw: HardwareView,
    flops: FlopsPerToken,
    exact: bool = False,
) -> MicrobatchTime:
    """Compute plus the exposed TP, CP, EP and PP communication of one micro-batch.

    Independent of the ZeRO stage and offload; (compute_s + exposed_s) x micro-batches x
    (1 + bubble overhead) is a lower bound of the step, which the layout search uses (scaled by
    the micro-batch size). exact=True: the compute of this micro-batch size (estimate_time).
    """
    m = cfg.model
    shape = ModelShape(m)
    mb = layout.num_microbatches
    parts, stage = _heaviest_stage(cfg, layout, hw, exact)
    layers = layout.stage_layers[stage]
    first_layer = sum(layout.stage_layers[:stage])
    w = MicrobatchWindows(
        cfg=cfg,
        layout=layout,
        shape=shape,
        stage=stage,
        layers=layers,
        moe_layers=sum(
            1 for i in range(first_layer, first_layer + layers) if i >= m.moe_dense_layers
        )
        if shape.is_moe
        else 0,
        tokens=layout.micro_batch_size * m.seq_length / max(1, layout.cp),
        act_bytes=DTYPE_BYTES[cfg.precision.compute_dtype],
        sp_div=layout.tp if cfg.parallel.sequence_parallel else 1,
        dispatcher=moe_dispatcher(cfg) if shape.is_moe and layout.ep > 1 else "",
        # Overlap windows from the exact compute: per token they only shrink with larger
        # micro-batches, so the exposed time stays a lower bound when scaled by tokens.
        exact=parts if exact else _heaviest_stage(cfg, layout, hw, True)[0],
    )
    colls: list[Collective] = []
    add = functools.partial(add_collective, colls, hw)
    # Per micro-batch collectives (on the critical path of every micro-batch).
    exposed: list[float] = []
    if layout.tp > 1:
        exposed.append(tensor_parallel_row(w, add))
    if layout.cp > 1:
        exposed.append(context_parallel_row(w, add))
    if layout.ep > 1 and shape.is_moe:
        if w.dispatcher == "allgather":
            exposed += allgather_dispatcher_rows(w, add)
        else:
            exposed.append(alltoall_row(w, add))
    if layout.pp > 1:
        exposed.append(pipeline_row(w, add))
    per_mb_exposed = 0.0
    for e in exposed:
        per_mb_exposed += e / mb
    attn_share = parts.attention_s / max(1e-30, parts.total_s)
    return MicrobatchTime(parts.total_s, per_mb_exposed, stage, attn_share, tuple(colls))


# CPU offload's optimizer step: DeepSpeed's CPU Adam (AVX) streams the fp32 master, m and v
# (read and written) at host-memory speed. Not fitted, an estimate: one GPU's share of a
# dual-socket server's DDR bandwidth (8 GPUs on 2 x 8-12 DDR5 channels, ~300-600 GB/s in all,
# less what the other GPUs' CPU Adam threads take) is of the order of 50 GB/s.
HOST_GBPS = 50.0
# Gradients down and updated weights up over each GPU's PCIe link: PCIe 4.0 x16 moves 32 GB/s
# per direction (PCI-SIG), about 25 GB/s achieved in cudaMemcpy with pinned memory (nvbandwidth);
# PCIe 5.0 hosts are faster, so this errs slow.
PCIE_GBPS = 25.0
# The compute-dtype weights copied back to the GPU after a CPU step are host_bytes / 6 for
# mixed-precision Adam: the host holds 12 bytes per parameter (fp32 master, m, v; ZeRO paper)
# and the GPU receives 2 (bf16 / fp16).
HOST_BYTES_PER_UPLOADED_BYTE = 6.0


def _optimizer_s(cfg: LLMTrainConfig, hw: HardwareView, st: StageMemory) -> float:
    """Optimizer step (memory-bound): 2 x optimizer + gradients + weights over HBM, or the
    measured step; with CPU offload the host's part and the PCIe transfers."""
    bpp = bytes_per_param(cfg)
    on_device = 2.0 * st.optimizer + st.gradients + st.weights
    optimizer_s = on_device / (hw.hbm_gbps * 1e9)
    if hw.profile is not None and bpp.optimizer > 0 and st.host_bytes == 0:
        # Measured: the engine's optimizer step (clip, step, zero_grad) on this rank's shard.
        measured = hw.profile.optimizer_s(st.optimizer / bpp.optimizer)
        optimizer_s = optimizer_s if measured is None else measured
    if pages_states(cfg):  # optim.offload=cpu: the update on the GPU, the states over PCIe
        optimizer_s += 2.0 * st.host_bytes / (hw.hbm_gbps * 1e9)
        optimizer_s += paged_states_s(st.host_bytes, PCIE_GBPS)
    elif st.host_bytes > 0:
        optimizer_s += 2.0 * st.host_bytes / (HOST_GBPS * 1e9)
        optimizer_s += (st.gradients + st.host_bytes / HOST_BYTES_PER_UPLOADED_BYTE) / (
            PCIE_GBPS * 1e9
        )
    return optimizer_s


def estimate_time(
    cfg: LLMTrainConfig,
    layout: Layout,
    hw: HardwareView,
    flops: FlopsPerToken,
    stages: tuple[StageMemory, ...],
) -> TimePlan:
    m = cfg.model
    mb = layout.num_microbatches
    per_mb = microbatch_time(cfg, layout, hw, flops, exact=True)
    t_compute_mb, per_mb_exposed, stage = per_mb.compute_s, per_mb.exposed_s, per_mb.stage
    colls = list(per_mb.collectives)
    add = functools.partial(add_collective, colls, hw)

    t_mb = t_compute_mb + per_mb_exposed
    pipeline_s = t_mb * mb
    # The bubble of the actual split (an uneven one fills and drains faster than pp x the
    # heaviest stage: config/pipeline_split.py bubble_scale; 1 for an even split).
    overhead = bubble_overhead(layout.pp, mb, layout.vpp) * bubble_scale(layout.stage_layers)
    bubble_s = t_mb * mb * overhead
    optimizer_s = _optimizer_s(cfg, hw, stages[stage])
    dp_exposed = data_parallel_rows(
        cfg, layout, stages[stage].params, t_compute_mb, add, optimizer_s=optimizer_s
    )

    extra = overhead_row(cfg, layout, hw.profile, stage)
    if extra is not None:  # measured: what a step of this layout costs beyond the terms above
        colls.append(extra)
        dp_exposed += extra.exposed_s
    # train.activation_offload: PCIe time the side stream cannot hide (plan/memory_savers.py).
    offload_s = mb * offload_exposed_s(
        offloaded_bytes(cfg, layout, stage), t_compute_mb, cfg.train.recompute, PCIE_GBPS
    )
    exposed = per_mb_exposed * mb + dp_exposed + offload_s
    step_s = pipeline_s + bubble_s + dp_exposed + optimizer_s + offload_s
    tokens_per_s = layout.global_batch_size * m.seq_length / step_s
    per_gpu = tokens_per_s / max(1, layout.world_size)
    model_tflops = flops.model * per_gpu
    hw_tflops = flops.hardware * per_gpu
    return TimePlan(
        step_s=step_s,
        compute_s=t_compute_mb * mb,
        bubble_s=bubble_s,
        exposed_comm_s=exposed,
        optimizer_s=optimizer_s,
        microbatch_s=t_mb,
        bubble_fraction=overhead / (1.0 + overhead),
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=per_gpu,
        tflops_per_gpu=model_tflops / 1e12,
        hardware_tflops_per_gpu=hw_tflops / 1e12,
        mfu=model_tflops / hw.peak_flops,
        hfu=hw_tflops / hw.peak_flops,
        collectives=tuple(colls),
        compute_stage=stage,
    )


__all__ = [
    "TimePlan",
    "attention_core_flops_fwd",
    "estimate_time",
    "microbatch_compute_s",
    "microbatch_time",
]
