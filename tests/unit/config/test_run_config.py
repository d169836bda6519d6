"""An older llmtrain's config.yaml read by this one (launcher.config.run_config)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from launcher.config.composition.compose import compose_config
from launcher.config.run_config import read_values, resumable_config
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError

pytestmark = pytest.mark.unit


def test_added_keys_take_defaults_and_removed_ones_are_named(tmp_path: Path) -> None:
    current = compose_config(["+cluster.env.A=b"]).values
    assert read_values(copy.deepcopy(current), tmp_path).values == current  # nothing to do
    old = copy.deepcopy(current)
    del old["logging"]  # a section added since
    del old["optim"]["eps"]  # a key added since
    old["model"]["dropout"] = False  # removed since, planner-only
    old["train"]["foo"] = 3  # removed since, unknown effect
    old["bar"] = {"baz": 1}  # a removed section
    stored = read_values(old, tmp_path / "config.yaml")
    assert stored.values["optim"]["eps"] == LLMTrainConfig().optim.eps
    assert stored.values["logging"]["wandb"] is False
    assert stored.values["cluster"]["env"] == {"A": "b"}  # a mapping's keys are values
    assert sorted(stored.missing) == ["logging", "optim.eps"]
    assert stored.harmless == ("model.dropout",)
    assert stored.unknown == {"train.foo": 3, "bar": {"baz": 1}}
    assert stored.config.optim.eps == LLMTrainConfig().optim.eps
    refusal = stored.refusal()
    assert refusal is not None and "train.foo=3, bar={'baz': 1}" in refusal


def test_resuming_refuses_unknown_keys_with_exit_2(tmp_path: Path) -> None:
    values = compose_config([]).values
    values["train"]["foo"] = 3
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(UserError) as caught:
        resumable_config(path)
    assert caught.value.exit_code == 2 and "train.foo=3" in str(caught.value)
    del values["train"]["foo"]
    path.write_text(yaml.safe_dump(values))
    assert resumable_config(path).unknown == {}
