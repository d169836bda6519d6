"""Fine-grained MoE step time: routing and permutation bytes, the expert all-to-all across nodes.

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.layout import derive_layout
from launcher.config.schema import (
    BackendConfig,
    ClusterConfig,
    LLMTrainConfig,
    ModelConfig,
    ParallelConfig,
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.planner import hardware_view, make_plan
from launcher.plan.timing.comm import collective_time, expert_alltoall_bus_gbps, place_group
from launcher.plan.timing.kernels import (
    COPY_EFFICIENCY,
    gemm_efficiency,
    moe_routing_bytes,
    stage_parts,
)
from launcher.validate.rules import check

pytestmark = pytest.mark.unit


def _moe(
    experts: int = 128, ep: int = 1, nodes: int = 1, dispatcher: str | None = "flex"
) -> LLMTrainConfig:
    """A fine-grained MoE on Megatron with DeepEP (flex) unless said otherwise."""
    model = ModelConfig(
        name=f"moe{experts}",
        num_layers=4,
        hidden_size=2048,
        ffn_hidden_size=6144,
        num_attention_heads=16,
        vocab_size=32000,
        seq_length=4096,
        activation="swiglu",
        norm="rmsnorm",
        position="rope",
        tie_embeddings=False,
        num_experts=experts,
        moe_top_k=8,
        moe_ffn_hidden_size=768,
    )
    return LLMTrainConfig(
        model=model,
        parallel=ParallelConfig(ep=ep),
        train=TrainConfig(micro_batch_size=1, global_batch_size=8 * nodes, steps=1),
        cluster=ClusterConfig(gpu="h100-sxm", num_nodes=nodes, gpus_per_node=8),
        backend=BackendConfig(name="megatron", moe_dispatcher=dispatcher),
        zero=ZeroConfig(stage=1),
    )


def test_routing_and_permutation_bytes_by_hand() -> None:
    # h 2048, top_k 8, 128 experts, bf16, per token and layer, forward:
    # router 5 passes x 4 B x 128 scores = 2,560; permute gathers 8 copies (read + write)
    # 2 x 8 x 2048 x 2 = 65,536; unpermute reads 8 copies, writes 1: 9 x 2048 x 2 = 36,864,
    # plus 8 fp32 probabilities = 32. Total 104,992 bytes.
    assert moe_routing_bytes(2048, 8, 128, 2) == pytest.approx(104_992)
    # DeepSeek-V3 shape (h 7168, top_k 8, 256 experts): 5,120 + 229,376 + 129,024 + 32.
    assert moe_routing_bytes(7168, 8, 256, 2) == pytest.approx(363_552)


def test_routing_bytes_are_streaming_copies_in_the_step() -> None:
    # One MoE layer, 4,096 tokens, no recompute (forward + backward = 3 byte passes). Going from
    # 128 to 256 experts changes only the router's fp32 scores among the non-GEMM bytes:
    # 20 B x 128 more per token -> 4096 x 3 x 2560 B = 31.46 MB at 0.8 x 3.35 TB/s = 11.74 us.
    hw_bytes = COPY_EFFICIENCY * 3350e9
    expected = 4096 * 3 * 20.0 * 128 / hw_bytes
    assert expected == pytest.approx(11.74e-6, rel=1e-3)
    bytes_s = []
    for experts in (128, 256):
        cfg = _moe(experts)
        hw = hardware_view(cfg)
        parts = stage_parts(
            cfg,
            derive_layout(cfg),
            hw.arch,
            hw.peak_flops,
            hw.matmul_peak_flops,
            hw.matmul_efficiency,
            hw.hbm_gbps,
            hw.tdp_watts,
            dense_layers=0,
            moe_layers=1,
            head=False,
        )
        bytes_s.append(parts.bytes_s)
    assert bytes_s[1] - bytes_s[0] == pytest.approx(expected, rel=1e-6)


def test_expert_alltoall_across_nodes_is_bound_by_the_nic() -> None:
    # ep 64 over 8 nodes of 8 H100s (NVLink 450 GB/s, one 50 GB/s NIC per GPU), top_k 8.
    # A token's 8 copies land on 8 x (1 - (7/8)^8) = 5.25 nodes, 7 x (1 - (7/8)^8) = 4.595 of
    # them remote: 4.595 / 50 = 0.0919 s per GB of tokens over the NIC, against 8 x 63/64 / 450
    # = 0.0175 over NVLink. collective_time charges 8 x 63/64 = 7.875 bytes per token byte, so
    # the bus bandwidth is 7.875 / 0.0919 = 85.7 GB/s (a ring over 8 rails would claim 400).
    place = place_group(64, 1, 8, 450.0, 50.0)
    assert place.bus_gbps == pytest.approx(400.0)
    assert expert_alltoall_bus_gbps(place, 8, 450.0, 50.0) == pytest.approx(85.70, rel=1e-3)
    # Inside one node the ring figure stands.
    inside = place_group(8, 1, 8, 450.0, 50.0)
    assert expert_alltoall_bus_gbps(inside, 8, 450.0, 50.0) == pytest.approx(450.0)
    # One copy per token is no ring either: it lands off-node with probability 56/64 (= 7 x
    # (1 - 7/8) remote nodes), 0.875 / 50 = 0.0175 s per GB over the NIC against 63/64 / 450 =
    # 0.0022 over NVLink; bus 0.984 / 0.0175 = 56.25 GB/s (the ring's 400 was 7x too fast).
    assert expert_alltoall_bus_gbps(place, 1, 450.0, 50.0) == pytest.approx(56.25)


def test_plan_prices_the_expert_alltoall_at_the_nic_bound() -> None:
    # 64 GPUs, ep 64: one all-to-all message is 8 copies x 4,096 tokens x 2048 x 2 B = 134.2 MB;
    # at 85.7 GB/s bus: 63/64 x 134.2e6 / 85.7e9 = 1.541 ms per call; 4 calls per MoE layer
    # and micro-batch, 4 layers, 1 micro-batch -> 16 calls.
    cfg = _moe(128, ep=64, nodes=8)
    a2a = next(c for c in make_plan(cfg).time.collectives if c.group == "ep")
    msg = 8 * 4096 * 2048 * 2
    assert a2a.message_bytes == pytest.approx(msg)
    assert a2a.bus_gbps == pytest.approx(85.70, rel=1e-3)
    assert a2a.calls_per_step == 16
    per_call = collective_time("all-to-all", msg, 64, 85.70)
    assert per_call == pytest.approx(1.541e-3, rel=2e-3)
    assert a2a.time_s == pytest.approx(16 * per_call, rel=1e-3)


def test_few_tokens_per_expert_run_far_below_peak() -> None:
    # Qwen3-235B-A22B-like routing without expert parallelism: 4,096 tokens x top_k 8 / 128
    # experts = 256 tokens per expert; at half_dim 128 a grouped GEMM with m = 256 reaches
    # 256 / 384 = 2/3 of the large-GEMM rate, and 32 tokens per expert (4,096 x 8 / 1,024)
    # only 32 / 160 = 1/5. The planner's expert GEMMs use m = tokens x top_k x ep / experts.
    assert gemm_efficiency(4096 * 8 / 128, 1.0, 128.0) == pytest.approx(2.0 / 3.0)
    assert gemm_efficiency(4096 * 8 / 1024, 1.0, 128.0) == pytest.approx(0.2)
    few = dataclasses.replace(_moe(128).model, num_experts=1024)
    cfg_few = dataclasses.replace(_moe(128), model=few)
    # Same active FLOPs (top_k 8 of equally wide experts), 8x fewer tokens per expert: slower.
    assert make_plan(cfg_few).time.compute_s > 1.2 * make_plan(_moe(128)).time.compute_s


def test_load_imbalance_paces_the_busiest_rank() -> None:
    # model.moe_load_imbalance 1.25 (a capacity factor of 1.25): the busiest rank receives 1.25x
    # the mean tokens, so each all-to-all moves 1.25 x 8 x 4,096 x 2048 x 2 B = 167.8 MB, and its
    # experts run 1.25 x 256 = 320 tokens each (ep 1, 128 experts) at 1.25x the FLOPs.
    base = _moe(128, ep=64, nodes=8)
    heavy = dataclasses.replace(
        base, model=dataclasses.replace(base.model, moe_load_imbalance=1.25)
    )
    a2a = [next(c for c in make_plan(x).time.collectives if c.group == "ep") for x in (base, heavy)]
    assert a2a[1].message_bytes == pytest.approx(1.25 * 8 * 4096 * 2048 * 2)
    assert a2a[1].time_s == pytest.approx(1.25 * a2a[0].time_s)
    one = _moe(128)
    skew = dataclasses.replace(one, model=dataclasses.replace(one.model, moe_load_imbalance=1.25))
    t1, t2 = make_plan(one).time.compute_s, make_plan(skew).time.compute_s
    assert t1 < t2 < 1.25 * t1  # only the routed experts' part grows


def test_load_imbalance_below_one_is_refused_naming_the_key() -> None:
    cfg = _moe(128)
    bad = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, moe_load_imbalance=0.8))
    errors = [v for v in check(bad) if v.is_error]
    assert [v.keys for v in errors] == [("model.moe_load_imbalance",)]
    assert "1.25" in errors[0].message
    assert not [v for v in check(cfg) if v.is_error]
