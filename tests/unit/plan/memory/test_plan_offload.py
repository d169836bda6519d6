"""Offload as each engine does it (launcher/plan/memory/offload.py): what stays on the GPU, what the
host holds, against DeepSpeed's own estimator."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.plan.memory.estimate import GIB
from launcher.plan.planner import make_plan

pytestmark = pytest.mark.unit

# The example: Llama 3 70B, ZeRO-3 with optimizer and parameter offload on 8 A100s.
DS70 = (
    "recipe=llama3-70b",
    "cluster=a100-80gb",
    "cluster.num_nodes=1",
    "parallel.tp=1",
    "parallel.pp=1",
    "parallel.sequence_parallel=false",
    "backend=deepspeed",
    "zero.stage=3",
    "zero.offload_optimizer=cpu",
    "zero.offload_params=cpu",
    "train.recompute=full",
)


def test_deepspeed_zero3_offload_keeps_fp32_gradients_on_the_host() -> None:
    plan = make_plan(compose_config(list(DS70)).config)
    stage = plan.memory.heaviest
    params = stage.params  # one GPU's parameters before sharding (the whole 70B model here)
    # Nothing of the model states stays on the GPU (it showed 32.9 GiB of fp32 gradients).
    assert stage.weights == 0 and stage.gradients == 0 and stage.optimizer == 0
    assert plan.memory.fits
    # Host per GPU: a 1/8 partition of 2 (bf16 weights) + 4 (fp32 gradients) + 12 (fp32 master,
    # Adam m and v) = 18 bytes per parameter; per node x 8 = 18 bytes x all parameters.
    assert stage.host_bytes == pytest.approx(18 * params / 8)
    per_node = stage.host_bytes * 8
    assert 1150 < per_node / GIB < 1200  # 70.6B x 18 = 1.27 TB


def test_host_memory_matches_deepspeeds_estimator() -> None:
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    plan = make_plan(compose_config(list(DS70)).config)
    params = plan.memory.heaviest.params
    cpu_mem, _, _ = stage3.estimate_zero3_model_states_mem_needs(
        int(params), 1, num_gpus_per_node=8, num_nodes=1, cpu_offload=True,
        cpu_offload_params=True, zero_init=True,
    )  # fmt: skip
    per_node = plan.memory.heaviest.host_bytes * 8
    # DeepSpeed: params x 18 x 1.5 (its additional_buffer_factor margin).
    assert cpu_mem == pytest.approx(per_node * 1.5, rel=1e-6)
    assert any("estimate_zero3_model_states_mem_needs" in a for a in plan.assumptions)


def test_deepspeed_stage1_offload_adds_the_fp32_partition_on_the_host() -> None:
    base = ["recipe=llama3-8b", "cluster.num_nodes=1", "backend=deepspeed", "zero.stage=1"]
    on = make_plan(compose_config([*base, "zero.offload_optimizer=cpu"]).config).memory.heaviest
    off = make_plan(compose_config(base).config).memory.heaviest
    # ZeRO-1 keeps its unsharded gradients on the GPU; the host gets the optimizer states
    # (12 bytes / 8) and the fp32 gradient partition (4 bytes / 8) per parameter.
    assert on.gradients == off.gradients
    assert on.host_bytes == pytest.approx((12 + 4) * on.params / 8)


def test_fsdp2_cpu_offload_moves_the_gradients_too() -> None:
    base = ["recipe=llama3-8b", "cluster.num_nodes=1", "backend=torch", "zero.stage=3"]
    on = compose_config([*base, "zero.offload_params=cpu", "zero.offload_optimizer=cpu"]).config
    stage = make_plan(on).memory.heaviest
    assert stage.gradients == 0 and stage.weights == 0 and stage.optimizer == 0
    assert stage.host_bytes > 0


# --- fp8 parameters (launcher/backends/fp8_params.py) ---------------------------------------------

MEG_FP8 = (
    "recipe=llama3-70b",
    "backend=megatron",
    "precision=fp8",
    "zero.stage=1",
    "parallel.pp_layers=null",
)


def test_fp8_param_gather_halves_the_weights_and_the_gather_bucket() -> None:
    from launcher.config.layout import derive_layout
    from launcher.plan.memory.estimate import stage_buffers

    plain = compose_config(list(MEG_FP8)).config
    fp8 = compose_config([*MEG_FP8, "precision.fp8_param_gather=true"]).config
    a, b = make_plan(plain).memory.stages[0], make_plan(fp8).memory.stages[0]
    # Transformer Engine without it: bf16 weight (2) + fp8 copy (1) + its transpose (1) = 4 bytes
    # for its linear layers, 2 for the embedding (and output layer), which stay bf16; with it:
    # the fp8 weight and its transpose only, 2 bytes, the embedding's bf16 2.
    lay0 = derive_layout(plain)
    m = plain.model
    vocab = m.vocab_size * m.hidden_size / lay0.tp  # stage 0 holds the embedding
    if lay0.pp == 1:
        vocab += m.vocab_size * m.hidden_size / lay0.tp + m.hidden_size  # output layer, norm
    assert b.weights == pytest.approx(2 * b.params)
    assert a.weights == pytest.approx(4 * a.params - 2 * vocab)
    assert b.optimizer == a.optimizer and b.gradients == a.gradients
    # The distributed optimizer's all-gather bucket (zero 1) carries 1 byte per element, not 2.
    bucket = plain.backend.allgather_bucket_size
    lay = derive_layout(plain)
    drop = stage_buffers(plain, lay) - stage_buffers(fp8, derive_layout(fp8))
    assert 0 < drop <= bucket
    from launcher.render.megatron_args import megatron_args

    assert "--fp8-param-gather" in megatron_args(fp8)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("precision=bf16",), "precision"),  # fp8_param needs fp8 mode (transformer_config.py)
        (("zero.stage=0",), "zero.stage"),  # needs the distributed optimizer or Megatron-FSDP
        (("backend=torch", "zero.stage=3"), "backend"),  # torchao keeps bf16 weights
    ],
)
def test_fp8_param_gather_refusals(overrides: tuple[str, ...], named: str) -> None:
    from launcher.backends import raw_refusals

    cfg = compose_config([*MEG_FP8, "precision.fp8_param_gather=true", *overrides]).config
    found = raw_refusals(cfg.backend.name, cfg)
    assert any(named in r.keys and "fp8_param_gather" in r.message for r in found), found


# Issue #40's acceptance command (optim.in_backward asked: grad_clip 0, gbs = mbs, compose).
RTX7B = (
    "model=llama2-7b",
    "finetune=full",
    "cluster=rtx4090",
    "optim.name=adamw8bit",
    "optim.in_backward=true",
    "train.recompute=full",
    "train.micro_batch_size=4",
    "model.seq_length=2048",
)
PARAMS_7B = 6_738_415_616  # 32 x 202,383,360 + 2 x 32,000 x 4,096 + 4,096 (final norm)
LARGEST_7B = 32_000 * 4_096  # the embedding / output layer: the largest tensor's states


def test_optim_offload_moves_the_moments_to_the_host_and_prices_pcie() -> None:
    from launcher.plan.timing.estimate import PCIE_GBPS

    pure = ("precision=bf16-pure",)
    paged = make_plan(compose_config([*RTX7B, *pure, "optim.offload=cpu"]).config)
    plain = make_plan(compose_config([*RTX7B, *pure]).config)
    on, off = paged.memory.heaviest, plain.memory.heaviest
    moments = 2 * (1 + 4 / 256)  # 8-bit m and v: a code a value, one fp32 scale a 256-block
    # Host: every parameter's moments, 6,738,415,616 x 2.03125 = 13.69e9 B = 12.75 GiB.
    assert on.host_bytes == pytest.approx(PARAMS_7B * moments)
    assert on.host_bytes / GIB == pytest.approx(12.75, abs=0.01)
    assert off.host_bytes == 0
    # GPU: the largest tensor's moments alone, 131,072,000 x 2.03125 = 0.25 GiB (bf16-pure has
    # no master: the whole bucket is the moments).
    assert off.optimizer == pytest.approx(PARAMS_7B * moments)
    assert on.optimizer == pytest.approx(LARGEST_7B * moments)
    # Weights, gradients and activations do not move.
    assert (on.weights, on.gradients, on.activations) == (
        off.weights,
        off.gradients,
        off.activations,
    )
    # Time: 2 x 13.69e9 B down and up at 25 GB/s = 1.095 s, plus the states' extra HBM pass
    # (read + write of the moved bytes, 2 x 13.69e9 / 1008e9 = 27 ms) on the step.
    pcie = 2 * PARAMS_7B * moments / (PCIE_GBPS * 1e9)
    assert pcie == pytest.approx(1.095, abs=0.001)
    hbm_left = 2 * (off.optimizer - on.optimizer) / 1008e9  # now read at the host's copy
    assert paged.time.optimizer_s - plain.time.optimizer_s == pytest.approx(pcie, abs=hbm_left)
    assert paged.time.step_s > plain.time.step_s + 1.0
    text = " | ".join(paged.savers)
    assert "optim.offload=cpu" in text and "12.75 GiB" in text and "+1.09 s" in text
    # The acceptance command's closest honest form fits: bf16-pure and the states on the host.
    assert paged.memory.heaviest.device_total < 24 * GIB
    # Mixed precision keeps the fp32 parameter (the master) on the GPU: 4 B x 6.74e9 = 25.1 GiB
    # beside 12.6 GiB of bf16 copies priced: no offload of the moments alone makes it fit.
    mixed = make_plan(compose_config([*RTX7B, "precision=bf16", "optim.offload=cpu"]).config)
    assert mixed.memory.heaviest.optimizer == pytest.approx(PARAMS_7B * 4 + LARGEST_7B * moments)
    assert not mixed.memory.fits


def test_optim_offload_moves_nothing_on_the_cpu_and_lora_moves_the_adapters() -> None:
    cpu = make_plan(compose_config(["optim.offload=cpu", "cluster=cpu"]).config)
    assert cpu.memory.heaviest.host_bytes == 0
    assert "nothing to move" in " | ".join(cpu.savers)
    lora = [*RTX7B[:1], "finetune=lora", "cluster=rtx4090", "train.micro_batch_size=1"]
    on = make_plan(compose_config([*lora, "optim.offload=cpu"]).config).memory.heaviest
    off = make_plan(compose_config(lora).config).memory.heaviest
    # Every adapter's fp32 m and v (8 B a parameter, no master) go to the host; the largest
    # adapter's stay: rank 16 x 4,096 (q, k, v and o are 4,096 wide) x 8 B = 524,288 B.
    assert on.host_bytes == pytest.approx(off.optimizer) and on.host_bytes > 0
    assert on.optimizer == pytest.approx(16 * 4096 * 8)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("parallel.tp=2", "cluster.gpus_per_node=2"), "parallel.tp"),
        (("zero.stage=1", "cluster.gpus_per_node=2"), "zero.stage"),
        (("precision=fp16",), "precision"),
        (("backend=deepspeed",), "backend"),
    ],
)
def test_optim_offload_refusals_name_the_key(overrides: tuple[str, ...], named: str) -> None:
    from launcher.backends import raw_refusals

    cfg = compose_config(["optim.offload=cpu", *overrides]).config
    refusals = raw_refusals(cfg.backend.name, cfg)
    assert any(
        "optim.offload" in r.keys and named in r.keys and "optim.offload=none" in r.message
        for r in refusals
    ), [r.message for r in refusals]
