"""backend.moe_dispatcher: its default per backend, the refusals, Megatron-LM's flags, and the
price of each dispatcher (launcher/plan/timing/comm.py, launcher/plan/timing/estimate.py).

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.backends import raw_refusals
from launcher.backends.common import moe_dispatcher
from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from launcher.plan.planner import make_plan
from launcher.plan.timing.comm import collective_time, expert_alltoall_bus_gbps, place_group
from launcher.render.megatron_args import megatron_args
from launcher.search.layouts import fixed_keys, search
from tests.cli import invoke, shown
from tests.unit.plan.timing.test_plan_moe_time import _moe

pytestmark = pytest.mark.unit

# A small MoE on one node of 4 GPUs (any backend runs it with ep 1).
SMALL_MOE = ["recipe=tiny", "model.num_experts=4", "model.moe_top_k=2"]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def with_dispatcher(c: LLMTrainConfig, dispatcher: str | None) -> LLMTrainConfig:
    return dataclasses.replace(c, backend=dataclasses.replace(c.backend, moe_dispatcher=dispatcher))


def test_bus_bandwidth_of_each_dispatcher_by_hand() -> None:
    # ep 64 over 8 nodes of 8 H100s (NVLink 450 GB/s, one 50 GB/s NIC per GPU), top_k 8.
    # collective_time charges 8 x 63/64 = 7.875 bytes per token byte; NVLink moves them in
    # 7.875 / 450 = 0.0175 s per GB.
    # flex: 7 x (1 - (7/8)^8) = 4.595 remote nodes per token, 4.595 / 50 = 0.0919 s per GB over
    # the NIC: bus 7.875 / 0.0919 = 85.70 GB/s.
    # alltoall: 8 x (64 - 8)/64 = 7.0 copies leave the node, 7.0 / 50 = 0.14 s per GB: bus
    # 7.875 / 0.14 = 56.25 GB/s.
    place = place_group(64, 1, 8, 450.0, 50.0)
    assert expert_alltoall_bus_gbps(place, 8, 450.0, 50.0, "flex") == pytest.approx(85.70, 1e-3)
    assert expert_alltoall_bus_gbps(place, 8, 450.0, 50.0, "alltoall") == pytest.approx(56.25)
    # ep 16 over 2 nodes, top_k 8: 7.5 bytes charged per token byte, 7.5 / 450 = 0.01667 s/GB
    # over NVLink. flex: 1 x (1 - (1/2)^8) = 0.9961 remote nodes, 0.9961 / 50 = 0.01992 s/GB,
    # still the NIC: bus 7.5 / 0.01992 = 376.5 GB/s. alltoall: 8 x 8/16 = 4 copies off-node,
    # 4 / 50 = 0.08 s/GB: bus 7.5 / 0.08 = 93.75 GB/s, 4x slower.
    two = place_group(16, 1, 8, 450.0, 50.0)
    assert expert_alltoall_bus_gbps(two, 8, 450.0, 50.0, "flex") == pytest.approx(376.5, 1e-3)
    assert expert_alltoall_bus_gbps(two, 8, 450.0, 50.0, "alltoall") == pytest.approx(93.75)
    # One member per node (ep 8 with stride 8 over 8 nodes), top_k 2: alltoall sends
    # 2 x 7/8 = 1.75 copies, all the charged bytes, so the bus is the NIC's 50 GB/s; flex sends
    # 7 x (1 - (7/8)^2) = 1.640625: bus 1.75 / (1.640625 / 50) = 53.33 GB/s.
    spread = place_group(8, 8, 8, 450.0, 50.0)
    assert expert_alltoall_bus_gbps(spread, 2, 450.0, 50.0, "alltoall") == pytest.approx(50.0)
    assert expert_alltoall_bus_gbps(spread, 2, 450.0, 50.0, "flex") == pytest.approx(53.333, 1e-4)
    # Inside one node both are the NVLink all-to-all.
    inside = place_group(8, 1, 8, 450.0, 50.0)
    for d in ("alltoall", "flex"):
        assert expert_alltoall_bus_gbps(inside, 8, 450.0, 50.0, d) == pytest.approx(450.0)
    with pytest.raises(ValueError, match="allgather"):
        expert_alltoall_bus_gbps(place, 8, 450.0, 50.0, "allgather")


def test_default_per_backend() -> None:
    # torch and deepspeed run llmtrain's all_to_all_single dispatch; Megatron-LM's own default is
    # allgather (transformer_config.py moe_token_dispatcher_type).
    assert moe_dispatcher(cfg(*SMALL_MOE)) == "alltoall"
    assert moe_dispatcher(cfg(*SMALL_MOE, "backend=deepspeed")) == "alltoall"
    assert moe_dispatcher(cfg(*SMALL_MOE, "backend=megatron")) == "allgather"
    for d in ("allgather", "alltoall", "flex"):
        assert (
            moe_dispatcher(cfg(*SMALL_MOE, "backend=megatron", f"backend.moe_dispatcher={d}")) == d
        )
    # The recipes say theirs: DeepSeek-V3's node-limited IB-then-NVLink dispatch is flex.
    assert moe_dispatcher(cfg("recipe=deepseek-v3")) == "flex"
    assert moe_dispatcher(cfg("recipe=mixtral-8x7b")) == "alltoall"


def test_torch_and_deepspeed_refuse_flex_and_allgather() -> None:
    for backend in ("torch", "deepspeed"):
        for d in ("flex", "allgather"):
            found = raw_refusals(
                backend, cfg(*SMALL_MOE, f"backend={backend}", f"backend.moe_dispatcher={d}")
            )
            assert [r.keys for r in found] == [("backend.moe_dispatcher",)], found
            assert "use backend.moe_dispatcher=alltoall" in found[0].message
        ok = cfg(*SMALL_MOE, f"backend={backend}", "backend.moe_dispatcher=alltoall")
        assert not raw_refusals(backend, ok)
    for d in ("allgather", "alltoall", "flex"):
        mcfg = cfg(
            *SMALL_MOE, "backend=megatron", "cluster=h100-80gb", f"backend.moe_dispatcher={d}"
        )
        assert not [r for r in raw_refusals("megatron", mcfg) if "moe_dispatcher" in r.keys[0]]


def test_validate_refuses_torch_with_flex_exit_2() -> None:
    result = invoke("validate", *SMALL_MOE, "backend.moe_dispatcher=flex")
    assert result.returncode == 2, shown(result)
    text = " ".join(shown(result).split())
    # The key, the rule (what the engine runs), and a value that works.
    assert "backend.moe_dispatcher=flex" in text
    assert "all_to_all_single" in text
    assert "use backend.moe_dispatcher=alltoall" in text
    assert invoke("validate", *SMALL_MOE).returncode == 0
    bad = invoke("validate", *SMALL_MOE, "backend.moe_dispatcher=deepep")
    assert bad.returncode == 2 and "must be one of allgather, alltoall, flex" in shown(bad)


def test_megatron_renders_the_dispatcher_flags() -> None:
    base = [*SMALL_MOE, "backend=megatron", "cluster=h100-80gb", "cluster.num_nodes=1"]
    flex = megatron_args(cfg(*base, "backend.moe_dispatcher=flex"))
    i = flex.index("--moe-token-dispatcher-type")
    assert flex[i : i + 4] == [
        "--moe-token-dispatcher-type",
        "flex",
        "--moe-flex-dispatcher-backend",
        "deepep",
    ]
    alltoall = megatron_args(cfg(*base, "backend.moe_dispatcher=alltoall"))
    i = alltoall.index("--moe-token-dispatcher-type")
    assert alltoall[i + 1] == "alltoall" and "--moe-flex-dispatcher-backend" not in alltoall
    # null: Megatron-LM's own default (allgather), no flag.
    default = megatron_args(cfg(*base))
    assert "--moe-token-dispatcher-type" not in default


def _a2a(c: LLMTrainConfig) -> tuple[float, float]:
    plan = make_plan(c)
    row = next(x for x in plan.time.collectives if x.group == "ep")
    return row.time_s, plan.time.step_s


def test_alltoall_is_slower_than_flex_across_nodes_and_equal_in_one() -> None:
    # 64 GPUs, ep 64, top_k 8: the same 16 all-to-alls of 134.2 MB at 56.25 against 85.70 GB/s
    # bus (test above): 85.70 / 56.25 = 1.5236x the time.
    flex_t, flex_step = _a2a(_moe(128, ep=64, nodes=8, dispatcher="flex"))
    all_t, all_step = _a2a(_moe(128, ep=64, nodes=8, dispatcher="alltoall"))
    assert all_t / flex_t == pytest.approx(85.70 / 56.25, rel=1e-3)
    # Exposed: the step grows by the difference.
    assert all_step - flex_step == pytest.approx(all_t - flex_t, rel=1e-6)
    # One node, ep 8: the same NVLink all-to-all.
    one_flex = make_plan(_moe(128, ep=8, nodes=1, dispatcher="flex")).time.step_s
    one_all = make_plan(_moe(128, ep=8, nodes=1, dispatcher="alltoall")).time.step_s
    assert one_flex == one_all


def test_allgather_prices_the_gathered_tokens() -> None:
    # Megatron's default on one node, ep 8, tp 1: each of the 8 ranks' 4,096 tokens gathered,
    # 8 x 4096 x 2048 x 2 B = 134.2 MB per all-gather; 2 per MoE layer and micro-batch (dispatch
    # forward, combine backward), 4 layers: 8 calls, at 7/8 x 134.2e6 / 450e9 = 0.261 ms each;
    # the same for the reduce-scatters.
    c = _moe(128, ep=8, nodes=1, dispatcher="allgather")
    rows = {x.name: x for x in make_plan(c).time.collectives if x.group == "tp x ep"}
    assert set(rows) == {"expert all-gather", "expert reduce-scatter"}
    msg = 8 * 4096 * 2048 * 2
    for row in rows.values():
        assert row.message_bytes == pytest.approx(msg)
        assert row.calls_per_step == 8 and row.bus_gbps == pytest.approx(450.0)
        per_call = collective_time("all-gather", msg, 8, 450.0)
        assert per_call == pytest.approx(0.2610e-3, rel=1e-3)
        assert row.time_s == pytest.approx(8 * per_call)
    assert not [x for x in make_plan(c).time.collectives if x.group == "ep"]
    # Null on megatron prices the same as allgather.
    assert make_plan(with_dispatcher(c, None)).time.step_s == make_plan(c).time.step_s


def test_assumptions_say_which_dispatcher_was_priced() -> None:
    for d, words in (
        ("flex", "DeepEP"),
        ("alltoall", "every routed copy"),
        ("allgather", "all-gathers"),
    ):
        said = [
            a
            for a in make_plan(_moe(128, ep=64, nodes=8, dispatcher=d)).assumptions
            if "MoE dispatcher" in a
        ]
        assert len(said) == 1 and words in said[0] and f"backend.moe_dispatcher={d}" in said[0]
    default = make_plan(_moe(128, ep=8, dispatcher=None)).assumptions
    assert any("allgather" in a and "backend=megatron's default" in a for a in default)
    assert not any("MoE dispatcher" in a for a in make_plan(_moe(128)).assumptions)  # ep 1


def test_search_keeps_the_configured_dispatcher() -> None:
    # Not a search key: every candidate keeps backend.moe_dispatcher and re-plans to its figure.
    base = ("recipe=mixtral-8x7b", "cluster.num_nodes=4", "backend.moe_dispatcher=flex")
    result = search(cfg(*base), fixed=fixed_keys(base[1:]), top=3)
    assert result.candidates
    for cand in result.candidates:
        assert not any("moe_dispatcher" in o for o in cand.overrides)
        again = cfg(*base, *cand.overrides)
        assert again.backend.moe_dispatcher == "flex"
        assert make_plan(again).time.tokens_per_s == pytest.approx(cand.tokens_per_s, rel=1e-12)


def test_expert_group_stride_follows_each_backends_rank_order() -> None:
    # 4 nodes of 8, tp 2, cp 2, ep 4 (dp 8). Megatron-core's expert ranks are expert-tensor
    # (= tp 2 here, since ep 4 divides dp x cp = 16) innermost, then expert: neighbours 2 apart,
    # the group spans 2 x 4 = 8 ranks, one node. llmtrain's torch engine carves ep out of dp
    # (mesh pp, edp, ep, cp, tp): neighbours tp x cp = 4 apart, 16 ranks, two nodes.
    from launcher.backends.common import expert_group_stride
    from launcher.config.layout import derive_layout

    base = [
        *SMALL_MOE,
        "cluster=h100-80gb",
        "cluster.num_nodes=4",
        "parallel.tp=2",
        "parallel.cp=2",
        "parallel.ep=4",
        "model.num_kv_heads=2",
    ]
    mcfg = cfg(*base, "backend=megatron")
    assert expert_group_stride(mcfg, derive_layout(mcfg)) == 2
    tcfg = cfg(*base, "backend=torch")
    assert expert_group_stride(tcfg, derive_layout(tcfg)) == 4
    # ep 32 does not divide dp x cp = 16: Megatron's expert tensor parallel is 1 (the experts
    # fold over tp too), so neighbours are adjacent ranks.
    folded = cfg(*base[:-2], "parallel.ep=32", "model.num_experts=32", "backend=megatron")
    assert expert_group_stride(folded, derive_layout(folded)) == 1


def test_allgather_with_tp_leaves_the_moe_mlp_out_of_the_tp_row() -> None:
    # tp 2, ep 4 on one node of 8 (dp 4; global batch 8: 2 micro-batches), 4 MoE layers,
    # allgather: Megatron-core's dispatcher gathers the MLP input over tp x ep, so each MoE
    # layer keeps only its attention's tensor-parallel all-reduces: 1 fwd + 1 bwd = 2 calls
    # (4 with alltoall): 4 x 2 x 2 = 16 per step (32 with alltoall).
    c = _moe(128, ep=4, nodes=1, dispatcher="allgather")
    c = dataclasses.replace(
        c,
        parallel=dataclasses.replace(c.parallel, tp=2, sequence_parallel=True),
    )
    rows = {x.group: x for x in make_plan(c).time.collectives}
    assert rows["tp"].calls_per_step == 4 * 2 * 2
    assert "attention only" in rows["tp"].note
    other = make_plan(with_dispatcher(c, "alltoall")).time.collectives
    assert next(x for x in other if x.group == "tp").calls_per_step == 4 * 4 * 2
