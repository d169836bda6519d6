"""Each key's choices and bounds are declared once, on its schema field
(launcher/config/schema/allowed.py metadata), and read from there by validate
(launcher/validate/values.py), by composition's choice check, and by shell completion of values."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from launcher.cli_hints import complete_override
from launcher.config.schema import LLMTrainConfig, key_info
from launcher.config.schema.allowed import METADATA_KEY
from launcher.config.schema.keys import field_type
from launcher.validate.values import value_problems
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def with_value(key: str, value: Any) -> LLMTrainConfig:
    section, name = key.split(".")
    cfg = LLMTrainConfig()
    return dataclasses.replace(
        cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})}
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model.num_layers", 0, "must be a positive integer"),
        ("model.num_layers", 10_001, "implausibly large (limit 10,000); check for a typo"),
        ("slurm.chain", -1, "must be an integer >= 0"),
        ("cluster.storage_write_gbps", 0.0, "must be a number > 0"),
        ("train.hang_timeout_s", math.nan, "must be a number >= 0"),
        ("zero.stage", 4, "must be 0-3"),
        (
            "train.seed",
            -1,
            "must be an integer in [0, 4294967295] (numpy's and Megatron-LM's seed range), "
            "e.g. 1234",
        ),
        ("optim.lr", math.inf, "must be a finite number > 0, e.g. 3e-4"),
        ("optim.warmup_steps", -1, "must be a finite number >= 0, e.g. 10 (0: no warmup)"),
        ("optim.min_lr", 1.0, "must lie between 0 and optim.lr=0.0003"),
        ("optim.betas", [0.9, 1.0], "need two values in [0, 1), e.g. [0.9, 0.95]"),
        ("optim.betas", [0.9], "need two values in [0, 1), e.g. [0.9, 0.95]"),
        ("model.hidden_dropout", 1.0, "must be in [0, 1)"),
        ("optim.wsd_decay_fraction", 1.5, "must be in [0, 1]"),
        # One message a key: the range's, not also "larger than float32 holds".
        ("model.attention_dropout", 1e39, "must be in [0, 1)"),
    ],
)
def test_a_value_outside_its_declared_bounds_names_the_key(
    key: str, value: Any, message: str
) -> None:
    shown = list(value) if isinstance(value, list) else value
    assert value_problems(with_value(key, value)) == [((key,), f"{key}={shown}: {message}")]


def test_values_within_bounds_pass_and_optional_keys_may_be_null() -> None:
    assert value_problems(LLMTrainConfig()) == []
    assert value_problems(with_value("optim.wsd_decay_fraction", 1.0)) == []
    assert value_problems(with_value("model.num_kv_heads", None)) == []
    assert value_problems(with_value("model.num_layers", 10_000)) == []


def test_a_number_without_bounds_is_still_checked_for_what_the_ranks_hold() -> None:
    assert value_problems(with_value("model.moe_load_imbalance", 1e39)) == [
        (
            ("model.moe_load_imbalance",),
            "model.moe_load_imbalance=1e+39: larger than float32 holds (at most 3.403e+38), "
            "the dtype the ranks use; e.g. model.moe_load_imbalance=1",
        )
    ]


def test_every_declared_bound_is_enforced() -> None:
    # Read from the metadata alone: a value just past each key's lower or upper bound fails.
    for key, spec in key_info.ranges().items():
        integer = int in (field_type(key), *getattr(field_type(key), "__args__", ()))
        low = spec.gt if spec.gt is not None else spec.ge - (1 if integer else 0.5)  # type: ignore[operator]
        value: Any = [low] * (spec.length or 1) if spec.length else low
        # (optim.lr=0 also puts optim.min_lr above it: that key's own message.)
        assert value_problems(with_value(key, value))[0][0] == (key,), key
        if spec.le is not None:
            assert [k for k, _ in value_problems(with_value(key, spec.le + 1))] == [(key,)], key
        if spec.typo_above is not None:
            too_big = with_value(key, spec.typo_above + 1)
            assert "check for a typo" in value_problems(too_big)[0][1], key


def test_choices_are_the_fields_metadata_in_schema_order() -> None:
    found = key_info.choices()
    assert found["parallel.pp_schedule"] == ("gpipe", "1f1b", "interleaved")
    assert found["backend.moe_dispatcher"] == ("allgather", "alltoall", "flex")
    field = key_info.schema_field("precision.fp8_recipe")
    assert field is not None and found["precision.fp8_recipe"] == (
        field.metadata[METADATA_KEY].choices
    )
    assert key_info.allowed("model.nope") is None and key_info.allowed("model.name") is None


def test_completion_offers_the_declared_choices() -> None:
    assert complete_override("optim.schedule=") == [
        f"optim.schedule={c}" for c in key_info.choices()["optim.schedule"]
    ]
    assert complete_override("zero.offload_params=c") == ["zero.offload_params=cpu"]
    # bash splits at '=': the bare values.
    assert complete_override("=", ["plan", "precision.fp8_recipe"]) == ["tensorwise", "rowwise"]


def test_composition_refuses_a_word_outside_the_choices() -> None:
    result = invoke("validate", "zero.offload_params=gpu")
    assert result.returncode == 2
    assert "zero.offload_params=gpu: must be one of none, cpu" in shown(result)
