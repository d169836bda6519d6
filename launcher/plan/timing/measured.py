"""Compute priced from a profile (``llmtrain calibrate``) instead of published figures.

The operators of a micro-batch (``launcher.plan.operators``, the list calibrate measured) are looked
up in the profile (``launcher.plan.hardware.profile.Rates``): a GEMM shape measured is its measured
forward and backward time; a shape not measured takes the FLOP rate of the nearest measured shape;
the attention core likewise (FLOPs of batch x heads x seq^2 x head_dim; with context parallelism cp
times the causal block of s / cp measured: the ring runs cp blocks on a rank); element-wise work
is the layer's counted bytes (``operators.elementwise_bytes``) at the seconds per byte measured
for the nearest layer; the loss scales by tokens x vocabulary. A class the profile has nothing
for keeps the catalog's price (``launcher.plan.timing.kernels``) and is named so (``coverage``).

Passes as kernels.py counts them: forward + backward measured directly, plus the forwards each
layer's recompute mode runs again (launcher/plan/recompute.py). With backend.compile
the measured (eager) element-wise time is scaled by the fitted compile_bytes fraction (fitted.py);
fp8 linear layers are priced from the catalog (calibrate times the compute dtype).
"""

from __future__ import annotations

from launcher.backends.common import recompute_mode
from launcher.backends.engine_choices import compile_in_force
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.calibration.fitted import constants
from launcher.plan.hardware.profile_rates import Rates, layout_family, overhead_units
from launcher.plan.memory.estimate import DTYPE_BYTES
from launcher.plan.operators import Gemm, Operators, elementwise_bytes, operators
from launcher.plan.recompute import extra_forwards
from launcher.plan.timing.comm import Collective
from launcher.plan.timing.kernels import ComputeParts
from launcher.plan.timing.packed_rows import packed_attention_s, packed_kernel_of


def _gemms_s(rates: Rates, gemms: tuple[Gemm, ...]) -> tuple[float, float] | None:
    fwd = bwd = 0.0
    for g in gemms:
        found = rates.gemm(g.m, g.n, g.k)
        if found is None:
            return None
        fwd += found[0] * g.count
        bwd += found[1] * g.count
    return fwd, bwd


def stage_parts(
    cfg: LLMTrainConfig,
    layout: Layout,
    rates: Rates,
    dense_layers: int,
    moe_layers: int,
    head: bool,
    catalog: ComputeParts,
    arch: str,
    hbm_gbps: float,
) -> ComputeParts:
    """One micro-batch on one GPU holding the given layers, priced from the profile where it
    measured the class, from `catalog` (kernels.stage_parts) where it did not; `arch` and
    `hbm_gbps` (the device's) price packed rows' attention from the causal kernel measured."""
    ops = operators(cfg, layout)
    fp8 = cfg.precision.fp8 and not cfg.precision.fp8_emulate
    eager = ops.attention.kind == "eager"
    # Forwards run again per layer kind (plan.recompute), as the backend recomputes each.
    x_d = extra_forwards(recompute_mode(cfg, moe=False), eager)
    x_m = extra_forwards(recompute_mode(cfg, moe=True), eager)
    n = max(1, dense_layers + moe_layers)
    a_x = (dense_layers * x_d.attention + moe_layers * x_m.attention) / n
    e_x = (dense_layers * x_d.elementwise + moe_layers * x_m.elementwise) / n

    linear_s = catalog.linear_s
    other_s = catalog.other_gemm_s
    if not fp8 and not ops.mla:
        dense = _gemms_s(rates, ops.dense_gemms)
        moe = _gemms_s(rates, tuple(g for g in ops.moe_gemms if g.name != "moe router"))
        if dense is not None and (moe_layers == 0 or moe is not None):
            lin = dense_layers * (dense[0] * (1 + x_d.gemm) + dense[1])
            if moe is not None:
                lin += moe_layers * (moe[0] * (1 + x_m.gemm) + moe[1])
            linear_s = lin
    head_s = None
    if head:
        found = rates.gemm(*ops.head_gemm.shape)
        head_s = None if found is None else found[0] + found[1]
    router = _gemms_s(rates, tuple(g for g in ops.moe_gemms if g.name == "moe router"))
    if (head_s is not None or not head) and (router is not None or moe_layers == 0):
        other_s = (head_s or 0.0) + (
            moe_layers * (router[0] * (1 + x_m.gemm) + router[1]) if router is not None else 0.0
        )
        loss = rates.loss_s(ops.tokens, ops.vocab_local) if head else (0.0, 0.0)
        if loss is not None:
            other_s += loss[0] + loss[1]

    attention_s = catalog.attention_s
    a = ops.attention
    found_attn = rates.attention_s(a.kind, a.batch, a.heads, a.kv_heads, a.seq, a.head_dim)
    if found_attn is not None:
        fwd, bwd, _ = found_attn
        # With context parallelism each rank runs cp blocks of s / cp keys (the ring), the
        # causal one measured: cp x its time (kernels.py prices the same s^2 / cp per rank).
        kernel = packed_kernel_of(cfg)
        if kernel:  # packed rows: from the causal kernel measured (packed_rows.py)
            mask = ops.tokens * a.seq * a.heads
            elem = DTYPE_BYTES[cfg.precision.compute_dtype]
            fwd, bwd = packed_attention_s(kernel, (fwd, bwd), arch, mask, elem, hbm_gbps * 1e9)
        attention_s = (dense_layers + moe_layers) * (fwd * (1 + a_x) + bwd) * max(1, layout.cp)

    bytes_s = catalog.bytes_s
    per_byte = rates.elementwise_per_byte(
        elementwise_bytes(ops, DTYPE_BYTES[cfg.precision.compute_dtype])
    )
    if per_byte is not None:
        layer = elementwise_bytes(ops, DTYPE_BYTES[cfg.precision.compute_dtype])
        fwd_b, bwd_b = per_byte
        bytes_s = (dense_layers + moe_layers) * layer * (fwd_b * (1 + e_x) + bwd_b)
        if compile_in_force(cfg)[0]:  # as the engine runs (fp8 compiles by default)
            bytes_s *= constants("default").compile_bytes
    return ComputeParts(linear_s, other_s, attention_s, bytes_s)


def overhead_row(
    cfg: LLMTrainConfig, layout: Layout, rates: Rates | None, stage: int
) -> Collective | None:
    """The step's measured overhead beyond the planner's terms (launch/step_overhead.py: the waits
    for the slower rank, the engine's small per-step collectives, the dispatch) as a row of the
    collective table, for the synchronisations of `stage` (profile_rates.overhead_units); None
    without a profile or a measured run of this layout family."""
    if rates is None:
        return None
    units = overhead_units(layout, layout.stage_layers[stage])
    seconds = rates.overhead_s(layout_family(cfg, layout), units)
    if seconds is None or seconds <= 0:
        return None
    note = "measured by llmtrain calibrate on a shrunk run of this layout"
    group = layout.world_size
    return Collective(
        "per-step overhead", "overhead", "all", group, 0, 1, 0, seconds, seconds, note
    )


def coverage(cfg: LLMTrainConfig, layout: Layout, rates: Rates) -> dict[str, str]:
    """Where each part of the step time comes from: "profile" (measured shapes), "profile
    (scaled)" (nearest measured shape at its rate), or "catalog (...)" with the reason."""
    ops: Operators = operators(cfg, layout)
    out: dict[str, str] = {}

    def gemm_source(gemms: tuple[Gemm, ...]) -> str:
        found = [rates.gemm(g.m, g.n, g.k) for g in gemms]
        if not gemms or any(f is None for f in found):
            return "catalog (no GEMM measured in this dtype/threads)"
        return "profile" if all(f is not None and f[2] for f in found) else "profile (scaled)"

    if cfg.precision.fp8 and not cfg.precision.fp8_emulate:
        out["linear_gemms"] = "catalog (fp8 GEMMs are not profiled)"
    elif ops.mla:
        out["linear_gemms"] = "catalog (MLA projections are not profiled)"
    else:
        out["linear_gemms"] = gemm_source(
            ops.dense_gemms + tuple(g for g in ops.moe_gemms if g.name != "moe router")
        )
    out["output_layer"] = gemm_source((ops.head_gemm,))
    a = ops.attention
    found = rates.attention_s(a.kind, a.batch, a.heads, a.kv_heads, a.seq, a.head_dim)
    out["attention"] = (
        "catalog (not measured)"
        if found is None
        else ("profile" if found[2] else "profile (scaled)")
    )
    if not rates.elementwise:
        out["elementwise"] = "catalog (not measured)"
    else:
        out["elementwise"] = "profile" + (
            " x compile_bytes (fitted)" if compile_in_force(cfg)[0] else ""
        )
    out["loss"] = "profile" if rates.loss else "catalog (not measured)"
    out["optimizer"] = (
        "catalog (CPU offload)"
        if cfg.zero.offload_optimizer == "cpu"
        else ("profile" if rates.optimizer else "catalog (not measured)")
    )
    return out


__all__ = ["coverage", "overhead_row", "stage_parts"]
