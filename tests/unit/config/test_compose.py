"""Composition: recipes, group options, overrides, and every kind of bad input."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.composition.provenance import value_sources
from launcher.errors import ConfigError

pytestmark = pytest.mark.unit


def problems(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    return str(info.value)


def test_default_is_the_tiny_recipe() -> None:
    composed = compose_config([])
    assert composed.choices["recipe"] == "tiny"
    assert composed.config.model.name == "tiny"
    assert composed.config.cluster.gpu == "cpu"


def test_mission_example_overrides_the_recipe() -> None:
    composed = compose_config(["recipe=gpt-7b", "zero.stage=3"])
    assert composed.config.zero.stage == 3
    assert composed.config.model.name == "gpt-7b"


def test_command_line_group_beats_recipe_choice() -> None:
    composed = compose_config(["recipe=llama3-70b", "model=llama3-8b", "parallel.tp=2"])
    assert composed.config.model.name == "llama3-8b"
    assert composed.config.parallel.tp == 2
    assert composed.choices["model"] == "llama3-8b"


def test_plus_adds_to_free_form_env_and_tilde_removes_it() -> None:
    composed = compose_config(["+cluster.env.NCCL_DEBUG=INFO"])
    assert composed.config.cluster.env == {"NCCL_DEBUG": "INFO"}


def test_unknown_keys_are_all_reported_with_suggestions() -> None:
    text = problems(["+parallel.foo=1", "train.tp=3", "model.num_layrs=3"])
    assert "parallel.foo: unknown key" in text
    assert "valid keys of parallel: tp, pp, vpp" in text
    assert "train.tp: unknown key (did you mean 'parallel.tp'?)" in text
    assert "model.num_layrs: unknown key (did you mean 'num_layers'?)" in text


def test_plus_on_a_new_top_level_key_is_rejected() -> None:
    assert "foo: unknown key" in problems(["+foo=1"])


def test_bad_group_option_lists_options_and_suggests() -> None:
    text = problems(["precision=bf17"])
    assert "precision=bf17: no such precision (did you mean 'bf16'?)" in text
    assert "available: bf16, bf16-pure, fp16, fp32, fp8" in text


def test_bad_recipe_lists_recipes() -> None:
    text = problems(["recipe=llama3-7b"])
    assert "no such recipe" in text
    assert "llama3-8b" in text


def test_type_errors_name_key_and_expected_type() -> None:
    assert "parallel.tp=abc: expected an integer, got str 'abc'" in problems(["parallel.tp=abc"])
    # An integral float (1e12) is still refused, with the integer to write instead.
    assert "write it as an integer: train.tokens=1000000000000" in problems(["train.tokens=1e12"])
    assert "write it as" not in problems(["train.tokens=1.5"])
    assert "optim.lr=fast: expected a number" in problems(["optim.lr=fast"])
    assert "model.num_kv_heads=x: expected an integer or null" in problems(["model.num_kv_heads=x"])
    assert "model.tie_embeddings=maybe: expected true or false" in problems(
        ["model.tie_embeddings=maybe"]
    )
    assert "parallel.pp_layers[1]=b: expected an integer (list element)" in problems(
        ["parallel.pp_layers=[1,b]"]
    )


def test_choice_keys_are_checked_with_suggestion() -> None:
    text = problems(["parallel.pp_schedule=1f1c"])
    assert "parallel.pp_schedule=1f1c: must be one of gpipe, 1f1b, interleaved" in text
    assert "did you mean '1f1b'" in text


def test_malformed_override_explains_the_grammar() -> None:
    assert "key=value" in problems(["model.foo"])


def test_deleting_a_schema_key_says_to_set_it() -> None:
    assert "cannot be deleted" in problems(["~model.num_layers"])


def test_sources_tell_each_layer_apart() -> None:
    composed = compose_config(["recipe=llama3-70b", "parallel.tp=4"])
    sources = value_sources(composed)
    assert sources["parallel.tp"] == "command line"
    assert sources["model.num_layers"] == "model/llama3-70b.yaml (chosen by recipe llama3-70b)"
    assert sources["optim.name"] == "optim/adamw.yaml (default)"
    assert sources["slurm.job_name"] == "schema default"
    assert sources["recipe"] == "command line"
    # The recipe sets cluster.num_nodes in its own body.
    assert sources["cluster.num_nodes"] == "recipe llama3-70b"


def test_a_training_length_on_the_command_line_replaces_the_recipes() -> None:
    # gpt-7b's recipe sets train.tokens (300B); `train.steps=5` for a trial means 5 steps.
    recipe = compose_config(["recipe=gpt-7b"]).config.train
    assert recipe.tokens == 300_000_000_000 and recipe.steps is None
    short = compose_config(["recipe=gpt-7b", "train.steps=5"]).config.train
    assert (short.steps, short.tokens) == (5, None)
    # ... and the other way round (the tiny recipe sets steps).
    tiny = compose_config(["train.tokens=1000000"]).config.train
    assert (tiny.steps, tiny.tokens) == (None, 1_000_000)
    # Both on the command line: kept as given, for the validator to refuse.
    both = compose_config(["recipe=gpt-7b", "train.steps=5", "train.tokens=100"]).config.train
    assert (both.steps, both.tokens) == (5, 100)


def test_in_backward_asked_sets_no_clipping_and_one_micro_batch_unless_given() -> None:
    # The tiny recipe's global batch 8 and the optim group's clip 1.0 would refuse the step in
    # the backward (2 micro-batches of 4, a clipped norm): asked for, it brings its own values.
    asked = ["optim.in_backward=true", "train.micro_batch_size=4"]
    composed = compose_config(asked)
    cfg = composed.config
    assert (cfg.optim.grad_clip, cfg.train.global_batch_size, cfg.train.grad_accum) == (
        0.0,
        None,
        None,
    )
    sources = value_sources(composed)
    assert sources["optim.grad_clip"] == "command line (optim.in_backward=true sets it)"
    assert sources["train.global_batch_size"] == "command line (optim.in_backward=true sets it)"
    # A value given beside it stays (validate then says why it cannot run); so does the batch.
    given = compose_config([*asked, "optim.grad_clip=0.5", "train.grad_accum=2"]).config
    assert (given.optim.grad_clip, given.train.global_batch_size, given.train.grad_accum) == (
        0.5,
        8,
        2,
    )
    assert (
        value_sources(compose_config([*asked, "optim.grad_clip=0.5"]))["optim.grad_clip"]
        == "command line"
    )
    # Not asked (or asked false): the recipe's values.
    plain = compose_config(["optim.in_backward=false"]).config
    assert (plain.optim.grad_clip, plain.train.global_batch_size) == (1.0, 8)


@pytest.mark.parametrize(("recipe", "base"), [("tiny-sft-lora", "tiny-llama"),
                                              ("tiny-dpo-lora", "tiny-sft-merged")])  # fmt: skip
def test_recipe_bases_resolve_under_run_root_dir(recipe: str, base: str) -> None:
    """A chain of runs under another run.root_dir finds its base there, not in ./runs."""
    cfg = compose_config([f"recipe={recipe}", "run.root_dir=/scratch/me"])
    assert cfg.config.train.init_from == f"/scratch/me/{base}"
    assert compose_config([f"recipe={recipe}"]).config.train.init_from == f"runs/{base}"
