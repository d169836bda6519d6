"""The collectives of one training step, row by row (plan/timing/estimate.py's module docstring says
what each costs and when it hides): tensor, context, expert and pipeline parallel per micro-batch,
and data parallel / ZeRO per step. Each row is priced by ``add_collective`` (comm.py's bus model, or
the collective measured on this machine) and appended to the plan's table."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from launcher.backends.common import backend_of, expert_group_stride, expert_tensor_parallel
from launcher.backends.moe_overlap import moe_overlap_on
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.calibration.fitted import constants
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.memory.estimate import HardwareView
from launcher.plan.memory.model_states import bytes_per_param, pipelined_fsdp_accumulates
from launcher.plan.model_shape import ModelShape
from launcher.plan.schedule import combined_1f1b_overlap_share
from launcher.plan.timing.comm import (
    Collective,
    collective_time,
    expert_alltoall_bus_gbps,
    place_group,
)
from launcher.plan.timing.kernels import ComputeParts


def add_collective(
    colls: list[Collective],
    hw: HardwareView,
    *,
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


@dataclass(frozen=True)
class MicrobatchWindows:
    """What the per-micro-batch collectives of the heaviest stage are priced from."""

    cfg: LLMTrainConfig
    layout: Layout
    shape: ModelShape
    stage: int
    layers: int  # layers on the heaviest stage
    moe_layers: int  # ... of which MoE layers
    tokens: float  # tokens of one micro-batch on one GPU (split over cp)
    act_bytes: int
    sp_div: int  # tp with sequence parallelism, else 1
    dispatcher: str  # the MoE dispatcher with ep > 1, else ""
    exact: ComputeParts  # the exact compute of one micro-batch (the overlap windows)


Add = Callable[..., tuple[float, float]]


def tensor_parallel_row(w: MicrobatchWindows, add: Add) -> float:
    """Tensor parallel's activation all-reduces (or all-gather + reduce-scatter); exposed s."""
    cfg, m, mb = w.cfg, w.cfg.model, w.layout.num_microbatches
    per_layer = 6 if cfg.train.recompute == "full" else 4
    calls = w.layers * per_layer
    note = "2 fwd + 2 bwd per layer" + (" + 2 recompute" if per_layer == 6 else "")
    if w.dispatcher == "allgather":
        # Megatron-core's allgather dispatcher gathers the MLP's input over tp x ep and
        # reduce-scatters its output (moe/token_dispatcher.py, MoEAllGatherTokenDispatcher):
        # an MoE layer's own tensor-parallel gather / reduce-scatter is that collective
        # (priced below), so only its attention's half stays in this row.
        calls -= w.moe_layers * per_layer // 2
        note += "; MoE layers: attention only (the dispatcher gathers over tp x ep)"
    # Megatron --tp-comm-overlap / torchtitan async TP hide TP collectives behind the linear GEMMs.
    tp_window = w.exact.linear_s * mb if cfg.backend.tp_comm_overlap else None
    _, e = add(
        name="tensor-parallel activations",
        kind="all-reduce",
        group="tp",
        size=w.layout.tp,
        stride=1,
        msg=w.tokens * m.hidden_size * w.act_bytes,
        calls=calls * mb,
        window=tp_window,
        note=note,
    )
    return float(e)


def context_parallel_row(w: MicrobatchWindows, add: Add) -> float:
    """Context parallel's K/V ring, hidden behind the attention core; exposed s."""
    mb, tp, cp = w.layout.num_microbatches, w.layout.tp, w.layout.cp
    kv = (w.shape.kv_heads * w.shape.head_dim * 2) * w.tokens * w.act_bytes / tp
    _, e = add(
        name="context-parallel K/V ring",
        kind="p2p",
        group="cp",
        size=cp,
        stride=tp,
        msg=kv,
        calls=w.layers * 3 * (cp - 1) * mb,
        window=w.exact.attention_s * mb,
        note="overlaps attention compute",
    )
    return float(e)


def allgather_dispatcher_rows(w: MicrobatchWindows, add: Add) -> list[float]:
    """Megatron-core's MoEAllGatherTokenDispatcher over the tp x ep group (contiguous ranks: its
    expert rank generator orders expert-tensor then expert parallel, megatron/core/
    parallel_state.py): every rank receives every token of the group, whatever the routing (so
    no load imbalance). With tp > 1 this replaces the MLP's own tensor-parallel collectives (the
    tensor-parallel row leaves them out). Exposed s of each row."""
    m, mb = w.cfg.model, w.layout.num_microbatches
    group = expert_tensor_parallel(w.cfg, w.layout) * w.layout.ep
    msg = group * w.tokens * m.hidden_size * w.act_bytes / w.sp_div
    exposed = []
    for name, kind in (
        ("expert all-gather", "all-gather"),
        ("expert reduce-scatter", "reduce-scatter"),
    ):
        _, e = add(
            name=name,
            kind=kind,
            group="tp x ep",
            size=group,
            stride=1,
            msg=msg,
            calls=2 * w.moe_layers * mb,
            window=None,
            note="allgather dispatcher: dispatch fwd + combine bwd"
            if kind == "all-gather"
            else "allgather dispatcher: combine fwd + dispatch bwd",
        )
        exposed.append(float(e))
    return exposed


def alltoall_row(w: MicrobatchWindows, add: Add) -> float:
    """The alltoall / flex dispatcher's dispatch and combine, forward and backward; exposed s."""
    cfg, m = w.cfg, w.cfg.model
    pp, mb, vpp = w.layout.pp, w.layout.num_microbatches, w.layout.vpp
    # The busiest rank receives (and returns) moe_load_imbalance x the mean tokens.
    msg = (m.moe_top_k or 1) * w.tokens * m.hidden_size * w.act_bytes / w.sp_div
    msg *= max(1.0, float(m.moe_load_imbalance))
    # backend.moe_comm_overlap (Megatron-Core's combined 1F1B): the dispatches and combines of
    # paired forwards / backwards run beside the partner's compute; the warm-up forwards and
    # cool-down backwards run alone (plan.schedule).
    share, a2a_window = 1.0, None
    note = f"{w.dispatcher} dispatcher: dispatch + combine, fwd + bwd"
    if moe_overlap_on(cfg):
        share = combined_1f1b_overlap_share(pp, mb, vpp, w.stage)
        a2a_window = w.exact.total_s * mb * share
        note += f"; {share:.0%} beside another micro-batch's compute (combined 1F1B)"
    _, e = add(
        name="expert all-to-all",
        kind="all-to-all",
        group="ep",
        size=w.layout.ep,
        stride=expert_group_stride(cfg, w.layout),
        msg=msg,
        calls=4 * w.moe_layers * mb,
        window=a2a_window,
        note=note,
        top_k=m.moe_top_k or 1,
        dispatcher=w.dispatcher,
        hideable=share,
    )
    return float(e)


def pipeline_row(w: MicrobatchWindows, add: Add) -> float:
    """Pipeline p2p of activations and their gradients; exposed s."""
    lay, mb = w.layout, w.layout.num_microbatches
    msg = w.tokens * w.cfg.model.hidden_size * w.act_bytes / w.sp_div
    _, e = add(
        name="pipeline p2p",
        kind="p2p",
        group="pp",
        size=2,
        stride=lay.tp * lay.cp * lay.dp,
        msg=msg,
        calls=2 * lay.vpp * mb,
        # Megatron overlaps the p2p of the interleaved schedule with compute
        # (overlap_p2p_comm, on by default with virtual pipeline stages).
        window=w.exact.total_s * mb
        if (lay.vpp > 1 and backend_of(w.cfg).overlaps_interleaved_p2p)
        else None,
        note="activation forward, gradient backward",
    )
    return float(e)


# The backward's share of a layer's compute: it runs two GEMMs (data and weight gradient) per
# forward GEMM (Narayanan et al. 2021, section 5.1: 6 = 2 forward + 4 backward FLOPs per
# parameter and token), so 2/3 of the compute; with full recompute the forward runs again inside
# the backward: 3 of 4 passes.
BWD_SHARE = 2.0 / 3.0


BWD_SHARE_FULL_RECOMPUTE = 3.0 / 4.0


def data_parallel_rows(
    cfg: LLMTrainConfig,
    layout: Layout,
    params: float,
    t_compute_mb: float,
    add: Add,
    *,
    optimizer_s: float = 0.0,
) -> float:
    """Data parallel / ZeRO collectives of one step (plan/timing/estimate.py's module docstring);
    exposed s. `optimizer_s`: the optimizer step's seconds, which the distributed optimizer's
    parameter all-gather also runs beside with backend.overlap_param_gather_with_optimizer_step."""
    mb = layout.num_microbatches
    overlap = cfg.backend.overlap_comm
    bpp = bytes_per_param(cfg)
    shard = layout.dp * layout.cp
    z = cfg.zero.stage
    dp_exposed = 0.0
    if shard <= 1:
        return dp_exposed
    bwd_share = BWD_SHARE_FULL_RECOMPUTE if cfg.train.recompute == "full" else BWD_SHARE
    grads = params * bpp.gradients
    weights = params * DTYPE_BYTES[cfg.precision.compute_dtype]
    last_bwd = t_compute_mb * bwd_share if overlap else None
    first_fwd = t_compute_mb * (1 - bwd_share) if overlap else None
    dp = functools.partial(add, group="dp", size=shard, stride=layout.tp)
    if z == 0:
        return (
            dp_exposed
            + dp(
                name="gradient all-reduce",
                kind="all-reduce",
                msg=grads,
                calls=1,
                window=last_bwd,
                note="once per step",
            )[1]
        )
    if z == 1:
        dp_exposed += dp(
            name="gradient reduce-scatter",
            kind="reduce-scatter",
            msg=grads,
            calls=1,
            window=last_bwd,
            note="once per step",
        )[1]
        if cfg.backend.overlap_param_gather_with_optimizer_step and first_fwd is not None:
            # --overlap-param-gather-with-optimizer-step (Megatron-LM core_v0.16.1): the first
            # model chunk gets its own optimizer (megatron/core/optimizer/__init__.py), and
            # ChainedOptimizer.step_with_ready_grads (optimizer.py) starts that chunk's
            # parameter all-gather as soon as it has stepped, beside the other vpp - 1 chunks'
            # steps: their share of the optimizer step joins the first forward as the window.
            vpp = max(1, layout.vpp)
            first_fwd += optimizer_s * (vpp - 1) / vpp
        return dp_exposed + parameter_gather_after_step(dp, weights, first_fwd)
    window = t_compute_mb * mb if overlap else None
    if z >= 3:
        total, e = dp(
            name="parameter all-gather",
            kind="all-gather",
            msg=weights,
            calls=2 * mb,
            window=window,
            note="forward and backward, per micro-batch",
        )
        dp_exposed += e
        window = None if window is None else max(0.0, window - total)
    if pipelined_fsdp_accumulates(cfg, layout):
        # One reduce-scatter of the accumulated gradients after the schedule's last backward
        # (torch.distributed.pipelining's REDUCE_GRAD action): nothing is left to hide it behind
        # on the stage that finishes last.
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
    dp_exposed += dp(
        name="gradient reduce-scatter",
        kind="reduce-scatter",
        msg=rs_bytes,
        calls=rs_calls,
        window=rs_window,
        note=rs_when,
    )[1]
    if z == 2:
        dp_exposed += parameter_gather_after_step(dp, weights, first_fwd)
    return dp_exposed


def parameter_gather_after_step(dp: Add, weights: float, first_fwd: float | None) -> float:
    """ZeRO-1/2's all-gather of the updated parameters after the optimizer step, hidden behind
    the first micro-batch's forward with overlap_comm; exposed s."""
    return float(
        dp(
            name="parameter all-gather",
            kind="all-gather",
            msg=weights,
            calls=1,
            window=first_fwd,
            note="after the optimizer step",
        )[1]
    )
