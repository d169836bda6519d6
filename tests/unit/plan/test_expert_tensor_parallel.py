"""parallel.etp (Megatron-core's --expert-tensor-parallel-size): its rules, the flag, and what plan
derives from it (expert weights per rank, the expert group's placement).

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import pytest

from launcher.backends.common import expert_group_stride, expert_tensor_parallel
from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.planner import make_plan
from launcher.render.megatron_args import megatron_args
from launcher.validate.rules import check
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

# Mixtral 8x7B on 8 nodes of 8 H100: tp 2, pp 4, cp 2 -> dp 4; a stage's tp x cp x dp = 16 ranks,
# ep 8; expert hidden size 14336.
MIXTRAL = ["recipe=mixtral-8x7b", "cluster.num_nodes=8", "parallel.tp=2"]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def _etp_errors(c: LLMTrainConfig) -> list[str]:
    return [v.message for v in check(c) if v.is_error and "parallel.etp" in v.keys]


def test_null_is_tp_and_a_set_value_is_used() -> None:
    c = cfg(*MIXTRAL)
    assert expert_tensor_parallel(c, derive_layout(c)) == 2
    one = cfg(*MIXTRAL, "parallel.etp=1")
    assert expert_tensor_parallel(one, derive_layout(one)) == 1
    assert _etp_errors(one) == []
    # Megatron-core orders expert ranks expert-tensor first: ep neighbours etp apart.
    assert expert_group_stride(c, derive_layout(c)) == 2
    assert expert_group_stride(one, derive_layout(one)) == 1


def test_megatron_rules_with_values_that_work() -> None:
    # etp 4 x ep 8 = 32 does not divide 16; etp 1 and 2 do (1 x 8, 2 x 8).
    found = _etp_errors(cfg(*MIXTRAL, "parallel.etp=4"))
    assert len(found) == 1 and "valid etp: 1, 2" in found[0], found
    # etp 3: 24 does not divide 16, and 3 does not divide 14336 = 2^11 x 7.
    found = _etp_errors(cfg(*MIXTRAL, "parallel.etp=3"))
    assert len(found) == 2 and "expert hidden size 14336" in found[1], found
    assert _etp_errors(cfg(*MIXTRAL, "parallel.etp=0")) == ["parallel.etp=0: must be 1 or more"]


def test_engines_that_split_experts_over_tp_refuse_other_values() -> None:
    for backend in ("torch", "deepspeed"):
        found = _etp_errors(cfg(*MIXTRAL, f"backend={backend}", "parallel.etp=1"))
        assert len(found) == 1 and "use parallel.etp=null (or 2)" in found[0], found
        assert _etp_errors(cfg(*MIXTRAL, f"backend={backend}", "parallel.etp=2")) == []


def test_validate_exit_2_names_the_key() -> None:
    result = invoke("validate", *MIXTRAL, "parallel.etp=4")
    assert result.returncode == 2
    assert "parallel.etp=4 x parallel.ep=8" in " ".join(shown(result).split())
    assert "Traceback" not in shown(result)


def test_flag_rendered_only_when_it_differs_from_tp() -> None:
    args = megatron_args(cfg(*MIXTRAL, "parallel.etp=1"))
    i = args.index("--expert-tensor-parallel-size")
    assert args[i + 1] == "1"
    assert "--expert-tensor-parallel-size" not in megatron_args(cfg(*MIXTRAL))
    assert "--expert-tensor-parallel-size" not in megatron_args(cfg(*MIXTRAL, "parallel.etp=2"))


def test_expert_weights_per_rank_follow_etp() -> None:
    # Each rank holds experts / (ep x etp) of the expert weights: etp 1 doubles them against
    # etp 2 (8 experts over ep 8, each whole rather than split in two); the dense weights stay.
    two = make_plan(cfg(*MIXTRAL)).memory.stages[0]
    one = make_plan(cfg(*MIXTRAL, "parallel.etp=1")).memory.stages[0]
    # Mixtral's 8 experts per layer: 3 x 4096 x 14336 x 8 = 1.409e9 parameters a layer, 8 layers
    # on stage 0 (32 over pp 4): 11.27e9 over ep 8 = 1.409e9 a rank at etp 1, half at etp 2.
    expert_params_per_rank_etp1 = 3 * 4096 * 14336 * 8 * 8 / 8
    assert one.params - two.params == pytest.approx(expert_params_per_rank_etp1 / 2, rel=1e-6)
