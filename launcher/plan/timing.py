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
  CPU offload over HOST_GBPS, plus gradients down and weights up over PCIE_GBPS.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from launcher.backends.common import (
    backend_of,
    expert_group_stride,
    expert_tensor_parallel,
    moe_dispatcher,
)
from launcher.backends.moe_overlap import moe_overlap_on
from launcher.config.layout import Layout
from launcher.config.pipeline_split import bubble_scale, mtp_stage
from launcher.config.schema import LLMTrainConfig
from launcher.plan.comm import (
    Collective,
    collective_time,
    expert_alltoall_bus_gbps,
    place_group,
)
from launcher.plan.fitted import constants
from launcher.plan.flops import FlopsPerToken, attention_core_flops_fwd
from launcher.plan.kernels import ComputeParts, stage_parts
from launcher.plan.measured import overhead_row
from launcher.plan.measured import stage_parts as measured_parts
from launcher.plan.memory import (
    DTYPE_BYTES,
    HardwareView,
    StageMemory,
    bytes_per_param,
    pipelined_fsdp_accumulates,
)
from launcher.plan.model_shape import ModelShape
from launcher.plan.schedule import bubble_overhead, combined_1f1b_overlap_share

# CPU Adam (DeepSpeed's AVX implementation) streams the fp32 states at host-memory speed.
HOST_GBPS = 50.0
PCIE_GBPS = 25.0


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
            n_dense,
            n_moe,
            with_head,
            m_limit=not exact,
        )
        if hw.profile is None:
            return catalog
        # Measured on this machine (llmtrain calibrate): launcher/plan/measured.py. Not exact
        # (the search's bound): every measured class at its fastest measured rate
        # (Rates.optimistic), the others from the catalog with unbounded token dimensions.
        rates = hw.profile if exact else hw.profile.optimistic()
        return measured_parts(cfg, layout, rates, n_dense, n_moe, with_head, catalog)

    parts = priced(dense, moe, head)
    if mtp:
        extra = priced(0, 0, True)
        parts = ComputeParts(
            parts.linear_s + mtp * extra.linear_s,
            parts.other_gemm_s + mtp * extra.other_gemm_s,
            parts.attention_s + mtp * extra.attention_s,
            parts.bytes_s + mtp * extra.bytes_s,
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


def _add_collective(
    colls: list[Collective],
    hw: HardwareView,
    name: str,
    kind: str,
    group: str,
    size: int,
    stride: int,
    msg: float,
    calls: int,
    window: float | None,
    note: str,
    top_k: int = 0,
    dispatcher: str = "flex",
    hideable: float = 1.0,
) -> tuple[float, float]:
    """Time one collective per step, append its row, return (total, exposed) seconds.
    top_k > 0: an expert dispatch / combine of top_k copies per token by `dispatcher` (alltoall
    or flex, comm.py). hideable: the share of the calls that may run inside `window` (the rest
    is exposed whatever the window)."""
    # A group inside one NVLink domain (a node, or a GB200 NVL72 rack) gets NVLink bandwidth.
    domain = max(hw.gpus_per_node, hw.scale_up_domain)
    place = place_group(size, stride, domain, hw.intra_gbps, hw.inter_gbps)
    bus = place.bus_gbps
    if top_k > 0:
        bus = expert_alltoall_bus_gbps(place, top_k, hw.intra_gbps, hw.inter_gbps, dispatcher)
    total = collective_time(kind, msg, size, bus) * calls
    # Measured on this machine for this kind and group size (one node only: inter-node links and
    # other group sizes stay the catalog's).
    measured = None
    if hw.profile is not None and size <= hw.gpus_per_node:
        measured = hw.profile.collective_s(kind, size, msg)
    if measured is not None:
        total = measured * calls
    # Overlapped communication is not free: NCCL kernels take SMs and HBM bandwidth from the
    # compute they run beside, which slows by overlap_cost x the hidden communication time.
    if window is None:
        exposed = total
    else:
        hidden = min(total * hideable, window)
        exposed = total - hidden + constants(hw.arch).overlap_cost * hidden
    colls.append(Collective(name, kind, group, size, msg, calls, bus, total, exposed, note))
    return total, exposed


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
    act_bytes = DTYPE_BYTES[cfg.precision.compute_dtype]
    tp, pp, cp, dp, ep, vpp = layout.tp, layout.pp, layout.cp, layout.dp, layout.ep, layout.vpp
    mb = layout.num_microbatches
    tokens = layout.micro_batch_size * m.seq_length / max(1, cp)
    sp_div = tp if cfg.parallel.sequence_parallel else 1

    parts, stage = _heaviest_stage(cfg, layout, hw, exact)
    # Overlap windows from the exact compute: per token they only shrink with larger
    # micro-batches, so the exposed time stays a lower bound when scaled by tokens.
    exact_parts = parts if exact else _heaviest_stage(cfg, layout, hw, True)[0]
    t_compute_mb = parts.total_s
    attn_share = parts.attention_s / max(1e-30, t_compute_mb)
    layers = layout.stage_layers[stage]
    # Megatron --tp-comm-overlap / torchtitan async TP hide TP collectives behind the linear GEMMs.
    tp_window = exact_parts.linear_s * mb if cfg.backend.tp_comm_overlap else None
    colls: list[Collective] = []
    add = functools.partial(_add_collective, colls, hw)

    # Per micro-batch collectives (on the critical path of every micro-batch).
    per_mb_exposed = 0.0
    first_layer = sum(layout.stage_layers[:stage])
    moe_layers = (
        sum(1 for i in range(first_layer, first_layer + layers) if i >= m.moe_dense_layers)
        if shape.is_moe
        else 0
    )
    dispatcher = moe_dispatcher(cfg) if shape.is_moe and ep > 1 else ""
    if tp > 1:
        per_layer = 6 if cfg.train.recompute == "full" else 4
        calls = layers * per_layer
        note = "2 fwd + 2 bwd per layer" + (" + 2 recompute" if per_layer == 6 else "")
        if dispatcher == "allgather":
            # Megatron-core's allgather dispatcher gathers the MLP's input over tp x ep and
            # reduce-scatters its output (moe/token_dispatcher.py, MoEAllGatherTokenDispatcher):
            # an MoE layer's own tensor-parallel gather / reduce-scatter is that collective
            # (priced below), so only its attention's half stays in this row.
            calls -= moe_layers * per_layer // 2
            note += "; MoE layers: attention only (the dispatcher gathers over tp x ep)"
        kind = "all-reduce"
        msg = tokens * m.hidden_size * act_bytes
        _, e = add(
            "tensor-parallel activations", kind, "tp", tp, 1, msg, calls * mb, tp_window, note
        )
        per_mb_exposed += e / mb
    if cp > 1:
        kv = (shape.kv_heads * shape.head_dim * 2) * tokens * act_bytes / tp
        attn_time = exact_parts.attention_s
        _, e = add(
            "context-parallel K/V ring",
            "p2p",
            "cp",
            cp,
            tp,
            kv,
            layers * 3 * (cp - 1) * mb,
            attn_time * mb,
            "overlaps attention compute",
        )
        per_mb_exposed += e / mb
    if ep > 1 and shape.is_moe:
        if dispatcher == "allgather":
            # Megatron-core's MoEAllGatherTokenDispatcher over the tp x ep group (contiguous
            # ranks: its expert rank generator orders expert-tensor then expert parallel,
            # megatron/core/parallel_state.py): every rank receives every token of the group,
            # whatever the routing (so no load imbalance). With tp > 1 this replaces the MLP's
            # own tensor-parallel collectives (the row above leaves them out).
            group = expert_tensor_parallel(cfg, layout) * ep
            msg = group * tokens * m.hidden_size * act_bytes / sp_div
            for name, kind in (
                ("expert all-gather", "all-gather"),
                ("expert reduce-scatter", "reduce-scatter"),
            ):
                _, e = add(
                    name,
                    kind,
                    "tp x ep",
                    group,
                    1,
                    msg,
                    2 * moe_layers * mb,
                    None,
                    "allgather dispatcher: dispatch fwd + combine bwd"
                    if kind == "all-gather"
                    else "allgather dispatcher: combine fwd + dispatch bwd",
                )
                per_mb_exposed += e / mb
        else:
            # The busiest rank receives (and returns) moe_load_imbalance x the mean tokens.
            msg = (m.moe_top_k or 1) * tokens * m.hidden_size * act_bytes / sp_div
            msg *= max(1.0, float(m.moe_load_imbalance))
            # backend.moe_comm_overlap (Megatron-Core's combined 1F1B): the dispatches and
            # combines of paired forwards / backwards run beside the partner's compute; the
            # warm-up forwards and cool-down backwards run alone (plan.schedule).
            share, a2a_window = 1.0, None
            note = f"{dispatcher} dispatcher: dispatch + combine, fwd + bwd"
            if moe_overlap_on(cfg):
                share = combined_1f1b_overlap_share(pp, mb, vpp, stage)
                a2a_window = exact_parts.total_s * mb * share
                note += f"; {share:.0%} beside another micro-batch's compute (combined 1F1B)"
            _, e = add(
                "expert all-to-all",
                "all-to-all",
                "ep",
                ep,
                expert_group_stride(cfg, layout),
                msg,
                4 * moe_layers * mb,
                a2a_window,
                note,
                top_k=m.moe_top_k or 1,
                dispatcher=dispatcher,
                hideable=share,
            )
            per_mb_exposed += e / mb
    if pp > 1:
        msg = tokens * m.hidden_size * act_bytes / sp_div
        _, e = add(
            "pipeline p2p",
            "p2p",
            "pp",
            2,
            tp * cp * dp,
            msg,
            2 * vpp * mb,
            # Megatron overlaps the p2p of the interleaved schedule with compute
            # (overlap_p2p_comm, on by default with virtual pipeline stages).
            exact_parts.total_s * mb
            if (vpp > 1 and backend_of(cfg).overlaps_interleaved_p2p)
            else None,
            "activation forward, gradient backward",
        )
        per_mb_exposed += e / mb

    return MicrobatchTime(t_compute_mb, per_mb_exposed, stage, attn_share, tuple(colls))


def estimate_time(
    cfg: LLMTrainConfig,
    layout: Layout,
    hw: HardwareView,
    flops: FlopsPerToken,
    stages: tuple[StageMemory, ...],
) -> TimePlan:
    m = cfg.model
    tp, pp, cp, dp, vpp = layout.tp, layout.pp, layout.cp, layout.dp, layout.vpp
    mb = layout.num_microbatches
    overlap = cfg.backend.overlap_comm
    per_mb = microbatch_time(cfg, layout, hw, flops, exact=True)
    t_compute_mb, per_mb_exposed, stage = per_mb.compute_s, per_mb.exposed_s, per_mb.stage
    colls = list(per_mb.collectives)
    add = functools.partial(_add_collective, colls, hw)

    t_mb = t_compute_mb + per_mb_exposed
    pipeline_s = t_mb * mb
    # The bubble of the actual split (an uneven one fills and drains faster than pp x the
    # heaviest stage: config/pipeline_split.py bubble_scale; 1 for an even split).
    overhead = bubble_overhead(pp, mb, vpp) * bubble_scale(layout.stage_layers)
    bubble_s = t_mb * mb * overhead

    # Data parallel / ZeRO.
    bpp = bytes_per_param(cfg)
    params = stages[stage].params
    shard = dp * cp
    z = cfg.zero.stage
    dp_exposed = 0.0
    bwd_share = 3.0 / 4.0 if cfg.train.recompute == "full" else 2.0 / 3.0
    if shard > 1:
        grads = params * bpp.gradients
        weights = params * DTYPE_BYTES[cfg.precision.compute_dtype]
        last_bwd = t_compute_mb * bwd_share if overlap else None
        first_fwd = t_compute_mb * (1 - bwd_share) if overlap else None
        if z == 0:
            dp_exposed += add(
                "gradient all-reduce",
                "all-reduce",
                "dp",
                shard,
                tp,
                grads,
                1,
                last_bwd,
                "once per step",
            )[1]
        elif z == 1:
            dp_exposed += add(
                "gradient reduce-scatter",
                "reduce-scatter",
                "dp",
                shard,
                tp,
                grads,
                1,
                last_bwd,
                "once per step",
            )[1]
            dp_exposed += add(
                "parameter all-gather",
                "all-gather",
                "dp",
                shard,
                tp,
                weights,
                1,
                first_fwd,
                "after the optimizer step",
            )[1]
        else:
            window = t_compute_mb * mb if overlap else None
            if z >= 3:
                dp_exposed += add(
                    "parameter all-gather",
                    "all-gather",
                    "dp",
                    shard,
                    tp,
                    weights,
                    2 * mb,
                    window,
                    "forward and backward, per micro-batch",
                )[1]
                window = None if window is None else max(0.0, window - colls[-1].time_s)
            if pipelined_fsdp_accumulates(cfg, layout):
                # One reduce-scatter of the accumulated gradients after the schedule's last
                # backward (torch.distributed.pipelining's REDUCE_GRAD action): nothing is left
                # to hide it behind on the stage that finishes last.
                reduce = cfg.precision.grad_dtype
                if cfg.precision.compute_dtype == "fp32":
                    reduce = "fp32"
                rs_bytes, rs_calls, rs_window, rs_when = (
                    params * DTYPE_BYTES[reduce],
                    1,
                    None,
                    "once per step, after the last backward",
                )
            else:
                rs_bytes, rs_calls, rs_window, rs_when = grads, mb, window, "per micro-batch"
            dp_exposed += add(
                "gradient reduce-scatter",
                "reduce-scatter",
                "dp",
                shard,
                tp,
                rs_bytes,
                rs_calls,
                rs_window,
                rs_when,
            )[1]
            if z == 2:
                dp_exposed += add(
                    "parameter all-gather",
                    "all-gather",
                    "dp",
                    shard,
                    tp,
                    weights,
                    1,
                    first_fwd,
                    "after the optimizer step",
                )[1]

    # Optimizer step (memory-bound).
    st = stages[stage]
    on_device = 2.0 * st.optimizer + st.gradients + st.weights
    optimizer_s = on_device / (hw.hbm_gbps * 1e9)
    if hw.profile is not None and bpp.optimizer > 0 and st.host_bytes == 0:
        # Measured: the engine's optimizer step (clip, step, zero_grad) on this rank's shard.
        measured = hw.profile.optimizer_s(st.optimizer / bpp.optimizer)
        optimizer_s = optimizer_s if measured is None else measured
    if st.host_bytes > 0:
        optimizer_s += 2.0 * st.host_bytes / (HOST_GBPS * 1e9)
        optimizer_s += (st.gradients + st.host_bytes / 6.0) / (PCIE_GBPS * 1e9)

    extra = overhead_row(cfg, layout, hw.profile, stage)
    if extra is not None:  # measured: what a step of this layout costs beyond the terms above
        colls.append(extra)
        dp_exposed += extra.exposed_s
    exposed = per_mb_exposed * mb + dp_exposed
    step_s = pipeline_s + bubble_s + dp_exposed + optimizer_s
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
