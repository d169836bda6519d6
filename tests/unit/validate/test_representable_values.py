"""Numbers the ranks cannot hold are refused by `validate` (issue 30 item 7): a float setting must
fit float32 (finite magnitude at most FP32_MAX, not so small that it rounds to 0), an integer
int64; `plan --search` exits 2 on a configuration with such a value, as `plan` does."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.validate.rules import check
from launcher.validate.values import FP32_MAX, FP32_TINY, INT64_MAX
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def errors(*overrides: str) -> list[str]:
    return [v.message for v in check(compose_config(list(overrides)).config) if v.is_error]


def test_the_bounds_are_float32_s_and_int64_s() -> None:
    import numpy as np

    assert np.finfo(np.float32).max == FP32_MAX
    assert np.float32(FP32_TINY) > 0 and np.float32(FP32_TINY / 4) == 0
    assert np.iinfo(np.int64).max == INT64_MAX


@pytest.mark.parametrize(
    ("override", "key", "works"),
    [
        ("optim.lr=1e39", "optim.lr", "optim.lr=0.0003"),  # the issue's value, with sgd below
        ("optim.eps=1e-50", "optim.eps", "optim.eps=1e-08"),  # rounds to 0 in float32
        ("optim.min_lr=1e-60", "optim.min_lr", "optim.min_lr=3e-05"),
        ("optim.weight_decay=1e300", "optim.weight_decay", "optim.weight_decay=0.1"),
        ("model.rope_theta=1e39", "model.rope_theta", "model.rope_theta=10000"),
        ("train.hang_timeout_s=5e38", "train.hang_timeout_s", "train.hang_timeout_s=1800"),
        ("train.steps=99999999999999999999", "train.steps", "train.steps=100"),
        ("train.seed=-99999999999999999999", "train.seed", None),  # seed's own range says it
        ("cluster.price_per_gpu_hour=1e40", "cluster.price_per_gpu_hour", "leave"),
    ],
)
def test_a_value_the_ranks_cannot_hold_is_an_error_naming_the_key_and_a_value_that_works(
    override: str, key: str, works: str | None
) -> None:
    found = errors("optim.name=sgd", override)
    mine = [m for m in found if m.startswith(key + "=")]
    assert len(mine) == 1, found  # one message per key, not one per rule
    if works is not None:
        assert works in mine[0], mine


def test_values_within_float32_and_int64_stay_valid() -> None:
    assert errors("optim.lr=3e38", "optim.eps=1e-40", "train.steps=9223372036854775807") == [
        m for m in errors("train.steps=9223372036854775807") if "train.steps" in m
    ]
    assert errors("optim.lr=3e38", "optim.eps=1e-40") == []


def test_validate_refuses_the_issue_s_command_with_exit_2() -> None:
    result = invoke("validate", "optim.name=sgd", "optim.lr=1e39")
    assert result.returncode == 2, shown(result)
    assert "optim.lr=1e+39" in " ".join(shown(result).split())
    assert "Traceback" not in shown(result)


def test_plan_search_refuses_an_invalid_base_configuration_like_plan() -> None:
    # UserError is exit 2 (launcher.cli.entry); before, the search ranked layouts and exited 0
    # with "not valid" for the configuration as given.
    from launcher.errors import UserError
    from launcher.search.layouts import search

    for override in ("cluster.num_nodes=1250000", "optim.lr=1e39"):
        key = override.split("=")[0]
        assert any(m.startswith(key) for m in errors(override))  # what `plan` refuses
        with pytest.raises(UserError, match=key):
            search(compose_config([override]).config, top=1)
