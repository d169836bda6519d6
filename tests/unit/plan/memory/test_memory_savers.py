"""The fine-tuners' memory savers as the planner prices them (plan/memory/memory_savers.py),
the engines' refusals (launcher/backends/memory_savers.py), the GPUs people own and one verdict.
Expected bytes are written term by term in the comments (pure; no torch)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from launcher.backends import raw_refusals
from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.plan.hardware.lookup import cluster_gpu, get_gpu
from launcher.plan.memory import memory_savers
from launcher.plan.memory.estimate import GIB, MemoryPlan, StageMemory
from launcher.plan.memory.model_states import bytes_per_param, moment_bytes, stage_states
from launcher.plan.memory.stage_activations import activation_parts, offloaded_bytes
from launcher.plan.planner import make_plan
from launcher.search.layouts import _given
from launcher.validate.rules import check

pytestmark = pytest.mark.unit

# Llama 2 7B full fine-tuning on one RTX 4090, as issue #40's acceptance command asks.
SEVEN_B = [
    "model=llama2-7b",
    "finetune=full",
    "cluster=rtx4090",
    "train.recompute=full",
    "train.micro_batch_size=4",
    "train.global_batch_size=4",
    "model.seq_length=2048",
    "train.steps=10",
    "zero.stage=0",
]
PARAMS_7B = 6_738_415_616  # 32 x 202,383,360 + 2 x 32,000 x 4,096 + 4,096 (final norm)


def _cfg(*overrides: str):  # type: ignore[no-untyped-def]
    return compose_config([*SEVEN_B, *overrides]).config


def test_quantized_adam_states_are_codes_plus_one_fp32_scale_a_block() -> None:
    # 8-bit: m and v, 1 byte a value + 4 bytes per 256-value block each: 2 x 1.015625.
    assert moment_bytes(_cfg("optim.name=adamw8bit")) == pytest.approx(2.03125)
    # 4-bit: half a byte a value + 4 bytes per 128-value block, twice: 2 x 0.53125.
    assert moment_bytes(_cfg("optim.name=adamw4bit")) == pytest.approx(1.0625)
    # bf16 states: 2 moments x 2 bytes; fp32: 2 x 4.
    assert moment_bytes(_cfg("optim.state_dtype=bf16")) == 4.0
    assert moment_bytes(_cfg()) == 8.0


def test_pure_bf16_is_two_bytes_of_weights_and_gradients_no_master() -> None:
    pure = bytes_per_param(_cfg("precision=bf16-pure"))
    # bf16 weight 2 + bf16 gradient 2 + Adam's m and v in the weights' dtype (torch's
    # zeros_like(param)) 2 x 2; no fp32 master: 8 bytes, against mixed precision's 2 + 4 + 12.
    assert (pure.weights, pure.gradients, pure.optimizer) == (2.0, 2.0, 4.0)
    mixed = bytes_per_param(_cfg("precision=bf16"))
    assert (mixed.weights, mixed.gradients, mixed.optimizer) == (2.0, 4.0, 12.0)
    # The master_weights key says the same as the option.
    assert bytes_per_param(
        _cfg("precision=bf16", "precision.master_weights=false", "precision.grad_dtype=bf16")
    ) == (pure)


def test_in_backward_holds_the_largest_tensors_gradient_only() -> None:
    cfg = _cfg("precision=bf16-pure", "optim.in_backward=true", "optim.grad_clip=0")
    states = stage_states(cfg, derive_layout(cfg), 0)
    # The output layer (untied) is the largest tensor: 32,000 x 4,096 values, bf16 gradients.
    assert states.gradients == 32_000 * 4_096 * 2
    plain = stage_states(_cfg("precision=bf16-pure"), derive_layout(cfg), 0)
    assert plain.gradients == PARAMS_7B * 2  # every gradient, 2 bytes


def test_activation_offload_keeps_two_layers_on_the_gpu_and_prices_pcie() -> None:
    base = _cfg()
    off = _cfg("train.activation_offload=true")
    layout = derive_layout(base)
    kept = activation_parts(base, layout, 0).kept
    # Full recompute keeps each layer's input, b x s x h bf16: 4 x 2048 x 4096 x 2 a layer.
    per_layer = 4 * 2048 * 4096 * 2
    assert kept == pytest.approx(32 * per_layer)
    assert activation_parts(off, layout, 0).kept == pytest.approx(2 * per_layer)
    # Every layer's input crosses PCIe (the hooks copy each saved tensor out as the forward makes
    # it, the two on the device included: they are the ones in flight), not the 30 the device
    # does not hold: 32 x 64 MiB = 2 GiB each way.
    assert offloaded_bytes(off, layout, 0) == pytest.approx(32 * per_layer)
    assert offloaded_bytes(base, layout, 0) == 0.0
    # On the CPU there is nowhere to move them: nothing saved, nothing priced.
    cpu = dataclasses.replace(off, cluster=dataclasses.replace(off.cluster, gpu="cpu"))
    assert activation_parts(cpu, layout, 0).kept == pytest.approx(kept)
    # 2 GiB over 25 GB/s = 85.9 ms each way; a 40 ms forward share hides 40 ms of the copy
    # out, a 120 ms backward all of the copy back (full recompute: forward 1/4 of 160 ms).
    one_way = 32 * per_layer / 25e9
    exposed = memory_savers.offload_exposed_s(32 * per_layer, 0.160, "full", 25.0)
    assert exposed == pytest.approx(one_way - 0.040)


def test_each_saver_is_named_in_the_plan() -> None:
    plan = make_plan(
        _cfg(
            "precision=bf16-pure",
            "optim.name=adamw4bit",
            "optim.in_backward=true",
            "optim.grad_clip=0",
            "train.activation_offload=true",
        )
    )
    text = " | ".join(plan.savers)
    for word in ("bf16-pure", "adamw4bit", "in backward", "offloaded to host"):
        assert word in text
    # Each saver lowers the planned memory against plain mixed-precision AdamW.
    assert plan.memory.heaviest.allocated < make_plan(_cfg()).memory.heaviest.allocated / 4


def test_savers_are_refused_where_they_cannot_hold() -> None:
    def keys(*overrides: str) -> set[str]:
        cfg = _cfg(*overrides)
        return {k for r in raw_refusals(cfg.backend.name, cfg) for k in r.keys}

    # clipping needs every gradient (asked alone, in_backward brings grad_clip=0: compose)
    assert "optim.grad_clip" in keys("optim.in_backward=true", "optim.grad_clip=1")
    assert "train.grad_accum" in keys(
        "optim.in_backward=true", "optim.grad_clip=0", "train.global_batch_size=8"
    )
    assert "cluster.gpus_per_node" in keys(
        "optim.in_backward=true",
        "optim.grad_clip=0",
        "cluster.gpus_per_node=2",
        "train.global_batch_size=8",
    )
    assert keys("optim.in_backward=true", "optim.grad_clip=0") == set()
    assert "backend" in keys("backend=deepspeed", "train.activation_offload=true")
    assert "precision.master_weights" in keys("backend=deepspeed", "precision=bf16-pure")
    assert "optim.state_dtype" in keys("optim.name=sgd", "optim.state_dtype=bf16")
    assert "optim.name" in keys("backend=deepspeed", "optim.name=adamw8bit")


def test_owned_gpus_and_a_gpu_described_by_keys() -> None:
    assert get_gpu("rtx4090").peak_tflops["bf16"] == 165.2  # fp32 accumulate, dense
    assert get_gpu("rtx4090").memory_bytes == 24564 * 2**20
    cfg = _cfg(
        "cluster.gpu=custom",
        "cluster.gpu_memory_gib=24",
        "cluster.gpu_bf16_tflops=165.2",
        "cluster.gpu_memory_gbps=1008",
    )
    gpu = cluster_gpu(cfg.cluster)
    assert (gpu.memory_bytes, gpu.peak_tflops["bf16"], gpu.memory_bandwidth_gbps) == (
        24 * GIB,
        165.2,
        1008.0,
    )
    missing = _cfg("cluster.gpu=custom", "cluster.gpu_memory_gib=24")
    problems = [v for v in check(missing) if v.is_error and "cluster.gpu_bf16_tflops" in v.keys]
    assert problems and "cluster.gpu_memory_gbps" in problems[0].message


def _stage(total: float) -> StageMemory:
    return StageMemory(0, 1, 0, total, 0, 0, 0, 0, 0.0, 1, 0.0, fragmentation=1.0)


def test_above_the_gpus_memory_the_verdict_is_does_not_fit_never_tight() -> None:
    # 80 GiB, 10% headroom: usable 72; the memory band (8.8% or 45.6%) never widens the word.
    assert MemoryPlan((_stage(70 * GIB),), 80 * GIB, 0.1, band=0.088).verdict == "fits"
    assert MemoryPlan((_stage(79 * GIB),), 80 * GIB, 0.1, band=0.088).verdict == "tight"
    # 84 GiB allocated on 80: does not fit (the band rule called it tight: 84 x 0.912 = 76.6).
    assert MemoryPlan((_stage(84 * GIB),), 80 * GIB, 0.1, band=0.088).verdict == "does_not_fit"
    # 110.6 GiB on 80 (issue #40), even with a 45.6% band.
    assert MemoryPlan((_stage(110.6 * GIB),), 80 * GIB, 0.1, band=0.456).verdict == "does_not_fit"


# Fine-tuning layouts: models x methods x GPUs x micro-batches x recompute x savers (216).
_BASES = ("model=llama2-7b", "model=llama3-1b")
_VARIANTS = list(
    itertools.product(
        ("full", "lora", "qlora"),
        ("rtx4090", "l40s", "a100-80gb"),
        (1, 8),
        ("none", "full"),
        ("adamw", "adamw8bit", "offload"),
    )
)


def _variant(base, method, gpu, mbs, recompute, saver):  # type: ignore[no-untyped-def]
    """`base` with one layout's keys replaced (composed once: the test stays in seconds)."""
    r = dataclasses.replace
    train = r(base.train, micro_batch_size=mbs, global_batch_size=8, recompute=recompute)
    train = r(train, activation_offload=saver == "offload")
    optim = r(base.optim, name="adamw" if saver == "offload" else saver)
    ft = r(base.finetune, name=method, targets=["all-linear"] if method == "qlora" else ["q", "v"])
    cluster = r(base.cluster, gpu=gpu, name=gpu)
    return r(base, train=train, optim=optim, finetune=ft, cluster=cluster)


def test_plan_and_search_say_the_same_verdict_on_fine_tuning_layouts() -> None:
    words = {"fits": "fits", "tight": "tight", "does_not_fit": "does not fit"}
    seen = set()
    for model in _BASES:
        base = compose_config(
            [model, "cluster=rtx4090", "zero.stage=0", "model.seq_length=2048", "train.steps=10"]
        ).config
        for variant in _VARIANTS:
            cfg = _variant(base, *variant)
            plan = make_plan(cfg, with_fixes=False)
            _, status = _given(cfg, 0.10)
            assert status == words[plan.memory.verdict], (model, variant)
            # does not fit exactly when what must be resident exceeds the GPU's memory.
            need = max(s.allocated + s.overhead for s in plan.memory.stages)
            above = need > plan.memory.capacity
            assert (plan.memory.verdict == "does_not_fit") == above, (model, variant)
            seen.add(plan.memory.verdict)
    assert len(_BASES) * len(_VARIANTS) >= 200 and seen == {"fits", "tight", "does_not_fit"}
