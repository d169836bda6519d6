"""The per-operator compute model (launcher.plan.timing.kernels) and the step-time physics around
it.

Expected values are derived by hand in the comments, formula by formula.
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.composition.presets import model_preset
from launcher.config.layout import derive_layout
from launcher.config.schema import (
    BackendConfig,
    ClusterConfig,
    LLMTrainConfig,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.calibration.fitted import ATTN_HALF_SEQ, constants
from launcher.plan.planner import hardware_view, make_plan
from launcher.plan.timing.estimate import microbatch_compute_s, microbatch_time
from launcher.plan.timing.kernels import (
    ATTENTION_KERNEL_RATE,
    attention_efficiency,
    clock_factor,
    gemm_efficiency,
    gemm_time,
)

pytestmark = pytest.mark.unit


def test_gemm_efficiency_saturates_with_the_output_dimension() -> None:
    # MAMF 0.8, half_dim 64: d = 8192 -> 0.8 * 8192 / 8256 = 0.7938; d = 512 -> 0.8 * 512/576
    # = 0.7111; d = 64 -> 0.4.
    assert gemm_efficiency(8192, 0.8, 64) == pytest.approx(0.79380, rel=1e-4)
    assert gemm_efficiency(512, 0.8, 64) == pytest.approx(0.71111, rel=1e-4)
    assert gemm_efficiency(64, 0.8, 64) == pytest.approx(0.4)


def test_gemm_time_is_a_smooth_roofline() -> None:
    # 4096^3 GEMM on H100 (989.4e12 bf16, 3.35e12 B/s), MAMF 0.8, half_dim 0:
    # compute 2 * 4096^3 / (989.4e12 * 0.8) = 1.3744e11 / 7.9152e11 = 173.6 us;
    # memory 3 * 4096^2 * 2 B / 3.35e12 = 30.05 us; sqrt(173.6^2 + 30.05^2) = 176.2 us.
    flops = 2.0 * 4096**3
    t = gemm_time(flops, 4096, 4096, 4096, 989.4e12, 0.8, 0.0, 3.35e12, 2.0)
    assert t == pytest.approx(176.2e-6, rel=2e-3)
    # A short reduction dimension (k = 96, an eager attention score GEMM 2048 x 2048 x 96) is
    # memory-bound on an A100 (312e12, 2.039e12 B/s): per GEMM 8.05e8 FLOPs, compute 2.58 us
    # at 100%; bytes (2*2048*96 + 2048^2) * 2 = 9.17e6 -> 4.50 us; sqrt -> 5.19 us.
    flops = 2.0 * 2048 * 2048 * 96
    t = gemm_time(flops, 2048, 2048, 96, 312e12, 1.0, 0.0, 2.039e12, 2.0)
    assert t == pytest.approx(5.19e-6, rel=1e-2)


def test_attention_efficiency_formula() -> None:
    # H100 + Transformer Engine: benchmark rate 0.58 x fitted factor x s / (s + 256).
    c = constants("hopper")
    s = 4096.0
    expected = ATTENTION_KERNEL_RATE[("hopper", "te")] * c.attn_efficiency * s / (s + ATTN_HALF_SEQ)
    assert attention_efficiency(s, c, "te", "hopper") == pytest.approx(expected)
    # PyTorch SDPA's FA2 kernel reaches less of an H100 than cuDNN / TE does.
    assert attention_efficiency(s, c, "sdpa", "hopper") < attention_efficiency(s, c, "te", "hopper")
    # Shorter key blocks (s / cp per ring step) run at a lower rate.
    assert attention_efficiency(1024, c, "te", "hopper") < attention_efficiency(
        8192, c, "te", "hopper"
    )


def test_clock_factor_under_a_power_cap() -> None:
    # P ~ f^3: a 700 W board capped at 500 W runs at (500/700)^(1/3) = 0.8939 of its clock.
    assert clock_factor(500.0, 700.0) == pytest.approx(0.89390, rel=1e-4)
    assert clock_factor(None, 700.0) == 1.0
    assert clock_factor(800.0, 700.0) == 1.0


def _dense(hidden: int, layers: int = 8) -> LLMTrainConfig:
    model = ModelConfig(
        name=f"d{hidden}",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=hidden // 128,
        vocab_size=32000,
        seq_length=4096,
        activation="swiglu",
        norm="rmsnorm",
        position="rope",
        tie_embeddings=False,
    )
    return LLMTrainConfig(
        model=model,
        train=TrainConfig(micro_batch_size=1, global_batch_size=8, steps=1),
        cluster=ClusterConfig(gpu="h100-sxm", gpus_per_node=8),
        backend=BackendConfig(name="megatron"),
        zero=ZeroConfig(stage=1),
    )


def test_bigger_hidden_size_reaches_higher_gemm_efficiency() -> None:
    # Per executed FLOP, a model with h = 8192 computes faster than one with h = 1024: its GEMMs'
    # output tiles are fuller and element-wise bytes grow with h, FLOPs with h^2.
    small, big = _dense(1024), _dense(8192)
    per_flop = []
    for cfg in (small, big):
        plan = make_plan(cfg)
        tokens = 4096
        per_flop.append(plan.time.compute_s / (plan.flops.executed * tokens * 8 / 8))
    assert per_flop[1] < per_flop[0] * 0.9


def test_fp8_speeds_up_compute() -> None:
    base = dataclasses.replace(_dense(4096), model=model_preset("llama3-8b", seq_length=4096))
    fp8 = dataclasses.replace(base, precision=PrecisionConfig(name="fp8", fp8=True))
    t16, t8 = make_plan(base).time.compute_s, make_plan(fp8).time.compute_s
    assert t8 < 0.85 * t16


def test_tp_comm_overlap_hides_tensor_parallel_traffic() -> None:
    cfg = dataclasses.replace(
        _dense(8192, layers=16),
        parallel=ParallelConfig(tp=8, sequence_parallel=True),
        cluster=ClusterConfig(gpu="h100-sxm", gpus_per_node=8),
    )
    on = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, tp_comm_overlap=True))
    tp_off = next(c for c in make_plan(cfg).time.collectives if c.group == "tp")
    tp_on = next(c for c in make_plan(on).time.collectives if c.group == "tp")
    assert tp_off.exposed_s == pytest.approx(tp_off.time_s)
    assert tp_on.exposed_s < 0.5 * tp_off.exposed_s


def test_nvl72_groups_inside_the_rack_get_nvlink() -> None:
    # GB200 trays hold 4 GPUs but 72 share NVLink: a tp=4 x dp=16 data-parallel group (stride 4,
    # 64 GPUs) lies inside one rack and gets the 900 GB/s NVLink bus, not 16 x 50 GB/s of IB.
    cfg = dataclasses.replace(
        _dense(4096),
        parallel=ParallelConfig(tp=4),
        train=TrainConfig(micro_batch_size=1, global_batch_size=16, steps=1),
        cluster=ClusterConfig(gpu="gb200", num_nodes=16, gpus_per_node=4),
        zero=ZeroConfig(stage=1),
    )
    dp = [c for c in make_plan(cfg).time.collectives if c.group == "dp"]
    assert dp and all(c.bus_gbps == pytest.approx(900.0) for c in dp)


def test_power_cap_slows_the_step() -> None:
    cfg = _dense(4096)
    capped = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, power_limit_w=400.0))
    assert make_plan(capped).time.step_s > 1.1 * make_plan(cfg).time.step_s


def test_compile_reduces_non_gemm_time() -> None:
    cfg = dataclasses.replace(_dense(2048), backend=BackendConfig(name="torch"))
    compiled = dataclasses.replace(cfg, backend=BackendConfig(name="torch", compile=True))
    assert make_plan(compiled).time.compute_s < make_plan(cfg).time.compute_s


def test_search_bounds_hold_for_larger_micro_batches() -> None:
    # The layout search scales the one-sequence compute (and exposed comm) by the micro-batch
    # size: per token the bound must not exceed the exact time of any larger micro-batch.
    base = dataclasses.replace(
        _dense(4096),
        model=model_preset("mixtral-8x7b", seq_length=4096),
        parallel=ParallelConfig(tp=2, ep=4, sequence_parallel=True),
        cluster=ClusterConfig(gpu="h100-sxm", gpus_per_node=8),
    )
    one = dataclasses.replace(base, train=TrainConfig(micro_batch_size=1, global_batch_size=32))
    lay1 = derive_layout(one)
    hw = hardware_view(one)
    plan1 = make_plan(one)
    bound_c, _, _ = microbatch_compute_s(one, lay1, hw, plan1.flops)
    bound_t = microbatch_time(one, lay1, hw, plan1.flops)
    for mbs in (1, 2, 4):
        cfg = dataclasses.replace(
            base, train=TrainConfig(micro_batch_size=mbs, global_batch_size=32)
        )
        lay = derive_layout(cfg)
        exact = microbatch_time(cfg, lay, hw, plan1.flops, exact=True)
        assert bound_c * mbs <= exact.compute_s * (1 + 1e-9)
        assert (bound_t.compute_s + bound_t.exposed_s) * mbs <= (
            exact.compute_s + exact.exposed_s
        ) * (1 + 1e-9)
