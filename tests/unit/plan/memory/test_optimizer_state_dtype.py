"""optim.state_dtype: Megatron-Core's precision-aware optimizer (Adam's moments in 16 bits, the
fp32 master as 16-bit remainders of bf16 weights), priced, rendered and refused where the engine
refuses it (launcher/backends/optimizer_precision.py, launcher/plan/memory/model_states.py)."""

from __future__ import annotations

import pytest

from launcher.backends import raw_refusals
from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.render.megatron_args import megatron_args

pytestmark = pytest.mark.unit

MEG = (
    "recipe=llama3-8b",
    "cluster=h100-80gb",
    "cluster.num_nodes=1",
    "backend=megatron",
    "zero.stage=1",
    "parallel.tp=2",
    "parallel.pp=1",
    "parallel.pp_layers=null",
)


def _stage(*overrides: str):  # type: ignore[no-untyped-def]
    return make_plan(compose_config([*MEG, *overrides]).config).memory.stages[0]


def test_bf16_moments_and_master_remainders_on_bf16_weights() -> None:
    plain, low = _stage(), _stage("optim.state_dtype=bf16")
    # fp32 Adam: master 4 + m 4 + v 4 = 12 bytes a parameter; the precision-aware optimizer on
    # bf16 weights: remainders 2 + m 2 + v 2 = 6, half; weights and gradients do not move.
    assert low.optimizer == pytest.approx(plain.optimizer * 6 / 12)
    assert (low.weights, low.gradients) == (plain.weights, plain.gradients)
    # fp16 moments weigh the same as bf16 ones.
    assert _stage("optim.state_dtype=fp16").optimizer == pytest.approx(low.optimizer)


def test_fp8_current_scaling_keeps_the_full_master() -> None:
    fp8 = ("precision=fp8", "backend.fp8_scaling=tensorwise")
    plain, low = _stage(*fp8), _stage(*fp8, "optim.state_dtype=bf16")
    # Not Megatron-Core's "no fp8 or delayed scaling" case: fp32 master 4 + m 2 + v 2 = 8 of 12.
    assert low.optimizer == pytest.approx(plain.optimizer * 8 / 12)
    # Delayed scaling (Megatron-Core's default recipe) keeps remainders: 6 of 12.
    delayed = _stage("precision=fp8", "optim.state_dtype=bf16")
    assert delayed.optimizer == pytest.approx(plain.optimizer * 6 / 12)
    # fp8 parameters are not bf16: FusedAdam keeps the whole fp32 master.
    gathered = _stage("precision=fp8", "precision.fp8_param_gather=true", "optim.state_dtype=bf16")
    assert gathered.optimizer == pytest.approx(plain.optimizer * 8 / 12)


def test_rendered_as_megatron_flags() -> None:
    args = megatron_args(compose_config([*MEG, "optim.state_dtype=bf16"]).config)
    at = args.index("--exp-avg-dtype")
    assert args[at + 1] == "bf16"
    assert args[args.index("--exp-avg-sq-dtype") + 1] == "bf16"
    assert args.count("--use-precision-aware-optimizer") == 1
    offloaded = megatron_args(
        compose_config([*MEG, "optim.state_dtype=bf16", "zero.offload_optimizer=cpu"]).config
    )
    assert offloaded.count("--use-precision-aware-optimizer") == 1
    assert "--exp-avg-dtype" not in megatron_args(compose_config(list(MEG)).config)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("optim.name=sgd",), "optim.name"),  # FusedAdam only (optimizer_config.py)
        (("zero.stage=0",), "zero.stage"),  # the distributed optimizer only
        (("zero.stage=3",), "zero.stage"),  # not with Megatron-FSDP
        # backend=torch keeps bf16 moments for adam/adamw (launcher/train/optim_states.py) only.
        (("backend=torch", "optim.name=sgd"), "optim.name"),
        (("backend=deepspeed", "parallel.tp=1"), "backend"),
    ],
)
def test_refused_where_the_engine_refuses_it(overrides: tuple[str, ...], named: str) -> None:
    cfg = compose_config([*MEG, "optim.state_dtype=bf16", *overrides]).config
    found = raw_refusals(cfg.backend.name, cfg)
    assert any(named in r.keys and "optim.state_dtype" in r.message for r in found), found
    assert not any(
        "optim.state_dtype" in r.message
        for r in raw_refusals(cfg.backend.name, compose_config([*MEG, *overrides]).config)
    )
