"""Every shipped recipe composes, validates, and opens with the command that runs it."""

from __future__ import annotations

import pytest

from launcher import resources
from launcher.config.composition.compose import compose_config
from launcher.config.composition.presets import model_preset
from launcher.validate.rules import check
from launcher.verdict import assess

pytestmark = pytest.mark.unit

REQUIRED = {
    "tiny",
    "gpt-125m",
    "gpt-7b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "gpt3-175b",
    "opt-175b",
    "gpt-neox-20b",
    "bloom-176b",
    "mt-nlg-530b",
    "mixtral-8x7b",
    "deepseek-v3",
}


def test_required_recipes_are_shipped() -> None:
    assert set(resources.recipe_names()) >= REQUIRED


@pytest.mark.parametrize("name", resources.recipe_names())
def test_recipe_validates(name: str) -> None:
    composed = compose_config([f"recipe={name}"])
    errors = [v.message for v in check(composed.config) if v.is_error]
    assert errors == [], errors
    assert composed.config.model.name == composed.choices["model"]


@pytest.mark.parametrize("name", resources.recipe_names())
def test_recipe_opens_with_its_command(name: str) -> None:
    first = (resources.recipes_dir() / f"{name}.yaml").read_text().splitlines()[0]
    assert first.startswith("# llmtrain ") and f"recipe={name}" in first, first


@pytest.mark.parametrize("name", resources.group_options("model"))
def test_model_preset_equals_the_composed_model(name: str) -> None:
    # model_preset reads conf/model/NAME.yaml without Hydra (calibration points and worked
    # exercises use it); it must give exactly what `model=NAME` composes to.
    composed = compose_config([f"model={name}"]).config.model
    assert model_preset(name) == composed
    assert model_preset(name, seq_length=123).seq_length == 123


@pytest.mark.parametrize("name", resources.recipe_names())
def test_recipe_fits_by_its_own_plan(name: str) -> None:
    # A shipped recipe that `plan` says does not fit would make `run`/`submit` refuse it.
    from launcher.plan.planner import make_plan

    plan = make_plan(compose_config([f"recipe={name}"]).config)
    assert plan.memory.fits, f"{name}: stage {plan.memory.heaviest.stage} does not fit"


def test_recipes_say_whether_an_engine_here_runs_them() -> None:
    from launcher.views.config import recipe_rows

    rows = {row["name"]: row for row in recipe_rows()}
    assert rows["tiny"]["runnable"] and rows["llama3-8b"]["runnable"]
    # backend=megatron recipes: `run`/`submit` launch Megatron-LM's pretrain_gpt.py.
    for name in ("gpt3-175b", "bloom-176b", "deepseek-v3"):
        assert rows[name]["runnable"] and rows[name]["backend"] == "megatron"
    for name, row in rows.items():
        assert row["valid"], name
        verdict = assess([f"recipe={name}"])
        preset = any(n.startswith("planning preset: run/submit need") for n in verdict.notes)
        assert preset == (not row["runnable"]), name
