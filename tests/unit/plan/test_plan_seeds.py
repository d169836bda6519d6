"""The worked exercises of ../shared/seeds/001 (and friends), reproduced with the planner's own
functions. Expected values are derived by hand in the comments."""

from __future__ import annotations

import math

import pytest

from launcher.config.composition.presets import model_preset
from launcher.config.layout import derive_layout
from launcher.config.schema import (
    ClusterConfig,
    LLMTrainConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.memory.estimate import bytes_per_param
from launcher.plan.model_shape import ModelShape
from launcher.plan.planner import make_plan
from launcher.plan.schedule import bubble_fraction, pipeline_efficiency
from launcher.plan.timing.comm import collective_time, place_group
from launcher.plan.totals import lost_fraction, young_daly_interval

pytestmark = pytest.mark.unit

GPT3 = model_preset("gpt3-175b")
# 2 + 2 + 12 bytes per parameter (ZeRO paper): fp16 weights and gradients, fp32 master + Adam.
MIXED_16 = PrecisionConfig(name="fp16", compute_dtype="fp16", grad_dtype="fp16")


def test_seven_b_with_zero_1_2_3_on_4_gpus() -> None:
    # 7e9 params x 16 bytes = 112 GB unsharded. On 4 GPUs:
    # ZeRO-1: 2 + 2 + 12/4 = 7 bytes   -> 49 GB
    # ZeRO-2: 2 + (2 + 12)/4 = 5.5     -> 38.5 GB
    # ZeRO-3: 16/4 = 4                  -> 28 GB
    cfg = LLMTrainConfig(precision=MIXED_16)
    bpp = bytes_per_param(cfg)
    assert (bpp.weights, bpp.gradients, bpp.optimizer) == (2, 2, 12)
    n, d = 7e9, 4
    per_stage = {
        0: bpp.weights + bpp.gradients + bpp.optimizer,
        1: bpp.weights + bpp.gradients + bpp.optimizer / d,
        2: bpp.weights + (bpp.gradients + bpp.optimizer) / d,
        3: (bpp.weights + bpp.gradients + bpp.optimizer) / d,
    }
    expected = {0: 112e9, 1: 49e9, 2: 38.5e9, 3: 28e9}
    for stage, per_param in per_stage.items():
        assert n * per_param == pytest.approx(expected[stage])


def test_seven_b_zero_stages_through_the_planner() -> None:
    # Same exercise through make_plan (model states only: weights + gradients + optimizer).
    model = model_preset("llama2-7b", seq_length=2048)
    n = ModelShape(model).total_params()
    for stage, per_param in ((1, 7.0), (2, 5.5), (3, 4.0)):
        cfg = LLMTrainConfig(
            model=model,
            precision=MIXED_16,
            zero=ZeroConfig(stage=stage),
            cluster=ClusterConfig(gpu="a100-80gb", gpus_per_node=4),
        )
        h = make_plan(cfg).memory.heaviest
        assert h.weights + h.gradients + h.optimizer == pytest.approx(n * per_param)


def test_pipeline_efficiency_for_32_stages() -> None:
    # efficiency = m / (m + p - 1) with p = 32: 8/39, 16/47, 32/63, 64/95.
    p = 32
    assert pipeline_efficiency(p, 8) == pytest.approx(8 / 39)  # 20.5%
    assert pipeline_efficiency(p, 16) == pytest.approx(16 / 47)  # 34.0%
    assert pipeline_efficiency(p, 32) == pytest.approx(32 / 63)  # 50.8%
    assert pipeline_efficiency(p, 64) == pytest.approx(64 / 95)  # 67.4%
    # Passes 90% when m / (m + 31) >= 0.9  <=>  m >= 279.
    first = next(m for m in range(1, 1000) if pipeline_efficiency(p, m) >= 0.9)
    assert first == 279
    # The seed's small cases: p=4, m=4 -> 3/7; p=8, m=32 -> 7/39.
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(8, 32) == pytest.approx(7 / 39)
    # Interleaving with v chunks divides the bubble: (p-1)/(v m) of compute.
    assert bubble_fraction(8, 32, 4) == pytest.approx(7 / (4 * 32 + 7))


def test_70b_gradient_all_reduce_on_256_gpus_at_100_gbps() -> None:
    # 70e9 bf16 gradients = 140 GB; ring all-reduce moves 2 (n-1)/n of it per GPU:
    # 2 * 255/256 * 140e9 B / 12.5e9 B/s (100 Gb/s) = 22.3 s.
    t = collective_time("all-reduce", 70e9 * 2, 256, 100 / 8)
    assert t == pytest.approx(2 * 255 / 256 * 140e9 / 12.5e9)
    assert t == pytest.approx(22.3, abs=0.05)


def test_405b_layout_on_2048_gpus() -> None:
    # TP 8 (one node) x PP 16 x DP 16 = 2048; each GPU holds ~405e9 / 128 = 3.2e9 parameters,
    # 6.3 GB of bf16 weights.
    model = model_preset("llama3-405b")
    cfg = LLMTrainConfig(
        model=model,
        parallel=ParallelConfig(tp=8, pp=16, sequence_parallel=True),
        zero=ZeroConfig(stage=1),
        train=TrainConfig(global_batch_size=2048, recompute="full"),
        cluster=ClusterConfig(gpu="h100-sxm", num_nodes=256, gpus_per_node=8),
    )
    plan = make_plan(cfg)
    assert plan.layout.dp == 16
    assert plan.total_params == pytest.approx(405e9, rel=0.01)
    middle = plan.memory.stages[8]
    assert middle.params == pytest.approx(plan.total_params / 128, rel=0.08)
    assert middle.weights == pytest.approx(2 * plan.total_params / 128, rel=0.08)
    # TP within a node (NVLink), PP across nodes (stride tp*cp*dp = 128 GPUs).
    assert not place_group(8, 1, 8, 450, 50).spans_nodes
    assert place_group(16, 128, 8, 450, 50).bus_gbps == 50


def test_175b_on_1024_gpus_tp8_pp16_dp8() -> None:
    # 175e9 / (8 * 16) = 1.37e9 parameters per GPU: 2.73 GB fp16 weights, 2.73 GB fp16 grads,
    # 16.4 GB fp32 master + Adam without ZeRO (12 bytes), 2.05 GB with ZeRO-1 over dp = 8.
    cfg = LLMTrainConfig(
        model=GPT3,
        parallel=ParallelConfig(tp=8, pp=16),
        precision=MIXED_16,
        zero=ZeroConfig(stage=0),
        train=TrainConfig(global_batch_size=1536, recompute="full"),
        cluster=ClusterConfig(gpu="a100-80gb", num_nodes=128, gpus_per_node=8),
    )
    plan = make_plan(cfg)
    assert plan.layout.dp == 8
    mid = plan.memory.stages[8]  # 6 layers, no embedding
    per_gpu = 175e9 / 128
    assert mid.weights == pytest.approx(2 * per_gpu, rel=0.05)
    assert mid.gradients == pytest.approx(2 * per_gpu, rel=0.05)
    assert mid.optimizer == pytest.approx(12 * per_gpu, rel=0.05)
    zero1 = make_plan(
        LLMTrainConfig(**{**cfg.__dict__, "zero": ZeroConfig(stage=1)})
    ).memory.stages[8]
    assert zero1.optimizer == pytest.approx(12 * per_gpu / 8, rel=0.05)


def test_checkpoint_cadence_minimises_expected_lost_work() -> None:
    # Young/Daly: waste(tau) = C/tau + tau/(2M) is minimal at tau* = sqrt(2 C M).
    # C = 60 s, M = 3 h = 10800 s -> tau* = sqrt(2 * 60 * 10800) = 1138 s,
    # waste = 2 * C/tau* = 10.5%.
    c, m = 60.0, 10800.0
    tau = young_daly_interval(c, m)
    assert tau == pytest.approx(math.sqrt(2 * 60 * 10800))
    assert lost_fraction(tau, c, m) == pytest.approx(2 * c / tau)
    for other in (0.5 * tau, 0.9 * tau, 1.1 * tau, 2 * tau):
        assert lost_fraction(other, c, m) > lost_fraction(tau, c, m)


def test_llama3_failure_rate_default() -> None:
    # 419 interruptions in 54 days on 16,384 GPUs -> 16,384 GPUs for 54 days expect 419.
    from launcher.plan.totals import FAILURES_PER_GPU_HOUR

    expected = FAILURES_PER_GPU_HOUR * 54 * 24 * 16384
    assert expected == pytest.approx(419)


def test_layout_sanity() -> None:
    cfg = LLMTrainConfig(cluster=ClusterConfig(gpu="a100-80gb", num_nodes=2, gpus_per_node=8))
    assert derive_layout(cfg).dp == 16
