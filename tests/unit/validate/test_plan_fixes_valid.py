"""Every fix `plan` shows passes validate's rules, and combined fixes (a group option, two keys)
are found (issue 33, item 4)."""

from __future__ import annotations

import json

import pytest

from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.validate.rules import check, passes
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

ONE_NODE = ["recipe=llama3-70b", "cluster=h100-80gb", "cluster.num_nodes=1", "parallel.pp=1"]


# Issue #40: Llama 2 7B fully fine-tuned on one RTX 4090 (24 GiB) with the savers it names; mixed
# precision's fp32 master (25.1 GiB) cannot fit as typed: only the torch engine's savers do.
RTX4090_7B = [
    "model=llama2-7b",
    "finetune=full",
    "cluster=rtx4090",
    "optim.name=adamw8bit",
    "optim.in_backward=true",
    "precision=bf16",
    "train.recompute=full",
    "train.micro_batch_size=4",
    "model.seq_length=2048",
]


@pytest.mark.parametrize(
    "overrides",
    [
        ONE_NODE,
        [*ONE_NODE, "zero.stage=3"],
        [*ONE_NODE, "backend=deepspeed", "parallel.sequence_parallel=false"],
        RTX4090_7B,
    ],
    ids=["torch", "torch-zero3", "deepspeed", "7b-rtx4090-savers"],
)
def test_each_fix_shown_is_valid_and_fits(overrides: list[str]) -> None:
    plan = make_plan(compose_config(overrides).config, accept=passes)
    assert plan.memory.verdict == "does_not_fit"
    assert plan.fixes, "a fix exists (zero=stage3-offload; the savers for the 7B)"
    for fix in plan.fixes:
        fixed = compose_config([*overrides, *fix.overrides]).config
        errors = [v.message for v in check(fixed) if v.is_error]
        assert not errors, (fix.line, errors)
        again = make_plan(fixed, accept=passes)
        assert again.memory.fits, fix.line
        assert again.memory.heaviest.device_total == pytest.approx(fix.device_bytes)
        assert again.time.step_s == pytest.approx(fix.step_s)
        assert again.layout.global_batch_size == fix.global_batch_size
    # Fastest first: time per token (a fix may shrink a derived global batch).
    speeds = [f.tokens_per_s for f in plan.fixes]
    assert speeds == sorted(speeds, reverse=True)


def test_the_savers_fit_the_7b_on_one_rtx4090() -> None:
    """The fixes combine pure bf16 (no fp32 master) with the states on the host (torchtune's
    paged 8-bit AdamW) and one more change, under 24 GiB; no saver the deepspeed engine lacks
    is offered there."""
    plan = make_plan(compose_config(RTX4090_7B).config, accept=passes)
    both = [
        f for f in plan.fixes if {"precision=bf16-pure", "optim.offload=cpu"} <= set(f.overrides)
    ]
    assert both, [f.line for f in plan.fixes]
    assert all(f.fits and f.device_bytes < 24 * 2**30 for f in both)
    # The fastest keeps the global batch: activation offload over a smaller micro-batch.
    assert set(plan.fixes[0].overrides) == {
        "precision=bf16-pure",
        "optim.offload=cpu",
        "train.activation_offload=true",
    }
    savers = ("precision=bf16-pure", "optim.offload", "in_backward", "activation_offload")
    deepspeed = make_plan(
        compose_config([*ONE_NODE, "backend=deepspeed", "parallel.sequence_parallel=false"]).config,
        accept=passes,
    )
    assert not [f.line for f in deepspeed.fixes if any(s in f.line for s in savers)]


def test_torch_offload_is_offered_as_the_group_option_it_needs() -> None:
    lines = [f.line for f in make_plan(compose_config(ONE_NODE).config, accept=passes).fixes]
    # torch offloads only at stage 3 with parameters too: `zero.offload_optimizer=cpu` alone is
    # refused by validate, so it must not be offered
    assert "zero.offload_optimizer=cpu" not in lines
    assert "zero=stage3-offload" in lines


def test_plan_prints_the_valid_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINAL_WIDTH", "200")
    result = invoke("plan", *ONE_NODE, "zero.stage=3")
    assert result.returncode == 0, shown(result)
    (fix,) = [
        f
        for f in make_plan(compose_config([*ONE_NODE, "zero.stage=3"]).config, accept=passes).fixes
        if f.line.startswith("zero=stage3-offload")
    ]
    gib = fix.device_bytes / 2**30
    assert 10 < gib < 20, gib  # about 16 GiB: weights, gradients and states on the host
    assert f"zero=stage3-offload -> {gib:.1f}" in shown(result)
    assert "none found" not in shown(result)


def test_plan_prints_each_fix_with_its_step_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINAL_WIDTH", "200")
    result = invoke("plan", *RTX4090_7B)
    assert result.returncode == 0, shown(result)
    fixes = make_plan(compose_config(RTX4090_7B).config, accept=passes).fixes
    text = shown(result)
    for fix in fixes[:5]:
        assert f"{fix.line} -> {fix.device_bytes / 2**30:.1f}, step " in text, text
    assert "for a global batch of" in text  # a smaller micro-batch shrinks the derived batch
    assert "none found" not in text
    done = invoke("plan", *RTX4090_7B, "--json")
    document = json.loads(done.stdout)
    assert [f["step_s"] for f in document["fixes"]] == pytest.approx([f.step_s for f in fixes])
