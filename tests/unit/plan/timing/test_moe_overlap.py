"""backend.moe_comm_overlap (Megatron-Core's --overlap-moe-expert-parallel-comm): Megatron-Core's
conditions, the flag, the schedule's paired share, and what plan charges for it (the expert
all-to-all partly hidden, one more micro-batch in flight).

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.backends import raw_refusals
from launcher.config.composition.compose import compose_config
from launcher.config.pipeline_split import layers_in_flight
from launcher.config.schema import LLMTrainConfig
from launcher.plan.calibration.fitted import constants
from launcher.plan.planner import make_plan
from launcher.plan.schedule import chunk_microbatches_in_flight, combined_1f1b_overlap_share
from launcher.render.megatron_args import megatron_args
from tests.cli import invoke, shown
from tests.unit.plan.timing.test_plan_moe_time import _moe

pytestmark = pytest.mark.unit

KEY = "backend.moe_comm_overlap"
# An MoE on Megatron that runs the overlap: ep 8 on one node, alltoall, no full recompute, bf16.
MEGATRON_MOE = [
    "recipe=tiny",
    "model.num_experts=8",
    "model.moe_top_k=2",
    "backend=megatron",
    "cluster=h100-80gb",
    "cluster.num_nodes=1",
    "parallel.ep=8",
    "backend.moe_dispatcher=alltoall",
    "train.recompute=none",
    "precision=bf16",
]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def _keys(c: LLMTrainConfig) -> list[tuple[str, ...]]:
    return [r.keys for r in raw_refusals(c.backend.name, c) if KEY in r.keys]


def test_paired_share_of_the_combined_schedule_by_hand() -> None:
    # No pipeline, 8 micro-batches: the first forward runs alone, the other 7 pair with a
    # backward (and the last backward runs alone): 7/8.
    assert combined_1f1b_overlap_share(1, 8, 1, 0) == pytest.approx(7 / 8)
    assert combined_1f1b_overlap_share(1, 1, 1, 0) == 0.0
    # pp 4, vpp 2, 16 micro-batches = 32 chunk forwards on each stage. Stage 0 warms up with
    # (4 - 0 - 1) x 2 + (2 - 1) x 4 + 1 = 11 of them alone: 21/32 paired. Stage 3:
    # 0 + 4 + 1 = 5 alone: 27/32.
    assert combined_1f1b_overlap_share(4, 16, 2, 0) == pytest.approx(21 / 32)
    assert combined_1f1b_overlap_share(4, 16, 2, 3) == pytest.approx(27 / 32)
    # 4 micro-batches: 8 chunk forwards, all in stage 0's warm-up: nothing pairs.
    assert combined_1f1b_overlap_share(4, 4, 2, 0) == 0.0


def test_one_more_microbatch_in_flight() -> None:
    # No pipeline: the forward of micro-batch i + 1 runs while i still waits for its backward.
    assert chunk_microbatches_in_flight("1f1b", 1, 8, 1, 0) == 1
    assert chunk_microbatches_in_flight("1f1b", 1, 8, 1, 0, extra_warmup=1) == 2
    assert chunk_microbatches_in_flight("1f1b", 1, 1, 1, 0, extra_warmup=1) == 1
    # Interleaved pp 4, vpp 2, 16 micro-batches, stage 0: warm-up 3 x 2 + 4 = 10, + 1 in the
    # steady state = 11 chunks; one extra warm-up forward: 12.
    assert chunk_microbatches_in_flight("interleaved", 4, 16, 2, 0) == 11
    assert chunk_microbatches_in_flight("interleaved", 4, 16, 2, 0, extra_warmup=1) == 12
    # Uneven chunks (1, 2) on stage 0 of pp 2, vpp 2, 4 micro-batches (8 chunk forwards):
    # warm-up (2 - 1) x 2 + 2 + 1 = 5 forwards of chunks 0, 0, 1, 1, 0 = 1+1+2+2+1 = 7 layers;
    # steady: + chunk 0 (1) -> 8, - backward of chunk 1 (2) -> 6; + chunk 1 (2) -> 8, - 2 -> 6;
    # + chunk 1 (2) -> 8, - chunk 0 (1) -> 7. Peak 8 (7 without the extra forward).
    assert layers_in_flight("interleaved", 2, 4, 2, 0, (1, 2)) == 7
    assert layers_in_flight("interleaved", 2, 4, 2, 0, (1, 2), extra_warmup=1) == 8


def test_megatron_conditions_each_refused_with_a_value_that_works() -> None:
    assert _keys(cfg(*MEGATRON_MOE, f"{KEY}=true")) == []
    cases = [
        (["parallel.ep=1"], "parallel.ep", "use parallel.ep=2"),
        (["backend.moe_dispatcher=allgather"], "backend.moe_dispatcher", "alltoall"),
        (["backend.moe_dispatcher=null"], "backend.moe_dispatcher", "alltoall"),
        (["train.recompute=full"], "train.recompute", "train.recompute=selective"),
        (["precision=fp32"], "precision", "precision=bf16"),
        (
            ["cluster.num_nodes=2", "parallel.pp=2", "parallel.pp_schedule=1f1b"],
            "parallel.vpp",
            "parallel.vpp=2",
        ),
        (["model.num_experts=null", "parallel.ep=1"], "model.num_experts", f"{KEY}=false"),
    ]
    for extra, key, works in cases:
        found = raw_refusals("megatron", cfg(*MEGATRON_MOE, f"{KEY}=true", *extra))
        mine = [r for r in found if KEY in r.keys]
        assert len(mine) == 1 and key in mine[0].keys, (extra, found)
        assert works in mine[0].message, mine[0].message
    # Selective recompute is what Megatron-Core allows beside it.
    assert _keys(cfg(*MEGATRON_MOE, f"{KEY}=true", "train.recompute=selective")) == []
    # With virtual stages the pipeline is accepted (recipe=tiny: 4 layers, pp 2 x vpp 2).
    piped = cfg(
        *MEGATRON_MOE,
        f"{KEY}=true",
        "cluster.num_nodes=2",
        "parallel.pp=2",
        "parallel.vpp=2",
        "parallel.pp_schedule=interleaved",
    )
    assert _keys(piped) == []


def test_torch_and_deepspeed_refuse_it() -> None:
    for backend in ("torch", "deepspeed"):
        c = cfg("recipe=tiny", "model.num_experts=4", f"backend={backend}", f"{KEY}=true")
        found = [r for r in raw_refusals(backend, c) if KEY in r.keys]
        assert len(found) == 1 and "backend=megatron" in found[0].message
        assert f"use {KEY}=false" in found[0].message


def test_validate_exit_2_names_the_key() -> None:
    result = invoke("validate", *MEGATRON_MOE, f"{KEY}=true", "train.recompute=full")
    assert result.returncode == 2, shown(result)
    text = " ".join(shown(result).split())
    assert f"{KEY}=true with train.recompute=full" in text and "Traceback" not in text
    bad = invoke("validate", *MEGATRON_MOE, f"{KEY}=maybe")
    assert bad.returncode == 2 and KEY in " ".join(shown(bad).split())


def test_megatron_renders_the_flag() -> None:
    on = megatron_args(cfg(*MEGATRON_MOE, f"{KEY}=true"))
    assert on.count("--overlap-moe-expert-parallel-comm") == 1
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(cfg(*MEGATRON_MOE))


def _overlap(c: LLMTrainConfig, on: bool) -> LLMTrainConfig:
    return dataclasses.replace(c, backend=dataclasses.replace(c.backend, moe_comm_overlap=on))


def _with_batch(c: LLMTrainConfig, global_batch: int) -> LLMTrainConfig:
    return dataclasses.replace(
        c, train=dataclasses.replace(c.train, global_batch_size=global_batch)
    )


def test_alltoall_exposure_by_hand() -> None:
    # 128 experts top-8, alltoall, 4 micro-batches per rank: 3 of 4 pair (share 3/4), and the
    # paired all-to-all hides behind at most the paired compute (3/4 of the step's compute);
    # what hides still costs overlap_cost of its time. exposed = total - hidden x (1 - cost).
    # ep 8 in one node (global batch 32 over dp 8): the NVLink all-to-all is short, so
    # hidden = 3/4 x total.
    # ep 64 over 8 nodes (global batch 256 over dp 64): the NIC-bound all-to-all outlasts the
    # compute, so hidden = 3/4 x compute.
    for ep, nodes, window_bound in ((8, 1, False), (64, 8, True)):
        base = _with_batch(_moe(128, ep=ep, nodes=nodes, dispatcher="alltoall"), 32 * nodes)
        off, on = make_plan(base), make_plan(_overlap(base, True))
        row_off = next(x for x in off.time.collectives if x.group == "ep")
        row_on = next(x for x in on.time.collectives if x.group == "ep")
        assert row_off.exposed_s == pytest.approx(row_off.time_s)
        assert row_on.time_s == pytest.approx(row_off.time_s)
        total, compute = row_on.time_s, on.time.compute_s
        assert (total > compute) == window_bound, (total, compute)
        hidden = 0.75 * (compute if window_bound else total)
        cost = constants(on.hardware.arch).overlap_cost
        assert row_on.exposed_s == pytest.approx(total - hidden * (1 - cost))
        assert "75% beside another micro-batch's compute" in row_on.note
        assert on.time.step_s < off.time.step_s
        assert any("combined 1F1B" in a for a in on.assumptions)
        assert not any("combined 1F1B" in a for a in off.assumptions)
    # One micro-batch per rank: nothing to pair with, the same price.
    single = _moe(128, ep=64, nodes=8, dispatcher="alltoall")
    assert make_plan(_overlap(single, True)).time.step_s == make_plan(single).time.step_s


def test_memory_holds_one_more_microbatch() -> None:
    # pp 1 with 4 micro-batches: 2 in flight instead of 1, so the activations grow by one
    # micro-batch's worth of layer activations (the transient buffers are the same).
    base = _with_batch(_moe(128, ep=8, nodes=1, dispatcher="alltoall"), 32)
    off = make_plan(base).memory.stages[0]
    on = make_plan(_overlap(base, True)).memory.stages[0]
    assert (off.in_flight, on.in_flight) == (1, 2)
    assert on.activations > off.activations
    # Dense layers or not, doubling the held micro-batches adds exactly what one holds:
    # on - off == off - transients, i.e. 2 x off - on == the transients, which are positive.
    transients = 2 * off.activations - on.activations
    assert 0 < transients < off.activations
