"""A config key typed as an option, a bare recipe name, and shell completion of overrides."""

from __future__ import annotations

import pytest
import typer

from launcher.cli import app
from launcher.cli_hints import complete_override, override_typed_as_option
from launcher.config.composition.compose import compose_config
from launcher.errors import ConfigError
from tests.cli import invoke

pytestmark = pytest.mark.unit

ROOT = typer.main.get_command(app)


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["run", "--recipe", "gpt-7b"], "recipe=gpt-7b"),
        (["run", "--dry-run", "--recipe=tiny"], "recipe=tiny"),
        (["plan", "--steps", "5"], "train.steps=5"),
        (["plan", "--parallel.tp=2"], "parallel.tp=2"),
        (["validate", "--zero-stage"], None),  # not a key: click's own "No such option"
        (["data", "prepare", "--recipe", "x"], "recipe=x"),
        (["plan", "--steps", "recipe=tiny"], "train.steps=VALUE"),  # the next word is an override
    ],
)
def test_config_key_typed_as_option(argv: list[str], suggestion: str | None) -> None:
    hint = override_typed_as_option(ROOT, argv)
    if suggestion is None:
        assert hint is None
    else:
        assert hint is not None and suggestion in hint and "--force" not in hint


def test_declared_options_pass() -> None:
    # --json, --top, --dry-run are the commands' own options: nothing to say.
    assert override_typed_as_option(ROOT, ["plan", "--json", "--top", "3", "recipe=tiny"]) is None
    assert override_typed_as_option(ROOT, ["run", "--dry-run", "train.steps=2"]) is None


def test_the_real_command_exits_2_with_the_override_form() -> None:
    proc = invoke("run", "--recipe", "gpt-7b", env={"COLUMNS": "200"})
    assert proc.returncode == 2
    assert "recipe=gpt-7b" in proc.stderr and "Traceback" not in proc.stderr
    assert "--force" not in proc.stderr


def test_bare_recipe_word_suggests_recipe_override() -> None:
    with pytest.raises(ConfigError) as exc:
        compose_config(["gpt-7b"])
    assert "Did you mean recipe=gpt-7b" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        compose_config(["h100-80gb"])
    assert "cluster=h100-80gb" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        compose_config(["no-such-thing"])
    assert "Did you mean" not in str(exc.value)


def test_completion_offers_recipes_options_and_keys() -> None:
    assert "recipe=gpt-7b" in complete_override("recipe=gpt")
    assert all(c.startswith("recipe=gpt") for c in complete_override("recipe=gpt"))
    assert "cluster=h100-80gb" in complete_override("cluster=h1")
    assert "parallel.tp=" in complete_override("parallel.t")
    assert "+train.steps=" in complete_override("+train.st")
    assert "recipe=" in complete_override("rec")
    assert complete_override("train.steps=") == []  # a value: nothing to offer
