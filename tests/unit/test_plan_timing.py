"""Compute time per micro-batch: the GEMM / non-GEMM split, derived by hand."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.plan.flops import flops_per_token
from launcher.plan.planner import hardware_view
from launcher.plan.timing import STEP_EFFICIENCY, microbatch_compute_s, stage_compute_flops

pytestmark = pytest.mark.unit


def compute_s(*overrides: str) -> tuple[float, float]:
    cfg = compose_config(["recipe=llama3-8b", *overrides]).config
    flops = flops_per_token(cfg.model, cfg.train.recompute)
    seconds, _, attn_share = microbatch_compute_s(
        cfg, derive_layout(cfg), hardware_view(cfg), flops
    )
    return seconds, attn_share


def test_without_fp8_compute_is_flops_over_peak_efficiency_and_step_factor() -> None:
    # bf16 on H100, one stage: t = F / (P * e * STEP_EFFICIENCY), whatever the attention share.
    cfg = compose_config(["recipe=llama3-8b"]).config
    hw, layout = hardware_view(cfg), derive_layout(cfg)
    assert hw.matmul_peak_flops == hw.peak_flops
    stage_flops, _ = stage_compute_flops(cfg, layout, flops_per_token(cfg.model, "selective"), 0)
    t, _ = compute_s()
    assert t == pytest.approx(
        stage_flops / (hw.peak_flops * hw.matmul_efficiency * STEP_EFFICIENCY)
    )


def test_fp8_speeds_up_only_the_linear_gemms() -> None:
    # With fp8 the linear layers (share 1 - a of the FLOPs) run at the fp8 peak, ~2 x bf16 on H100;
    # attention (a) and the non-GEMM part (1/STEP_EFFICIENCY - 1 of the GEMM time) do not:
    #   t_fp8 / t_bf16 = [(1 - a) x P16/P8 + a + (1/S - 1)] / (1/S)
    t_bf16, a = compute_s()
    t_fp8, a8 = compute_s("precision=fp8")
    assert a8 == pytest.approx(a)
    s = STEP_EFFICIENCY
    hw8 = hardware_view(compose_config(["recipe=llama3-8b", "precision=fp8"]).config)
    ratio = hw8.peak_flops / hw8.matmul_peak_flops  # 989.4 / 1978.9 on H100 SXM
    assert ratio == pytest.approx(0.5, rel=1e-3)
    expected = ((1 - a) * ratio + a + (1 / s - 1)) / (1 / s)
    assert t_fp8 / t_bf16 == pytest.approx(expected)
    # For Llama 3 8B that is a ~1.3x speed-up, not the 2x of the peaks.
    assert 1.2 < t_bf16 / t_fp8 < 1.5
