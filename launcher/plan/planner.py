"""The planner's entry point: make_plan(cfg) -> Plan (memory, FLOPs, time, totals, fixes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan import finetune, preference
from launcher.plan.assumptions import assumptions
from launcher.plan.calibration.bands import ErrorBand, error_band
from launcher.plan.fixes import Fix, suggest_fixes, with_sections
from launcher.plan.flops import FlopsPerToken, config_flops
from launcher.plan.hardware.lookup import cluster_gpu
from launcher.plan.hardware.profile import ProfileChoice, ProfileError, choose, cpu_threads
from launcher.plan.memory.estimate import (
    GIB,
    HardwareView,
    MemoryPlan,
    StageMemory,
    bytes_per_param,
    estimate_memory,
    fp8_weight_copy_bytes,
)
from launcher.plan.memory.memory_savers import saver_notes
from launcher.plan.memory.model_states import moment_bytes
from launcher.plan.memory.offload import paged_states_note
from launcher.plan.memory.stage_activations import offloaded_bytes
from launcher.plan.model_shape import ModelShape
from launcher.plan.padded_length import priced_length
from launcher.plan.timing.estimate import PCIE_GBPS, TimePlan, estimate_time
from launcher.plan.timing.measured import coverage
from launcher.plan.totals import Totals, estimate_totals


@dataclass(frozen=True)
class Plan:
    config: LLMTrainConfig
    layout: Layout
    hardware: HardwareView
    total_params: int
    active_params: int
    memory: MemoryPlan
    flops: FlopsPerToken
    time: TimePlan
    totals: Totals
    fixes: tuple[Fix, ...]
    assumptions: tuple[str, ...]
    # Leave-one-source-out error bands of this configuration's regime (bands.py).
    time_band: ErrorBand | None = None
    memory_band: ErrorBand | None = None
    # The operator profile the compute was priced from (llmtrain calibrate), or None: published
    # figures only; `sources` names where each part of the step time came from.
    profile: ProfileChoice | None = None
    profile_note: str | None = None
    sources: tuple[tuple[str, str], ...] = ()
    # One line per memory saver in force (plan/memory_savers.py saver_notes).
    savers: tuple[str, ...] = ()
    # data.packing=false: the length a micro-batch was priced at (plan/padded_length.py).
    priced_length: str | None = None


def hardware_view(cfg: LLMTrainConfig) -> HardwareView:
    """Catalog figures for cluster.gpu with the cluster's overrides applied."""
    gpu = cluster_gpu(cfg.cluster)
    c = cfg.cluster
    p = cfg.precision
    dtype = "tf32" if p.compute_dtype == "fp32" and gpu.supports("tf32") else p.compute_dtype
    if not gpu.supports(dtype):
        dtype = "fp32"
    # Emulated fp8 (torchao emulate=True) rounds through fp8 but multiplies in the compute dtype.
    matmul = "fp8" if p.fp8 and not p.fp8_emulate and gpu.supports("fp8") else dtype
    return HardwareView(
        key=gpu.key,
        name=gpu.name,
        memory_bytes=gpu.memory_bytes,
        overhead_bytes=gpu.cuda_context_bytes,
        peak_flops=gpu.peak_flops(dtype),
        matmul_peak_flops=gpu.peak_flops(matmul),
        matmul_efficiency=gpu.matmul_efficiency,
        hbm_gbps=gpu.memory_bandwidth_gbps,
        intra_gbps=c.intra_node_bandwidth_gbps or gpu.intra_node_bandwidth_gbps,
        inter_gbps=c.inter_node_bandwidth_gbps or gpu.inter_node_bandwidth_gbps,
        gpus_per_node=max(1, c.gpus_per_node),
        price_per_gpu_hour=(
            c.price_per_gpu_hour if c.price_per_gpu_hour is not None else gpu.price_per_gpu_hour
        ),
        arch=gpu.arch,
        tdp_watts=gpu.tdp_watts,
        scale_up_domain=gpu.scale_up_domain,
    )


def checkpoint_bytes(cfg: LLMTrainConfig, total_params: int) -> float:
    """Weights in the compute dtype plus the optimizer states (master copy, moments); with
    finetune=lora|qlora the adapters alone (fp32) and their optimizer states."""
    if finetune.is_finetune(cfg):
        adapters = finetune.adapter_params(cfg)
        return adapters * (finetune.ADAPTER_WEIGHT_BYTES + moment_bytes(cfg))
    bpp = bytes_per_param(cfg)
    weights = bpp.weights - fp8_weight_copy_bytes(cfg)
    return total_params * (weights + bpp.optimizer)


# Band of a plan priced from a profile, not fitted: what operator timings leave out (the training
# loop's own Python, data loading, logging, allocator work) and the run-to-run noise of a shared
# machine; parts priced from the catalog add their leave-one-source-out band by their share.
PROFILE_BAND = 0.10


def choose_profile(cfg: LLMTrainConfig) -> tuple[ProfileChoice | None, str | None]:
    """The profile the plan prices from (cluster.profile, else the cache's for cluster.gpu) and
    a note; a cluster.profile that cannot be used is a UserError (exit 2) naming the key."""
    c = cfg.cluster
    threads = cpu_threads(c.gpus_per_node) if c.gpu == "cpu" else 0
    try:
        return choose(c.gpu, c.profile, cfg.precision.compute_dtype, threads)
    except ProfileError as exc:
        raise UserError(
            f"cluster.profile={c.profile}: {exc}. Write one on this machine with `llmtrain "
            f"calibrate cluster={c.name} --out PATH`, or set cluster.profile=none for published "
            "figures"
        ) from None


def priced_hardware(
    cfg: LLMTrainConfig,
) -> tuple[HardwareView, ProfileChoice | None, str | None]:
    """hardware_view with the profile's figures attached when one is chosen (choose_profile):
    what `plan` and `plan --search` price from, the profile, and the note about it."""
    hw = hardware_view(cfg)
    profile, note = choose_profile(cfg)
    if profile is not None:
        hw = dataclasses.replace(hw, profile=profile.rates)
    return hw, profile, note


def pricing_line(profile: ProfileChoice | None) -> str:
    """Where the step time's figures come from, one line (plan and plan --search)."""
    if profile is None:
        return "priced from published figures (GPU catalog + fitted constants)"
    return profile.line + "; links between nodes and other GPU counts from the catalog"


def profile_band(catalog: ErrorBand, sources: dict[str, str], time: TimePlan) -> ErrorBand:
    """PROFILE_BAND on the measured share of the step, the catalog band on the rest."""
    measured = 0.0
    total = max(1e-30, time.step_s)
    share = {
        "optimizer": time.optimizer_s,
        "compute": time.compute_s + time.bubble_s,
    }
    if sources.get("optimizer", "").startswith("profile"):
        measured += share["optimizer"]
    measured_classes = sum(
        1
        for k in ("linear_gemms", "output_layer", "attention", "elementwise")
        if sources.get(k, "").startswith("profile")
    )
    measured += share["compute"] * measured_classes / 4.0
    frac = min(1.0, measured / total)
    typical = PROFILE_BAND * frac + catalog.typical * (1.0 - frac)
    worst = 2.0 * PROFILE_BAND * frac + catalog.worst * (1.0 - frac)
    return ErrorBand(
        typical,
        worst,
        0,
        f"profile-based: {frac:.0%} of the step measured on this machine",
        "profile",
    )


def _with_reference(cfg: LLMTrainConfig, time: TimePlan, flops: FlopsPerToken) -> TimePlan:
    """The step with dpo's live reference forward added (launcher/plan/preference.py); the
    rates fall by the same ratio."""
    extra = preference.reference_forward_s(cfg, time.compute_s, flops.executed)
    if extra <= 0:
        return time
    slower = time.step_s / (time.step_s + extra)
    return dataclasses.replace(
        time,
        step_s=time.step_s + extra,
        compute_s=time.compute_s + extra,
        tokens_per_s=time.tokens_per_s * slower,
        tokens_per_s_per_gpu=time.tokens_per_s_per_gpu * slower,
        tflops_per_gpu=time.tflops_per_gpu * slower,
        hardware_tflops_per_gpu=time.hardware_tflops_per_gpu * slower,
        mfu=time.mfu * slower,
        hfu=time.hfu * slower,
    )


def make_plan(
    cfg: LLMTrainConfig,
    headroom: float = 0.10,
    *,
    accept: Callable[[LLMTrainConfig], bool] | None = None,
    with_fixes: bool = True,
    padded_batches: bool = True,
) -> Plan:
    """Plan a validated configuration: memory per stage, FLOPs, step time, totals, fixes.
    `accept` judges each fix's configuration (``launcher.validate.rules.passes``, given by the
    commands that show fixes); without it every fix that fits is offered. `with_fixes=False`:
    none looked for (the search's configuration as given, which shows none).
    `padded_batches=False`: rows priced at model.seq_length even where the engines cut them
    (the search, which prices every layout at whole rows)."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    given, layout = cfg, derive_layout(cfg)
    padded = priced_length(cfg, layout) if padded_batches else None
    if padded is not None:  # activations and compute at the priced length; Plan.config as given
        cfg = with_sections(cfg, model={"seq_length": padded.tokens})
    hw, profile, profile_note = priced_hardware(cfg)
    shape = ModelShape(given.model)
    # Preference objectives: two sequences a pair and the reference's forward (preference.py).
    priced = preference.priced_config(cfg)
    priced_layout = derive_layout(priced) if priced is not cfg else layout
    memory = estimate_memory(priced, priced_layout, hw, headroom)
    memory = preference.with_reference_copy(cfg, memory)  # dpo, finetune.reference=copy
    flops = config_flops(cfg)
    time = estimate_time(priced, priced_layout, hw, flops, memory.stages)
    time = _with_reference(cfg, time, flops)
    total_params = shape.total_params()
    totals = estimate_totals(
        steps=layout.steps,
        step_s=time.step_s,
        world_size=layout.world_size,
        price_per_gpu_hour=hw.price_per_gpu_hour,
        checkpoint_bytes=checkpoint_bytes(cfg, total_params),
        storage_write_gbps=cfg.cluster.storage_write_gbps,
    )
    wanted = with_fixes and memory.verdict != "fits"
    fixes = suggest_fixes(cfg, hw, headroom, accept=accept) if wanted else ()
    catalog_band = error_band("time", cfg, hw.arch)
    time_band: ErrorBand | None = catalog_band
    sources: dict[str, str] = {}
    if profile is not None:
        sources = coverage(cfg, layout, profile.rates)
        sources["collectives"] = (
            "profile (measured group sizes on one node), catalog for the rest"
            if profile.rates.collectives
            else "catalog"
        )
        # Figures calibrate called noise and --force kept earn no band: none is stated (the
        # published figures' own band is not theirs; plan says so, views.plan.time_band_text).
        time_band = None if profile.noise else profile_band(catalog_band, sources, time)
    return Plan(
        config=given,
        layout=layout,
        hardware=hw,
        total_params=total_params,
        active_params=shape.active_params(),
        memory=memory,
        flops=flops,
        time=time,
        totals=totals,
        fixes=fixes,
        assumptions=assumptions(cfg, layout),
        time_band=time_band,
        memory_band=error_band("memory", cfg, hw.arch),
        profile=profile,
        profile_note=profile_note,
        sources=tuple(sources.items()),
        savers=_saver_lines(cfg, layout, memory.heaviest),
        priced_length=None if padded is None else padded.note,
    )


def _saver_lines(cfg: LLMTrainConfig, layout: Layout, heaviest: StageMemory) -> tuple[str, ...]:
    """One line per memory saver in force (memory_savers.saver_notes, offload's optim.offload)."""
    lines = saver_notes(cfg, layout, offloaded_bytes(cfg, layout, heaviest.stage))
    if cfg.optim.offload == "cpu":
        lines.append(paged_states_note(cfg, heaviest.host_bytes, PCIE_GBPS))
    return tuple(lines)


__all__ = [
    "GIB",
    "Fix",
    "Plan",
    "hardware_view",
    "make_plan",
    "priced_hardware",
    "pricing_line",
    "suggest_fixes",
]
