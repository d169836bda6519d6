"""The planner's entry point: make_plan(cfg) -> Plan (memory, FLOPs, time, totals, fixes)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan import finetune, preference
from launcher.plan.assumptions import assumptions
from launcher.plan.calibration.bands import ErrorBand, error_band
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
class Fix:
    """One change that makes the configuration fit: the override line and the memory it gives."""

    overrides: tuple[str, ...]
    device_bytes: float
    fits: bool
    # The step time with the fix (what it costs in speed beside what it saves); 0: not priced.
    step_s: float = 0.0

    @property
    def line(self) -> str:
        return " ".join(self.overrides)


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


def _memory_only(cfg: LLMTrainConfig, hw: HardwareView, headroom: float) -> MemoryPlan:
    priced = preference.priced_config(cfg)
    memory = estimate_memory(priced, derive_layout(priced), hw, headroom)
    return preference.with_reference_copy(cfg, memory)


def _with_sections(cfg: LLMTrainConfig, **parts: dict[str, object]) -> LLMTrainConfig:
    """`cfg` with some keys of its sections replaced (``zero={"stage": 3}``: zero.stage=3)."""
    changes = {
        name: dataclasses.replace(getattr(cfg, name), **vals) for name, vals in parts.items()
    }
    return dataclasses.replace(cfg, **changes)


def suggest_fixes(
    cfg: LLMTrainConfig,
    hw: HardwareView,
    headroom: float,
    limit: int = 6,
    accept: Callable[[LLMTrainConfig], bool] | None = None,
) -> tuple[Fix, ...]:
    """The smallest single changes (then pairs) that make the heaviest rank fit.

    Tried in order of how little they cost in speed: ZeRO stage up, selective then full recompute,
    smaller micro-batch (global batch kept through more accumulation), tp up within a node, pp up,
    CPU offload of the optimizer (with the ZeRO stage it needs), the zero group's options. Every
    candidate, single or pair, must pass `accept` (validate's rules, which the layers above plan
    pass in: plan never imports validate); each is re-planned with the same memory function.
    """
    valid = accept or (lambda _: True)
    layout = derive_layout(cfg)
    world = layout.world_size
    candidates: list[tuple[tuple[str, ...], LLMTrainConfig]] = []
    z = cfg.zero.stage
    for stage in range(z + 1, 4):
        candidates.append(((f"zero.stage={stage}",), _with_sections(cfg, zero={"stage": stage})))
    order = ["none", "selective", "full"]
    for r in order[order.index(cfg.train.recompute) + 1 :]:
        candidates.append(((f"train.recompute={r}",), _with_sections(cfg, train={"recompute": r})))
    mbs = layout.micro_batch_size
    while mbs > 1:
        mbs //= 2
        accum = layout.global_batch_size // max(1, mbs * layout.dp)
        changes: dict[str, object] = {"micro_batch_size": mbs, "grad_accum": max(1, accum)}
        candidates.append(((f"train.micro_batch_size={mbs}",), _with_sections(cfg, train=changes)))
    for tp in (2, 4, 8, 16):
        mp = tp * layout.pp * layout.cp
        if tp > layout.tp and world % mp == 0 and cfg.model.num_attention_heads % tp == 0:
            candidates.append(
                ((f"parallel.tp={tp}",), _with_sections(cfg, parallel={"tp": tp, "dp": None}))
            )
    for pp in (2, 4, 8, 16, 32):
        mp = layout.tp * pp * layout.cp
        if pp > layout.pp and world % mp == 0 and cfg.model.num_layers >= pp:
            candidates.append(
                (
                    (f"parallel.pp={pp}",),
                    _with_sections(cfg, parallel={"pp": pp, "dp": None, "pp_layers": None}),
                )
            )
    offload_stages = range(max(1, z), 4)
    if cfg.zero.offload_optimizer != "cpu":
        for stage in offload_stages:
            lead = () if stage == z else (f"zero.stage={stage}",)
            candidates.append(
                (
                    (*lead, "zero.offload_optimizer=cpu"),
                    _with_sections(cfg, zero={"stage": stage, "offload_optimizer": "cpu"}),
                )
            )
    # The zero group's options (`zero=stage3-offload`): several keys at once, as a user types them.
    for option, values in _zero_options().items():
        changed = _with_sections(cfg, zero=values)
        if changed.zero != cfg.zero and changed.zero.stage >= z:
            candidates.append(((f"zero={option}",), changed))
    # Only what validate accepts is offered: the same rules (and the backend's refusals) judge
    # every candidate before its memory is priced (a fix that validate refuses is no fix).
    candidates = [(o, c) for o, c in candidates if valid(c)]
    fixes: list[tuple[Fix, LLMTrainConfig, MemoryPlan]] = []
    for overrides, changed in candidates:
        mem = _memory_only(changed, hw, headroom)
        fixes.append((Fix(overrides, mem.heaviest.device_total, mem.fits), changed, mem))
    fitting = [f for f in fixes if f[0].fits]
    if not fitting:
        # Pairs of the single changes, cheapest first.
        for i, (o1, c1) in enumerate(candidates):
            for o2, _ in candidates[i + 1 :]:
                if {_fix_key(x) for x in o1} & {_fix_key(x) for x in o2}:
                    continue
                merged = _merge(c1, o2, cfg)
                if merged is None or not valid(merged):
                    continue
                mem = _memory_only(merged, hw, headroom)
                if mem.fits:
                    fitting.append((Fix(o1 + o2, mem.heaviest.device_total, True), merged, mem))
            if len(fitting) >= limit:
                break
    return tuple(_timed(fix, changed, hw, mem) for fix, changed, mem in fitting[:limit])


def _timed(fix: Fix, cfg: LLMTrainConfig, hw: HardwareView, memory: MemoryPlan) -> Fix:
    """`fix` with the step time of its configuration (the speed it costs)."""
    time = estimate_time(cfg, derive_layout(cfg), hw, config_flops(cfg), memory.stages)
    return dataclasses.replace(fix, step_s=time.step_s)


def _fix_key(override: str) -> str:
    """The section a fix changes: `zero.stage=3` and `zero=stage3-offload` both change zero."""
    key = override.split("=", 1)[0]
    return key.split(".", 1)[0] if key.split(".", 1)[0] == "zero" else key


@functools.cache
def _zero_options() -> dict[str, dict[str, object]]:
    """conf/zero/NAME.yaml's keys by option name (flat key: value files)."""
    import yaml

    from launcher import resources

    options: dict[str, dict[str, object]] = {}
    for name in resources.group_options("zero"):
        path = resources.conf_dir() / "zero" / f"{name}.yaml"
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(values, dict):
            options[name] = {k: v for k, v in values.items() if k != "defaults"}
    return options


def _merge(
    base: LLMTrainConfig, overrides: tuple[str, ...], orig: LLMTrainConfig
) -> LLMTrainConfig | None:
    """Apply simple `section.key=value` overrides (ints and words) to a config."""
    cfg = base
    for line in overrides:
        key, _, raw = line.partition("=")
        section, _, name = key.partition(".")
        if not name:  # a group option (zero=stage3-offload)
            if section != "zero" or raw not in _zero_options():
                return None
            cfg = _with_sections(cfg, zero=_zero_options()[raw])
            continue
        value: object = int(raw) if raw.isdigit() else raw
        extra: dict[str, object] = {name: value}
        if section == "parallel" and name in ("tp", "pp"):
            extra["dp"] = None
            if name == "pp":
                extra["pp_layers"] = None
        if section == "train" and name == "micro_batch_size":
            layout = derive_layout(orig)
            extra["grad_accum"] = max(1, layout.global_batch_size // (int(raw) * layout.dp))
        cfg = _with_sections(cfg, **{section: extra})
    return cfg


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
        cfg = _with_sections(cfg, model={"seq_length": padded.tokens})
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
