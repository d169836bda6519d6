"""Validation rules: each one fires with the key, the numbers and values that would work."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import auto_split, derive_layout
from launcher.validate.rules import RULES, Violation, check, divisors, nearest

pytestmark = pytest.mark.unit


def violations(*overrides: str) -> list[Violation]:
    return check(compose_config(list(overrides)).config)


def errors(*overrides: str) -> list[str]:
    return [v.message for v in violations(*overrides) if v.is_error]


def warnings(*overrides: str) -> list[str]:
    return [v.message for v in violations(*overrides) if not v.is_error]


# A model with 32 heads and 8 kv heads on 2 nodes x 8 GPUs: the shapes the rules talk about.
LLAMA = ("recipe=llama3-8b", "cluster.num_nodes=2", "train.global_batch_size=64")


def test_helpers() -> None:
    assert divisors(32) == [1, 2, 4, 8, 16, 32]
    assert nearest([1, 2, 4, 8, 16, 32], 6, 2) == [4, 8]


def test_default_recipe_is_valid() -> None:
    assert errors() == []


def test_every_rule_is_named_and_registered() -> None:
    assert {
        "positive-values",
        "world-size",
        "expert-parallel",
        "attention-heads",
        "pipeline-split",
        "context-parallel",
        "tensor-parallel-shapes",
        "batch-arithmetic",
        "precision-hardware",
        "backend-capabilities",
    } <= set(RULES)


def test_tp_not_dividing_heads_lists_valid_tp() -> None:
    found = errors(*LLAMA, "parallel.tp=6")
    assert any(
        "parallel.tp=6 does not divide model.num_attention_heads=32; "
        "valid tp: 1, 2, 4, 8, 16, 32" in m
        for m in found
    ), found


def test_all_violations_reported_together() -> None:
    # 16 GPUs: tp=6 breaks heads, world size and kv heads at once; cp=3 breaks nothing else here.
    found = violations(*LLAMA, "parallel.tp=6", "model.seq_length=8190", "parallel.cp=1")
    rules = {v.rule for v in found if v.is_error}
    assert {"attention-heads", "world-size"} <= rules


def test_world_size_with_explicit_dp() -> None:
    # 2 nodes x 8 = 16 GPUs; dp=4 x tp=2 = 8 != 16 -> dp=8 works, as would 1 node.
    found = errors(*LLAMA, "parallel.tp=2", "parallel.dp=4")
    assert any(
        "parallel.dp=4 x tp=2 x pp=1 x cp=1 = 8 GPUs, but cluster.num_nodes=2" in m
        and "parallel.dp=8" in m
        and "cluster.num_nodes=1" in m
        for m in found
    ), found


def test_world_size_inferred_dp_needs_divisibility() -> None:
    # tp=4 x pp=3 = 12 does not divide 16.
    # No tp makes 3 x tp divide 16, so only the node count is offered: lcm(12, 8) / 8 = 3 nodes.
    found = errors(*LLAMA, "parallel.tp=4", "parallel.pp=3")
    assert any(
        "= 12 does not divide the world size" in m and "use a multiple of 3 nodes" in m
        for m in found
    ), found


def test_dp_is_inferred() -> None:
    layout = derive_layout(compose_config([*LLAMA, "parallel.tp=4"]).config)
    assert (layout.world_size, layout.dp, layout.dp_inferred) == (16, 4, True)
    # global 64 = micro 1 x dp 4 x accum 16
    assert layout.grad_accum == 16


def test_kv_heads_rule_and_replication_warning() -> None:
    # 32 heads, 8 kv heads: tp=16 replicates each kv head twice -> warning, not error.
    found = violations(*LLAMA, "parallel.tp=16", "cluster.num_nodes=2")
    assert any("replicated on 2 ranks" in v.message and not v.is_error for v in found)
    # 12 kv heads (of 48 heads) with tp=8: neither divides the other.
    found_err = errors(
        *LLAMA,
        "model.num_attention_heads=48",
        "model.num_kv_heads=12",
        "parallel.tp=8",
        "model.hidden_size=6144",
    )
    assert any("tp must divide the kv heads" in m for m in found_err), found_err


def test_even_split_has_no_warning_uneven_warns_with_split() -> None:
    assert not [w for w in warnings(*LLAMA, "parallel.pp=4") if "split" in w]
    # 32 layers on pp=16 is even; on pp=... use 30 layers on 4 stages: (30+2)/4 = 8 slots each.
    found = warnings(*LLAMA, "parallel.pp=4", "model.num_layers=30")
    assert any("automatic split [7, 8, 8, 7]" in w for w in found), found


def test_llama3_405b_split_matches_the_paper() -> None:
    # 126 layers on 16 stages: first and last stages one layer lighter (Llama 3 paper 3.3.2).
    assert auto_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert sum(auto_split(31, 4)) == 31


def test_explicit_pp_layers_must_sum() -> None:
    found = errors(*LLAMA, "parallel.pp=2", "parallel.pp_layers=[10,20]")
    assert any("sums to 30, but model.num_layers=32" in m for m in found), found
    assert not errors(*LLAMA, "parallel.pp=2", "parallel.pp_layers=[15,17]")
    found = errors(*LLAMA, "parallel.pp=2", "parallel.pp_layers=[32]")
    assert any("needs one per pipeline chunk" in m for m in found)


def test_vpp_needs_pp_and_interleaved() -> None:
    found = errors(*LLAMA, "parallel.vpp=2")
    assert any("needs pp > 1 and the interleaved schedule" in m for m in found)
    assert not [
        m
        for m in errors(
            *LLAMA, "parallel.vpp=2", "parallel.pp=2", "parallel.pp_schedule=interleaved"
        )
        if "vpp" in m
    ]


def test_context_parallel_needs_2cp_to_divide_seq() -> None:
    found = errors(*LLAMA, "parallel.cp=2", "model.seq_length=8190")
    assert any("model.seq_length=8190 is not divisible by 2 x parallel.cp = 4" in m for m in found)


def test_ffn_divisibility_and_vocab_padding() -> None:
    found = errors(*LLAMA, "parallel.tp=8", "model.ffn_hidden_size=14340")
    assert any("does not divide model.ffn_hidden_size=14340" in m for m in found)
    # 128256 % 16 == 0; use a vocab that does not divide: 50257 (GPT-2) with tp=2.
    found_w = warnings(*LLAMA, "parallel.tp=2", "model.vocab_size=50257")
    # padded to a multiple of 128 x 2 = 256: ceil(50257/256)*256 = 50432
    assert any("padded to 50432" in w for w in found_w), found_w


def test_batch_arithmetic() -> None:
    # dp 16 x micro 1 = 16 per pass; 100 is not a multiple -> nearest 96, 112.
    found = errors(*LLAMA, "train.global_batch_size=100")
    assert any("nearest valid global batch: 96, 112" in m for m in found), found
    found = errors(*LLAMA, "train.grad_accum=3")
    assert any("!= micro_batch_size x dp x grad_accum = 1 x 16 x 3 = 48" in m for m in found)


def test_pipeline_microbatches() -> None:
    # pp=4 over 16 GPUs -> dp 4; global 8 -> accum 2 < pp -> error; 32 -> 8 < 16 -> warning.
    assert any(
        "never fills" in m for m in errors(*LLAMA, "parallel.pp=4", "train.global_batch_size=8")
    )
    found = warnings(*LLAMA, "parallel.pp=4", "train.global_batch_size=32")
    assert any("8 micro-batches per step < 4 x parallel.pp = 16" in w for w in found), found


def test_tp_across_nodes_warns() -> None:
    found = warnings(*LLAMA, "parallel.tp=16")
    assert any("crosses the node boundary" in w for w in found)


def test_precision_vs_hardware() -> None:
    found = errors("recipe=gpt-7b", "cluster=v100-32gb", "precision=bf16", "cluster.num_nodes=1")
    assert any("does not support (needs Ampere or newer)" in m for m in found), found
    found = errors("recipe=gpt-7b", "cluster=a100-80gb", "precision=fp8")
    assert any("fp8 needs fp8 tensor cores" in m for m in found), found
    found = errors("recipe=gpt-7b", "precision=fp16", "precision.loss_scaling=none")
    assert any("loss scaling" in m for m in found)


def test_backend_capabilities() -> None:
    # The rule reports launcher/backends/' table for the configured backend (test_backends.py).
    found = errors(*LLAMA, "backend=deepspeed", "zero.stage=2", "parallel.pp=2")
    assert any("DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only" in m for m in found)
    found = errors(*LLAMA, "backend=deepspeed", "parallel.cp=2")
    assert any("parallel.cp=2: llmtrain's DeepSpeed engine runs data parallel" in m for m in found)
    found = errors(*LLAMA, "backend=deepspeed", "parallel.tp=2", "parallel.pp=2")
    assert any("runs AutoTP tensor parallel without a pipeline" in m for m in found)
    found = errors(*LLAMA, "backend=megatron", "zero.stage=2")
    assert any("zero.stage=2: Megatron-LM has no" in m for m in found)
    assert not errors(*LLAMA, "backend=megatron", "zero.stage=3")  # Megatron-FSDP
    found = errors(*LLAMA, "backend=deepspeed", "zero.stage=0", "zero.offload_optimizer=cpu")
    assert any("use zero.stage=1 or 2 or 3" in m for m in found)


def test_expert_parallel_rules() -> None:
    found = errors(*LLAMA, "parallel.ep=2")
    assert any("needs a mixture-of-experts model" in m for m in found)
    # Mixtral has 8 experts: ep=3 divides neither 8 nor dp.
    found = errors("recipe=mixtral-8x7b", "parallel.ep=3")
    assert any("does not divide model.num_experts=8" in m for m in found), found


def test_non_positive_and_absurd_values() -> None:
    assert any("parallel.tp=0: must be a positive integer" in m for m in errors("parallel.tp=0"))
    assert any("cluster.num_nodes=-1" in m for m in errors("cluster.num_nodes=-1"))
    assert any("implausibly large" in m for m in errors("cluster.num_nodes=5000000"))
    assert any("zero.stage=7: must be 0-3" in m for m in errors("zero.stage=7"))


def test_steps_xor_tokens() -> None:
    both = errors("train.tokens=1000000", "train.steps=10")
    assert any("exactly one of train.steps" in m for m in both)
    assert any("exactly one of train.steps" in m for m in errors("train.steps=null"))
    # One on the command line replaces the other from the recipe (tiny sets steps).
    assert not errors("train.tokens=1000000")


def test_rules_needing_dp_stay_silent_when_dp_cannot_be_inferred() -> None:
    # tp=6 x pp=4 = 24 does not divide 2048 GPUs: dp is undefined, so no batch or micro-batch
    # advice computed from a rounded-down dp (2048 // 24 = 85) may appear, only the causes.
    found = violations("recipe=llama3-70b", "parallel.tp=6")
    rules = {v.rule for v in found}
    assert "world-size" in rules and "attention-heads" in rules
    assert "batch-arithmetic" not in rules
    assert not [v for v in found if "85" in v.message], found
    # A rule's checks that do not need dp still run.
    both = violations("recipe=llama3-70b", "parallel.tp=6", "train.steps=5", "train.tokens=5")
    assert any("exactly one of train.steps" in v.message for v in both)
