"""`--config FILE` and `recipe=PATH`: a user's own YAML composed with the shipped groups, the
command line winning, unknown keys named with the file, provenance, a cache keyed on content, and
hostile files refused with exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.config.composition import compose_cache
from launcher.config.composition.compose import compose_config
from launcher.config.composition.config_file import expand, render_value
from launcher.errors import ConfigError
from tests.cli import invoke, said, shown

pytestmark = pytest.mark.unit

MINE = """\
model:
  num_layers: 3
  name: mine
train.steps: 7
optim:
  betas: [0.9, 0.99]
  name: adamw
cluster: cpu
run:
  name: "it's \\\\ mine"
"""
RECIPE = """\
defaults:
  - override /model: tiny
model:
  hidden_size: 96
train:
  steps: 5
"""


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMTRAIN_NO_CACHE", raising=False)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def show(*args: str) -> dict:  # type: ignore[type-arg]
    result = invoke("show", *args, "--sources", "--json")
    assert result.returncode == 0, shown(result)
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_config_file_composes_with_groups_and_overrides_win(tmp_path: Path) -> None:
    mine = write(tmp_path / "mine.yaml", MINE)
    doc = show("--config", str(mine), "model.num_layers=5")
    config, sources = doc["config"], doc["sources"]
    assert config["model"]["num_layers"] == 5 and sources["model.num_layers"] == "command line"
    assert config["model"]["name"] == "mine"
    assert sources["model.name"] == f"config file {mine}"
    assert config["train"]["steps"] == 7 and config["train"]["tokens"] is None
    assert config["optim"]["betas"] == [0.9, 0.99]
    assert config["run"]["name"] == "it's \\ mine"
    assert config["cluster"]["name"] == "cpu"
    # The recipe's group files still fill the rest.
    assert sources["model.hidden_size"].startswith("model/tiny.yaml")
    # train.tokens on the command line replaces the file's train.steps.
    config = show("--config", str(mine), "train.tokens=1000000")["config"]
    assert config["train"]["steps"] is None and config["train"]["tokens"] == 1000000


@pytest.mark.parametrize(
    "value",
    [None, True, 3, 2.5e-05, "a b", "x'y", "a\\b", "end\\", "q\\'x", "${x}", [1, "z"], {"A": "1"}],
)
def test_values_round_trip_through_the_override_grammar(value: object) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (parsed,) = OverridesParser.create().parse_overrides([f"k={render_value(value)}"])
    assert parsed.value() == value


def test_unknown_keys_name_the_key_and_the_file(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "model:\n  num_layerz: 3\ntrain:\n  tp: 2\n")
    code, output = said(invoke("validate", "--config", str(bad)))
    assert code == 2
    assert "model.num_layerz: unknown key (did you mean 'num_layers'?)" in output
    assert "train.tp: unknown key (did you mean 'parallel.tp'?)" in output
    assert str(bad) in output
    typed = write(tmp_path / "typed.yaml", "model: {num_layers: abc}\n")
    with pytest.raises(ConfigError, match=r"model.num_layers=abc: expected an integer.*typed.yaml"):
        compose_config(expand(str(typed), []))


def test_a_recipe_file_with_values_of_the_wrong_shape_names_each_key(tmp_path: Path) -> None:
    """OmegaConf says only "Cannot merge DictConfig with ListConfig" for these (found by the
    fuzzer); the recipe check names the key, the expected type and the file."""
    text = "slurm:\n  extra_sbatch_args: {a: 1}\nparallel:\n  tp: [1, 2]\nzero: 3\n"
    bad = write(tmp_path / "shapes.yaml", text)
    code, output = said(invoke("validate", f"recipe={bad}"))
    assert code == 2
    flat = " ".join(output.split())
    assert "slurm.extra_sbatch_args: expected list[str], got a mapping" in flat
    assert "parallel.tp: expected an integer, got a list" in flat
    assert "zero: a section of keys, not 3" in flat
    assert "Cannot merge" not in flat and "shapes.yaml" in flat


def test_recipe_by_path_and_the_cache_sees_an_edit(tmp_path: Path) -> None:
    recipe = write(tmp_path / "r.yaml", RECIPE)
    first = compose_config([f"recipe={recipe}"])
    assert first.config.model.hidden_size == 96 and first.config.train.steps == 5
    name = first.choices["recipe"]
    assert compose_cache.load(first.overrides) is not None  # cached under the content's name
    doc = show(f"recipe={recipe}")
    assert doc["sources"]["model.hidden_size"] == f"recipe {name} ({recipe})"
    # Same path, same size, new content (mtime kept): the change is seen.
    stat = recipe.stat()
    write(recipe, RECIPE.replace("96", "64"))
    os.utime(recipe, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert compose_config([f"recipe={recipe}"]).config.model.hidden_size == 64
    # The same through --config, relative to the config file's folder.
    mine = write(tmp_path / "mine.yaml", "recipe: ./r.yaml\ntrain:\n  steps: 9\n")
    composed = compose_config(expand(str(mine), []))
    assert composed.config.model.hidden_size == 64 and composed.config.train.steps == 9
    write(mine, "recipe: ./r.yaml\ntrain:\n  steps: 8\n")
    assert compose_config(expand(str(mine), [])).config.train.steps == 8


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("DIR", "is a folder"),
        ("- 1\n- 2\n", "must hold keys and values"),
        ("LINK", "is a symbolic link"),
        ('a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n', "anchors/aliases"),
        ("HUGE", "a config file holds at most"),
        ("model: [\n", "invalid YAML"),
        ("\xff\xfe", "UTF-8"),
    ],
)
@pytest.mark.parametrize("how", ["--config", "recipe"])
def test_hostile_files_are_refused_with_exit_2(
    tmp_path: Path, content: str | None, message: str, how: str
) -> None:
    path = tmp_path / "x.yaml"
    if content == "DIR":
        path.mkdir()
    elif content == "LINK":
        write(tmp_path / "real.yaml", "model: {num_layers: 2}\n")
        path.symlink_to(tmp_path / "real.yaml")
    elif content == "HUGE":
        path.write_bytes(b"a" * (2 << 20))
    elif content == "\xff\xfe":
        path.write_bytes(b"\xff\xfe\x00")
    elif content is not None:
        write(path, content)
    args = ["show", "--config", str(path)] if how == "--config" else ["show", f"recipe={path}"]
    code, output = said(invoke(*args))
    assert code == 2, output
    assert message in output


def test_the_console_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    done = invoke("run", "--config", str(tmp_path / "none.yaml"))
    assert done.returncode == 2
    assert "--config=" in done.stderr and "no such file" in done.stderr
    assert "Traceback" not in done.stderr
