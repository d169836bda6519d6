"""The plan document (plan.json): what `plan --json` prints and what `run` / `submit` write into
the run directory. Its typed reader for the training runtime is ``launcher.plan.figures``.
"""

from __future__ import annotations

import math
from typing import Any

from launcher.backends.engine_choices import engine_json
from launcher.plan import finetune
from launcher.plan.calibration.bands import ErrorBand
from launcher.plan.memory.build_peak import build_json
from launcher.plan.planner import Plan
from launcher.plan.preference import reference_mode


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The public, stable document: the keys listed in issue 3, plus extras."""
    return {
        "model": {
            "name": plan.config.model.name,
            "total_params": plan.total_params,
            "active_params": plan.active_params,
        },
        # finetune=lora|qlora: the adapters alone train (launcher/plan/finetune.py).
        "finetune": {
            "name": plan.config.finetune.name,
            "trainable_params": finetune.trainable_params(plan.config),
            # finetune.objective=dpo|simpo|orpo: 2 sequences a pair (launcher/plan/preference.py)
            "objective": plan.config.finetune.objective,
            "reference": reference_mode(plan.config),
        },
        "hardware": {"gpu": plan.hardware.key, "name": plan.hardware.name},
        "backend": plan.config.backend.name,
        "engine": engine_json(plan.config),
        "layout": _layout_json(plan),
        "memory": _memory_json(plan),
        "flops": {
            "per_token_model": plan.flops.model,
            "per_token_hardware": plan.flops.hardware,
            "per_token_executed": plan.flops.executed,
        },
        "time": _time_json(plan),
        "totals": _totals_json(plan),
        "checkpoint": {
            "size_bytes": int(plan.totals.checkpoint_bytes),
            "write_s": plan.totals.checkpoint_write_s,
            "interval_s": _finite(plan.totals.checkpoint_interval_s),
            "mtbf_s": _finite(plan.totals.mtbf_s),
        },
        "fixes": [
            {
                "overrides": list(f.overrides),
                "device_bytes": int(f.device_bytes),
                "step_s": f.step_s,
                "tokens_per_s": f.tokens_per_s,
                "global_batch_size": f.global_batch_size,
            }
            for f in plan.fixes
        ],
        "assumptions": list(plan.assumptions),
    }


def _layout_json(plan: Plan) -> dict[str, Any]:
    """layout: the parallel degrees and batch sizes."""
    lay = plan.layout
    return {
        "world_size": lay.world_size,
        "tp": lay.tp,
        "pp": lay.pp,
        "vpp": lay.vpp,
        "cp": lay.cp,
        "ep": lay.ep,
        "dp": lay.dp,
        "micro_batch_size": lay.micro_batch_size,
        "global_batch_size": lay.global_batch_size,
        "grad_accum": lay.grad_accum,
    }


def _memory_json(plan: Plan) -> dict[str, Any]:
    """memory: the heaviest rank's buckets in bytes, the verdict, and each pipeline stage."""
    mem = plan.memory
    h = mem.heaviest
    return {
        "weights_bytes": int(h.weights),
        "gradients_bytes": int(h.gradients),
        "optimizer_bytes": int(h.optimizer),
        "activations_bytes": int(h.activations),
        "buffers_bytes": int(h.buffers),
        "overhead_bytes": int(h.overhead),
        "allocated_bytes": int(h.allocated),
        "reserved_bytes": int(h.reserved),
        "device_bytes": int(h.device_total),
        "capacity_bytes": int(mem.capacity),
        "usable_bytes": int(mem.usable),
        "headroom": mem.headroom,
        "fits": mem.fits,
        "verdict": mem.verdict,
        "error_band": _band_json(plan.memory_band),
        "heaviest_stage": h.stage,
        "host_bytes_per_gpu": int(h.host_bytes),
        "host_bytes_per_node": int(h.host_bytes * plan.hardware.gpus_per_node),
        "build": build_json(plan.config, plan.layout, h),
        "stages": [
            {
                "stage": s.stage,
                "layers": s.layers,
                "in_flight": s.in_flight,
                "allocated_bytes": int(s.allocated),
                "device_bytes": int(s.device_total),
            }
            for s in mem.stages
        ],
    }


def _time_json(plan: Plan) -> dict[str, Any]:
    """time: the step time, its parts and pricing, throughput, MFU/HFU, each collective."""
    t = plan.time
    return {
        "step_s": t.step_s,
        "error_band": _band_json(plan.time_band),
        "pricing": pricing_json(plan),
        "tokens_per_s": t.tokens_per_s,
        "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
        "tflops_per_gpu": t.tflops_per_gpu,
        "hardware_tflops_per_gpu": t.hardware_tflops_per_gpu,
        "mfu": t.mfu,
        "hfu": t.hfu,
        "bubble_fraction": t.bubble_fraction,
        "compute_s": t.compute_s,
        "bubble_s": t.bubble_s,
        "exposed_comm_s": t.exposed_comm_s,
        "optimizer_s": t.optimizer_s,
        "collectives": [
            {
                "name": c.name,
                "kind": c.kind,
                "group": c.group,
                "group_size": c.group_size,
                "message_bytes": int(c.message_bytes),
                "calls_per_step": c.calls_per_step,
                "bus_gbps": c.bus_gbps,
                "time_s": c.time_s,
                "exposed_s": c.exposed_s,
            }
            for c in t.collectives
        ],
    }


def _totals_json(plan: Plan) -> dict[str, Any]:
    """totals: the whole training's steps, time, GPU-hours, cost and expected failures."""
    tot = plan.totals
    return {
        "steps": tot.steps,
        "train_s": tot.train_s,
        "gpu_hours": tot.gpu_hours,
        "cost_usd": tot.cost_usd,
        "expected_interruptions": tot.expected_interruptions,
        "lost_fraction": tot.lost_fraction,
        "expected_wall_s": tot.expected_wall_s if math.isfinite(tot.expected_wall_s) else None,
    }


def pricing_json(plan: Plan) -> dict[str, Any]:
    """time.pricing: the source of each part of the step time (profile or catalog)."""
    p = plan.profile
    return {
        "source": "profile" if p is not None else "published figures",
        "profile": None
        if p is None
        else {"path": p.path, "origin": p.origin, "created": p.created, "device": p.device},
        "parts": dict(plan.sources) if plan.sources else None,
        "note": plan.profile_note,
    }


def _band_json(band: ErrorBand | None) -> dict[str, object] | None:
    if band is None:
        return None
    return {
        "typical": band.typical,
        "worst": band.worst,
        "rows": band.rows,
        "regime": band.regime,
        "method": band.source,
    }
