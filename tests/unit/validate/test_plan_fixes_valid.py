"""Every fix `plan` shows passes validate's rules, and combined fixes (a group option, two keys)
are found (issue 33, item 4)."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.validate.rules import check, passes
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

ONE_NODE = ["recipe=llama3-70b", "cluster=h100-80gb", "cluster.num_nodes=1", "parallel.pp=1"]


@pytest.mark.parametrize(
    "extra", [[], ["zero.stage=3"], ["backend=deepspeed", "parallel.sequence_parallel=false"]]
)
def test_each_fix_shown_is_valid_and_fits(extra: list[str]) -> None:
    overrides = ONE_NODE + extra
    plan = make_plan(compose_config(overrides).config, accept=passes)
    assert plan.memory.verdict == "does_not_fit"
    assert plan.fixes, "a fix exists: zero=stage3-offload fits at about 16 GiB"
    for fix in plan.fixes:
        fixed = compose_config([*overrides, *fix.overrides]).config
        errors = [v.message for v in check(fixed) if v.is_error]
        assert not errors, (fix.line, errors)
        again = make_plan(fixed, accept=passes)
        assert again.memory.fits, fix.line
        assert again.memory.heaviest.device_total == pytest.approx(fix.device_bytes)


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
