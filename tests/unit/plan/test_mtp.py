"""model.mtp_layers: DeepSeek-V3's multi-token prediction (Megatron-Core --mtp-num-layers) as
plan prices it and validate accepts it, with Megatron-Core's layout rules for its "m".

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.pipeline_split import SplitError, SplitKeys, megatron_split, mtp_stage
from launcher.config.schema import LLMTrainConfig
from launcher.plan.flops import flops_per_token
from launcher.plan.memory.estimate import stage_params
from launcher.plan.model_shape import ModelShape
from launcher.plan.planner import make_plan
from launcher.render.megatron_args import megatron_args
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

# A small MoE on Megatron: 4 layers (the first dense), 8 experts top-2, pp 2 on 2 nodes of 8.
MOE = [
    "recipe=tiny",
    "backend=megatron",
    "cluster=h100-80gb",
    "cluster.num_nodes=2",
    "parallel.pp=2",
    "precision=bf16",
    "model.tie_embeddings=false",
    "model.num_experts=8",
    "model.moe_top_k=2",
    "model.moe_dense_layers=1",
    "model.norm=rmsnorm",
]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def test_module_parameters_by_hand() -> None:
    # tiny: h 128, ffn 512 (GELU: 2 x 128 x 512 + biases), the last layer is an MoE layer.
    # One module = that MoE layer + the 2h -> h projection (2 x 128 x 128 = 32,768) + three
    # RMSNorms (3 x 128 = 384).
    c = cfg(*MOE, "model.mtp_layers=1")
    shape = ModelShape(c.model)
    assert shape.mtp_is_moe
    assert shape.mtp_module_params() == shape.moe_layer_params() + 32_768 + 384
    base = ModelShape(cfg(*MOE).model)
    assert shape.total_params() - base.total_params() == shape.mtp_module_params()
    # Active: the module's idle experts (8 - 2) do not count.
    idle = 6 * shape.expert_params()
    assert shape.active_params() - base.active_params() == shape.mtp_module_params() - idle


def test_flops_count_the_module_and_its_head() -> None:
    # Per token, forward + backward: 6 x (the module's active parameters + the head's V x h
    # once more), and one more attention core.
    c, b = cfg(*MOE, "model.mtp_layers=1"), cfg(*MOE)
    shape = ModelShape(c.model)
    active_module = shape.mtp_module_params() - 6 * shape.expert_params()
    head = c.model.vocab_size * c.model.hidden_size
    with_mtp, without = flops_per_token(c.model, "none"), flops_per_token(b.model, "none")
    assert with_mtp.matmul - without.matmul == pytest.approx(6 * (active_module + head))
    assert with_mtp.attention == pytest.approx(without.attention * 5 / 4)


def test_layout_rules_follow_megatron_core() -> None:
    # 4 layers over pp 2: the m after the last t, as many m as modules.
    keys = SplitKeys(layout="Ett|ttmL", mtp=1)
    assert megatron_split(4, 2, 1, keys) == (2, 2)
    assert mtp_stage("Ett|ttmL", 2, 1) == 1
    # A stage of its own for the module (Megatron-Bridge's standalone MTP stage): pp 3.
    assert megatron_split(4, 3, 1, SplitKeys(layout="Ett|tt|mL", mtp=1)) == (2, 2, 0)
    assert mtp_stage("Ett|tt|mL", 3, 1) == 2
    # Interleaved: virtual stage 3 of pp 2 is stage 1.
    assert mtp_stage("Et|t|t|tmL", 2, 1) == 1
    # Without a layout: the last stage; without modules: none.
    assert mtp_stage(None, 4, 1) == 3 and mtp_stage("Ett|ttL", 2, 0) is None
    for text, mtp, words in (
        ("Ett|ttL", 1, "as many m as model.mtp_layers=1 (it has 0)"),
        ("Ett|ttmmL", 1, "as many m as model.mtp_layers=1 (it has 2)"),
        ("Ettm|ttL", 1, "every t before the first m"),
        ("Ett|ttmL", 0, "set model.mtp_layers=1"),
    ):
        with pytest.raises(SplitError, match="m") as err:
            megatron_split(4, 2, 1, SplitKeys(layout=text, mtp=mtp))
        assert words in err.value.message, err.value.message


def test_memory_and_time_of_the_stage_holding_it() -> None:
    # pp 2, no layout: the modules sit on the last stage, which gains the module's parameters
    # (its experts over ep 1, the rest dense), one more layer of activations and one more
    # logits buffer; stage 0 is unchanged.
    c, b = cfg(*MOE, "model.mtp_layers=1"), cfg(*MOE)
    shape = ModelShape(c.model)
    lay = derive_layout(c)
    assert stage_params(c, lay, 0) == stage_params(b, derive_layout(b), 0)
    last, base_last = stage_params(c, lay, 1), stage_params(b, derive_layout(b), 1)
    routed = shape.expert_params() * 8
    assert last.expert - base_last.expert == pytest.approx(routed)
    assert last.dense - base_last.dense == pytest.approx(shape.mtp_module_params() - routed)
    plan, base_plan = make_plan(c), make_plan(b)
    assert plan.memory.stages[0].activations == base_plan.memory.stages[0].activations
    assert plan.memory.stages[1].activations > base_plan.memory.stages[1].activations
    # Time: stage 1 computes one more MoE layer and the output head and loss once more.
    from launcher.plan.planner import hardware_view
    from launcher.plan.timing.estimate import stage_compute_parts

    hw = hardware_view(c)
    s0, s1 = (stage_compute_parts(c, lay, hw, s) for s in (0, 1))
    b0, b1 = (stage_compute_parts(b, derive_layout(b), hw, s) for s in (0, 1))
    assert s0 == b0
    assert s1.linear_s > b1.linear_s and s1.attention_s > b1.attention_s
    assert s1.other_gemm_s > b1.other_gemm_s  # the head's GEMM (and the router) once more


def test_rendered_and_refused_where_not_run() -> None:
    args = megatron_args(cfg(*MOE, "model.mtp_layers=1"))
    i = args.index("--mtp-num-layers")
    assert args[i + 1] == "1"
    assert "--mtp-num-layers" not in megatron_args(cfg(*MOE))
    torch_run = invoke("validate", "recipe=tiny", "model.mtp_layers=1")
    assert torch_run.returncode == 2
    assert "use model.mtp_layers=0, or backend=megatron" in " ".join(shown(torch_run).split())
    negative = invoke("validate", *MOE, "model.mtp_layers=-1")
    assert negative.returncode == 2 and "model.mtp_layers" in shown(negative)


def test_expert_overlap_takes_one_module_at_most() -> None:
    from launcher.backends import raw_refusals

    base = [*MOE, "cluster.num_nodes=1", "parallel.pp=1", "parallel.ep=8"]
    base += ["backend.moe_dispatcher=alltoall", "backend.moe_comm_overlap=true"]
    c = cfg(*base, "model.mtp_layers=2")
    found = [r for r in raw_refusals("megatron", c) if "model.mtp_layers" in r.keys]
    assert len(found) == 1 and "use model.mtp_layers=1" in found[0].message
    one = cfg(*base, "model.mtp_layers=1")
    assert not [r for r in raw_refusals("megatron", one) if "model.mtp_layers" in r.keys]
